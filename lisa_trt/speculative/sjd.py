"""Speculative Jacobi Decoding (SJD): training-free, no drafter (docs/spec/speculative.md).

A window of W draft tokens is verified with ONE causal target forward per iteration:
[root, d_1 .. d_W] at positions root .. root + W. Draft d_j was drawn from p_prev_j (the
previous iteration's distribution at that slot, uniform for fresh slots); it is accepted with
min(1, p_now(d_j) / p_prev(d_j)); the first rejection is resampled from norm(max(0, p_now -
p_prev)) (verify.sjd_accept). Unaccepted slots become the next drafts, re-sampled from this
iteration's distributions (the Jacobi update). The accepted K/V are already contiguous, so the
cache only advances its lengths.

This is the one Jacobi loop (setup, prefill, guide, timer, stats, commits). Its window SHAPE is a
seam: `ChainWindow` (SJD's chain, below) or SJD-PAC's tree window (speculative/sjd_pac.py),
each bringing its forward inputs, verification and next drafts. The chain has two seams of its
own: `redraft` (the Jacobi update: how the next drafts are drawn from their new distributions;
SJD draws them independently, MC-SJD (speculative/mcsjd.py) couples each new draft with the
previous draft at the same image position) and `accept` (the verification of the window;
SJD's test above, GSD's grouped test in speculative/gsd.py, GASV's in speculative/sjd_gasv.py).
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..config import SamplingConfig
from ..timing import Timer
from ..errors import InputError
from .autoregressive import cfg_batch, layout_for, new_target_cache
from .decode import DecodeStats, Guide
from .methods import Method, MethodOption, register_method
from .sampling import make_generator, sample_from_logits
from .verify import sjd_accept


@dataclass(frozen=True)
class SJDSettings:
    """The Jacobi window every SJD-family loop reads (flat name sjd_window; CLI --sjd-window): draft
    tokens verified per target forward (sjd, mcsjd, sjd-pac's columns, gsd, sjd-gasv; not zipar)."""

    window: int = 16

    def __post_init__(self):
        if isinstance(self.window, bool) or not isinstance(self.window, numbers.Integral) or self.window < 1:
            raise InputError(f"--sjd-window (sjd_window) must be an integer >= 1, got {self.window!r}")


def draft_prior(layout, V: int, device):
    """`prior(token_index (B, W)) -> (B, W, V)`: the law fresh Jacobi slots are drafted from:
    uniform over the layout's allowed tokens (the whole head when None), one-hot where the
    layout forces a token (Lumina-mGPT's row ends), so forced slots are always accepted."""
    base = torch.zeros(V, device=device)
    if layout.allowed is None:
        base.fill_(1.0 / V)
    else:
        ids = layout.allowed.to(device)
        base[ids] = 1.0 / ids.numel()
    forced = None if layout.forced is None else layout.forced.to(device)

    def prior(idx: torch.Tensor) -> torch.Tensor:
        out = base.expand(*idx.shape, V)
        if forced is None:
            return out
        f = forced[idx.clamp(max=forced.numel() - 1)]
        one_hot = torch.zeros_like(out).scatter_(-1, f.clamp(min=0)[..., None], 1.0)
        return torch.where((f >= 0)[..., None], one_hot, out)

    return prior


def _sjd_test(p_now, p_prev, drafts, gen):
    return sjd_accept(p_now, p_prev, drafts, gen), None  # lossless: TVD 0


def _step_tvd(slot_tvd, k, from_bonus, W):
    """Mean TVD over the k + 1 tokens a step commits: the accepted drafts (slots < k) and the
    resampled slot k carry their slot's TVD; a fresh draw from p_now (bonus) carries 0."""
    if slot_tvd is None:
        return torch.zeros(k.shape, device=k.device)
    j = torch.arange(W, device=k.device)[None]
    take = (j < k[:, None]) | ((j == k[:, None]) & ~from_bonus[:, None])
    return (slot_tvd.float() * take).sum(-1) / (k + 1).float()


class ChainWindow:
    """SJD's window shape: a chain of W drafts after the root, verified slot by slot (the loop's
    `redraft` and `accept` seams, module docstring). One object per decode (it holds the drafts)."""

    name = "SJD"

    def __init__(self, redraft: Optional[Callable] = None, accept: Optional[Callable] = None):
        self.redraft, self.accept = redraft, accept

    def scratch(self, window: int) -> int:
        """Cache slots one forward needs beyond the committed prefix."""
        return window + 1

    def start(self, p0: torch.Tensor, gen) -> None:
        """First drafts from the prior laws p0 (B, window, V)."""
        B, window, V = p0.shape
        self.window, self.V = window, V
        self.p_prev = p0
        self.drafts = torch.multinomial(p0.reshape(-1, V), 1, generator=gen).reshape(B, window)

    def inputs(self, root: torch.Tensor, cache, W: int, n_positions: int):
        """(tokens (B, S), positions, slots, mask, token-index offsets (S,)) of one forward."""
        dev = root.device
        toks = torch.cat([root, self.drafts[:, :W]], 1)  # (B, W + 1)
        S = W + 1
        slots = cache.lengths[:, None] + torch.arange(S, device=dev)[None]
        pos = cache.positions(slots).clamp(max=n_positions - 1)
        causal = torch.tril(torch.ones(S, S, dtype=torch.bool, device=dev))[None].expand(slots.shape[0], S, S)
        slots = slots.clamp(max=cache.max_len - 1)
        return toks, pos, slots, cache.attention_mask(slots, causal), torch.arange(S, device=dev)

    def verify(self, p_now: torch.Tensor, W: int, n_done: torch.Tensor, N_img: int, gen, greedy: bool):
        """-> (committed tokens this step (B,), their tokens (B, W + 1), mean TVD (B,))."""
        B, S, _ = p_now.shape
        dev = p_now.device
        drafts = self.drafts
        slot_tvd = None
        if W:
            res, slot_tvd = (self.accept or _sjd_test)(p_now[:, :W], self.p_prev[:, :W], drafts[:, :W], gen)
            acc_len, res_tok = res.accept_len, res.token
        else:
            acc_len = torch.zeros(B, dtype=torch.long, device=dev)
            res_tok = acc_len - 1
        k = torch.minimum(acc_len, (N_img - n_done - 1).clamp(min=0))
        full = k >= W
        bonus = sample_from_logits(torch.log(p_now[torch.arange(B, device=dev), k.clamp(max=S - 1)]), gen, greedy)
        # a fresh draw from p_now at slot k when the window ran out or was cut at the image end
        from_bonus = full | (acc_len > k) | (res_tok < 0)
        last = torch.where(from_bonus, bonus, res_tok)
        ncom = torch.where(n_done < N_img, k + 1, 0)
        base = torch.cat([drafts[:, :W], last[:, None]], 1)
        toks = torch.where(torch.arange(W + 1, device=dev)[None] < k[:, None], base, last[:, None])
        self.k = k
        return ncom, toks, _step_tvd(slot_tvd, k, from_bonus, W)

    def advance(self, p_now: torch.Tensor, ncom: torch.Tensor, cache, guide, prior, n_next: torch.Tensor, W: int, gen):
        """Keep the accepted K/V (contiguous: the lengths advance) and make the next drafts."""
        B, S, V = p_now.shape
        dev = p_now.device
        window, k = self.window, self.k
        cache.lengths += guide.dup(ncom)
        # Jacobi update: slot j of the next window was slot k + 1 + j of this one
        src = (k[:, None] + 1 + torch.arange(window, device=dev)[None])  # (B, window)
        fresh = src >= S - 1
        srcc = src.clamp(max=max(S - 2, 0))
        p_next = p_now[:, :-1].gather(1, srcc[:, :, None].expand(-1, -1, V)) if W else self.p_prev
        p_new = torch.where(fresh[..., None], prior(n_next[:, None] + torch.arange(window, device=dev)[None]), p_next)
        if self.redraft is None:
            self.drafts = torch.multinomial(p_new.reshape(-1, V), 1, generator=gen).reshape(B, window)
        else:
            old = self.drafts.gather(1, srcc)
            p_old = self.p_prev.gather(1, srcc[:, :, None].expand(-1, -1, V))
            has_old = ~fresh if W else torch.zeros_like(fresh)
            self.drafts = self.redraft(p_new, p_old, old, has_old, gen)
        self.p_prev = p_new


def _commit(stats: DecodeStats, out_buf, live_rows: list, ncom, step_tvd, step_toks, n_done, W: int) -> None:
    """Record a step's committed counts and TVD of the rows still decoding (`live_rows`, host ints:
    no read) and write its tokens into `out_buf` (B, N_img + 1) in one fixed-shape masked write (no
    boolean-mask indexing): slot j of a row lands at n_done + j when it is committed (j < ncom) and
    inside the image, else in the dump column N_img."""
    B, N_img = out_buf.shape[0], out_buf.shape[1] - 1
    dev = out_buf.device
    if len(live_rows) < B:
        live = torch.tensor(live_rows, dtype=torch.long, device=dev)
        ncom_live, tvd_live = ncom[live], step_tvd[live]
    else:
        ncom_live, tvd_live = ncom, step_tvd
    stats.committed.append(ncom_live)
    stats.tvd.append(tvd_live)
    dst = n_done[:, None] + torch.arange(W + 1, device=dev)[None]
    dst = torch.where((dst - n_done[:, None] < ncom[:, None]) & (dst < N_img), dst, N_img)
    out_buf.scatter_(1, dst, step_toks[:, : W + 1])


@torch.no_grad()
def sjd_generate(target, cond, *, sampling: SamplingConfig = SamplingConfig(), window: int = 16,
                 seed: Optional[int] = None, generator: Optional[torch.Generator] = None,
                 num_tokens: Optional[int] = None,
                 redraft: Optional[Callable] = None,
                 accept: Optional[Callable] = None, layout=None, shape=None,
                 on_step=None) -> tuple[torch.Tensor, DecodeStats]:
    """Generate tokens with SJD (the one Jacobi loop). Returns (tokens (B, N), DecodeStats).

    layout: the family's SequenceLayout of the request (models/family.py; default: the family's
        free layout of `num_tokens`): which tokens may be drafted, which are forced (one-hot
        laws, always accepted), positions from the cache (left-padded prompt rows).

    redraft: optional `redraft(p_new, p_old, old, has_old, gen) -> drafts (B, window)`, the
        Jacobi update: p_new (B, window, V) are the distributions the next drafts must follow,
        old (B, window) the drafts the same image positions had in this iteration, drawn from
        p_old (B, window, V); has_old (B, window) is False for fresh slots (no previous draft).
        None: independent draws from p_new (plain SJD).
    accept: optional `accept(p_now, p_prev, drafts, gen) -> (SJDResult, tvd)`, the verification
        of the W window drafts ((B, W, V), (B, W, V), (B, W)); tvd (B, W) is the total variation
        distance between the law of the token each slot commits and p_now there (None: 0, a
        lossless rule). None: `verify.sjd_accept` (plain SJD, lossless).
    shape: the window shape, a fresh object per call with `scratch(window)`, `start(p0, gen)`,
        `inputs(root, cache, W, n_positions)`, `verify(p_now, W, n_done, N, gen, greedy)` and
        `advance(p_now, ncom, cache, guide, prior, n_next, W, gen)` (ChainWindow; SJD-PAC's tree
        window, speculative/sjd_pac.py). None: ChainWindow(redraft, accept); a shape brings its
        own drafting and verification, so redraft / accept must then be None.
    on_step: the per-step hook of every decode loop (run.py `run_method`).
    """
    if shape is None:
        shape = ChainWindow(redraft, accept)
    elif redraft is not None or accept is not None:
        raise InputError("sjd_generate: pass redraft / accept to the window shape, not with `shape`")
    tc = target.config
    B = target.check_cond(cond)
    layout = layout if layout is not None else layout_for(target, num_tokens)
    N_img = layout.n_tokens
    if window < 1:
        raise InputError(f"{shape.name} window must be >= 1, got {window}")
    guide, timer, stats = Guide(sampling, layout), Timer(), DecodeStats()
    V = tc.vocab_size
    t0 = time.perf_counter()
    with timer.measure("target"):
        full = cfg_batch(target, cond, sampling.cfg_scale)
        cache = new_target_cache(target, 2 * B if guide.cfg else B, full, N_img, extra=shape.scratch(window))
        pre = target.prefill(full, cache)
        stats.target_forwards += 1
    dev = cache.lengths.device
    gen = generator or make_generator(seed, dev)
    out_buf = torch.full((B, N_img + 1), -1, dtype=torch.long, device=dev)  # column N_img: dump of masked writes
    out = out_buf[:, :N_img]
    out[:, 0] = sample_from_logits(guide(pre.logits[:, -1], torch.zeros(B, dtype=torch.long, device=dev)), gen, sampling.greedy)
    n_done = torch.ones(B, dtype=torch.long, device=dev)
    prior = draft_prior(layout, V, dev)
    shape.start(prior(n_done[:, None] + torch.arange(window, device=dev)[None]).clone(), gen)
    while True:
        done = n_done.tolist()  # the step's one host read: loop end, window width, rows still decoding
        if min(done) >= N_img:
            break
        # finished rows keep running with W = 0 effective drafts; their outputs are ignored
        W = int(min(window, N_img - min(done) - 1))
        live_rows = [b for b, n in enumerate(done) if n < N_img]
        with timer.measure("target"):
            root = out.gather(1, (n_done - 1)[:, None])
            toks, pos, slots, mask, offs = shape.inputs(root, cache, W, tc.n_positions)
            logits = target.forward_tokens(guide.dup(toks), pos, slots, mask, cache).logits
            stats.target_forwards += 1
        with timer.measure("accept"):
            p_now = torch.softmax(guide(logits, n_done[:, None] + offs[None]), -1)  # (B, S, V)
            ncom, step_toks, step_tvd = shape.verify(p_now, W, n_done, N_img, gen, sampling.greedy)
        with timer.measure("host"):
            _commit(stats, out_buf, live_rows, ncom, step_tvd, step_toks, n_done, W)
            shape.advance(p_now, ncom, cache, guide, prior, n_done + ncom, W, gen)
            n_done += ncom
        if on_step is not None:
            on_step(out, n_done.clamp(max=N_img))
    stats.times = dict(timer.totals)
    stats.times["total"] = time.perf_counter() - t0
    stats.settings["sjd_window"] = int(window)
    return out.contiguous(), stats


def _sjd_loop(target, cond, *, sampling, window, seed, spec=None, layout=None, on_step=None):
    """Plain SJD on one batch (the registry's loop protocol)."""
    return sjd_generate(target, cond, sampling=sampling, window=window, seed=seed, layout=layout, on_step=on_step)


register_method(Method(
    "sjd", "sjd", "speculative Jacobi decoding (no drafter)", settings=SJDSettings, loop=_sjd_loop,
    options=(MethodOption("--sjd-window", "sjd_window", int, "SJD family (sjd, mcsjd, sjd-pac, gsd, sjd-gasv): "
                          "draft tokens per Jacobi window (default 16)."),)))
