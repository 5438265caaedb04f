"""Tiny random models and conditions for tests and smoke checks (no downloads, seconds on CPU)."""

from __future__ import annotations

import torch

from .config import target_config
from .models.families.llamagen.model import Transformer


def make_target(model_type: str = "c2i", seed: int = 0, std: float = 0.1, **overrides) -> Transformer:
    """A tiny random target ("tiny" config) with weights large enough for peaky logits."""
    g = torch.Generator().manual_seed(seed)
    kw = dict(model_type=model_type)
    if model_type == "t2i":
        kw.update(cls_token_num=6, caption_dim=12)
    kw.update(overrides)
    m = Transformer(target_config("tiny", **kw))
    with torch.no_grad():
        for name, p in m.named_parameters():
            noise = torch.randn(p.shape, generator=g) * std
            p.copy_(1.0 + noise if name.endswith("norm.weight") else noise)
        if model_type == "t2i":  # the null caption is a buffer: seed it too (not the global RNG)
            u = m.cls_embedding.uncond_embedding
            u.copy_(torch.randn(u.shape, generator=g) / u.shape[1] ** 0.5)
    return m.eval()


def make_cond(model, batch: int = 2, seed: int = 1):
    """Class ids (c2i) or (features, mask) with different valid lengths per row (t2i)."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    if cfg.model_type == "c2i":
        return torch.randint(0, cfg.num_classes, (batch,), generator=g)
    feats = torch.randn(batch, cfg.cls_token_num, cfg.caption_dim, generator=g)
    mask = torch.zeros(batch, cfg.cls_token_num)
    for b in range(batch):
        mask[b, : min(2 + b, cfg.cls_token_num)] = 1  # valid tokens first
    return feats, mask
