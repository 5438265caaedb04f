"""Tiny random models and conditions for tests and smoke checks (no downloads, seconds on CPU).

The family of `model_type` builds them (ModelFamily.random_target / random_cond)."""

from __future__ import annotations

import torch

from .models.family import family_of


def make_target(model_type: str = "c2i", seed: int = 0, std: float = 0.1, **overrides):
    """A tiny random target of `model_type` with weights large enough for peaky logits."""
    return family_of(model_type).random_target(model_type, seed=seed, std=std, **overrides)


def make_cond(model, batch: int = 2, seed: int = 1):
    """A random condition for `model` (the family's random_cond; LlamaGen: real class ids, or
    caption features with a different valid length per row)."""
    g = torch.Generator().manual_seed(seed)
    return family_of(model.config).random_cond(model.config, batch, g)
