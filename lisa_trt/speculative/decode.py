"""Tree speculative decoding: prefill, draft, verify, accept, compact both caches, repeat.

The loop orchestrates; the math lives in sampling.py, tree.py, verify.py and gasv.py. It runs on
any engine that follows engines/base.py (torch eager, ONNX Runtime, TensorRT), with batch > 1
(rows finish at different steps and are dropped from the batch; no padding changes results) and
CFG as batch halves [cond; uncond] with identical trees in both halves.

Cache invariants at the start of every step, for each active row with n committed tokens:
- target cache: prefix + z_0 .. z_{n-2} (lengths = cls + n - 1); z_{n-1} is the tree ROOT;
- drafter cache: one entry per committed token z_0 .. z_{n-1} at slots cls .. cls + n - 1
  (entry for z_j = fc(target taps at z_j's predecessor) + E[z_j]); the root's entry gives the
  drafter distribution and hidden state the tree grows from.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..config import SamplingConfig
from ..errors import InputError
from ..timing import Timer
from .autoregressive import cfg_batch, layout_for, new_target_cache
from .sampling import (RowGenerators, cfg_active, cfg_combine, make_generator, process_logits, sample_from_logits,
                       split_cfg)
from .methods import METHODS, Method, RuleContext, SpecConfig, get_method  # noqa: F401 (re-exports METHODS)
from ..models.family import SequenceLayout
from .subvocab import RELAXED, SubVocabVerifier
from .tree import DraftTree, ExpandRequest, build_dynamic_tree

@dataclass
class DecodeStats:
    """Per-run statistics (batch-level: lists over verification steps)."""

    committed: list = field(default_factory=list)  # per step: (active rows,) tokens committed
    tvd: list = field(default_factory=list)  # per step: (active rows,) mean TVD(p_raw, law)
    rows: list = field(default_factory=list)  # per step: (active rows,) original row indices
    target_forwards: int = 0
    drafter_calls: int = 0
    times: dict = field(default_factory=dict)  # seconds: draft, target, accept, host, total
    settings: dict = field(default_factory=dict)  # what the loop ran with, recorded in stats (e.g. sjd_window)

    @property
    def mal(self) -> float:
        """Mean accepted length: committed tokens per verification forward, over rows and steps."""
        if not self.committed:
            return 1.0
        return float(torch.cat([c.float().cpu() for c in self.committed]).mean())

    @property
    def mean_tvd(self) -> float:
        if not self.tvd:
            return 0.0
        return float(torch.cat([t.float().cpu() for t in self.tvd]).mean())

    def row(self, b: int) -> dict:
        """MAL and mean TVD of original row b alone (its own steps)."""
        com = [c[r == b].float().cpu() for c, r in zip(self.committed, self.rows)]
        tv = [t[r == b].float().cpu() for t, r in zip(self.tvd, self.rows)]
        com, tv = torch.cat(com) if com else torch.ones(1), torch.cat(tv) if tv else torch.zeros(1)
        return {"mal": float(com.mean()) if com.numel() else 1.0,
                "mean_tvd": float(tv.mean()) if tv.numel() else 0.0, "steps": int(com.numel())}

    def as_dict(self) -> dict:
        return {"mal": self.mal, "mean_tvd": self.mean_tvd, "steps": len(self.committed),
                "target_forwards": self.target_forwards, "drafter_calls": self.drafter_calls,
                "times": dict(self.times), **self.settings}


class Guide:
    """Raw logits of the (CFG) batch -> guided, filtered logits of the real rows, restricted and
    forced by the family's SequenceLayout (models/family.py). Public: the tree decoder, SJD and
    calibration rollouts share it, so every loop guides, filters and forces the same way."""

    def __init__(self, sampling: SamplingConfig, layout=None):
        self.s, self.layout = sampling, layout if layout is not None else SequenceLayout(1)  # None: free tokens
        self.cfg = cfg_active(sampling.cfg_scale)
        self._entry = True  # the first logits guided (the prefill's) are checked: where data enters

    def _process(self, x: torch.Tensor) -> torch.Tensor:
        check, self._entry = (True if self._entry else None), False
        return process_logits(x, self.s.temperature, self.s.top_k, self.s.top_p, check=check)

    def __call__(self, raw: torch.Tensor, token_index: Optional[torch.Tensor] = None) -> torch.Tensor:
        s = self.s
        if self.cfg:
            guided = cfg_combine(raw, s.cfg_scale)
            if s.cfg_interval > -1 and token_index is not None:
                off = (token_index - 1 > s.cfg_interval)[..., None]  # official: step i-1 > interval
                guided = torch.where(off, split_cfg(raw)[0].float(), guided)
        else:
            guided = raw.float()
        return self.layout.law(guided, token_index, self._process)

    def forced(self, token_index: torch.Tensor) -> Optional[torch.Tensor]:
        """(B, N) long: the token id forced at each index, -1 where it is sampled (None when the
        layout forces nothing)."""
        f = self.layout.forced
        return None if f is None else f.to(token_index.device)[token_index.clamp(max=f.numel() - 1)]

    def dup(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of the real batch -> rows of the CFG batch (same tokens in both halves)."""
        return torch.cat([x, x]) if self.cfg else x

    def rows(self, idx: torch.Tensor, B: int) -> torch.Tensor:
        """Indices of real rows `idx` in a CFG batch of 2B (cond half then uncond half)."""
        return torch.cat([idx, idx + B]) if self.cfg else idx


