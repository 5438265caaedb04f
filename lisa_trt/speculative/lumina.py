"""Lumina-mGPT image spans through the generic decode loops (speculative/autoregressive.py).

The protocol (prompt template, span layout, forced row ends, CFG rows) is the Chameleon
family's: models/families/chameleon/lumina.py; this module keeps the names older code imports.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..models.families.chameleon.lumina import (END, LATENT_PER_GRID, NEWLINE, PATCH, SEP, START, TEMPLATE,  # noqa: F401
                                                LuminaImages, LuminaTokenizer, grids, row_end_mask, size_token,
                                                span_request, tokens_to_codes)
from ..models.families.chameleon.vq import find_vq_dir  # noqa: F401 (re-exported)
from .autoregressive import generate
from .sampling import cfg_active


@torch.no_grad()
def generate_image_tokens(target, tokenizer: LuminaTokenizer, captions: Sequence[str], width: int, height: int,
                          *, cfg_scale: float = 3.0, temperature: float = 1.0, top_k: int = 2000,
                          greedy: bool = False, seed: Optional[int] = None, top_p: float = 1.0,
                          cfg_interval: int = -1, seeds=None) -> LuminaImages:
    """Sample one image per caption with Lumina-mGPT's protocol (the generic AR loop)."""
    prompts, layout, (h_lat, w_lat) = span_request(target, tokenizer, captions, width, height, cfg_active(cfg_scale))
    out = generate(target, prompts, layout=layout, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k,
                   top_p=top_p, greedy=greedy, seed=seed, cfg_interval=cfg_interval, seeds=seeds)
    return LuminaImages(out, tokens_to_codes(target, out, h_lat, w_lat))
