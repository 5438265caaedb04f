"""Speculative Jacobi Decoding (SJD): training-free, no drafter (docs/spec/speculative.md).

A window of W draft tokens is verified with ONE causal target forward per iteration:
[root, d_1 .. d_W] at positions root .. root + W. Draft d_j was drawn from p_prev_j (the
previous iteration's distribution at that slot, uniform for fresh slots); it is accepted with
min(1, p_now(d_j) / p_prev(d_j)); the first rejection is resampled from norm(max(0, p_now -
p_prev)) (verify.sjd_accept). Unaccepted slots become the next drafts, re-sampled from this
iteration's distributions (the Jacobi update). The accepted K/V are already contiguous, so the
cache only advances its lengths. The window is fixed: every forward feeds the root and all W
drafts (one input shape for the whole decode, as a CUDA graph or a TensorRT profile wants); near
the image end the slots past it are computed and never committed, and the step's one host read
is the rows' committed counts (tests/speculative/test_step_budget_jacobi.py).

This is the one Jacobi loop (`JacobiDecoder`: its decode session, speculative/session.py, holds the
setup: prefill, CFG rows, cache, generator, guide, timer, stats). Its window SHAPE is a seam:
`ChainWindow` (SJD's chain, below) or SJD-PAC's tree window (speculative/sjd_pac.py), each
bringing its forward inputs, verification and next drafts. The chain has two seams of its own:
`redraft` (the Jacobi update: how the next drafts are drawn from their new distributions; SJD
draws them independently, MC-SJD (speculative/mcsjd.py) couples each new draft with the previous
draft at the same image position) and `accept` (the verification of the window; SJD's test
above, GSD's grouped test in speculative/gsd.py, GASV's in speculative/sjd_gasv.py).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..config import SamplingConfig
from ..errors import InputError
from .methods import Method, MethodOption, register_method
from .sampling import sample_from_logits
from .session import DecodeSession, DecodeStats, Decoder
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

    def inputs(self, root: torch.Tensor, cache, n_positions: int):
        """(tokens (B, S), positions, slots, mask, token-index offsets (S,)) of one forward: the root
        and the whole window, S = window + 1 at every step (slots past the image are computed, and
        never committed: verify cuts there)."""
        dev = root.device
        toks = torch.cat([root, self.drafts], 1)  # (B, window + 1)
        S = self.window + 1
        slots = cache.lengths[:, None] + torch.arange(S, device=dev)[None]
        pos = cache.positions(slots).clamp(max=n_positions - 1)
        causal = torch.tril(torch.ones(S, S, dtype=torch.bool, device=dev))[None].expand(slots.shape[0], S, S)
        slots = slots.clamp(max=cache.max_len - 1)
        return toks, pos, slots, cache.attention_mask(slots, causal), torch.arange(S, device=dev)

    def verify(self, p_now: torch.Tensor, n_done: torch.Tensor, N_img: int, gen, greedy: bool):
        """-> (committed tokens this step (B,), their tokens (B, W + 1), mean TVD (B,)); W the window.
        A row commits at most the drafts left before its image ends (finished rows: none)."""
        B, S, _ = p_now.shape
        dev, W, drafts = p_now.device, self.window, self.drafts
        res, slot_tvd = (self.accept or _sjd_test)(p_now[:, :W], self.p_prev, drafts, gen)
        acc_len, res_tok = res.accept_len, res.token
        k = torch.minimum(acc_len, (N_img - n_done - 1).clamp(min=0))
        full = k >= W
        bonus = sample_from_logits(torch.log(p_now[torch.arange(B, device=dev), k.clamp(max=S - 1)]), gen, greedy)
        # a fresh draw from p_now at slot k when the window ran out or was cut at the image end
        from_bonus = full | (acc_len > k) | (res_tok < 0)
        last = torch.where(from_bonus, bonus, res_tok)
        ncom = torch.where(n_done < N_img, k + 1, 0)
        base = torch.cat([drafts, last[:, None]], 1)
        toks = torch.where(torch.arange(W + 1, device=dev)[None] < k[:, None], base, last[:, None])
        self.k = k
        return ncom, toks, _step_tvd(slot_tvd, k, from_bonus, W)

    def advance(self, p_now: torch.Tensor, ncom: torch.Tensor, cache, guide, prior, n_next: torch.Tensor, gen):
        """Keep the accepted K/V (contiguous: the lengths advance) and make the next drafts."""
        B, S, V = p_now.shape
        dev = p_now.device
        window, k = self.window, self.k
        cache.lengths += guide.dup(ncom)
        # Jacobi update: slot j of the next window was slot k + 1 + j of this one
        src = (k[:, None] + 1 + torch.arange(window, device=dev)[None])  # (B, window)
        fresh = src >= S - 1
        srcc = src.clamp(max=S - 2)
        p_next = p_now[:, :-1].gather(1, srcc[:, :, None].expand(-1, -1, V))
        p_new = torch.where(fresh[..., None], prior(n_next[:, None] + torch.arange(window, device=dev)[None]), p_next)
        if self.redraft is None:
            self.drafts = torch.multinomial(p_new.reshape(-1, V), 1, generator=gen).reshape(B, window)
        else:
            old = self.drafts.gather(1, srcc)
            p_old = self.p_prev.gather(1, srcc[:, :, None].expand(-1, -1, V))
            self.drafts = self.redraft(p_new, p_old, old, ~fresh, gen)
        self.p_prev = p_new


def _record(stats: DecodeStats, live_rows: list, ncom, step_tvd) -> None:
    """Record a step's committed counts and TVD of the rows still decoding (`live_rows`, host ints:
    no read)."""
    if len(live_rows) < ncom.shape[0]:
        live = torch.tensor(live_rows, dtype=torch.long, device=ncom.device)
        ncom, step_tvd = ncom[live], step_tvd[live]
    stats.committed.append(ncom)
    stats.tvd.append(step_tvd)


class JacobiDecoder(Decoder):
    """The one Jacobi loop behind the Decoder contract (speculative/session.py): a window of
    `window` drafts verified per target forward, its shape `make_shape(session)` (a fresh one per
    decode: ChainWindow, SJD-PAC's TreeWindow) using `scratch` cache slots past the prefix."""

    row_seeds = False  # one generator for the batch (a served batch decodes row by row)

    def __init__(self, target, name: str, window: int, make_shape: Callable, scratch: int):
        if window < 1:
            raise InputError(f"{name} window must be >= 1, got {window}")
        self.target, self.name, self.window = target, name, int(window)
        self.make_shape, self.scratch = make_shape, scratch

    @torch.no_grad()
    def decode(self, session: DecodeSession, *, on_step=None, on_progress=None) -> tuple:
        shape, window, target, guide, cache, gen = (self.make_shape(session), self.window, session.target,
                                                    session.guide, session.cache, session.gen)
        timer, stats, out, greedy = session.timer, session.stats, session.out, session.sampling.greedy
        B, N_img, dev = session.B, session.N, session.device
        out[:, 0] = session.first_token()
        n_done = torch.ones(B, dtype=torch.long, device=dev)
        prior = draft_prior(session.layout, target.config.vocab_size, dev)
        shape.start(prior(n_done[:, None] + torch.arange(window, device=dev)[None]).clone(), gen)
        while True:
            done = n_done.tolist()  # the step's one host read: loop end, rows still decoding
            if min(done) >= N_img:
                break
            # finished rows keep running (they commit nothing); their outputs are ignored
            live_rows = [b for b, n in enumerate(done) if n < N_img]
            with timer.measure("target"):
                root = out.gather(1, (n_done - 1)[:, None])
                toks, pos, slots, mask, offs = shape.inputs(root, cache, target.config.n_positions)
                logits = target.forward_tokens(guide.dup(toks), pos, slots, mask, cache).logits
                stats.target_forwards += 1
            with timer.measure("accept"):
                p_now = torch.softmax(guide(logits, n_done[:, None] + offs[None]), -1)  # (B, S, V)
                ncom, step_toks, step_tvd = shape.verify(p_now, n_done, N_img, gen, greedy)
            with timer.measure("host"):
                _record(stats, live_rows, ncom, step_tvd)
                session.commit(step_toks, n_done, ncom)  # one fixed-shape masked write
                shape.advance(p_now, ncom, cache, guide, prior, n_done + ncom, gen)
                n_done += ncom
            session.report(out, n_done.clamp(max=N_img), on_step, on_progress)
        stats.settings["sjd_window"] = window
        return session.finish()


def chain_decoder(target, name: str, spec, redraft: Optional[Callable] = None, accept: Optional[Callable] = None):
    """A JacobiDecoder over SJD's chain window (`spec`'s sjd_window) with the given seams."""
    window = spec.settings("sjd").window
    return JacobiDecoder(target, name, window, lambda session: ChainWindow(redraft, accept),
                         ChainWindow().scratch(window))


@torch.no_grad()
def sjd_generate(target, cond, *, sampling: SamplingConfig = SamplingConfig(), window: int = 16,
                 seed: Optional[int] = None, generator: Optional[torch.Generator] = None,
                 num_tokens: Optional[int] = None,
                 redraft: Optional[Callable] = None,
                 accept: Optional[Callable] = None, layout=None, shape=None,
                 on_step=None) -> tuple[torch.Tensor, DecodeStats]:
    """Generate tokens with SJD (the one Jacobi loop, JacobiDecoder on a decode session). Returns
    (tokens (B, N), DecodeStats).

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
        `inputs(root, cache, n_positions)`, `verify(p_now, n_done, N, gen, greedy)` and
        `advance(p_now, ncom, cache, guide, prior, n_next, gen)`, every step the same shapes (the whole
        window; a row's commits are cut where its image ends) (ChainWindow; SJD-PAC's tree
        window, speculative/sjd_pac.py). None: ChainWindow(redraft, accept); a shape brings its
        own drafting and verification, so redraft / accept must then be None.
    on_step: the per-step hook of every decode loop (run.py `run_method`).
    """
    if shape is None:
        shape = ChainWindow(redraft, accept)
    elif redraft is not None or accept is not None:
        raise InputError("sjd_generate: pass redraft / accept to the window shape, not with `shape`")
    dec = JacobiDecoder(target, shape.name, window, lambda session: shape, shape.scratch(window))
    session = dec.open(cond, sampling=sampling, layout=layout, seed=seed, generator=generator, num_tokens=num_tokens)
    return dec.decode(session, on_step=on_step)


def _sjd_decoder(target, drafter, tables, gasv, spec):
    """Plain SJD's Decoder (Method.decoder)."""
    return chain_decoder(target, "sjd", spec)


register_method(Method(
    "sjd", "sjd", "speculative Jacobi decoding (no drafter)", settings=SJDSettings, decoder=_sjd_decoder,
    options=(MethodOption("--sjd-window", "sjd_window", int, "SJD family (sjd, mcsjd, sjd-pac, gsd, sjd-gasv): "
                          "draft tokens per Jacobi window (default 16)."),)))