@dataclass
class _Decode:
    """One generate call: what it decodes with (resolved once) and where it stands.

    Tensors of the active rows follow the CFG batch where the engines do (root_lp, root_h: 2Bc
    rows with CFG); out / n_done index the original rows, `active` maps one to the other.
    """

    method: Method
    spec: SpecConfig
    guide: Guide
    gen: object  # torch.Generator, or RowGenerators (one per original row)
    session: object  # the method's per-decode state (Method.session), None without one
    tcache: object
    dcache: object
    out_buf: torch.Tensor  # (B, N + 1) committed tokens, -1 where not yet decoded; column N: dump
    n_done: torch.Tensor  # (B,) committed tokens per original row
    active: torch.Tensor  # (Bc,) original indices of the rows still decoding
    root_lp: torch.Tensor  # drafter logits at each active row's tree root
    root_h: torch.Tensor  # drafter hidden state at each active row's tree root
    timer: Timer
    stats: DecodeStats
    min_left: int = 0  # fewest tokens any active row still needs (host int, from the step's one read)
    gen_active: object = None  # `gen` of the active rows (RowGenerators: selected when rows retire)

    @property
    def out(self) -> torch.Tensor:
        """(B, N) committed tokens (a view of out_buf)."""
        return self.out_buf[:, : self.n_tokens]

    @property
    def greedy(self) -> bool:
        return self.guide.s.greedy

    @property
    def n_tokens(self) -> int:
        return self.guide.layout.n_tokens

    @property
    def device(self) -> torch.device:
        return self.tcache.lengths.device  # all bookkeeping lives with the engines' caches


def _generators(seed, generator, seeds, B: int, tree, dev):
    """The decode's random source: one generator per row (`seeds`) or one for the batch."""
    if seeds is None:
        return generator or make_generator(seed, dev)
    if len(seeds) != B:
        raise InputError(f"{len(seeds)} seeds for {B} prompts; pass one seed per prompt")
    return RowGenerators(seeds, dev, cap=tree.total_tokens + tree.depth + 1)


