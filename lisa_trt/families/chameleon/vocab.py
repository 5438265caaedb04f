"""The image codes inside the Chameleon vocabulary: token ids and the SubVocab of the relaxed rules
(the shared families/prompt_family.py over Chameleon's IMGIMG* names)."""

from __future__ import annotations

import torch

from ...models.family import SubVocab
from ..prompt_family import cached_image_ids, sub_vocab_of, token_code_lut
from .model import image_vocab


def image_ids(target) -> torch.Tensor:
    """Sorted token ids of the image codes (cached on the target)."""
    cfg = target.config
    return cached_image_ids(target, lambda: image_vocab(cfg.vocabulary_map, cfg.vocab_size))


def sub_vocab(target) -> SubVocab:
    """The K image codes (sorted ids, their VQ rows); the forced tokens (row ends) come from the layout."""
    return sub_vocab_of(image_vocab(target.config.vocabulary_map, target.config.vocab_size))


def code_lut(cfg) -> torch.Tensor:
    """(vocab_size,) token id -> VQ code (-1 elsewhere)."""
    return token_code_lut(image_vocab(cfg.vocabulary_map, cfg.vocab_size), cfg.vocab_size)
