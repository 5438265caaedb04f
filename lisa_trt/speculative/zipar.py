"""ZipAR: row-parallel "next-set" decoding through spatial locality (He et al., ICML 2025,
arXiv 2412.04062); training-free, approximate. docs/spec/decoders.md.

Raster order makes token (r, c) wait for the whole row above, though it mostly depends on the
tokens spatially near it. ZipAR starts row r once `window` tokens of row r - 1 are decoded and
then advances every row in flight by one token per target forward, so rows run staggered by
`window` tokens and an image of H rows of W tokens takes about W + (H - 1) * window forwards
instead of H * W. Token (r, c) is sampled from the target's law given the tokens decoded so far
(all rows above up to column c + window - 1 of row r - 1, ...), not the whole raster prefix:
the tokens of row r - 1 right of its window are missing from its context. That is the
approximation; the loop measures it: after decoding, one teacher-forced target pass over the
tokens gives each token's true raster conditional, and DecodeStats.tvd holds the total
variation distance between the law each token was drawn from and that conditional (the per-token
TVD lantern / gasv / gsd report).

Rules followed (the authors' code, LlamaGen-ZipAR `decode_n_tokens_zipar`):
- the first row is decoded token by token; row 1 starts when row 0 is complete, row r >= 2
  when row r - 1 holds `window` tokens;
- the first token of a new row is predicted by feeding the last decoded token of the row above
  at the raster position just before the row start (the "auxiliary" token); its K/V are never
  read by another query (here: masked; the authors overwrite them later);
- every query attends to the prompt and to the decoded tokens at raster positions before it
  (here: an explicit mask over the cache; undecoded slots are invisible, see docs).
Chameleon / Lumina-mGPT spans (a forced row-end token closing each row) are rows of W + 1
tokens, the row end included, as the authors' Lumina-mGPT code counts them; forced tokens are
one-hot laws (TVD 0). A layout whose forced tokens are not row ends of a regular grid is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..errors import InputError
from .methods import Method, MethodOption, register_method
from .sampling import sample_from_logits
from .session import DecodeSession, Decoder, layout_for


@dataclass(frozen=True)
class ZipARSettings:
    """ZipAR knobs (flat names zipar_window, zipar_measure_tvd; CLI --zipar-window)."""

    window: int = 8  # tokens of row r - 1 decoded before row r starts (the LlamaGen code's default)
    measure_tvd: bool = True  # one teacher-forced pass after decoding measures the per-token TVD

    def __post_init__(self):
        if int(self.window) < 1:
            raise InputError(f"ZipAR window must be >= 1, got {self.window}")


def row_length(target, layout) -> int:
    """Tokens per image row of `layout`: the forced-token period (row ends, then optionally a tail of
    forced end tokens: Emu3's end-of-frame / image / sequence) or the grid width."""
    n = int(layout.n_tokens)
    if layout.forced is not None and bool((layout.forced >= 0).any()):
        f = (layout.forced >= 0).cpu()
        L = int(f.nonzero()[0, 0]) + 1
        free = (~f).nonzero()
        body = (int(free[-1, 0]) // L + 1) * L if free.numel() else n  # through the last sampled token's row
        if body > n or not torch.equal(f[:body], torch.arange(body) % L == L - 1) or not bool(f[body:].all()):
            raise InputError("ZipAR decodes image rows; this layout forces tokens that are not the row ends "
                             "of a regular grid (and a forced tail): use sjd, mcsjd or a tree method instead")
        return L
    hw = getattr(target.config, "grid_hw", None)
    if hw is None:
        raise InputError(f"ZipAR needs the image grid; {type(target.config).__name__} has no grid_hw")
    return int(hw[1])


def schedule(n_tokens: int, row_len: int, window: int) -> list:
    """The forwards of ZipAR over one image (the same for every batch row).

    Returns a list of steps; a step is a list of feeds (fed, src, predicts): the token at image
    index `src` is fed at the slot of index `fed` (fed != src for a row start's auxiliary token),
    and the query's logits give the law of index `predicts` (-1: K/V only). Index 0 comes from
    the prefill."""
    rows = (n_tokens + row_len - 1) // row_len
    start = [r * row_len for r in range(rows)]
    length = [min(row_len, n_tokens - s) for s in start]
    n = [0] * rows
    n[0] = 1
    started = [True] + [False] * (rows - 1)
    pending = [0]  # decoded, not fed yet
    steps, decoded = [], 1
    while decoded < n_tokens:
        for r in range(1, rows):
            need = length[r - 1] if r == 1 else min(window, length[r - 1])
            if not started[r] and n[r - 1] >= need:
                started[r] = True
        feeds, by_fed = [], {}
        for i in pending:
            r = i // row_len
            nxt = i + 1 if i + 1 < start[r] + length[r] and n[r] == i + 1 - start[r] else -1
            by_fed[i] = len(feeds)
            feeds.append([i, i, nxt])
        for r in range(1, rows):
            if started[r] and n[r] == 0:
                prev = start[r] - 1
                if prev in by_fed:
                    feeds[by_fed[prev]][2] = start[r]
                else:  # the auxiliary token: the last decoded token of the row above
                    feeds.append([prev, start[r - 1] + n[r - 1] - 1, start[r]])
        pending = []
        for fed, src, pred in feeds:
            if pred >= 0:
                n[pred // row_len] += 1
                pending.append(pred)
                decoded += 1
        steps.append([tuple(f) for f in feeds])
        if not any(f[2] >= 0 for f in feeds):
            raise RuntimeError("ZipAR schedule made no progress")  # a bug, not a user error
    return steps


class StepPlan(NamedTuple):
    """The schedule as fixed-shape tensors (T steps, S = the most feeds of a step), built once before
    the loop: every forward feeds S tokens, so the target sees one input shape. A step's pads feed
    token 0 at the scratch slot past the image (index N, shared: no query reads it), seen by no
    other query, and predict nothing. `made` (host ints) are the indices each step decodes (its
    commit count)."""

    fed: torch.Tensor  # (T, S) image index of the slot each feed writes (pads: N)
    src: torch.Tensor  # (T, S) image index of the token fed (pads: 0)
    pred: torch.Tensor  # (T, S) image index its logits decode (N: none, the dump column)
    aux: torch.Tensor  # (T, S) bool: the slot's own token is not fed (a row start's auxiliary token, a pad)
    mark: torch.Tensor  # (T, S) index whose K/V the feed makes visible to later steps (N: none)
    made: list


def step_plan(steps: list, N: int, dev) -> StepPlan:
    """`schedule`'s steps padded to one width (StepPlan)."""
    S = max(len(st) for st in steps)
    rows = [list(st) + [(N, 0, -1)] * (S - len(st)) for st in steps]
    fed, src, pred = (torch.tensor([[f[i] for f in r] for r in rows], device=dev) for i in range(3))
    aux = fed != src
    return StepPlan(fed, src, torch.where(pred >= 0, pred, N), aux, torch.where(aux, N, fed),
                    [[f[2] for f in st if f[2] >= 0] for st in steps])


def _step_inputs(cache, base, fed, aux, in_cache, N: int):
    """Slots (R, S), the RoPE positions' slots and the attention mask (R, S, Lmax) of one step (fixed shapes)."""
    dev = fed.device
    slots = base[:, None] + fed[None]  # (R, S)
    S = fed.numel()
    # among the step's own feeds: real (non-auxiliary) tokens at earlier raster positions, and self
    anc = ((fed[None, :] <= fed[:, None]) & ~aux[None, :]) | torch.eye(S, dtype=torch.bool, device=dev)
    mask = cache.attention_mask(slots, anc[None].expand(slots.shape[0], S, S))
    vis = in_cache[None, :N] & (torch.arange(N, device=dev)[None, :] <= fed[:, None])  # (S, N) decoded before
    cols = (base[:, None] + torch.arange(N, device=dev)[None]).clamp(max=cache.max_len - 1)  # (R, N)
    extra = torch.zeros_like(mask)
    extra.scatter_(2, cols[:, None, :].expand(-1, S, -1), vis[None].expand(slots.shape[0], S, N))
    return slots, mask | extra


def raster_prefix(tokens: torch.Tensor) -> torch.Tensor:
    """(B,) length of each row's raster prefix of decoded tokens (undecoded ones are -1)."""
    undone = tokens < 0
    return torch.where(undone.any(1), undone.int().argmax(1), tokens.shape[1])


class ZipARDecoder(Decoder):
    """ZipAR behind the Decoder contract (speculative/session.py): every batch row follows the same
    schedule, so rows batch without waiting for each other and take one generator each (`seeds`:
    a row's tokens are those it gets decoded alone with that seed). Every forward has the same
    shape (`StepPlan`: the schedule padded to its widest step) and the step reads nothing back."""

    name = "zipar"
    scratch = 1  # the pads' slot, past the image (StepPlan)

    def __init__(self, target, spec):
        self.target, self.settings = target, spec.settings("zipar")

    def open(self, cond, *, sampling, layout=None, num_tokens=None, **kw) -> DecodeSession:
        """The session, after the layout's rows are checked (a layout ZipAR cannot decode is refused
        before the prefill)."""
        self.target.check_cond(cond)
        layout = layout if layout is not None else layout_for(self.target, num_tokens)
        row_length(self.target, layout)
        return super().open(cond, sampling=sampling, layout=layout, **kw)

    @torch.no_grad()
    def decode(self, session: DecodeSession, *, on_step=None, on_progress=None) -> tuple:
        """-> (tokens (B, N), DecodeStats with per-token TVD). on_step: a row's committed prefix is its
        raster prefix with no undecoded token (ZipAR decodes rows in parallel)."""
        target, cache, guide, gen, timer, stats = (session.target, session.cache, session.guide, session.gen,
                                                   session.timer, session.stats)
        B, N, dev, greedy, out = session.B, session.N, session.device, session.sampling.greedy, session.out
        plan = step_plan(schedule(N, row_length(target, session.layout), int(self.settings.window)), N, dev)
        if session.prompt_len + N + self.scratch > cache.max_len:
            raise InputError(f"ZipAR needs {self.scratch} scratch cache slot past the image; open the session with "
                             "ZipARDecoder.open")
        base = cache.lengths.clone()  # slot of image index 0 per (CFG) row; lengths stay at the prompt
        laws = _Laws(B, N, target.config.vocab_size, session.sampling.top_k, dev) if self.settings.measure_tvd else None
        out[:, 0] = session.first_token()
        in_cache = torch.zeros(N + 1, dtype=torch.bool, device=dev)  # entry N: the dump of aux feeds and pads
        for t, made in enumerate(plan.made):
            fed, pred = plan.fed[t], plan.pred[t]
            with timer.measure("target"):
                slots, mask = _step_inputs(cache, base, fed, plan.aux[t], in_cache, N)
                pos = cache.positions(slots).clamp(max=target.config.n_positions - 1)
                logits = target.forward_tokens(guide.dup(out[:, plan.src[t]]), pos, slots.clamp(max=cache.max_len - 1),
                                               mask, cache).logits
                stats.target_forwards += 1
            with timer.measure("accept"):
                lg = guide(logits, pred[None].expand(B, -1))  # (B, S, V); feeds that decode nothing: dumped
                session.out_buf.scatter_(1, pred[None].expand(B, -1), sample_from_logits(lg, gen, greedy))
                if laws is not None:
                    laws.put(pred, torch.softmax(lg.float(), -1))
                in_cache[plan.mark[t]] = True
                stats.committed.append(torch.full((B,), len(made), device=dev))
                stats.rows.append(torch.arange(B, device=dev))  # every row takes every step
            session.report(out, raster_prefix(out), on_step, on_progress)
        if laws is not None:
            with timer.measure("tvd"):
                per_token = _raster_tvd(session, base, laws)
            stats.tvd = [per_token[:, m].mean(1) for m in plan.made]
        else:
            stats.tvd = [torch.zeros(B, device=dev) for _ in plan.made]
        return session.finish()


def zipar_decoder(target, drafter, tables, gasv, spec):
    """ZipAR's Decoder (Method.decoder); its window is `spec`'s zipar_window (not the SJD window)."""
    return ZipARDecoder(target, spec)


class _Laws:
    """The law each token was drawn from, kept sparse when top-k filtering bounds its support
    (Lumina-mGPT: 2000 of 65536 tokens), so the TVD pass stays cheap at real sizes."""

    def __init__(self, B: int, N: int, V: int, top_k: int, dev):
        self.k = V if not top_k or top_k >= V else int(top_k)
        self.val = torch.zeros(B, N + 1, self.k, device=dev)  # index N: the dump of feeds that decode nothing
        self.idx = torch.zeros(B, N + 1, self.k, dtype=torch.long, device=dev)

    def put(self, where: torch.Tensor, p: torch.Tensor) -> None:
        """p (B, P, V) the laws of image indices `where` (P,) (N: dumped)."""
        v, i = p.topk(self.k, dim=-1) if self.k < p.shape[-1] else (p, torch.arange(p.shape[-1], device=p.device)
                                                                     .expand_as(p))
        self.val[:, where], self.idx[:, where] = v, i

    def tvd(self, p: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """TV(law_i, p_i) for image indices lo .. hi - 1, p (B, hi - lo, V): the law is 0 off its support."""
        v, i = self.val[:, lo:hi], self.idx[:, lo:hi]
        pa = p.gather(-1, i)
        return 0.5 * ((pa - v).abs().sum(-1) + (1.0 - pa.sum(-1)).clamp(min=0.0))


@torch.no_grad()
def _raster_tvd(session: DecodeSession, base: torch.Tensor, laws: _Laws, chunk: int = 256) -> torch.Tensor:
    """(B, N) TVD between each token's ZipAR law and its raster conditional given the tokens
    before it: one teacher-forced target pass over the session's cache (its prompt kept, the
    image slots rewritten from `base`) in chunks of `chunk` tokens (index 0 came from the
    prefill, exactly: 0)."""
    target, cache, guide, tokens, N = session.target, session.cache, session.guide, session.out, session.N
    B, dev = session.B, session.device
    cache.lengths.copy_(base)  # the ZipAR K/V past the prompt are masked out, then overwritten
    out = torch.zeros(B, N, device=dev)
    for lo in range(0, N - 1, chunk):
        S = min(chunk, N - 1 - lo)
        slots = cache.lengths[:, None] + torch.arange(S, device=dev)[None]
        causal = torch.tril(torch.ones(S, S, dtype=torch.bool, device=dev))[None].expand(slots.shape[0], S, S)
        mask = cache.attention_mask(slots, causal)
        pos = cache.positions(slots).clamp(max=target.config.n_positions - 1)
        logits = target.forward_tokens(guide.dup(tokens[:, lo:lo + S]), pos, slots, mask, cache).logits
        cache.lengths += S
        idx = torch.arange(lo + 1, lo + 1 + S, device=dev)[None].expand(B, -1)
        p_ar = torch.softmax(guide(logits, idx).float(), -1)  # (B, S, V): the laws of index lo + 1 ..
        out[:, lo + 1:lo + 1 + S] = laws.tvd(p_ar, lo + 1, lo + 1 + S)
    return out


register_method(Method(
    "zipar", "sjd", "ZipAR: row-parallel next-set decoding, a row starts once a window of the row above "
    "is decoded (approximate: reports TVD; no drafter)", settings=ZipARSettings, decoder=zipar_decoder, row_seeds=True,
    options=(MethodOption("--zipar-window", "zipar_window", int, "ZipAR: tokens of the row above decoded "
                          "before a row starts (smaller: more rows in parallel, fewer forwards, more distortion)."),)))

__all__ = ["StepPlan", "ZipARDecoder", "ZipARSettings", "row_length", "schedule", "step_plan", "zipar_decoder"]
