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
from .methods import METHODS, RuleContext, SpecConfig, get_method  # noqa: F401 (METHODS, SpecConfig re-exported)
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

    def _process(self, x: torch.Tensor) -> torch.Tensor:
        return process_logits(x, self.s.temperature, self.s.top_k, self.s.top_p)

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

    def _verify(self, logits: torch.Tensor, tree: DraftTree, spec: SpecConfig, greedy: bool, gen, guide,
                token_index, session=None, rows=None):
        """Guided, filtered logits (B, N, V) at the tree nodes -> VerifyResult (the method's rule).

        A layout with a sub-vocabulary runs the relaxed rules over the codebook (subvocab.py)."""
        ctx = RuleContext(spec=spec, greedy=greedy, generator=gen, tables=self.tables, gasv=self.gasv,
                          session=session, rows=rows, token_index=token_index)
        sv = guide.layout.sub_vocab
        if sv is not None and spec.method in RELAXED:
            ver = self._sub.get(id(sv))
            if ver is None:
                ver = self._sub[id(sv)] = SubVocabVerifier(sv, logits.shape[-1], self.tables, logits.device)
            return ver(spec.method, logits, tree, guide.forced(token_index), ctx)
        return get_method(spec.method).rule(logits, tree, ctx)

    @torch.no_grad()
    def generate(self, cond, *, sampling: SamplingConfig = SamplingConfig(), spec: SpecConfig = SpecConfig(),
                 seed: Optional[int] = None, generator: Optional[torch.Generator] = None,
                 num_tokens: Optional[int] = None, seeds=None,
                 on_progress=None, layout=None) -> tuple[torch.Tensor, DecodeStats]:
        """Generate image tokens for `cond` with tree speculation.

        layout: the family's SequenceLayout of the request (models/family.py; default: the
            whole image, or `num_tokens` of it): which ids may be drafted / sampled, which
            are forced (one-hot laws for the drafter and the target alike).

        on_progress: optional callback(tokens done, summed over rows) after every step (progress
            bars; costs one host sync per step, so leave it None on the hot path).
        seeds: one seed per row (instead of seed/generator): each row draws from its own
            generator (sampling.RowGenerators), so a row's tokens do not depend on the other
            rows of the batch (served requests batched together == decoded alone).

        Returns:
            tokens (B, N) long, DecodeStats.
        """
        target, drafter = self.target, self.drafter
        if get_method(spec.method).kind != "tree":
            raise InputError(f"method {spec.method!r} does not use the tree decoder; run it with "
                             "lisa_trt.speculative.run.run_method")
        if get_method(spec.method).greedy_sampling:
            sampling = dataclasses.replace(sampling, greedy=True)
        B = target.check_cond(cond)
        layout = layout if layout is not None else layout_for(target, num_tokens)
        N_img = layout.n_tokens
        guide, timer, stats = Guide(sampling, layout), Timer(), DecodeStats()
        greedy = sampling.greedy
        t_start = time.perf_counter()

        # -- prefill: the target's own first token, then the drafter entry for z_0 ----------
        with timer.measure("target"):
            full = cfg_batch(target, cond, sampling.cfg_scale)
            cls = target.prompt_len(full)  # prompt slots (LlamaGen: the class / caption prefix)
            tcache = new_target_cache(target, 2 * B if guide.cfg else B, full, N_img, extra=spec.tree.total_tokens)
            pre = target.prefill(full, tcache, taps=True)
            stats.target_forwards += 1
        dev = tcache.lengths.device  # all bookkeeping lives with the engines' caches
        if seeds is not None:
            if len(seeds) != B:
                raise InputError(f"{len(seeds)} seeds for {B} prompts; pass one seed per prompt")
            gen = RowGenerators(seeds, dev, cap=spec.tree.total_tokens + spec.tree.depth + 1)
        else:
            gen = generator or make_generator(seed, dev)
        meth = get_method(spec.method)
        session = None
        if meth.session is not None and not greedy:  # per-decode state of the method (coupled drafting)
            session = meth.session(batch=B, vocab=pre.logits.shape[-1], generator=gen, device=dev, spec=spec)
        first_law = guide(pre.logits[:, -1], torch.zeros(B, dtype=torch.long, device=dev))
        if session is not None:
            first = session.sample(first_law, torch.zeros(B, dtype=torch.long, device=dev), torch.arange(B, device=dev))
        else:
            first = sample_from_logits(first_law, gen, greedy)
        out = torch.full((B, N_img), -1, dtype=torch.long, device=dev)
        out[:, 0] = first
        n_done = torch.ones(B, dtype=torch.long, device=dev)  # committed tokens per (original) row
        active = torch.arange(B, device=dev)
        # drafter slots: the sequence plus one tree's expansion scratch (depth * top_k nodes)
        dmax = cls + N_img + max(spec.tree.total_tokens, spec.tree.depth * spec.tree.top_k)
        with timer.measure("draft"):
            dcache = drafter.new_cache(tcache.batch, dmax)
            if not getattr(drafter, "keeps_prompt", False):  # the oracle's cache holds the target's prompt
                dcache.col_valid[:, :cls] = False  # the prompt holds no drafter entries
            dcache.lengths.fill_(cls)
            dcache.pad = tcache.pad.clone()  # drafter positions count like the target's
            d_logits, d_hidden = self._drafter_commit(dcache, pre.taps,
                                                      guide.dup(first[:, None]))
            root_lp, root_h = d_logits[:, -1], d_hidden[:, -1]

        while active.numel():
            Bc = active.numel()
            nd = n_done[active]  # (Bc,) committed tokens of the active rows (one gather per step)
            remaining = N_img - nd  # (Bc,) >= 1
            root_tok = out[active, nd - 1]
            root_pos = tcache.positions(tcache.lengths[:, None])[:, 0]  # every row (CFG halves may differ)
            # -- draft a tree -------------------------------------------------------------
            with timer.measure("draft"):
                tree = self._draft(dcache, root_tok, root_lp, root_h, root_pos, guide, spec,
                                   nd, stats, session, active)
                tree = tree.truncate(remaining - 1)
            # -- verify it with one target forward ------------------------------------------
            with timer.measure("target"):
                Nn = tree.n_nodes
                tok2 = guide.dup(tree.tokens)
                slots = tcache.lengths[:, None] + torch.arange(Nn, device=dev)[None]
                pos = root_pos[:, None] + guide.dup(torch.where(tree.valid, tree.depths, 0))
                mask = tcache.attention_mask(slots, guide.dup(tree.ancestors))
                tout = target.forward_tokens(tok2, pos, slots, mask, tcache, taps=True)
                stats.target_forwards += 1
            with timer.measure("accept"):
                token_index = nd[:, None] + tree.depths  # z index each node predicts
                logits = guide(tout.logits, token_index)
                res = self._verify(logits, tree, spec, greedy,
                                   gen.select(active) if isinstance(gen, RowGenerators) else gen, guide, token_index,
                                   session, active)
            # -- commit: compact caches, feed the drafter the accepted path ------------------
            with timer.measure("host"):
                acc = res.accept_len  # (Bc,)
                ncom = acc + 1
                stats.committed.append(ncom)
                stats.rows.append(active.clone())
                stats.tvd.append(res.tvd)
                cols = torch.arange(res.tokens.shape[1], device=dev)[None]
                take = cols < ncom[:, None]  # (Bc, D+1)
                r_i, c_i = take.nonzero(as_tuple=True)  # one nonzero for the three masked reads
                out[active[r_i], nd[r_i] + c_i] = res.tokens[r_i, c_i]
                path = res.path.clamp(min=0)  # (Bc, D+1) node ids, root first
                src = slots[: Bc].gather(1, path)
                tcache.compact(guide.dup(src), guide.dup(ncom))
            with timer.measure("draft"):
                taps = tout.taps.gather(1, guide.dup(path)[:, :, None].expand(-1, -1, tout.taps.shape[-1]))
                new_tok = res.tokens.clamp(min=0)  # (Bc, D+1): accepted drafts then bonus
                d_logits, d_hidden = self._drafter_commit(dcache, taps,
                                                          guide.dup(new_tok), counts=guide.dup(ncom))
                last = (ncom - 1)
                root_lp = d_logits.gather(1, guide.dup(last)[:, None, None].expand(-1, 1, d_logits.shape[-1]))[:, 0]
                root_h = d_hidden.gather(1, guide.dup(last)[:, None, None].expand(-1, 1, d_hidden.shape[-1]))[:, 0]
            nd = nd + ncom
            n_done[active] = nd
            if on_progress is not None:
                on_progress(int(n_done.sum()))
            keep = nd < N_img
            if not bool(keep.all()):
                idx = torch.nonzero(keep).flatten()
                rows2 = guide.rows(idx, Bc)
                tcache.select_rows(rows2)
                dcache.select_rows(rows2)
                root_lp, root_h = root_lp[rows2], root_h[rows2]
                active = active[idx]
        stats.times = dict(timer.totals)
        stats.times["total"] = time.perf_counter() - t_start
        return out, stats

    # -- drafter helpers -------------------------------------------------------------------

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

    def _draft(self, dcache, root_tok, root_lp_raw, root_h, root_pos, guide, spec, n_done, stats, session=None,
               rows=None):
        """EAGLE-2 dynamic tree from the drafter's guided, filtered distributions (transformed by
        the method's session when it has one: Method.session)."""
        n_pos = self.target.config.n_positions
        hist = {"h": root_h[:, None]}  # hidden_out of the previous call's nodes (CFG rows)
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

        root_lp = logprobs(root_lp_raw, n_done)
        t = spec.tree
        return build_dynamic_tree(root_tok, root_lp, expand, top_k=t.top_k, depth=t.depth,
                                  total_tokens=t.total_tokens)
