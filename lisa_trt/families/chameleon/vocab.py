"""The image codes inside the Chameleon vocabulary: token ids and the SubVocab of the relaxed rules."""

from __future__ import annotations

import torch

from ...models.family import SubVocab
from .model import image_vocab


def image_ids(target) -> torch.Tensor:
    """Sorted token ids of the image codes (cached on the target)."""
    ids = getattr(target, "_image_token_ids", None)
    if ids is None:
        vm = image_vocab(target.config.vocabulary_map, target.config.vocab_size)
        ids = torch.tensor(sorted(vm), dtype=torch.long)
        target._image_token_ids = ids
    return ids


def sub_vocab(target) -> SubVocab:
    """The K image codes (sorted ids, their VQ rows); the forced tokens (row ends) come from the layout."""
    vm = image_vocab(target.config.vocabulary_map, target.config.vocab_size)
    ids = sorted(vm)
    return SubVocab(torch.tensor(ids), torch.tensor([vm[i] for i in ids]))
