"""Emu3's classifier-free guidance rows, written once (target, family and exported graph use it).

transformers' rule (UnbatchedClassifierFreeGuidanceLogitsProcessor, read, not copied): the
unconditional branch is `negative_prompt_ids` when given, else the LAST prompt token alone; it
runs as its own sequence from position 0 and receives every generated token. Guidance mixes
log-softmaxes, G (log p_c - log p_u) + log p_u; restricted to the allowed tokens that is the
same law (and the same argmax) as the loop's u + G (c - u) on raw logits, because the two
normalisers are constants of the row.
"""

from __future__ import annotations

import torch

from ...errors import InputError
from ...models.prompts import Prompts


def null_prompts(cond) -> Prompts:
    """The unconditional rows of `cond`: its carried ones (a negative prompt), else each row's last
    real prompt token alone (transformers' fallback; left padding keeps it in the last column)."""
    p = Prompts.of(cond)
    if p.uncond is not None:
        return p.uncond
    if p.ids.shape[1] == 0:
        raise InputError("an empty prompt has no last token for the unconditional branch; pass negative_prompt_ids")
    return Prompts(p.ids[:, -1:].clone(), torch.ones_like(p.ids[:, -1:], dtype=torch.bool))
