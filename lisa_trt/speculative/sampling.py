"""Sampling math shared by the reference loop and every verification rule (pure functions).

Semantics follow LlamaGen's generate.py (docs/spec/llamagen.md, "Generation"): CFG on fp32 logits as
`uncond + (cond - uncond) * scale`, then temperature, top-k (keep values >= k-th largest), top-p
(HF style, the first token always kept), softmax, multinomial.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import InputError


def split_cfg(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A CFG batch [cond; uncond] (2B, ...) -> (cond (B, ...), uncond (B, ...))."""
    half = x.shape[0] // 2
    return x[:half], x[half:]


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
                   top_p: float = 1.0) -> torch.Tensor:
    """Guided logits -> temperature-scaled, filtered fp32 logits (-inf outside the support)."""
    check_finite(logits)
    out = logits.float() / max(temperature, 1e-5)
    out = top_k_filter(out, top_k)
    return top_p_filter(out, top_p)


def guided_logits(raw: torch.Tensor, cfg_scale: float, use_cfg: bool) -> torch.Tensor:
    """Raw target logits of the (CFG) batch -> guided logits of the real batch.

    Args:
        raw: (2B, ..., V) when CFG is on (cfg_scale > 1), else (B, ..., V).
        use_cfg: False after `cfg_interval`: the conditional half alone is used.
    """
    if cfg_scale > 1.0:
        return cfg_combine(raw, cfg_scale) if use_cfg else split_cfg(raw)[0].float()
    return raw.float()


def sample_from_logits(logits: torch.Tensor, generator: Optional[torch.Generator] = None,
                       greedy: bool = False) -> torch.Tensor:
    """Processed logits (..., V) -> token ids (...). Greedy = argmax."""
    if greedy:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits, dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


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
