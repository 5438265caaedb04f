"""The decode session: what every decode loop sets up, written once (docs/architecture.md, "Decode loops").

`open_session(target, cond, sampling=...)` checks the condition, resolves the family's layout
(models/family.py `SequenceLayout`: how many tokens, which ids may be sampled, which are forced),
builds the CFG rows [cond; uncond], allocates the target cache (prompt + N tokens + the loop's
scratch slots), runs the prefill, makes the random source (one generator, or one per row from
`seeds`: sampling.RowGenerators), the `Guide` (CFG, filtering, forcing) and the guided logits of
the first token. The loop then only steps.

Every method is a `Decoder` (this module's contract): `Method.decoder(target, drafter, tables,
gasv, spec)` builds it (speculative/methods.py), `decoder.open(cond, ...)` opens its session
(the cache scratch it needs: `Decoder.scratch`; per-row seeds only where `Decoder.row_seeds`),
and `decoder.decode(session, on_step=, on_progress=) -> (tokens (B, N), DecodeStats)` runs it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..config import SamplingConfig
from ..errors import InputError
from ..models.family import SequenceLayout, family_of
from ..timing import Timer
from .sampling import (RowGenerators, cfg_active, cfg_combine, make_generator, process_logits, sample_from_logits,
                       split_cfg)


def cfg_batch(target, cond, cfg_scale: float):
    """[cond; uncond] when CFG is on (sampling.cfg_active), else cond unchanged.

    A target whose conditions need more than concatenation (prompts of different lengths,
    re-left-padded together) provides `cfg_rows(cond, null)`."""
    if not cfg_active(cfg_scale):
        return cond
    null = target.null_cond(cond)
    rows = getattr(target, "cfg_rows", None)
    if rows is not None:
        return rows(cond, null)
    if isinstance(cond, (tuple, list)):
        return tuple(torch.cat([c, n]) for c, n in zip(cond, null))
    return torch.cat([cond, null])


def layout_for(target, num_tokens: Optional[int] = None, image_tokens_only: bool = False) -> SequenceLayout:
    """The family's layout of `num_tokens` free tokens (default: the whole image)."""
    return family_of(target.config).free_layout(target, num_tokens, image_tokens_only)


def new_target_cache(target, rows: int, full_cond, n_tokens: int, extra: int = 0):
    """A target cache for `rows` rows: the prompt of `full_cond`, n_tokens and `extra` scratch."""
    return target.new_cache(rows, extra=extra, prompt_len=target.prompt_len(full_cond), n_tokens=n_tokens)


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
    forced by the family's SequenceLayout (models/family.py). Public: every decode loop (through
    its session) and the calibration rollouts share it, so they guide, filter and force alike."""

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


def generators(B: int, device, *, seed: Optional[int] = None, seeds=None, generator=None, cap: int = 64):
    """A decode's random source: one generator per row (`seeds`: RowGenerators, drawing blocks of
    `cap` values) or one for the batch (`generator`, else a fresh one seeded with `seed`)."""
    if seeds is None:
        return generator or make_generator(seed, device)
    if len(seeds) != B:
        raise InputError(f"{len(seeds)} seeds for {B} prompts; pass one seed per prompt")
    return RowGenerators(seeds, device, cap=cap)


@dataclass
class DecodeSession:
    """One batch after its prefill: everything a decode loop reads besides its own state.

    Tensors follow the target's cache: `cache` and `prefill` have the CFG rows (2B with CFG);
    `first`, `out_buf` and the loop's tokens have the real rows (B)."""

    target: object
    cond: object  # the request's condition (B rows)
    full: object  # the condition of the cache's rows: cond, or [cond; uncond] with CFG (cfg_batch)
    B: int
    layout: SequenceLayout
    sampling: SamplingConfig
    guide: Guide
    cache: object  # the target's KVCache: prompt, N tokens, `extra` scratch slots
    prompt_len: int  # cache slots the prompt takes
    prefill: object  # the prefill's output when the loop asked for taps (else None), until take_taps()
    first: torch.Tensor  # (B, V) guided, filtered logits of token 0 (the prefill's last position)
    gen: object  # torch.Generator, or RowGenerators (one per row)
    out_buf: torch.Tensor  # (B, N + 1) tokens, -1 where not decoded; column N: the dump of masked writes
    timer: Timer
    stats: DecodeStats  # the prefill counted
    t0: float  # perf_counter at the session's start

    @property
    def cfg(self) -> bool:
        return self.guide.cfg

    @property
    def N(self) -> int:
        """Tokens to generate per row."""
        return self.layout.n_tokens

    @property
    def device(self) -> torch.device:
        return self.cache.lengths.device  # all bookkeeping lives with the engines' caches

    @property
    def out(self) -> torch.Tensor:
        """(B, N) the tokens (a view of out_buf)."""
        return self.out_buf[:, : self.N]

    def take_taps(self) -> torch.Tensor:
        """The prefill's taps, handed over once: the session then drops the prefill's output, so an
        engine's pooled output buffers are free again for the loop's steps (engines/trt.py)."""
        taps, self.prefill = self.prefill.taps, None
        return taps

    def first_token(self) -> torch.Tensor:
        """(B,) token 0 drawn from `first` with the session's generator (argmax when greedy)."""
        return sample_from_logits(self.first, self.gen, self.sampling.greedy)

    def commit(self, tokens: torch.Tensor, start: torch.Tensor, count: torch.Tensor, rows=None) -> None:
        """Write tokens[i, :count[i]] at columns start[i] .. of out row rows[i] (rows None: row i) in
        one fixed-shape masked write (no host read): entries past a row's count or past the image
        land in the dump column N."""
        cols = torch.arange(tokens.shape[1], device=tokens.device)[None]
        dst = start[:, None] + cols
        dst = torch.where((cols < count[:, None]) & (dst < self.N), dst, self.N)
        if rows is None:
            self.out_buf.scatter_(1, dst, tokens)
        else:
            self.out_buf.index_put_((rows[:, None].expand_as(dst), dst), tokens)

    @staticmethod
    def report(tokens: torch.Tensor, done: torch.Tensor, on_step=None, on_progress=None) -> None:
        """After a step: on_progress(tokens done over all rows) (a host read, only when given) and
        on_step(tokens (B, N), done (B,)), the per-step hook of every loop (run.py `run_method`)."""
        if on_progress is not None:
            on_progress(int(done.sum()))
        if on_step is not None:
            on_step(tokens, done)

    def finish(self, tokens: Optional[torch.Tensor] = None) -> tuple:
        """(tokens (B, N) contiguous, DecodeStats with the phase times and the total)."""
        self.stats.times = dict(self.timer.totals)
        self.stats.times["total"] = time.perf_counter() - self.t0
        return (self.out if tokens is None else tokens).contiguous(), self.stats


