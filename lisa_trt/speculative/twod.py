"""LISA in two dimensions: `gasv-2d` and `exact-2d`, the drafter's drafts per active row with
GASV (or exact) acceptance per row, every row verified in one target forward under one 2-D mask
(docs/decoders.md).

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

Distribution: with one active row (rows = 1, or a lag of a whole row) every query sees its whole
raster prefix and `exact-2d` is exact speculative sampling of the target (lossless; greedy:
token-identical to plain greedy decoding); `gasv-2d` then moves GASV's bounded mass per token like
`gasv`. With several rows a non-leading row decides without the undecoded right part of the
rows above, so neither keeps the target's distribution exactly (like PJD and ZipAR).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from ..errors import InputError
from .methods import Method, MethodOption, RuleContext, exact_rule, gasv_rule, register_method
from .pjd import (PJDDecoder, PJDSettings, RowGrid, _ContextLaws, _raster_done, _Step, lane_state, next_drafts,
                  pjd_accept, row_causal_visible, shift_lanes)
from .sjd import draft_prior
from .session import Decoder
from .tree import DraftTree
from .zipar import _raster_tvd, row_length


@dataclass(frozen=True)
class TwoDSettings:
    """The 2-D methods' knobs (flat names gasv_2d_rows, gasv_2d_window, gasv_2d_lag; exact-2d reads
    them too)."""

    rows: int = 4  # active rows verified per target forward
    window: int = 4  # drafter chain length per active row
    lag: int = 2  # columns a row trails the row above
    below: str = "drafter"  # drafts of the rows below the leading one: "drafter" | "jacobi" (PJD's)

    def __post_init__(self):
        if self.below not in ("drafter", "jacobi"):
            raise InputError(f"--gasv-2d-below (gasv_2d_below) must be drafter or jacobi, got {self.below!r}")
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
        logits, hidden = self.drafter.forward(self.drafter.project_taps(tp), tok, pos, dup(slot), mask, self.dc)
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
        below = _JacobiBelow(session, grid, K, lane_state(n_rows, lead, grid, R, st.lag)) if st.below == "jacobi" else None
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
                    record.put(rows, n, ncom, below.p_now, live)
                    below.advance(rows, n, ncom, shift)
                lead = lead + shift.long()
            session.report(session.out, _raster_done(n_rows, lead, grid), on_step, on_progress)
        if below is not None:  # the rows below: their context's TVD (added to the rule's: an upper bound)
            with timer.measure("tvd"):
                ctx = record.step_tvd(_raster_tvd(session, step.base, record))
                stats.tvd = [a + b for a, b in zip(stats.tvd, ctx)]
        stats.settings.update(gasv_2d_rows=R, gasv_2d_window=K, gasv_2d_lag=st.lag, gasv_2d_below=st.below)
        return session.finish()

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

    def __init__(self, session, grid: RowGrid, K: int, lanes):
        rows, n, _ = lanes
        self.s, self.g, self.K = session, grid, K
        self.prior = draft_prior(session.layout, session.target.config.vocab_size, session.device)
        self.law = self.prior(PJDDecoder._columns(rows, n, grid, K))
        self.drafts = PJDDecoder._draw(self.law, session.gen, session.sampling.greedy)

    def verify(self, logits, rows, n, cap, drafts, committed, new):
        """The rows below: PJD's acceptance (stop at the first rejection) -> (committed, tokens)."""
        B, R, K = drafts.shape
        pred = rows[..., None] * self.g.L + n[..., None] + torch.arange(K + 1, device=n.device)
        p_now = torch.softmax(self.s.guide(logits, pred.reshape(B, -1).clamp(max=self.g.N - 1)), -1)
        self.p_now, self.used = p_now.view(B, R, K + 1, -1), drafts
        c, t, self.ratio = pjd_accept(self.p_now, self.law, drafts, (cap - n).clamp(min=0), self.s.gen,
                                      self.s.sampling.greedy)
        return torch.cat([committed[:, :1], c[:, 1:]], 1), torch.cat([new[:, :1], t[:, 1:]], 1)

    def advance(self, rows, n, committed, shift):
        """The Jacobi update of every lane, then the lane shift (PJD's)."""
        g, K, gen, greedy = self.g, self.K, self.s.gen, self.s.sampling.greedy
        drafts, law = next_drafts(self.p_now, self.law, self.used, self.ratio, committed,
                                  self.prior(PJDDecoder._columns(rows, n + committed, g, K)), PJDSettings.reuse,
                                  gen, greedy)
        fresh = self.prior(((rows[:, -1] + 1)[:, None] * g.L + torch.arange(K, device=n.device)).clamp(max=g.N - 1))
        self.drafts, self.law = shift_lanes(shift, (drafts, PJDDecoder._draw(fresh, gen, greedy)), (law, fresh))


def _decoder(name: str, rule):
    def make(target, drafter, tables, gasv, spec):
        return TwoDDecoder(target, drafter, tables, gasv, spec, name, rule)
    return make


_OPTIONS = (MethodOption("--gasv-2d-rows", "gasv_2d_rows", int, "gasv-2d / exact-2d: image rows drafted and verified "
                         "in parallel (1: the raster order)."),
            MethodOption("--gasv-2d-window", "gasv_2d_window", int, "gasv-2d / exact-2d: drafter tokens per active row."),
            MethodOption("--gasv-2d-lag", "gasv_2d_lag", int, "gasv-2d / exact-2d: columns a row trails the row above."),
            MethodOption("--gasv-2d-below", "gasv_2d_below", str, "gasv-2d / exact-2d: drafts of the rows below the "
                         "leading one: drafter, or jacobi (PJD's refinement; the drafter and rule on the leading row)."))
register_method(Method("gasv-2d", "sjd", "LISA in 2-D: the drafter's drafts per active row, every row verified in "
                       "one forward, GASV per row (approximate with several rows)", needs_drafter=True,
                       needs_tables=True, settings=TwoDSettings, decoder=_decoder("gasv-2d", gasv_rule),
                       options=_OPTIONS))
register_method(Method("exact-2d", "sjd", "the drafter's drafts per active row, exact acceptance per row "
                       "(lossless with one row in flight)", needs_drafter=True, decoder=_decoder("exact-2d", exact_rule)))

__all__ = ["TwoDDecoder", "TwoDSettings"]
