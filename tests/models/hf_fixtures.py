"""Helpers for tiny random transformers checkpoints of every HF-directory family (test-only)."""

from __future__ import annotations

import torch


def small_normal(name: str, p: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return 0.08 * torch.randn(p.shape, generator=g)


def randomize(model, seed: int = 0, weights=small_normal) -> None:
    """Non-trivial values everywhere: norm gammas 1 + N(0, 0.2), biases N(0, 0.1) (q/k norms too,
    not just ones / zeros), every other parameter weights(name, p, generator)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(weights(name, p, g))