class SpeculativeDecoder:
    """Runs one batch of prompts with tree speculation; reusable across calls.

    Args:
        target: a TargetEngine (torch Transformer, engines.graph.GraphTarget).
        drafter: a DrafterEngine (torch Drafter, engines.graph.GraphDrafter).
        tables: GASVTables bound to the target head (gasv) / with LANTERN neighbours (lantern).
        gasv: optional GASV engine `gasv(logits (N, V), tokens (N,), parents (N,), cfg) -> GASVGates`
            (engines.graph.GraphGASV); default: the PyTorch reference `gasv_gates` over `tables`.
    """

    def __init__(self, target, drafter, tables=None, gasv=None):
        self.target, self.drafter, self.tables, self.gasv = target, drafter, tables, gasv
        self._causal: dict = {}  # (S, device) -> (S, S) causal mask of a drafter commit
        self._sub = {}  # id(sub_vocab) -> SubVocabVerifier

    @torch.no_grad()
    def generate(self, cond, *, sampling: SamplingConfig = SamplingConfig(), spec: SpecConfig = SpecConfig(),
                 seed: Optional[int] = None, generator: Optional[torch.Generator] = None,
                 num_tokens: Optional[int] = None, seeds=None,
                 on_progress=None, layout=None, method: Optional[Method] = None,
                 on_step=None) -> tuple[torch.Tensor, DecodeStats]:
        """Generate image tokens for `cond` with tree speculation.

        method: the resolved Method (run_method passes it); None: the one `spec.method` names.

        layout: the family's SequenceLayout of the request (models/family.py; default: the
            whole image, or `num_tokens` of it): which ids may be drafted / sampled, which
            are forced (one-hot laws for the drafter and the target alike).

        on_progress: optional callback(tokens done, summed over rows) after every step (progress
            bars; costs one host sync per step, so leave it None on the hot path).
        on_step: the per-step hook of every decode loop (run.py `run_method`).
        seeds: one seed per row (instead of seed/generator): each row draws from its own
            generator (sampling.RowGenerators), so a row's tokens do not depend on the other
            rows of the batch (served requests batched together == decoded alone).

        Returns:
            tokens (B, N) long, DecodeStats.
        """
        method = method if method is not None else get_method(spec.method)  # once: every step reads it
        if method.kind != "tree":
            raise InputError(f"method {spec.method!r} does not use the tree decoder; run it with "
                             "lisa_trt.speculative.run.run_method")
        if method.greedy_sampling:
            sampling = dataclasses.replace(sampling, greedy=True)
        B = self.target.check_cond(cond)
        guide = Guide(sampling, layout if layout is not None else layout_for(self.target, num_tokens))
        t_start = time.perf_counter()
        rng = functools.partial(_generators, seed, generator, seeds, B, spec.tree)  # made once the device is known
        run = self._prefill(cond, B, method, spec, guide, rng)
        while run.active.numel():
            nd = run.n_done[run.active]  # (Bc,) committed tokens of the active rows (one gather per step)
            slots, tout, res = self._step(run, nd)
            nd = self._commit(run, nd, slots, tout, res)
            if on_progress is not None:
                on_progress(int(run.n_done.sum()))
            if on_step is not None:
                on_step(run.out, run.n_done)
            self._retire(run, nd)
        run.stats.times = dict(run.timer.totals)
        run.stats.times["total"] = time.perf_counter() - t_start
        return run.out.contiguous(), run.stats

    # -- the phases of a decode ------------------------------------------------------------

    def _prefill(self, cond, B: int, method: Method, spec: SpecConfig, guide: Guide, rng) -> _Decode:
        """Target prefill, the target's own first token z_0, then the drafter entry for z_0."""
        target, timer, stats = self.target, Timer(), DecodeStats()
        N = guide.layout.n_tokens
        with timer.measure("target"):
            full = cfg_batch(target, cond, guide.s.cfg_scale)
            cls = target.prompt_len(full)  # prompt slots (LlamaGen: the class / caption prefix)
            tcache = new_target_cache(target, 2 * B if guide.cfg else B, full, N, extra=spec.tree.total_tokens)
            pre = target.prefill(full, tcache, taps=True)
            stats.target_forwards += 1
        dev = tcache.lengths.device
        gen = rng(dev)
        session = None
        if method.session is not None and not guide.s.greedy:  # per-decode state of the method (coupled drafting)
            session = method.session(batch=B, vocab=pre.logits.shape[-1], generator=gen, device=dev, spec=spec)
        first = self._first_token(pre.logits[:, -1], B, guide, gen, session, dev)
        out = torch.full((B, N + 1), -1, dtype=torch.long, device=dev)
        out[:, 0] = first
        with timer.measure("draft"):
            dcache = self._new_drafter_cache(tcache, cls, N, spec.tree)
            d_logits, d_hidden = self._drafter_commit(dcache, pre.taps, guide.dup(first[:, None]))
        return _Decode(method, spec, guide, gen, session, tcache, dcache, out,
                       n_done=torch.ones(B, dtype=torch.long, device=dev), active=torch.arange(B, device=dev),
                       root_lp=d_logits[:, -1], root_h=d_hidden[:, -1], timer=timer, stats=stats,
                       min_left=N - 1, gen_active=gen)

    @staticmethod
    def _first_token(raw, B: int, guide: Guide, gen, session, dev) -> torch.Tensor:
        """z_0 of every row from the prefill's last logits (the session draws it when there is one)."""
        zero = torch.zeros(B, dtype=torch.long, device=dev)
        law = guide(raw, zero)
        if session is not None:
            return session.sample(law, zero, torch.arange(B, device=dev))
        return sample_from_logits(law, gen, guide.s.greedy)

    def _step(self, run: _Decode, nd: torch.Tensor):
        """Draft a tree from every active root, verify it with one target forward, accept.

        Returns (target-cache slots of the tree (CFG rows, Nn), target output, VerifyResult)."""
        tc, guide = run.tcache, run.guide
        remaining = run.n_tokens - nd  # (Bc,) >= 1
        root_tok = run.out[run.active, nd - 1]
        root_pos = tc.positions(tc.lengths[:, None])[:, 0]  # every row (CFG halves may differ)
        with run.timer.measure("draft"):
            tree = self._draft(run, root_tok, root_pos, nd)
            if run.min_left - 1 < tree.max_depth:  # the image's last steps (host ints: no read)
                tree = tree.truncate(remaining - 1)
        with run.timer.measure("target"):
            slots = tc.lengths[:, None] + torch.arange(tree.n_nodes, device=run.device)[None]
            pos = root_pos[:, None] + guide.dup(torch.where(tree.valid, tree.depths, 0))
            mask = tc.attention_mask(slots, guide.dup(tree.ancestors))
            tout = self.target.forward_tokens(guide.dup(tree.tokens), pos, slots, mask, tc, taps=True)
            run.stats.target_forwards += 1
        with run.timer.measure("accept"):
            token_index = nd[:, None] + tree.depths  # z index each node predicts
            res = self._verify(guide(tout.logits, token_index), tree, run, token_index)
        return slots, tout, res

    def _commit(self, run: _Decode, nd, slots, tout, res) -> torch.Tensor:
        """Write the accepted tokens, compact the target cache to the accepted path and feed the
        drafter that path -> the active rows' new committed counts."""
        guide, stats = run.guide, run.stats
        with run.timer.measure("host"):
            ncom = res.accept_len + 1  # (Bc,) accepted drafts plus the bonus token
            stats.committed.append(ncom)
            stats.rows.append(run.active.clone())
            stats.tvd.append(res.tvd)
            cols = torch.arange(res.tokens.shape[1], device=run.device)[None]
            # a fixed-shape masked write: entries past a row's count go to the dump column N
            dst = torch.where(cols < ncom[:, None], nd[:, None] + cols, run.n_tokens)
            run.out_buf.index_put_((run.active[:, None].expand_as(dst), dst), res.tokens)
            path = res.path.clamp(min=0)  # (Bc, D+1) node ids, root first
            run.tcache.compact(guide.dup(slots[: nd.numel()].gather(1, path)), guide.dup(ncom))
        with run.timer.measure("draft"):
            taps = tout.taps.gather(1, guide.dup(path)[:, :, None].expand(-1, -1, tout.taps.shape[-1]))
            new_tok = res.tokens.clamp(min=0)  # (Bc, D+1): accepted drafts then bonus
            d_logits, d_hidden = self._drafter_commit(run.dcache, taps, guide.dup(new_tok), counts=guide.dup(ncom))
            last = guide.dup(ncom - 1)[:, None, None]  # the new root: the last committed entry
            run.root_lp = d_logits.gather(1, last.expand(-1, 1, d_logits.shape[-1]))[:, 0]
            run.root_h = d_hidden.gather(1, last.expand(-1, 1, d_hidden.shape[-1]))[:, 0]
        nd = nd + ncom
        run.n_done[run.active] = nd
        return nd

    @staticmethod
    def _retire(run: _Decode, nd: torch.Tensor) -> None:
        """Rows whose image is complete leave the batch: both caches, the roots and `active`.

        The step's one host read: the active rows' committed counts (which rows are done, and
        how far the nearest is from the end: the next tree is truncated only then)."""
        left = [run.n_tokens - n for n in nd.tolist()]
        keep = [i for i, n in enumerate(left) if n > 0]
        run.min_left = min((left[i] for i in keep), default=0)
        if len(keep) == len(left):
            return
        if isinstance(run.gen, RowGenerators):
            run.gen_active = run.gen_active.select(keep)
        idx = torch.tensor(keep, dtype=torch.long, device=nd.device)
        rows = run.guide.rows(idx, nd.numel())
        run.tcache.select_rows(rows)
        run.dcache.select_rows(rows)
        run.root_lp, run.root_h = run.root_lp[rows], run.root_h[rows]
        run.active = run.active[idx]

    def _verify(self, logits: torch.Tensor, tree: DraftTree, run: _Decode, token_index):
        """Guided, filtered logits (B, N, V) at the tree nodes -> VerifyResult (the method's rule).

        A layout with a sub-vocabulary runs the relaxed rules over the codebook (subvocab.py)."""
        ctx = RuleContext(spec=run.spec, greedy=run.greedy, generator=run.gen_active, tables=self.tables, gasv=self.gasv,
                          session=run.session, rows=run.active, token_index=token_index)
        sv, name = run.guide.layout.sub_vocab, run.method.name
        if sv is not None and name in RELAXED:
            ver = self._sub.get(id(sv))
            if ver is None:
                ver = self._sub[id(sv)] = SubVocabVerifier(sv, logits.shape[-1], self.tables, logits.device)
            return ver(name, logits, tree, run.guide.forced(token_index), ctx)
        return run.method.rule(logits, tree, ctx)

    # -- drafter helpers -------------------------------------------------------------------

    def _new_drafter_cache(self, tcache, cls: int, n_tokens: int, tree):
        """An empty drafter cache sized for the sequence plus one tree's expansion scratch
        (depth * top_k nodes), its positions counted like the target's."""
        dcache = self.drafter.new_cache(tcache.batch, cls + n_tokens + max(tree.total_tokens, tree.depth * tree.top_k))
        if not getattr(self.drafter, "keeps_prompt", False):  # the oracle's cache holds the target's prompt
            dcache.col_valid[:, :cls] = False  # the prompt holds no drafter entries
        dcache.lengths.fill_(cls)
        dcache.pad = tcache.pad.clone()
        return dcache

    def _drafter_commit(self, dcache, taps, tokens, counts=None):
        """Append drafter entries for committed tokens (row b: the first counts[b] of them).

        Entry j consumes fc(taps[:, j]) (the projected target taps of the token before) and
        tokens[:, j]; it sits at position/slot dcache.lengths + j. A drafter with a fused commit
        (engines.graph.GraphDrafter over a drafter_commit graph) does fc + step in one call.
        """
        Bd, S = tokens.shape
        dev = dcache.lengths.device
        slots = dcache.lengths[:, None] + torch.arange(S, device=dev)[None]
        pos = dcache.positions(slots).clamp(max=self.target.config.n_positions - 1)
        causal = self._causal.get((S, dev))
        if causal is None:
            causal = self._causal[(S, dev)] = torch.tril(torch.ones(S, S, dtype=torch.bool, device=dev))
        slots = slots.clamp(max=dcache.max_len - 1)
        mask = dcache.attention_mask(slots, causal[None].expand(Bd, S, S))
        if getattr(self.drafter, "fused_commit", False):
            logits, hidden = self.drafter.commit(taps, tokens, pos, slots, mask, dcache)
        else:
            logits, hidden = self.drafter.forward(self.drafter.project_taps(taps), tokens, pos, slots, mask, dcache)
        dcache.lengths += S if counts is None else counts
        return logits, hidden

    def _draft(self, run: _Decode, root_tok, root_pos, n_done) -> DraftTree:
        """EAGLE-2 dynamic tree from the drafter's guided, filtered distributions (transformed by
        the method's session when it has one: Method.session)."""
        n_pos = self.target.config.n_positions
        guide, session, rows, dcache, stats = run.guide, run.session, run.active, run.dcache, run.stats
        hist = {"h": run.root_h[:, None]}  # hidden_out of the previous call's nodes (CFG rows)
        L = dcache.lengths

        def logprobs(raw, token_index):
            lp = torch.log_softmax(guide(raw, token_index), -1)
            return lp if session is None else session.draft(lp, token_index, rows)

        def expand(req: ExpandRequest) -> torch.Tensor:
            n = req.tokens.shape[1]
            parent = guide.dup(req.parent_slot)
            h_in = hist["h"].gather(1, parent[:, :, None].expand(-1, -1, hist["h"].shape[-1]))
            slots = L[:, None] + req.slot_offset + torch.arange(n, device=L.device)[None]
            pos = (root_pos[:, None] + req.depth).expand(-1, n).clamp(max=n_pos - 1)
            cols = req.slot_offset + n
            tree_slots = L[:, None] + torch.arange(cols, device=L.device)[None]
            m = dcache.attention_mask(slots, torch.zeros(slots.shape[0], n, n, dtype=torch.bool, device=L.device))
            m.scatter_(2, tree_slots[:, None, :].expand(-1, n, cols), guide.dup(req.mask))
            logits, hidden = self.drafter.forward(h_in, guide.dup(req.tokens), pos, slots, m, dcache)
            stats.drafter_calls += 1
            hist["h"] = hidden
            return logprobs(logits, (n_done + req.depth)[:, None].expand(-1, n))

        root_lp = logprobs(run.root_lp, n_done)
        t = run.spec.tree
        return build_dynamic_tree(root_tok, root_lp, expand, top_k=t.top_k, depth=t.depth,
                                  total_tokens=t.total_tokens)
