"""The reference autoregressive loop for Janus image tokens, with classifier-free guidance.

This is the plain one-token-at-a-time loop the speculative decoders are measured against; it
mirrors transformers' `JanusForConditionalGeneration.generate(generation_mode="image")`:

    rows = [cond; uncond]                  uncond = null_cond(cond) (BOS / BOI kept, rest PAD)
    l_c, l_u = generation-head logits of the last position of each half
    guided = l_u + (l_c - l_u) * G         (ClassifierFreeGuidanceLogitsProcessor, CFG eq. 6)
    z_t = argmax(guided)                   or a sample of softmax(guided / temperature)
    feed z_t to BOTH halves through the generation embeddings; repeat block_size times

With G == 1 there are no unconditional rows (guided = l_c). transformers 5.24 itself fails for
guidance_scale <= 1 (its loop doubles the batch but then skips the CFG processor).

Greedy codes equal transformers' when the checkpoint's generation_config adds no other logits
processors (repetition penalty etc.). Sampling draws from softmax(guided / temperature) with
its own generator: it does not replay transformers' RNG stream nor its default top_k=50.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...errors import InputError
from . import cond as C


def cfg_mix(cond_logits: torch.Tensor, uncond_logits: torch.Tensor, scale: float) -> torch.Tensor:
    """uncond + (cond - uncond) * scale, in transformers' order of operations."""
    return uncond_logits + (cond_logits - uncond_logits) * scale


def _pick(logits: torch.Tensor, greedy: bool, temperature: float, gen) -> torch.Tensor:
    if greedy:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


@torch.no_grad()
def generate_image_tokens(target, prompt_ids, cfg_scale: float = 5.0, greedy: bool = True,
                          temperature: float = 1.0, seed: Optional[int] = None) -> torch.Tensor:
    """Image codes (B, block_size) for Janus prompts, KV-cached, with CFG.

    Args:
        target: a JanusTarget.
        prompt_ids: (B, T) prompt ids, or (ids, mask) for left-padded batches (cond.py).
        cfg_scale: guidance G (1: no unconditional rows).
        greedy: argmax (True) or sampling at `temperature` with a generator seeded by `seed`.
    Returns:
        (B, N) LongTensor of codebook indices in raster order.
    """
    if not greedy and not temperature > 0:
        raise InputError(f"temperature must be > 0 for sampling, got {temperature}")
    B = target.check_cond(prompt_ids)
    ids, valid = C.split_cond(prompt_ids)
    guided_rows = cfg_scale != 1
    if guided_rows:
        null, _ = target.null_cond((ids, valid))
        ids, valid = torch.cat([ids, null]), torch.cat([valid, valid])
    rows, T, N = ids.shape[0], ids.shape[1], target.config.block_size
    dev = target.output.weight.device
    gen = torch.Generator(dev).manual_seed(seed) if seed is not None else None
    cache = target.new_cache(rows, max_len=T + N)
    logits = target.prefill((ids.to(dev), valid.to(dev)), cache).logits[:, -1]  # (rows, V)
    out = torch.empty(B, N, dtype=torch.long, device=dev)
    one = torch.ones(rows, 1, 1, dtype=torch.bool, device=dev)
    for i in range(N):
        mixed = cfg_mix(logits[:B], logits[B:], cfg_scale) if guided_rows else logits
        out[:, i] = _pick(mixed, greedy, temperature, gen)
        if i == N - 1:
            break
        tok = out[:, i:i + 1].repeat(rows // B, 1)  # the same code for both halves
        slots = cache.lengths[:, None]
        logits = target.forward_tokens(tok, cache.positions(slots), slots, cache.attention_mask(slots, one),
                                       cache).logits[:, -1]
        cache.lengths += 1
    return out
