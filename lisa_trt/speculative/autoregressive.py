"""The reference autoregressive loop (LlamaGen generate.py semantics) on the static KV cache."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..errors import InputError
from .sampling import guided_logits, make_generator, process_logits, sample_from_logits


def cfg_batch(target, cond, cfg_scale: float):
    """[cond; uncond] when CFG is on (cfg_scale > 1), else cond unchanged."""
    if cfg_scale <= 1.0:
        return cond
    null = target.null_cond(cond)
    if isinstance(cond, (tuple, list)):
        return tuple(torch.cat([c, n]) for c, n in zip(cond, null))
    return torch.cat([cond, null])


def step_inputs(cache, tokens: torch.Tensor):
    """Positions, slots and mask for one new token per row appended at `cache.lengths`."""
    B = tokens.shape[0]
    slots = cache.lengths[:, None]  # (B, 1)
    ones = torch.ones(B, 1, 1, dtype=torch.bool, device=tokens.device)
    return slots, slots, cache.attention_mask(slots, ones)


@torch.no_grad()
def generate(target, cond=None, *, cfg_scale: float = 1.0, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, greedy: bool = False, seed: Optional[int] = None,
             cfg_interval: int = -1, num_tokens: Optional[int] = None,
             generator: Optional[torch.Generator] = None,
             on_token: Optional[Callable[[int], None]] = None, seeds=None, max_new_tokens: Optional[int] = None,
             image_tokens_only: bool = False, input_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Sample image tokens with the plain AR loop.

    Args:
        target: a lisa_trt Transformer (eval).
        cond: class ids (B,) for c2i; (caption_features (B, 120, C), caption_mask (B, 120)) for t2i.
        cfg_scale: guidance scale; CFG runs as batch [cond; uncond] when > 1.
        greedy: argmax of the guided logits instead of sampling.
        seed: seeds a private torch.Generator (the global RNG is untouched).
        cfg_interval: guidance off after this decode step (-1: always on).
        num_tokens: tokens to generate (default: the whole image, config.block_size).
        on_token: called with the number of tokens done after each step (progress bars).
        seeds: one seed per row instead of `seed`: each row draws from its own generator
            (sampling.RowGenerators), so a row's tokens do not depend on the rest of the batch.
        max_new_tokens, image_tokens_only, input_ids: Chameleon-family targets only, where
            `cond` (or `input_ids=`) is the prompt (B, T): generate N new tokens over the raw head
            (optionally restricted to image-code tokens); see speculative/chameleon_decode.py.
    Returns:
        LongTensor (B, N) of image token ids.
    """
    if getattr(target, "family", "llamagen") == "chameleon":
        from .chameleon_decode import generate_tokens

        if max_new_tokens is None:
            raise InputError("Chameleon-family targets need max_new_tokens=N")
        prompt = cond if cond is not None else input_ids
        return generate_tokens(target, prompt, max_new_tokens, greedy=greedy, image_tokens_only=image_tokens_only,
                               temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, generator=generator)
    cfg = target.config
    B = target.check_cond(cond)
    N = cfg.block_size if num_tokens is None else int(num_tokens)
    if not 1 <= N <= cfg.block_size:
        raise InputError(f"num_tokens must be in 1..{cfg.block_size}, got {N}")
    full = cfg_batch(target, cond, cfg_scale)
    cache = target.new_cache(2 * B if cfg_scale > 1.0 else B)
    if seeds is not None:
        from .sampling import RowGenerators

        if len(seeds) != B:
            raise InputError(f"{len(seeds)} seeds for {B} prompts; pass one seed per prompt")
        gen = RowGenerators(seeds, cache.lengths.device)
    else:
        gen = generator or make_generator(seed, cache.lengths.device)
    raw = target.prefill(full, cache).logits[:, -1]
    out = torch.empty(B, N, dtype=torch.long, device=raw.device)
    for i in range(N):
        if i > 0:
            x = out[:, i - 1 : i]
            x = torch.cat([x, x]) if cfg_scale > 1.0 else x
            pos, slots, mask = step_inputs(cache, x)
            raw = target.forward_tokens(x, pos, slots, mask, cache).logits[:, -1]
            cache.lengths += 1
        # Official decode step index for z_i is i - 1; guidance stops when it exceeds cfg_interval.
        use_cfg = not (cfg_interval > -1 and i - 1 > cfg_interval)
        logits = process_logits(guided_logits(raw, cfg_scale, use_cfg), temperature, top_k, top_p)
        out[:, i] = sample_from_logits(logits, gen, greedy)
        if on_token is not None:
            on_token(i + 1)
    return out
