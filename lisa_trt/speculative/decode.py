"""Tree speculative decoding: on the decode session's prefill (speculative/session.py), draft,
verify, accept, compact both caches, repeat (`TreeDecoder`, every method with a `rule`).

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
from dataclasses import dataclass
from typing import Optional

import torch

from ..config import SamplingConfig
from ..errors import InputError
from .medusa import speculative_engines
from .methods import (METHODS, Method, MethodOption, RuleContext, SpecConfig, exact_rule, gasv_rule,  # noqa: F401
                      get_method, lantern_rule, register_method)  # (METHODS re-exported)
from .sampling import RowGenerators
from .session import DecodeSession, DecodeStats, Decoder, Guide  # noqa: F401 (DecodeStats, Guide re-exported)
from .subvocab import RELAXED, SubVocabVerifier
from .tree import DraftTree, ExpandRequest, build_dynamic_tree


def drafter_commit(drafter, taps, tokens, positions, slots, mask, cache):
    """The drafter fed the target's taps -> (logits, hidden): one engine call where the engine set
    fuses fc into the step (GraphDrafter.fused_commit: drafter_fused / drafter_commit), else
    project_taps then forward (torch drafters, older bundles)."""
    if getattr(drafter, "fused_commit", False):
        return drafter.commit(taps, tokens, positions, slots, mask, cache)
    return drafter.forward(drafter.project_taps(taps), tokens, positions, slots, mask, cache)


@dataclass
class _Decode:
    """One decode: its session (speculative/session.py), what it decodes with (resolved once) and
    where it stands.

    Tensors of the active rows follow the CFG batch where the engines do (root_lp, root_h: 2Bc
    rows with CFG); out / n_done index the original rows, `active` maps one to the other.
    """

    ds: DecodeSession
    method: Method
    spec: SpecConfig
    session: object  # the method's per-decode state (Method.session), None without one
    dcache: object
    n_done: torch.Tensor  # (B,) committed tokens per original row
    active: torch.Tensor  # (Bc,) original indices of the rows still decoding
    root_lp: torch.Tensor  # drafter logits at each active row's tree root
    root_h: torch.Tensor  # drafter hidden state at each active row's tree root
    min_left: int = 0  # fewest tokens any active row still needs (host int, from the step's one read)
    gen_active: object = None  # the session's generator of the active rows (RowGenerators: selected as rows retire)

    @property
    def guide(self) -> Guide:
        return self.ds.guide

    @property
    def gen(self):
        return self.ds.gen  # torch.Generator, or RowGenerators (one per original row)

    @property
    def tcache(self):
        return self.ds.cache

    @property
    def timer(self):
        return self.ds.timer

    @property
    def stats(self) -> DecodeStats:
        return self.ds.stats

    @property
    def out(self) -> torch.Tensor:
        """(B, N) committed tokens, -1 where not yet decoded (a view of the session's out_buf)."""
        return self.ds.out

    @property
    def greedy(self) -> bool:
        return self.guide.s.greedy

    @property
    def n_tokens(self) -> int:
        return self.ds.N

    @property
    def device(self) -> torch.device:
        return self.ds.device


class TreeDecoder(Decoder):
    """A tree method's decode loop (the Decoder contract, speculative/session.py): the engines of a
    SpeculativeDecoder with the method's rule and `spec`'s tree."""

    taps = True  # the drafter's first entry reads the prefill's taps

    def __init__(self, engines: "SpeculativeDecoder", method: Method, spec: SpecConfig):
        if method.rule is None:
            raise InputError(f"method {method.name!r} does not use the tree decoder; run it with "
                             "lisa_trt.speculative.run.run_method")
        self.engines, self.method, self.spec = engines, method, spec
        self.target, self.name = engines.target, method.name
        self.scratch = spec.tree.total_tokens  # one tree's nodes past the committed prefix
        self.row_cap = spec.tree.total_tokens + spec.tree.depth + 1

    @torch.no_grad()
    def decode(self, session: DecodeSession, *, on_step=None, on_progress=None) -> tuple:
        eng = self.engines
        run = eng._start(session, self.method, self.spec)
        while run.active.numel():
            nd = run.n_done[run.active]  # (Bc,) committed tokens of the active rows (one gather per step)
            slots, tout, res = eng._step(run, nd)
            nd = eng._commit(run, nd, slots, tout, res)
            session.report(run.out, run.n_done, on_step, on_progress)
            eng._retire(run, nd)
        return session.finish()


class TreeFactory:
    """`Method.decoder` of every tree method (`decoder=tree_decoder`): bound to its Method when the
    Method is made (Method.__post_init__ calls `bind`), it builds the method's engines (the drafter
    the method brings, e.g. the oracle's; Medusa heads paired with their target proxy; any other
    drafter as given) and the TreeDecoder, with `spec.method` set to the method."""

    def __init__(self, method: Optional[Method] = None):
        self.method = method

    def bind(self, method: Method) -> "TreeFactory":
        return TreeFactory(method)

    def __call__(self, target, drafter, tables, gasv, spec: SpecConfig) -> TreeDecoder:
        m = self.method
        if m is None:
            raise InputError("tree_decoder is bound to its method by Method(..., decoder=tree_decoder)")
        if m.drafter_factory is not None:  # the method brings its own drafter (the oracle)
            target, drafter = m.drafter_factory(target)
        elif drafter is None:
            raise InputError(f"method {m.name!r} needs a drafter (--drafter)")
        else:
            target, drafter = speculative_engines(target, drafter)  # Medusa heads run as a (proxy, drafter) pair
        return TreeDecoder(SpeculativeDecoder(target, drafter, tables, gasv=gasv), m,
                           dataclasses.replace(spec, method=m.name))

    def _key(self):
        return None if self.method is None else self.method.name

    def __eq__(self, other) -> bool:  # by method name (a Method compares its fields: no recursion)
        return isinstance(other, TreeFactory) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(("tree_decoder", self._key()))

    def __repr__(self) -> str:
        return f"tree_decoder({self._key()!r})"


tree_decoder = TreeFactory()  # Method(..., rule=..., decoder=tree_decoder)


# the tree rules of methods.py (here: their decoder is this file's; registered before SpecConfig() defaults below)

register_method(Method("greedy", "tree", "exact verification with argmax sampling everywhere", needs_drafter=True,
                       rule=exact_rule, greedy_sampling=True, decoder=tree_decoder))
EXACT = register_method(Method("exact", "tree", "exact speculative sampling (lossless)", needs_drafter=True, rule=exact_rule,
                       decoder=tree_decoder))
register_method(Method("lantern", "tree", "LANTERN relaxed acceptance", needs_drafter=True, needs_tables=True,
                       rule=lantern_rule, decoder=tree_decoder,
                       options=(MethodOption("--lantern-delta", "lantern_delta", float, "LANTERN TV budget delta."),
                                MethodOption("--lantern-gamma", "lantern_gamma", float,
                                             "Uncertainty-modulated LANTERN budget (0 = plain LANTERN)."))))
register_method(Method("gasv", "tree", "LISA: GASV gated soft verification", needs_drafter=True, needs_tables=True,
                       rule=gasv_rule, decoder=tree_decoder,
                       options=(MethodOption("--kappa", "gasv_kappa", float,
                                             "GASV kappa (larger: more permissive, faster, more distortion).",
                                             ("--gasv-kappa",)),
                                MethodOption("--lambda", "gasv_lambda", float,
                                             "GASV lambda in (0, 1] (smaller: more permissive; 1 = cluster branch off).",
                                             ("--gasv-lambda",)),
                                MethodOption("--delta", "gasv_delta", float,
                                             "GASV mass budget per sibling (0 = exact; 1 = no cap)."),
                                MethodOption("--neighbours", "gasv_neighbours", int,
                                             "GASV candidates per drafted token (codebook neighbours)."),
                                MethodOption("--scope", "gasv_scope", str,
                                             "GASV candidate scope: neighbours | cluster | support (ablation)."))))


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
        self._frames: dict = {}  # (top_k, depth, device) -> _DraftFrame constants

    @torch.no_grad()
    def generate(self, cond, *, sampling: SamplingConfig = SamplingConfig(), spec: SpecConfig = SpecConfig(),
                 seed: Optional[int] = None, generator: Optional[torch.Generator] = None,
                 num_tokens: Optional[int] = None, seeds=None,
                 on_progress=None, layout=None, method: Optional[Method] = None,
                 on_step=None) -> tuple[torch.Tensor, DecodeStats]:
        """Generate image tokens for `cond` with tree speculation (TreeDecoder on a decode session).

        method: the resolved Method (required; a name or None is refused).

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
        if not isinstance(method, Method):  # resolved once by the caller: every step reads it
            raise TypeError(f"SpeculativeDecoder.generate takes method=<a registered Method>, not {method!r}: "
                            "resolve the name once (speculative.methods.get_method(spec.method)) and pass it")
        if method.greedy_sampling:
            sampling = dataclasses.replace(sampling, greedy=True)
        dec = TreeDecoder(self, method, spec)
        session = dec.open(cond, sampling=sampling, layout=layout, seed=seed, seeds=seeds, generator=generator,
                           num_tokens=num_tokens)
        return dec.decode(session, on_step=on_step, on_progress=on_progress)

    # -- the phases of a decode ------------------------------------------------------------

    def _start(self, ds: DecodeSession, method: Method, spec: SpecConfig) -> _Decode:
        """After the session's prefill: the target's own first token z_0, then the drafter entry for z_0."""
        B, N, dev = ds.B, ds.N, ds.device
        session = None
        if method.session is not None and not ds.sampling.greedy:  # per-decode state of the method (coupled drafting)
            session = method.session(batch=B, vocab=ds.prefill.logits.shape[-1], generator=ds.gen, device=dev,
                                     spec=spec)
        if session is not None:  # the session draws z_0
            zero = torch.zeros(B, dtype=torch.long, device=dev)
            first = session.sample(ds.first, zero, torch.arange(B, device=dev))
        else:
            first = ds.first_token()
        ds.out_buf[:, 0] = first
        with ds.timer.measure("draft"):
            dcache = self._new_drafter_cache(ds.cache, ds.prompt_len, N, spec.tree)
            d_logits, d_hidden = self._drafter_commit(dcache, ds.take_taps(), ds.guide.dup(first[:, None]))
        return _Decode(ds, method, spec, session, dcache, n_done=torch.ones(B, dtype=torch.long, device=dev),
                       active=torch.arange(B, device=dev), root_lp=d_logits[:, -1], root_h=d_hidden[:, -1],
                       min_left=N - 1, gen_active=ds.gen)

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
            G = 2 if guide.cfg else 1
            slots = tc.lengths[:, None] + self._arange(tree.n_nodes, run.device)
            pos = (root_pos.view(G, -1, 1) + tree.depths * tree.valid).view(slots.shape)  # invalid nodes: the root's
            mask = _fresh_rows_mask(tc.visible(), slots, tree.ancestors, G)
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
            run.ds.commit(res.tokens, nd, ncom, rows=run.active)  # a fixed-shape masked write
            path = res.path.clamp(min=0)  # (Bc, D+1) node ids, root first
            counts = guide.dup(ncom)  # (CFG rows,)
            run.tcache.compact(guide.dup(slots[: nd.numel()].gather(1, path)), counts)
        with run.timer.measure("draft"):
            G, H = (2 if guide.cfg else 1), tout.taps.shape[-1]
            taps = tout.taps.view(G, nd.numel(), -1, H).gather(2, path[None, :, :, None].expand(G, -1, -1, H))
            new_tok = res.tokens.clamp(min=0)  # (Bc, D+1): accepted drafts then bonus
            d_logits, d_hidden = self._drafter_commit(run.dcache, taps.view(-1, *taps.shape[2:]), guide.dup(new_tok),
                                                      counts=counts)
            last = (counts - 1)[:, None, None]  # the new root: the last committed entry
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
        logits, hidden = drafter_commit(self.drafter, taps, tokens, pos, slots, mask, dcache)
        dcache.lengths += S if counts is None else counts
        return logits, hidden

    def _draft(self, run: _Decode, root_tok, root_pos, n_done) -> DraftTree:
        """EAGLE-2 dynamic tree from the drafter's guided, filtered distributions (transformed by
        the method's session when it has one: Method.session).

        Everything an expansion feeds the drafter that the tree's values do not decide is made once
        per step for every round (slots, positions, token indices, the committed columns of the
        mask: `_DraftFrame`); a round gathers its parents' hidden states and writes its nodes'
        mask columns, one op each."""
        guide, session, rows, stats = run.guide, run.session, run.active, run.stats
        t = run.spec.tree
        fr = _DraftFrame.make(self._frame_consts(t.top_k, t.depth, root_pos.device), run.dcache, root_pos, n_done,
                              self.target.config.n_positions, 2 if guide.cfg else 1)
        hist = {"h": run.root_h[:, None]}  # hidden_out of the previous call's nodes (CFG rows)

        def logprobs(raw, token_index):
            lp = torch.log_softmax(guide(raw, token_index), -1)
            return lp if session is None else session.draft(lp, token_index, rows)

        def expand(req: ExpandRequest) -> torch.Tensor:
            r = req.depth - 1
            h_in = fr.gather_parents(hist["h"], req.parent_slot)
            logits, hidden = self.drafter.forward(h_in, guide.dup(req.tokens), fr.pos[r], fr.slots[r],
                                                  fr.mask(req), run.dcache)
            stats.drafter_calls += 1
            hist["h"] = hidden
            return logprobs(logits, fr.token_index[r])

        root_lp = logprobs(run.root_lp, n_done)
        return build_dynamic_tree(root_tok, root_lp, expand, top_k=t.top_k, depth=t.depth,
                                  total_tokens=t.total_tokens)

    def _arange(self, n: int, dev) -> torch.Tensor:
        """(1, n) 0 .. n - 1 (made once per size and device)."""
        key = ("arange", n, dev)
        a = self._frames.get(key)
        if a is None:
            a = self._frames[key] = torch.arange(n, device=dev)[None]
        return a

    def _frame_consts(self, K: int, depth: int, dev) -> tuple:
        """Per tree shape: each round's slot offsets and depths (depth, 1, K), and 0 .. depth K - 1."""
        key = (K, depth, dev)
        c = self._frames.get(key)
        if c is None:
            ar = torch.arange(depth * K, device=dev)
            c = self._frames[key] = (ar.view(depth, 1, K), (ar // K + 1).view(depth, 1, K), ar)
        return c


def _fresh_rows_mask(seen: torch.Tensor, slots: torch.Tensor, ancestors: torch.Tensor, G: int) -> torch.Tensor:
    """(G B, S, Lmax) bool: the committed columns `seen` (G B, Lmax) and, over the new rows' slots
    (G B, S), `ancestors` (B, S, S) (the same in every CFG half). The slots lie past the committed
    columns (where `seen` is False), so writing the tree over `seen` is KVCache.attention_mask's
    `seen | tree`, in one scatter."""
    GB, Lmax = seen.shape
    S = slots.shape[1]
    m = seen.view(G, -1, 1, Lmax).expand(G, -1, S, Lmax).scatter(
        3, slots.view(G, -1, 1, S).expand(G, -1, S, S), ancestors[None].expand(G, -1, S, S))
    return m.view(GB, S, Lmax)


@dataclass
class _DraftFrame:
    """What one step's EAGLE-2 expansions feed the drafter besides the tree's values, made once per
    step. Round r (depth r + 1) drafts K nodes at drafter slots L + rK .. L + rK + K - 1.

    slots, pos: (depth, Bd, K) per round (Bd: the CFG rows; positions clamped to the table);
    token_index: (depth, B, K); flat: (G, B, 1, depth K) every round's slots; seen: (G, B, 1, Lmax)
    the committed columns (G = 2 with CFG: the halves share the tree)."""

    slots: torch.Tensor
    pos: torch.Tensor
    token_index: torch.Tensor
    flat: torch.Tensor
    seen: torch.Tensor

    @classmethod
    def make(cls, consts: tuple, dcache, root_pos, n_done, n_pos: int, G: int) -> "_DraftFrame":
        offsets, depths, ar = consts
        L = dcache.lengths
        B = L.shape[0] // G
        seen = dcache.visible()
        return cls(L[None, :, None] + offsets, (root_pos[None, :, None] + depths).clamp(max=n_pos - 1),
                   n_done[None, :, None] + depths, (L[:, None] + ar).view(G, B, 1, -1), seen.view(G, B, 1, -1))

    def gather_parents(self, h: torch.Tensor, parent_slot: torch.Tensor) -> torch.Tensor:
        """(Bd, n_prev, H) hidden states of the previous call's nodes -> (Bd, n, H) of each node's
        parent (parent_slot (B, n), the same in both CFG halves)."""
        G, B = self.flat.shape[:2]
        n, H = parent_slot.shape[1], h.shape[-1]
        idx = parent_slot[None, :, :, None].expand(G, B, n, H)
        return h.view(G, B, -1, H).gather(2, idx).view(G * B, n, H)

    def mask(self, req: ExpandRequest) -> torch.Tensor:
        """(Bd, n, Lmax) bool: the committed columns, and req.mask over this tree's slots so far."""
        G, B, _, Lmax = self.seen.shape
        n, cols = req.mask.shape[1:]
        idx = self.flat[..., :cols].expand(G, B, n, cols)
        m = self.seen.expand(G, B, n, Lmax).scatter(3, idx, req.mask[None].expand(G, B, n, cols))
        return m.view(G * B, n, Lmax)
