"""PJD: Parallel Jacobi Decoding (CVPR 2026, arXiv 2606.05703; docs/spec/speculative.md, "Two
dimensions"); training-free, approximate. docs/decoders.md.

SJD (speculative/sjd.py) refines one window of drafts along the raster order. PJD keeps several
image rows in flight: up to `rows` ACTIVE rows (lanes), row r + 1 trailing row r by `lag` columns,
each with a window of `window` draft tokens. ONE target forward verifies every lane's window
under a row-causal mask: a query at (r, c) sees the prompt, every decoded token of rows <= r that
lies before it in raster order (the finished rows, the decoded part of the rows above, its own
row's left part) and its own row's window left of it; no draft of another row.

Acceptance per lane, left to right: draft x at a slot is accepted if u < min(1, p_now(x) /
p_prev(x)) (SJD's rule, verify.ratio_accept; greedy: x == argmax p_now). The LEADING lane (the
first unfinished row: every row above it is finished) resamples its first rejection from
norm(max(p_now - p_prev, 0)) (a fresh draw from p_now after a fully accepted window), so it
commits at least one token per forward; the other lanes stop at their first rejection. Then the
Jacobi update: the next drafts of a lane are drawn from this forward's laws at their columns,
except that a draft whose ratio p_now(x) / p_prev(x) exceeded `reuse` (0.5) is kept (PJD's
reuse). When the leading row completes, the lanes shift up by one and a fresh row enters.

Column caps (the lag): a non-leading lane commits column c only when the row above has decoded
column c + lag (c < n_above - lag), or the row above is finished. A row starts (its first query
is the last decoded token of the row above fed at the raster position just before the row start,
ZipAR's "auxiliary" token, on a scratch slot) once the row above holds lag + 1 tokens.

Lossless where it holds: with rows = 1 (or a lag of at least a row) the one lane is always the
leading row and PJD is SJD row by row (with reuse 0: exactly SJD's rule; greedy: token-identical
to plain greedy decoding). With several lanes a token of a non-leading row is drawn without the
undecoded right part of the rows above (like ZipAR), so PJD is not strictly lossless.

Like ZipAR, PJD reports a per-token TVD: one teacher-forced target pass after decoding gives every
token's raster conditional; the TVD to the law the token was verified under is recorded.

Every step has the same shapes (lanes x (window + 1) queries); acceptance, the Jacobi update, the
lane shift and the token writes are fixed-shape tensor programs; the step's one host read is the
end test.

`PJDDecoder.accept` is the acceptance seam: `pjd-gasv-2d` (twod.PJDGASVDecoder) lends every lane's
drafts GASV's neighbour mass there (pjd_accept's `moved`) and reports the TVD it adds per token.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import InputError
from .methods import Method, MethodOption, register_method
from .session import Decoder
from .sjd import draft_prior
from .verify import jacobi_residual, ratio_accept
from .zipar import _raster_tvd, row_length


@dataclass(frozen=True)
class PJDSettings:
    """PJD knobs (flat names pjd_rows, pjd_window, pjd_lag, pjd_reuse; CLI --pjd-*)."""

    rows: int = 4  # active rows (lanes) verified per target forward
    window: int = 8  # draft tokens per active row
    lag: int = 2  # columns a row trails the row above (a row commits column c once the row above has c + lag)
    reuse: float = 0.5  # keep a draft whose ratio p_now / p_prev exceeds this (0: redraw every draft, SJD's update)
    key: ClassVar[str] = "pjd"  # the method whose knobs these are (error messages; subclasses: their own)

    def __post_init__(self):
        k = self.key.replace("_", "-")
        for name in ("rows", "window", "lag"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise InputError(f"--{k}-{name} ({self.key}_{name}) must be an integer >= 1, got {v!r}")
        if not 0.0 <= float(self.reuse):
            raise InputError(f"--{k}-reuse ({self.key}_reuse) must be >= 0 (0: no reuse), got {self.reuse!r}")


# ----------------------------------------------------------------------------- the grid of rows

class RowGrid:
    """The image as rows of `row_len` tokens (the last one may be shorter): per-row lengths padded
    with `pad` empty rows, so lanes past the image index real (empty) rows."""

    def __init__(self, n_tokens: int, row_len: int, pad: int, device):
        self.N, self.L = int(n_tokens), int(row_len)
        self.H = (self.N + self.L - 1) // self.L
        starts = torch.arange(self.H + pad, device=device) * self.L
        self.row_len = (self.N - starts).clamp(min=0, max=self.L)  # (H + pad,)


def lane_state(n_rows: torch.Tensor, lead: torch.Tensor, grid: RowGrid, lanes: int, lag: int):
    """The lanes of one step -> (rows (B, R), decoded columns n (B, R), cap (B, R)).

    n_rows (B, H + pad) decoded tokens per row; lead (B,) the leading (first unfinished) row.
    cap: a lane may commit columns n .. cap - 1: the whole row for the leading lane and below a
    finished row, else the columns c with c + lag decoded in the row above (c < n_above - lag)."""
    rows = lead[:, None] + torch.arange(lanes, device=lead.device)[None]  # (B, R)
    n = n_rows.gather(1, rows)
    rl = grid.row_len[rows]
    above = (rows - 1).clamp(min=0)
    n_above, rl_above = n_rows.gather(1, above), grid.row_len[above]
    cap = torch.where(n_above >= rl_above, rl, (n_above - lag).clamp(min=0).minimum(rl))
    cap[:, 0] = rl[:, 0]  # the leading lane: every row above is finished
    return rows, n, cap


def window_ancestors(lanes: int, window: int, device) -> torch.Tensor:
    """(S, S) bool over the step's S = lanes * (window + 1) queries: query j of a lane sees its own
    lane's queries 0 .. j (root and the drafts left of it), never another lane's drafts."""
    lane = torch.arange(lanes, device=device).repeat_interleave(window + 1)
    j = torch.arange(window + 1, device=device).repeat(lanes)
    return (lane[:, None] == lane[None, :]) & (j[None, :] <= j[:, None])


def row_causal_visible(q_index: torch.Tensor, q_row: torch.Tensor, n_rows: torch.Tensor, grid: RowGrid) -> torch.Tensor:
    """(B, S, N) bool: which decoded image tokens each query sees (the row-causal mask's image part).

    q_index (B, S): the raster index of each query's own token; q_row (B, S) its row. A query sees a
    decoded token i iff i lies in a row above it, or in its own row left of it (raster order)."""
    idx = torch.arange(grid.N, device=q_index.device)
    row_i = idx // grid.L
    decoded = (idx % grid.L)[None, :] < n_rows.gather(1, row_i[None].expand(n_rows.shape[0], -1))  # (B, N)
    above = row_i[None, None, :] < q_row[:, :, None]
    left = (row_i[None, None, :] == q_row[:, :, None]) & (idx[None, None, :] < q_index[:, :, None])
    return decoded[:, None, :] & (above | left)


# ----------------------------------------------------------------------------- acceptance

def pjd_accept(p_now: torch.Tensor, p_prev: torch.Tensor, drafts: torch.Tensor, free: torch.Tensor, gen,
               greedy: bool, moved=None):
    """Verify every lane's window -> (committed (B, R), tokens (B, R, K + 1), ratio (B, R, K)).

    p_now (B, R, K + 1, V): the target's laws at a lane's columns n .. n + K (query j predicts
    column n + j); p_prev (B, R, K, V): the laws the drafts (B, R, K) were drawn from; free (B, R):
    the columns a lane may still commit (cap - n, 0 for an idle lane). Every lane accepts its
    drafts left to right with SJD's test (greedy: draft == argmax p_now) and stops at the first
    rejection. Lane 0 is the leading row: it also commits the column after its accepted drafts,
    drawn from norm(max(p_now - p_prev, 0)) after a rejection, from p_now after a fully accepted
    window (greedy: argmax p_now), when that column is free. tokens[b, r, :committed[b, r]] are
    the committed tokens of lane r. moved (B, R, K), optional: mass added to every draft's
    acceptance probability, min(1, p_now / p_prev + moved) (GASV's relaxed test, twod.py; not in
    greedy mode); the residual stays SJD's."""
    B, R, K = drafts.shape
    dev, V = drafts.device, p_now.shape[-1]
    x_now = p_now[:, :, :K].gather(3, drafts[..., None])[..., 0]
    x_prev = p_prev.gather(3, drafts[..., None])[..., 0]
    ratio = torch.where(x_prev > 0, x_now / x_prev.clamp(min=1e-30), (x_now > 0).float())  # (B, R, K)
    if greedy:
        ok = drafts == p_now[:, :, :K].argmax(-1)
    else:
        acc = ratio_accept(x_now, x_prev)
        acc = acc if moved is None else (acc + moved).clamp(max=1.0)
        ok = torch.rand((B, R, K), generator=gen, device=dev) < acc
    n_valid = free.clamp(max=K)
    ok &= torch.arange(K, device=dev)[None, None] < n_valid[..., None]
    a = ok.long().cumprod(-1).sum(-1)  # (B, R) accepted drafts
    lead = a[:, 0]
    law = p_now[:, 0].gather(1, lead[:, None, None].expand(-1, 1, V))[:, 0]  # (B, V): column n + a
    q_at = p_prev[:, 0].gather(1, lead.clamp(max=K - 1)[:, None, None].expand(-1, 1, V))[:, 0]
    resid = torch.where((lead < n_valid[:, 0])[:, None], jacobi_residual(law, q_at), law)
    if greedy:
        extra = law.argmax(-1)
    else:
        extra = torch.multinomial(resid / resid.sum(-1, keepdim=True), 1, generator=gen)[:, 0]
    committed = torch.cat([torch.minimum(lead + 1, free[:, 0])[:, None], a[:, 1:]], 1)
    tokens = torch.cat([drafts, drafts[..., -1:]], -1)  # (B, R, K + 1)
    j = torch.arange(K + 1, device=dev)[None]
    tokens[:, 0] = torch.where(j == lead[:, None], extra[:, None], tokens[:, 0])
    return committed, tokens, ratio


def next_drafts(p_now: torch.Tensor, p_prev: torch.Tensor, drafts: torch.Tensor, ratio: torch.Tensor,
                committed: torch.Tensor, prior: torch.Tensor, reuse: float, gen, greedy: bool):
    """The Jacobi update of every lane -> (drafts (B, R, K), their laws (B, R, K, V)).

    Slot i of a lane's next window is column n + committed + i: its law is this forward's p_now
    there (query committed + i) while that lies in the window, else `prior` (B, R, K, V) (fresh
    columns: uniform over the allowed tokens, one-hot on forced ones). Its draft is the old draft
    of that column when its ratio exceeded `reuse` (PJD's reuse; never in greedy mode, where the
    draft is argmax of its law), else a fresh draw from the law."""
    B, R, K = drafts.shape
    V = p_now.shape[-1]
    src = committed[..., None] + torch.arange(K, device=drafts.device)[None, None]  # (B, R, K) old query index
    in_win = src <= K
    law = p_now.gather(2, src.clamp(max=K)[..., None].expand(-1, -1, -1, V))
    law = torch.where(in_win[..., None], law, prior)
    if greedy:
        return law.argmax(-1), law
    fresh = torch.multinomial(law.reshape(-1, V), 1, generator=gen).reshape(B, R, K)
    if reuse <= 0:
        return fresh, law
    old_ok = (src < K) & (ratio.gather(2, src.clamp(max=K - 1)) > reuse)
    keep = drafts.gather(2, src.clamp(max=K - 1))
    return torch.where(old_ok, keep, fresh), law


def shift_lanes(shift: torch.Tensor, *pairs):
    """Move every lane up by one where `shift` (B,) (the leading row finished): lane r takes lane
    r + 1's state and the last lane the fresh state. pairs: (state (B, R, ...), fresh (B, ...))."""
    out = []
    for state, fresh in pairs:
        moved = torch.cat([state[:, 1:], fresh[:, None]], 1)
        s = shift.view(-1, *([1] * (state.dim() - 1)))
        out.append(torch.where(s, moved, state))
    return out


# ----------------------------------------------------------------------------- the decoder

class _Step:
    """One step's fixed-shape inputs: lanes x (K + 1) queries, then one query that re-feeds the last
    token of the row above the leading row at its own slot (that row's final token may be a bonus
    draw whose K/V no forward wrote yet; every lane reads it)."""

    def __init__(self, session, grid: RowGrid, lanes: int, K: int):
        self.s, self.grid, self.R, self.K = session, grid, lanes, K
        dev = session.device
        self.base = session.cache.lengths.clone()  # (rows of the cache,) slot of image index 0; lengths stay
        self.j = torch.arange(K + 1, device=dev)
        self.scratch = session.N + torch.arange(lanes * (K + 1) + 1, device=dev)
        anc = window_ancestors(lanes, K, dev)
        S = anc.shape[0] + 1
        self.anc = torch.eye(S, dtype=torch.bool, device=dev)
        self.anc[:-1, :-1] = anc

    def inputs(self, rows, n, n_rows, drafts, lead):
        """-> (tokens (B, S), positions, slots, mask) of the CFG batch; the lanes' queries first."""
        s, g, K = self.s, self.grid, self.K
        B, R = n.shape
        col = n[..., None] - 1 + self.j  # (B, R, K + 1) each query's own column (-1: the row start's auxiliary)
        index = rows[..., None] * g.L + col
        real = (col >= 0) & (col < g.row_len[rows][..., None])
        above = (rows - 1).clamp(min=0)
        aux = above * g.L + n_rows.gather(1, above) - 1  # the last decoded token of the row above
        src = torch.where(col[..., 0] >= 0, index[..., 0], aux).clamp(min=0, max=g.N - 1)  # (B, R)
        last = (lead * g.L - 1).clamp(max=g.N - 1)  # (B,) the finished row's last token (-1: none)
        toks = torch.cat([s.out.gather(1, src)[..., None], drafts], -1).reshape(B, -1)
        toks = torch.cat([toks, s.out.gather(1, last.clamp(min=0)[:, None])], 1).clamp(min=0)  # (B, S)
        is_aux = torch.cat([(col == -1).reshape(B, -1), torch.zeros_like(last[:, None], dtype=torch.bool)], 1)
        index = torch.cat([index.reshape(B, -1), last[:, None]], 1)
        q_row = torch.cat([rows[..., None].expand(-1, -1, K + 1).reshape(B, -1), (lead - 1)[:, None]], 1)
        real = torch.cat([real.reshape(B, -1), (last >= 0)[:, None]], 1)
        rel = torch.where(real, index, self.scratch[None])  # slots after the prompt
        # an auxiliary query is its source token (with what precedes it) at the position before its
        # row; no other query reads its K/V (ZipAR's rule)
        src_q = torch.cat([src[..., None].expand(-1, -1, K + 1).reshape(B, -1), last[:, None]], 1)
        vis = row_causal_visible(torch.where(is_aux, src_q, index), torch.where(is_aux, src_q // g.L, q_row),
                                 n_rows, g)  # (B, S, N)
        eye = torch.eye(index.shape[1], dtype=torch.bool, device=index.device)
        anc = self.anc[None] & ~(is_aux[:, None, :] & ~eye[None])
        dup = s.guide.dup
        slots = self.base[:, None] + dup(rel)
        pos = s.cache.positions(self.base[:, None] + dup(index)).clamp(min=0, max=s.target.config.n_positions - 1)
        mask = s.cache.attention_mask(slots, dup(anc))
        cols = (self.base[:, None] + torch.arange(g.N, device=slots.device)[None])[:, None, :].expand(-1, slots.shape[1], -1)
        mask.scatter_(2, cols, dup(vis) | mask.gather(2, cols))
        return dup(toks), pos, slots, mask


class PJDDecoder(Decoder):
    """PJD behind the Decoder contract (speculative/session.py): `rows` lanes of `window` drafts."""

    row_seeds = False  # one generator for the batch (a served batch decodes row by row)

    def __init__(self, target, settings: PJDSettings, name: str = "pjd"):
        self.target, self.name, self.settings = target, name, settings
        self.scratch = settings.rows * (settings.window + 1) + 1

    @torch.no_grad()
    def decode(self, session, *, on_step=None, on_progress=None) -> tuple:
        st, target = self.settings, session.target
        R, K, dev, B = st.rows, st.window, session.device, session.B
        grid = RowGrid(session.N, row_length(target, session.layout), R, dev)
        step = _Step(session, grid, R, K)
        law_of, below = self.fresh_laws(session, grid, draft_prior(session.layout, target.config.vocab_size, dev))
        greedy, gen, timer, stats = session.sampling.greedy, session.gen, session.timer, session.stats
        session.out[:, 0] = session.first_token()
        n_rows = torch.zeros(B, grid.H + R, dtype=torch.long, device=dev)
        n_rows[:, 0] = 1
        lead = torch.zeros(B, dtype=torch.long, device=dev)
        rows = lead[:, None] + torch.arange(R, device=dev)[None]
        law = law_of(self._columns(rows, n_rows.gather(1, rows), grid, K))
        drafts = self._draw(law, gen, greedy)
        record = _ContextLaws(B, grid, target.config.vocab_size, dev)
        while True:
            done = lead.tolist()  # the step's one host read: the end test and the rows still decoding
            if min(done) >= grid.H:
                break
            live = [b for b, r in enumerate(done) if r < grid.H]
            with timer.measure("target"):
                rows, n, cap = lane_state(n_rows, lead, grid, R, st.lag)
                toks, pos, slots, mask = step.inputs(rows, n, n_rows, drafts, lead)
                out = target.forward_tokens(toks, pos, slots, mask, session.cache)
                logits = out.logits[:, :-1]
                stats.target_forwards += 1
            with timer.measure("accept"):
                pred = rows[..., None] * grid.L + n[..., None] + torch.arange(K + 1, device=dev)  # query j: column n + j
                p_now = torch.softmax(session.guide(logits, pred.reshape(B, -1).clamp(max=grid.N - 1)), -1)
                p_now = p_now.view(B, R, K + 1, -1)
                ncom, new, ratio, extra = self.accept(session, p_now, law, drafts, (cap - n).clamp(min=0))
            with timer.measure("host"):
                idx = torch.tensor(live, dtype=torch.long, device=dev)
                stats.committed.append(ncom.sum(1)[idx])
                stats.rows.append(idx)
                starts = (rows * grid.L + n).reshape(-1)
                session.commit(new.reshape(B * R, -1), starts, ncom.reshape(-1),
                               rows=torch.arange(B, device=dev).repeat_interleave(R))
                record.put(rows, n, ncom, p_now, idx, extra)
                if below is not None:  # the committed tokens' hidden states, for fresh laws from a 2-D head
                    below.put(out, toks[:B, : R * (K + 1)].view(B, R, K + 1), rows, n, n + ncom, lead)
                drafts, law = next_drafts(p_now, law, drafts, ratio, ncom, law_of(self._columns(rows, n + ncom, grid, K)),
                                          float(st.reuse), gen, greedy)
                n_rows.scatter_(1, rows, n + ncom)
                shift = ((n + ncom)[:, 0] >= grid.row_len[rows[:, 0]]) & (lead < grid.H)
                fresh_rows = rows[:, -1] + 1
                fresh_law = law_of((fresh_rows[:, None, None] * grid.L
                                    + torch.arange(K, device=dev)[None, None]).clamp(max=grid.N - 1))[:, 0]
                drafts, law = shift_lanes(shift, (drafts, self._draw(fresh_law, gen, greedy)), (law, fresh_law))
                lead = lead + shift.long()
            session.report(session.out, _raster_done(n_rows, lead, grid), on_step, on_progress)
        with timer.measure("tvd"):
            stats.tvd = record.step_tvd(_raster_tvd(session, step.base, record) + record.extra[:, : grid.N])
        stats.settings.update(self.report_settings())
        return session.finish()

    def fresh_laws(self, session, grid: RowGrid, prior):
        """(law_of, below): law_of((B, R, K) raster indices) -> (B, R, K, V) laws of the fresh drafts
        (PJD: the prior); below, if not None, is told each step's committed tokens
        (below.put(target output, fed tokens, rows, n, n after, lead): speculative/ssd.py's 2-D head)."""
        return prior, None

    def accept(self, session, p_now, law, drafts, free):
        """The step's acceptance -> (committed (B, R), tokens (B, R, K + 1), ratio (B, R, K), extra
        TVD per query (B, R, K + 1) or None). PJD: SJD's test (pjd_accept), no extra TVD."""
        return (*pjd_accept(p_now, law, drafts, free, session.gen, session.sampling.greedy), None)

    def report_settings(self) -> dict:
        st = self.settings
        return dict(pjd_rows=st.rows, pjd_window=st.window, pjd_lag=st.lag, pjd_reuse=float(st.reuse))

    @staticmethod
    def _columns(rows, n, grid: RowGrid, K: int) -> torch.Tensor:
        """(B, R, K) raster indices of the window columns n .. n + K - 1 of each lane (clamped)."""
        idx = rows[..., None] * grid.L + n[..., None] + torch.arange(K, device=n.device)
        return idx.clamp(max=grid.N - 1)

    @staticmethod
    def _draw(law: torch.Tensor, gen, greedy: bool) -> torch.Tensor:
        if greedy:
            return law.argmax(-1)
        return torch.multinomial(law.reshape(-1, law.shape[-1]), 1, generator=gen).view(law.shape[:-1])


class _ContextLaws:
    """The target's law each committed token was verified under (its row-causal context), for the
    teacher-forced TVD pass (zipar._raster_tvd): TV(law, raster conditional) per token measures what
    the missing right part of the rows above changed (0 with one row in flight). Dense (B, N, V)."""

    def __init__(self, B: int, grid: RowGrid, V: int, dev):
        self.g = grid
        self.val = torch.zeros(B, grid.N + 1, V, device=dev)  # column N: the dump of masked writes
        self.step_of = torch.full((B, grid.N + 1), -1, dtype=torch.long, device=dev)
        self.extra = torch.zeros(B, grid.N + 1, device=dev)  # a TVD the acceptance adds per token (GASV's)
        self.live, self.n = [], 0

    def put(self, rows, n, committed, p_now, live, extra=None):
        """A step's committed columns (lane j < committed) and their laws p_now (B, R, K + 1, V);
        extra (B, R, K + 1), optional: the TVD the acceptance added at each query's column."""
        B, R, K1, V = p_now.shape
        j = torch.arange(K1, device=n.device)
        dst = torch.where(j < committed[..., None], rows[..., None] * self.g.L + n[..., None] + j, self.g.N)
        dst = dst.clamp(max=self.g.N).reshape(B, -1)
        self.val.scatter_(1, dst[..., None].expand(-1, -1, V), p_now.reshape(B, -1, V))
        self.step_of.scatter_(1, dst, self.n)
        if extra is not None:
            self.extra.scatter_(1, dst, extra.reshape(B, -1).to(self.extra.dtype))
        self.live.append(live)
        self.n += 1

    def tvd(self, p: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """TV(law_i, p_i) for image indices lo .. hi - 1, p (B, hi - lo, V)."""
        return 0.5 * (p - self.val[:, lo:hi]).abs().sum(-1)

    def step_tvd(self, per_token: torch.Tensor) -> list:
        """Per step: the mean TVD of the tokens each live row committed (DecodeStats.tvd)."""
        out = []
        for s, live in enumerate(self.live):
            m = (self.step_of[:, : self.g.N] == s).float()
            out.append(((per_token * m).sum(1) / m.sum(1).clamp(min=1))[live])
        return out


def _raster_done(n_rows: torch.Tensor, lead: torch.Tensor, grid: RowGrid) -> torch.Tensor:
    """(B,) each row's committed raster prefix: the finished rows plus the leading row's decoded part."""
    return (lead * grid.L + n_rows.gather(1, lead[:, None])[:, 0]).clamp(max=grid.N)


def pjd_decoder(target, drafter, tables, gasv, spec):
    """PJD's Decoder (Method.decoder): `spec`'s pjd settings."""
    return PJDDecoder(target, spec.settings("pjd"))


register_method(Method(
    "pjd", "sjd", "PJD: parallel Jacobi decoding, several rows in flight each trailing the row above by a lag, "
    "verified in one forward under a row-causal mask (approximate; no drafter)", settings=PJDSettings,
    decoder=pjd_decoder,
    options=(MethodOption("--pjd-rows", "pjd_rows", int, "PJD: image rows decoded in parallel (1: SJD row by row)."),
             MethodOption("--pjd-window", "pjd_window", int, "PJD: draft tokens per active row."),
             MethodOption("--pjd-lag", "pjd_lag", int, "PJD: columns a row trails the row above (larger: less "
                          "distortion, fewer rows in parallel)."),
             MethodOption("--pjd-reuse", "pjd_reuse", float, "PJD: keep a rejected row's draft whose ratio "
                          "p_now / p_prev exceeds this (0: redraw all)."))))

__all__ = ["PJDDecoder", "PJDSettings", "RowGrid", "lane_state", "next_drafts", "pjd_accept", "pjd_decoder",
           "row_causal_visible", "shift_lanes", "window_ancestors"]