@torch.no_grad()
def open_session(target, cond, *, sampling: SamplingConfig, layout: Optional[SequenceLayout] = None,
                 seed: Optional[int] = None, seeds=None, extra: int = 0, taps: bool = False,
                 generator: Optional[torch.Generator] = None, num_tokens: Optional[int] = None,
                 row_cap: int = 64) -> DecodeSession:
    """Check `cond`, prefill it (with its CFG rows) into a fresh target cache and return the session.

    Args:
        target: a target of any family (torch model, engines.graph target, or a proxy of one).
        cond: the family's condition (B rows).
        sampling: CFG scale / interval, temperature, top-k / top-p, greedy.
        layout: the family's SequenceLayout of the request (default: its free layout of
            `num_tokens`, the whole image when None).
        seed / generator: the batch's one generator (a fresh one seeded with `seed` unless given);
        seeds: instead, one seed per row (RowGenerators with blocks of `row_cap` values), so a
            row's draws do not depend on the rest of the batch.
        extra: cache slots the loop writes beyond prompt + N (a tree, a Jacobi window).
        taps: the prefill returns the target's taps (the drafter's input).
    """
    B = target.check_cond(cond)
    layout = layout if layout is not None else layout_for(target, num_tokens)
    guide, timer, stats = Guide(sampling, layout), Timer(), DecodeStats()
    t0 = time.perf_counter()
    with timer.measure("target"):
        full = cfg_batch(target, cond, sampling.cfg_scale)
        cache = new_target_cache(target, 2 * B if guide.cfg else B, full, layout.n_tokens, extra=extra)
        pre = target.prefill(full, cache, **({"taps": True} if taps else {}))
        stats.target_forwards += 1
    dev = cache.lengths.device
    gen = generators(B, dev, seed=seed, seeds=seeds, generator=generator, cap=row_cap)
    first = guide(pre.logits[:, -1], torch.zeros(B, dtype=torch.long, device=dev))
    out_buf = torch.full((B, layout.n_tokens + 1), -1, dtype=torch.long, device=dev)
    pre = pre if taps else None  # only a loop that reads the taps keeps the prefill's output (take_taps)
    return DecodeSession(target, cond, full, B, layout, sampling, guide, cache, target.prompt_len(full), pre, first,
                         gen, out_buf, timer, stats, t0)


class Decoder:
    """One method's decode loop behind the one contract (every method: plain AR, tree, Medusa,
    the oracle, the Jacobi family, ZipAR).

    A subclass sets `target` (the engine its session prefills: a proxy where the method wraps
    the caller's, e.g. the oracle's RecordingTarget), `name`, and the class attributes below,
    and implements `decode`."""

    name = "decoder"
    scratch = 0  # cache slots the loop writes beyond prompt + N (open_session's `extra`)
    taps = False  # the loop reads the prefill's taps
    row_seeds = True  # the loop takes one seed per row (RowGenerators); False: one batch generator only
    row_cap = 64  # RowGenerators' per-row block (the most values one draw takes per row)
    target = None

    def open(self, cond, *, sampling: SamplingConfig, layout=None, seed: Optional[int] = None, seeds=None,
             generator: Optional[torch.Generator] = None, num_tokens: Optional[int] = None) -> DecodeSession:
        """This decoder's session for `cond` (open_session with its scratch, taps and row seeds)."""
        if seeds is not None and not self.row_seeds:
            raise InputError(f"the {self.name} loop has no per-row generators; decode its rows one by one")
        return open_session(self.target, cond, sampling=sampling, layout=layout, seed=seed, seeds=seeds,
                            extra=self.scratch, taps=self.taps, generator=generator, num_tokens=num_tokens,
                            row_cap=self.row_cap)

    def decode(self, session: DecodeSession, *, on_step=None, on_progress=None) -> tuple:
        """Decode the session's batch -> (tokens (B, N), DecodeStats).

        on_step: `on_step(tokens (B, N), done (B,))` after each step (run.py `run_method`);
        on_progress: `on_progress(tokens done over all rows)` after each step (a host read)."""
        raise NotImplementedError


__all__ = ["DecodeSession", "DecodeStats", "Decoder", "Guide", "cfg_batch", "generators", "layout_for",
           "new_target_cache", "open_session"]
