"""Sampling math shared by the reference loop and every verification rule (pure functions).

Semantics follow LlamaGen's generate.py (docs/spec/llamagen.md, "Generation"): CFG on fp32 logits as
`uncond + (cond - uncond) * scale`, then temperature, top-k (keep values >= k-th largest), top-p
(HF style, the first token always kept), softmax, multinomial.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import InputError
from ..validation import debug_checks


def split_cfg(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A CFG batch [cond; uncond] (2B, ...) -> (cond (B, ...), uncond (B, ...))."""
    half = x.shape[0] // 2
    return x[:half], x[half:]


def cfg_active(cfg_scale: float) -> bool:
    """THE rule for every family and loop: guidance runs as [cond; uncond] rows when
    cfg_scale > 1 (LlamaGen's and transformers' rule); cfg_scale <= 1 means no guidance."""
    return cfg_scale > 1.0


def cfg_combine(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """(2B, ..., V) CFG batch -> (B, ..., V) guided fp32 logits."""
    cond, uncond = split_cfg(logits.float())
    return uncond + (cond - uncond) * scale


def check_finite(logits: torch.Tensor, where: str = "target") -> None:
    if torch.isnan(logits).any():
        raise InputError(f"NaN in the {where} logits: the weights or inputs are broken "
                         "(check the checkpoint, or run in fp32 if fp16 overflowed)")


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set logits below the k-th largest to -inf (ties with the k-th value are kept)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter (HF style): drop tokens once the cumulative probability exceeds p."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    remove = cum > p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0, check: Optional[bool] = None) -> torch.Tensor:
    """Guided logits -> temperature-scaled, filtered fp32 logits (-inf outside the support).

    check: refuse NaN logits (a host read); None: only under the debug switch
    (validation.debug_checks). The loops pass True where logits enter (the prefill's)."""
    if check or (check is None and debug_checks()):
        check_finite(logits)
    out = logits.float() if temperature == 1.0 else logits.float() / max(temperature, 1e-5)  # x / 1 == x
    out = top_p_filter(top_k_filter(out, top_k), top_p)
    return out.clone() if out is logits else out  # a new tensor, as with a filter or a temperature


def guided_logits(raw: torch.Tensor, cfg_scale: float, use_cfg: bool) -> torch.Tensor:
    """Raw target logits of the (CFG) batch -> guided logits of the real batch.

    Args:
        raw: (2B, ..., V) when CFG is on (cfg_scale > 1), else (B, ..., V).
        use_cfg: False after `cfg_interval`: the conditional half alone is used.
    """
    if cfg_active(cfg_scale):
        return cfg_combine(raw, cfg_scale) if use_cfg else split_cfg(raw)[0].float()
    return raw.float()


def sample_from_logits(logits: torch.Tensor, generator: Optional[torch.Generator] = None,
                       greedy: bool = False) -> torch.Tensor:
    """Processed logits (..., V) -> token ids (...). Greedy = argmax."""
    if greedy:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits, dim=-1)
    if isinstance(generator, RowGenerators):
        return generator.multinomial(probs)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def uniform(shape, generator=None, device="cpu") -> torch.Tensor:
    """U[0, 1) draws of `shape` (rows first) from a torch.Generator or RowGenerators."""
    if isinstance(generator, RowGenerators):
        return generator.rand(shape)
    return torch.rand(shape, generator=generator, device=device)


class RowGenerators:
    """One private torch.Generator per batch row, so that row b's random draws depend only on
    its own seed and never on which other rows share the batch (served requests decoded
    together give the images they would give alone).

    Every draw takes a fixed-size block per row: `rand((B, *dims))` draws `cap` values per
    dim from each row's generator and slices the first `dims`, so the layout of a row's
    numbers does not depend on the batch-wide tree depth / width. `select(idx)` keeps the
    generators of rows still decoding (rows are dropped as they finish).
    """

    def __init__(self, seeds, device="cpu", cap: int = 64, _gens=None):
        self.device, self.cap = device, int(cap)
        self.gens = list(_gens) if _gens is not None else [make_generator(int(s), device) for s in seeds]

    def __len__(self) -> int:
        return len(self.gens)

    def select(self, idx) -> "RowGenerators":
        """The generators of rows `idx` (a 1-D index tensor or list), same state objects."""
        return RowGenerators(None, self.device, self.cap, [self.gens[int(i)] for i in idx])

    def _check(self, B: int) -> None:
        if B != len(self.gens):
            raise InputError(f"internal: {B} rows drawn with {len(self.gens)} row generators")

    def rand(self, shape) -> torch.Tensor:
        B, dims = int(shape[0]), tuple(int(d) for d in shape[1:])
        self._check(B)
        if any(d > self.cap for d in dims):
            raise InputError(f"internal: per-row draw {dims} exceeds the fixed block {self.cap}; "
                             "raise RowGenerators(cap=...)")
        block = (self.cap,) * len(dims)
        sl = tuple(slice(0, d) for d in dims)
        return torch.stack([torch.rand(block, generator=g, device=self.device)[sl] for g in self.gens]) \
            if B else torch.empty(shape, device=self.device)

    def multinomial(self, probs: torch.Tensor) -> torch.Tensor:
        """probs (B, ..., V) -> one draw per (row, ...) position, row b from generator b."""
        B = probs.shape[0]
        self._check(B)
        out = [torch.multinomial(probs[b].reshape(-1, probs.shape[-1]), 1, generator=g).reshape(probs.shape[1:-1])
               for b, g in enumerate(self.gens)]
        return torch.stack(out) if out else torch.empty(probs.shape[:-1], dtype=torch.long, device=probs.device)


def make_generator(seed: Optional[int], device="cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(int(seed))
    return g


def tvd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total variation distance 0.5 * sum |p - q| over the last axis (the one definition).

    Args:
        p, q: (..., V) probability vectors.
    Returns:
        (...,) TVD per row.
    """
    return 0.5 * (p - q).abs().sum(-1)
