"""LISA in two dimensions: `gasv-2d` and `exact-2d`, the drafter's drafts per active row with
GASV (or exact) acceptance per row, every row verified in one target forward under one 2-D mask;
and `pjd-gasv-2d`, PJD's Jacobi drafts with GASV's acceptance on every row (docs/decoders.md).

The rows advance as in PJD (speculative/pjd.py: `rows` lanes, each trailing the row above by
`lag` columns, the leading row first, the lanes shift when it finishes), but a lane's `window`
drafts come from the trained drafter instead of Jacobi iterations:

- the drafter keeps its own static cache with one entry per decoded image token i at slot
  prompt + i: (fc(target taps at the query that predicted i), z_i) (EAGLE-3 entries, rebuilt from
  the target's features as in the tree decoder, speculative/decode.py); its queries read it under
  the same row-causal mask as the target (pjd.row_causal_visible);
- every step re-writes the last `window + 2` entries of every lane (its newest tokens; fixed
  shape), whose last output is the lane's root; then `window - 1` drafter calls extend every
  lane's chain by its drafter's argmax (a top-1 tree per row: deterministic drafts, q = 1);
- one target forward verifies every lane (pjd's step inputs, with taps); the method's rule
  (methods.gasv_rule / exact_rule) verifies each lane's chain as a tree of its own; the leading
  lane commits its accepted drafts plus the rule's bonus token, the other lanes their accepted
  drafts only (they stop at the first rejection).

`below="jacobi"` (--gasv-2d-below) keeps the drafter and the rule for the leading row only: the
rows below take PJD's Jacobi drafts, acceptance and reuse (pjd.pjd_accept / next_drafts), and
their context's TVD is measured by PJD's teacher-forced pass (added to the rule's: an upper bound).

`below="jacobi-gasv"` is the same hybrid with GASV's relaxed test (below) on the rows below too.

`pjd-gasv-2d` (PJDGASVDecoder) is PJD (pjd.py: Jacobi drafts with reuse, lanes, lag, the
row-causal mask, one forward) with GASV's Geometry-Aware Soft Verification on EVERY lane: a draft
x at a slot whose law is p_now is lent the gated neighbour mass M(x) of that law
(sjd_gasv.moved_onto_drafts: GASV's gates with the calibrated constants and the --kappa / --lambda
/ --delta overrides) and accepted with min(1, p_now(x) / p_prev(x) + M(x)). The leading lane
resamples its first rejection from SJD's residual norm(max(p_now - p_prev, 0)) (or draws the column
after a full window from p_now), so it commits at least one token; the lanes below stop at their
first (relaxed) rejection. Greedy sampling moves no mass (PJD's argmax test). The reported TVD per
token is PJD's teacher-forced context TVD plus GASV's (a' - a)(1 - R(x)) (sjd-gasv's measure, an
upper bound on what the relaxed test moves given the draft): their sum bounds the token's law's
distance to its raster conditional (triangle inequality).

Distribution: with one active row (rows = 1, or a lag of a whole row) every query sees its whole
raster prefix and `exact-2d` is exact speculative sampling of the target (lossless; greedy:
token-identical to plain greedy decoding); `gasv-2d` then moves GASV's bounded mass per token like
`gasv`. With several rows a non-leading row decides without the undecoded right part of the
rows above, so neither keeps the target's distribution exactly (like PJD and ZipAR).
`pjd-gasv-2d` is never lossless: GASV moves up to its budget delta_eff of mass per token even with
one row (then it is sjd-gasv's rule row by row, with PJD's reuse instead of MC-SJD's coupling);
with several rows the rows below also lose the right part of the rows above. Only `exact-2d` with
one active row keeps the target's distribution.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import InputError
from .decode import drafter_commit
from .methods import Method, MethodOption, RuleContext, exact_rule, gasv_rule, register_method
from .pjd import (PJDDecoder, PJDSettings, RowGrid, _ContextLaws, _raster_done, _Step, lane_state, next_drafts,
                  pjd_accept, row_causal_visible, shift_lanes)
from .sjd_gasv import gasv_config, moved_onto_drafts
from .sjd import draft_prior
from .session import Decoder
from .tree import DraftTree
from .verify import jacobi_residual, ratio_accept
from .zipar import _raster_tvd, row_length


@dataclass(frozen=True)
class TwoDSettings:
    """The 2-D methods' knobs (flat names gasv_2d_rows, gasv_2d_window, gasv_2d_lag; exact-2d reads
    them too)."""

    rows: int = 4  # active rows verified per target forward
    window: int = 4  # drafter chain length per active row
    lag: int = 2  # columns a row trails the row above
    below: str = "drafter"  # the rows below the leading one: "drafter" | "jacobi" (PJD's) | "jacobi-gasv" (+ GASV)

    def __post_init__(self):
        if self.below not in ("drafter", "jacobi", "jacobi-gasv"):
            raise InputError(f"--gasv-2d-below (gasv_2d_below) must be drafter, jacobi or jacobi-gasv, got {self.below!r}")
        for name in ("rows", "window", "lag"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise InputError(f"--gasv-2d-{name} (gasv_2d_{name}) must be an integer >= 1, got {v!r}")


class _Drafts:
    """The drafter side of one decode: its cache, the taps buffer and the per-step drafting."""

    def __init__(self, session, drafter, grid: RowGrid, lanes: int, K: int):
        self.s, self.drafter, self.g, self.R, self.K = session, drafter, grid, lanes, K
        cache, dev = session.cache, session.device
        self.cls = session.prompt_len
        E = lanes * (K + 2) + lanes * K  # commit queries + chain queries (scratch)
        self.dc = self.drafter.new_cache(cache.batch, self.cls + grid.N + E)
        self.dc.col_valid[:, : self.cls] = False  # the prompt holds no drafter entry
        self.dc.lengths.fill_(self.cls)
        self.dc.pad = cache.pad.clone()
        taps = session.take_taps()[:, -1]  # (rows, 3H): the query that predicted token 0
        self.taps = taps.new_zeros(taps.shape[0], grid.N + 1, taps.shape[-1])  # column N: the dump
        self.taps[:, 0] = taps
        self.scratch = self.cls + grid.N + torch.arange(E, device=dev)

    def store_taps(self, taps, rows, n, committed):
        """taps (rows, S, 3H) of a verification forward: query j of a lane predicted column n + j."""
        g, K, dup = self.g, self.K, self.s.guide.dup
        B, R = n.shape
        j = torch.arange(K + 1, device=n.device)
        dst = rows[..., None] * g.L + n[..., None] + j
        dst = torch.where(j < committed[..., None], dst, g.N).clamp(max=g.N).reshape(B, -1)
        lane_taps = taps[:, : R * (K + 1)]
        self.taps.scatter_(1, dup(dst)[..., None].expand(-1, -1, taps.shape[-1]), lane_taps)

    def _mask(self, slots, index, q_row, n_rows, anc):
        vis = row_causal_visible(index, q_row, n_rows, self.g)
        dup = self.s.guide.dup
        mask = self.dc.attention_mask(slots, dup(anc))
        cols = (self.cls + torch.arange(self.g.N, device=slots.device))[None, None].expand(slots.shape[0],
                                                                                          slots.shape[1], -1)
        mask.scatter_(2, cols, dup(vis) | mask.gather(2, cols))
        return mask

    def draft(self, rows, n, n_rows):
        """Re-write every lane's newest entries, then chain `K` drafts per lane -> (B, R, K)."""
        s, g, K, R, dup = self.s, self.g, self.K, self.R, self.s.guide.dup
        B = n.shape[0]
        dev = n.device
        # the lane's newest token (a row start: the last decoded token of the row above) and the K + 1
        # tokens before it in raster order, those decoded; the last entry's output is the root
        above = (rows - 1).clamp(min=0)
        last = torch.where(n > 0, rows * g.L + n - 1, above * g.L + n_rows.gather(1, above) - 1)
        raw = last[..., None] - (K + 1) + torch.arange(K + 2, device=dev)  # (B, R, K + 2)
        index = raw.clamp(min=0, max=g.N - 1)
        real = (raw >= 0) & (raw < g.N) & ((index % g.L) < n_rows.gather(1, index.reshape(B, -1) // g.L).view_as(index))
        slot = torch.where(real, self.cls + index, self.scratch[: R * (K + 2)].view(R, K + 2)[None]).reshape(B, -1)
        eye = torch.eye(R * (K + 2), dtype=torch.bool, device=dev)[None].expand(B, -1, -1)
        mask = self._mask(dup(slot), index.reshape(B, -1), (index // g.L).reshape(B, -1), n_rows, eye)
        tok = dup(s.out.gather(1, index.reshape(B, -1)).clamp(min=0))
        tp = self.taps.gather(1, dup(index.reshape(B, -1))[..., None].expand(-1, -1, self.taps.shape[-1]))
        pos = self.dc.positions(dup(self.cls + index.reshape(B, -1))).clamp(max=s.target.config.n_positions - 1)
        logits, hidden = drafter_commit(self.drafter, tp, tok, pos, dup(slot), mask, self.dc)
        last = torch.arange(R, device=dev) * (K + 2) + K + 1
        lp, h = logits[:, last], hidden[:, last]  # (rows, R, .): every lane's root
        return self._chain(lp, h, rows, n, n_rows)

    def _chain(self, lp, h, rows, n, n_rows):
        s, g, K, R, dup = self.s, self.g, self.K, self.R, self.s.guide.dup
        B, dev = n.shape[0], n.device
        base = self.scratch[R * (K + 2):].view(K, R)
        col = n  # the column each lane's next draft takes
        drafts = []
        anc_slots = []
        for d in range(K):
            idx = (rows * g.L + col + d).clamp(max=g.N - 1)  # (B, R) the column drafted now
            tok = s.guide(lp, idx).argmax(-1)  # top-1 per lane (a deterministic draft: q = 1)
            drafts.append(tok)
            if d == K - 1:
                break
            slot = base[d][None].expand(B, -1)  # (B, R)
            anc_slots.append(slot)
            q_index = (rows * g.L + col + d)
            mask = self._mask(dup(slot), q_index, rows, n_rows, torch.eye(R, dtype=torch.bool, device=dev)[None]
                              .expand(B, -1, -1))
            for prev in anc_slots[:-1]:  # the lane's own earlier chain nodes
                mask.scatter_(2, dup(prev)[:, :, None], True)
            pos = self.dc.positions(dup(self.cls + q_index)).clamp(max=s.target.config.n_positions - 1)
            lp, h = self.drafter.forward(h, dup(tok), pos, dup(slot), mask, self.dc)
        return torch.stack(drafts, -1)  # (B, R, K)


class TwoDDecoder(Decoder):
    """The 2-D LISA decoder (module docstring) behind the Decoder contract."""

    row_seeds = False
    taps = True

    def __init__(self, target, drafter, tables, gasv, spec, name: str, rule):
        self.target, self.drafter, self.tables, self.gasv, self.spec = target, drafter, tables, gasv, spec
        self.name, self.rule = name, rule
        self.settings = spec.settings("gasv-2d")
        self.scratch = self.settings.rows * (self.settings.window + 1) + 1

    @torch.no_grad()
    def decode(self, session, *, on_step=None, on_progress=None) -> tuple:
        st, target = self.settings, session.target
        R, K, dev, B = st.rows, st.window, session.device, session.B
        grid = RowGrid(session.N, row_length(target, session.layout), R, dev)
        step, dr = _Step(session, grid, R, K), _Drafts(session, self.drafter, grid, R, K)
        timer, stats = session.timer, session.stats
        session.out[:, 0] = session.first_token()
        n_rows = torch.zeros(B, grid.H + R, dtype=torch.long, device=dev)
        n_rows[:, 0] = 1
        lead = torch.zeros(B, dtype=torch.long, device=dev)
        parents = torch.arange(-1, K, device=dev)[None].expand(B * R, -1)
        below = None if st.below == "drafter" else _JacobiBelow(session, grid, K, lane_state(n_rows, lead, grid, R, st.lag),
                                                                self._moved(session) if st.below == "jacobi-gasv" else None)
        record = _ContextLaws(B, grid, target.config.vocab_size, dev) if below is not None else None
        while True:
            done = lead.tolist()  # the step's one host read: the end test and the rows still decoding
            if min(done) >= grid.H:
                break
            live = torch.tensor([b for b, r in enumerate(done) if r < grid.H], dtype=torch.long, device=dev)
            rows, n, cap = lane_state(n_rows, lead, grid, R, st.lag)
            with timer.measure("draft"):
                drafts = dr.draft(rows, n, n_rows)
                stats.drafter_calls += K
                if below is not None:
                    drafts = torch.cat([drafts[:, :1], below.drafts[:, 1:]], 1)
            with timer.measure("target"):
                toks, pos, slots, mask = step.inputs(rows, n, n_rows, drafts, lead)
                out = target.forward_tokens(toks, pos, slots, mask, session.cache, taps=True)
                stats.target_forwards += 1
            with timer.measure("accept"):
                ncom, new, tvd = self._verify(session, out.logits[:, :-1], rows, n, cap, drafts, parents, grid)
                if below is not None:
                    ncom, new = below.verify(out.logits[:, :-1], rows, n, cap, drafts, ncom, new)
            with timer.measure("host"):
                stats.committed.append(ncom.sum(1)[live])
                stats.rows.append(live)
                stats.tvd.append(tvd[live])
                session.commit(new.reshape(B * R, -1), (rows * grid.L + n).reshape(-1), ncom.reshape(-1),
                               rows=torch.arange(B, device=dev).repeat_interleave(R))
                dr.store_taps(out.taps, rows, n, ncom)
                n_rows.scatter_(1, rows, n + ncom)
                shift = ((n + ncom)[:, 0] >= grid.row_len[rows[:, 0]]) & (lead < grid.H)
                if below is not None:
                    record.put(rows, n, ncom, below.p_now, live, below.extra)
                    below.advance(rows, n, ncom, shift)
                lead = lead + shift.long()
            session.report(session.out, _raster_done(n_rows, lead, grid), on_step, on_progress)
        if below is not None:  # the rows below: their context's TVD (added to the rule's: an upper bound)
            with timer.measure("tvd"):
                ctx = record.step_tvd(_raster_tvd(session, step.base, record) + record.extra[:, : grid.N])
                stats.tvd = [a + b for a, b in zip(stats.tvd, ctx)]
        stats.settings.update(gasv_2d_rows=R, gasv_2d_window=K, gasv_2d_lag=st.lag, gasv_2d_below=st.below)
        return session.finish()

    def _moved(self, session):
        """M(x) of the rows below (`below="jacobi-gasv"`): sjd_gasv.moved_onto_drafts bound to this run."""
        cfg = gasv_config(self.spec, self.tables, self.gasv)
        return lambda p, d: moved_onto_drafts(p, d, self.tables, cfg, self.gasv, session.layout.sub_vocab)

    def _verify(self, session, logits, rows, n, cap, drafts, parents, grid):
        """Every lane's chain verified by the rule as a tree of its own -> (committed (B, R),
        tokens (B, R, K + 1), mean TVD of the committed tokens (B,))."""
        B, R, K = drafts.shape
        dev = drafts.device
        free = (cap - n).clamp(min=0)
        root = session.out.gather(1, (rows * grid.L + n - 1).clamp(min=0, max=grid.N - 1))
        tokens = torch.cat([root[..., None], drafts], -1).reshape(B * R, K + 1)
        valid = (torch.arange(K + 1, device=dev)[None, None] <= free.clamp(max=K)[..., None]).reshape(B * R, -1)
        tree = DraftTree.from_parents(tokens, parents, valid=valid, static=(K, 1))
        index = (rows[..., None] * grid.L + n[..., None] + torch.arange(K + 1, device=dev)).clamp(max=grid.N - 1)
        lg = session.guide(logits, index.reshape(B, -1)).reshape(B * R, K + 1, -1)
        ctx = RuleContext(spec=self.spec, greedy=session.sampling.greedy, generator=session.gen, tables=self.tables,
                          gasv=self.gasv, token_index=index.reshape(B * R, -1))
        res = self.rule(lg, tree, ctx)
        a = res.accept_len.view(B, R)
        committed = torch.cat([torch.minimum(a[:, :1] + 1, free[:, :1]), a[:, 1:]], 1)
        new = res.tokens.clamp(min=0).view(B, R, K + 1)
        tv = res.pos_tvd.view(B, R, K + 1) * (torch.arange(K + 1, device=dev) < committed[..., None])
        tvd = tv.sum((1, 2)) / committed.sum(1).clamp(min=1)
        return committed, new, tvd


class _JacobiBelow:
    """PJD's Jacobi drafts and acceptance for the rows below the leading one (`below="jacobi"`):
    the leading row takes the drafter and the rule, the others converge by Jacobi refinement."""

    def __init__(self, session, grid: RowGrid, K: int, lanes, moved=None):
        rows, n, _ = lanes
        self.s, self.g, self.K, self.moved, self.extra = session, grid, K, moved, None
        self.prior = draft_prior(session.layout, session.target.config.vocab_size, session.device)
        self.law = self.prior(PJDDecoder._columns(rows, n, grid, K))
        self.drafts = PJDDecoder._draw(self.law, session.gen, session.sampling.greedy)

    def verify(self, logits, rows, n, cap, drafts, committed, new):
        """The rows below: PJD's acceptance (stop at the first rejection) -> (committed, tokens)."""
        B, R, K = drafts.shape
        pred = rows[..., None] * self.g.L + n[..., None] + torch.arange(K + 1, device=n.device)
        p_now = torch.softmax(self.s.guide(logits, pred.reshape(B, -1).clamp(max=self.g.N - 1)), -1)
        self.p_now, self.used = p_now.view(B, R, K + 1, -1), drafts
        m = None
        if self.moved is not None and not self.s.sampling.greedy:  # "jacobi-gasv": GASV's mass on every row below
            pn = self.p_now[:, :, :K]
            m = self.moved(pn.reshape(B, R * K, -1), drafts.reshape(B, -1)).view(B, R, K)
            tv = torch.cat([gasv_slot_tvd(pn.float(), self.law.float(), drafts, m), m.new_zeros(B, R, 1)], -1)
            self.extra = tv * (torch.arange(R, device=n.device) > 0)[None, :, None]  # lane 0: the rule's TVD
        c, t, self.ratio = pjd_accept(self.p_now, self.law, drafts, (cap - n).clamp(min=0), self.s.gen,
                                      self.s.sampling.greedy, moved=m)
        return torch.cat([committed[:, :1], c[:, 1:]], 1), torch.cat([new[:, :1], t[:, 1:]], 1)

    def advance(self, rows, n, committed, shift):
        """The Jacobi update of every lane, then the lane shift (PJD's)."""
        g, K, gen, greedy = self.g, self.K, self.s.gen, self.s.sampling.greedy
        drafts, law = next_drafts(self.p_now, self.law, self.used, self.ratio, committed,
                                  self.prior(PJDDecoder._columns(rows, n + committed, g, K)), PJDSettings.reuse,
                                  gen, greedy)
        fresh = self.prior(((rows[:, -1] + 1)[:, None] * g.L + torch.arange(K, device=n.device)).clamp(max=g.N - 1))
        self.drafts, self.law = shift_lanes(shift, (drafts, PJDDecoder._draw(fresh, gen, greedy)), (law, fresh))


# ----------------------------------------------------------------------------- GASV on every PJD lane

@dataclass(frozen=True)
class PJDGASVSettings(PJDSettings):
    """pjd-gasv-2d's knobs (flat names pjd_gasv_2d_rows, _window, _lag, _reuse; PJD's meaning; the
    GASV constants are `gasv`'s: the tables' config and --kappa / --lambda / --delta ...)."""

    rows: int = 4
    window: int = 12  # measured on the demo (16 images): MAL 5.48 vs 5.29 at 8, lower TVD (docs/decoders.md)
    lag: int = 2
    reuse: float = 0.5
    key: ClassVar[str] = "pjd_gasv_2d"


def gasv_slot_tvd(p_now, p_prev, drafts, moved):
    """(a' - a)(1 - R(x)) per draft (B, R, K): the TV distance between what a slot commits under the
    relaxed test a' = min(1, a + M(x)) and under SJD's a = min(1, p_now(x) / p_prev(x)) GIVEN the
    draft x, R the residual law (sjd_gasv.gasv_jacobi_accept's measure, per lane)."""
    x = drafts[..., None]
    a = ratio_accept(p_now.gather(-1, x)[..., 0], p_prev.gather(-1, x)[..., 0])
    resid = jacobi_residual(p_now, p_prev)
    rx = (resid / resid.sum(-1, keepdim=True)).gather(-1, x)[..., 0]
    return ((a + moved).clamp(max=1.0) - a) * (1.0 - rx)


class PJDGASVDecoder(PJDDecoder):
    """PJD with GASV's relaxed acceptance on EVERY lane (module docstring, "pjd-gasv-2d")."""

    def __init__(self, target, tables, gasv, spec):
        super().__init__(target, spec.settings("pjd-gasv-2d"), name="pjd-gasv-2d")
        self.tables, self.gasv, self.cfg = tables, gasv, gasv_config(spec, tables, gasv)

    def accept(self, session, p_now, law, drafts, free):
        """Every lane's drafts lent GASV's gated neighbour mass M(x) at their slot's law: accepted with
        min(1, p_now(x) / p_prev(x) + M(x)); greedy: PJD's (argmax) test, no mass moves."""
        if session.sampling.greedy:
            return super().accept(session, p_now, law, drafts, free)
        B, R, K = drafts.shape
        pn = p_now[:, :, :K]
        moved = moved_onto_drafts(pn.reshape(B, R * K, -1), drafts.reshape(B, -1), self.tables, self.cfg,
                                  self.gasv, session.layout.sub_vocab).view(B, R, K)
        ncom, new, ratio = pjd_accept(p_now, law, drafts, free, session.gen, False, moved=moved)
        tvd = torch.cat([gasv_slot_tvd(pn.float(), law.float(), drafts, moved), moved.new_zeros(B, R, 1)], -1)
        return ncom, new, ratio, tvd

    def report_settings(self) -> dict:
        return {f"pjd_gasv_2d_{k[len('pjd_'):]}": v for k, v in super().report_settings().items()} | {
            "gasv_delta": self.cfg.delta, "gasv_kappa": self.cfg.kappa}


def _pjd_gasv_decoder(target, drafter, tables, gasv, spec):
    return PJDGASVDecoder(target, tables, gasv, spec)


def _decoder(name: str, rule):
    def make(target, drafter, tables, gasv, spec):
        return TwoDDecoder(target, drafter, tables, gasv, spec, name, rule)
    return make


_OPTIONS = (MethodOption("--gasv-2d-rows", "gasv_2d_rows", int, "gasv-2d / exact-2d: image rows drafted and verified "
                         "in parallel (1: the raster order)."),
            MethodOption("--gasv-2d-window", "gasv_2d_window", int, "gasv-2d / exact-2d: drafter tokens per active row."),
            MethodOption("--gasv-2d-lag", "gasv_2d_lag", int, "gasv-2d / exact-2d: columns a row trails the row above."),
            MethodOption("--gasv-2d-below", "gasv_2d_below", str, "gasv-2d / exact-2d: drafts of the rows below the "
                         "leading one: drafter, jacobi (PJD's refinement; the drafter and rule on the leading row) or jacobi-gasv "
                         "(jacobi with GASV's relaxed test)."))
register_method(Method("gasv-2d", "sjd", "LISA in 2-D: the drafter's drafts per active row, every row verified in "
                       "one forward, GASV per row (approximate with several rows)", needs_drafter=True,
                       needs_tables=True, settings=TwoDSettings, decoder=_decoder("gasv-2d", gasv_rule),
                       options=_OPTIONS))
register_method(Method("exact-2d", "sjd", "the drafter's drafts per active row, exact acceptance per row "
                       "(lossless with one row in flight)", needs_drafter=True, decoder=_decoder("exact-2d", exact_rule)))

register_method(Method(
    "pjd-gasv-2d", "sjd", "PJD with GASV on every row: Jacobi drafts per active row, one forward under a row-causal "
    "mask, every row's drafts lent GASV's neighbour mass (approximate; no drafter, GASV tables)", needs_tables=True,
    settings=PJDGASVSettings, decoder=_pjd_gasv_decoder,
    options=(MethodOption("--pjd-gasv-2d-rows", "pjd_gasv_2d_rows", int, "pjd-gasv-2d: image rows decoded in "
                          "parallel (1: one row at a time with sjd-gasv's acceptance)."),
             MethodOption("--pjd-gasv-2d-window", "pjd_gasv_2d_window", int, "pjd-gasv-2d: draft tokens per active row."),
             MethodOption("--pjd-gasv-2d-lag", "pjd_gasv_2d_lag", int, "pjd-gasv-2d: columns a row trails the row above."),
             MethodOption("--pjd-gasv-2d-reuse", "pjd_gasv_2d_reuse", float, "pjd-gasv-2d: keep a draft whose ratio "
                          "p_now / p_prev exceeds this (0: redraw all)."))))

__all__ = ["PJDGASVDecoder", "PJDGASVSettings", "TwoDDecoder", "TwoDSettings", "gasv_slot_tvd"]
