"""KV-cached autoregressive loops for Chameleon-architecture targets.

`generate_tokens` is what `lisa_trt.generate(target, input_ids, max_new_tokens=N, ...)` runs for
this family: prefill the prompt once, then one cached forward per new token. `image_token_ids`
reads which vocabulary entries are VQ image codes (HF's `IMGIMG*` names in config.json's
vocabulary_map, else Lumina-mGPT's fixed range 4..8195).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import InputError
from .sampling import make_generator, process_logits, sample_from_logits

LUMINA_IMAGE_CODES = range(4, 8196)  # the 8,192 VQ codes of the Chameleon / Lumina-mGPT tokenizer


def _img_name_to_code(name: str) -> int:
    """'IMGIMG' + digits spelt A..J + one closing char -> VQ code (HF's bpe2img rule)."""
    return int("".join(str(ord(c) - ord("A")) if "A" <= c <= "J" else c for c in name[len("IMGIMG"):-1]))


def image_vocab(vocabulary_map: Optional[dict], vocab_size: int) -> dict[int, int]:
    """{token id: VQ code} for every image-code token of the vocabulary."""
    if vocabulary_map:
        found = {int(i): _img_name_to_code(n) for n, i in vocabulary_map.items() if n.startswith("IMGIMG")}
        if found:
            return found
    if vocab_size >= LUMINA_IMAGE_CODES.stop:
        return {t: t - LUMINA_IMAGE_CODES.start for t in LUMINA_IMAGE_CODES}
    raise InputError("this checkpoint's config.json has no vocabulary_map with IMGIMG* image tokens and "
                     f"its vocabulary ({vocab_size}) is too small for Lumina-mGPT's image codes 4..8195")


def device_of(target) -> torch.device:
    """Device of a torch target (its head) or of an exported-graph runner (`.device`)."""
    dev = getattr(target, "device", None)
    return dev if isinstance(dev, torch.device) else target.lm_head.weight.device


def image_token_ids(target) -> torch.Tensor:
    """Sorted LongTensor of the token ids that are VQ image codes (cached on the target)."""
    ids = getattr(target, "_image_token_ids", None)
    if ids is None:
        vm = image_vocab(target.config.vocabulary_map, target.config.vocab_size)
        ids = torch.tensor(sorted(vm), dtype=torch.long, device=device_of(target))
        target._image_token_ids = ids
    return ids


def restrict(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Set every vocabulary entry outside `allowed` to -inf. logits (..., V)."""
    keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    keep[allowed] = True
    return logits.masked_fill(~keep, float("-inf"))


def append_step(cache, tokens: torch.Tensor):
    """Positions, slots and mask for one new token per row at `cache.lengths`."""
    B = tokens.shape[0]
    slots = cache.lengths[:, None]  # (B, 1)
    ones = torch.ones(B, 1, 1, dtype=torch.bool, device=tokens.device)
    return cache.positions(slots), slots, cache.attention_mask(slots, ones)


@torch.no_grad()
def generate_tokens(target, input_ids: torch.Tensor, max_new_tokens: int, *, greedy: bool = True,
                    image_tokens_only: bool = False, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0, seed: Optional[int] = None, valid: Optional[torch.Tensor] = None,
                    generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Plain KV-cached AR loop over the raw head.

    Args:
        input_ids: (B, T) prompt (left-padded with `valid` False on padding if rows differ).
        max_new_tokens: N tokens to generate (no early stop: EOS is a token like any other).
        greedy: argmax; else sample with temperature / top_k / top_p from a private generator.
        image_tokens_only: restrict every step to the image-code tokens.
    Returns:
        LongTensor (B, N) of new token ids.
    """
    target.check_ids(input_ids)
    N = int(max_new_tokens)
    if N < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {N}")
    B, T = input_ids.shape
    cache = target.new_cache(B, T + N)
    gen = generator or make_generator(seed, input_ids.device)
    allowed = image_token_ids(target) if image_tokens_only else None
    raw = target.prefill(input_ids, cache, valid).logits[:, -1]
    out = torch.empty(B, N, dtype=torch.long, device=input_ids.device)
    for i in range(N):
        if i > 0:
            x = out[:, i - 1: i]
            pos, slots, mask = append_step(cache, x)
            raw = target.forward_tokens(x, pos, slots, mask, cache).logits[:, -1]
            cache.lengths += 1
        logits = restrict(raw, allowed) if allowed is not None else raw
        if not greedy:
            logits = process_logits(logits, temperature, top_k, top_p)
        out[:, i] = sample_from_logits(logits, gen, greedy)
    return out
