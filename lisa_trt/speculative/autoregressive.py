"""The reference autoregressive loop (LlamaGen generate.py semantics) on the static KV cache.

One loop for every family: the family answers what is generated (models/family.py
`SequenceLayout`: how many tokens, which ids may be sampled, which are forced) and what the
condition and its CFG rows are; the loop only prefills, steps and samples.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..errors import InputError
from ..models.family import SequenceLayout, family_of
from ..models.prompts import with_mask
from .sampling import cfg_active, guided_logits, make_generator, process_logits, sample_from_logits


def cfg_batch(target, cond, cfg_scale: float):
    """[cond; uncond] when CFG is on (sampling.cfg_active), else cond unchanged.

    A target whose conditions need more than concatenation (prompts of different lengths,
    re-left-padded together) provides `cfg_rows(cond, null)`."""
    if not cfg_active(cfg_scale):
        return cond
    null = target.null_cond(cond)
    rows = getattr(target, "cfg_rows", None)
    if rows is not None:
        return rows(cond, null)
    if isinstance(cond, (tuple, list)):
        return tuple(torch.cat([c, n]) for c, n in zip(cond, null))
    return torch.cat([cond, null])


def layout_for(target, num_tokens: Optional[int] = None, image_tokens_only: bool = False) -> SequenceLayout:
    """The family's layout of `num_tokens` free tokens (default: the whole image)."""
    return family_of(target.config).free_layout(target, num_tokens, image_tokens_only)


def new_target_cache(target, rows: int, full_cond, n_tokens: int, extra: int = 0):
    """A target cache for `rows` rows: the prompt of `full_cond`, n_tokens and `extra` scratch."""
    return target.new_cache(rows, extra=extra, prompt_len=target.prompt_len(full_cond), n_tokens=n_tokens)


def step_inputs(cache, tokens: torch.Tensor):
    """Positions, slots and mask for one new token per row appended at `cache.lengths`."""
    B = tokens.shape[0]
    slots = cache.lengths[:, None]  # (B, 1)
    ones = torch.ones(B, 1, 1, dtype=torch.bool, device=tokens.device)
    return cache.positions(slots), slots, cache.attention_mask(slots, ones)


@torch.no_grad()
def generate(target, cond=None, *, cfg_scale: float = 1.0, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, greedy: bool = False, seed: Optional[int] = None,
             cfg_interval: int = -1, num_tokens: Optional[int] = None,
             generator: Optional[torch.Generator] = None,
             on_token: Optional[Callable[[int], None]] = None, seeds=None, max_new_tokens: Optional[int] = None,
             image_tokens_only: bool = False, input_ids: Optional[torch.Tensor] = None,
             attention_mask: Optional[torch.Tensor] = None,
             layout: Optional[SequenceLayout] = None, on_step=None) -> torch.Tensor:
    """Sample tokens with the plain AR loop.

    Args:
        target: a target of any family (torch model or engines.graph target), eval mode.
        cond: the family's condition: LlamaGen c2i class ids (B,), t2i (caption_features
            (B, 120, C), caption_mask (B, 120)); prompt-id families (Chameleon, Janus) the prompt
            ids (B, T) (also as `input_ids=`), (ids, valid) or models.chameleon.Prompts.
        cfg_scale: guidance scale; CFG runs as batch [cond; uncond] when > 1.
        greedy: argmax of the guided logits instead of sampling.
        seed: seeds a private torch.Generator (the global RNG is untouched).
        cfg_interval: guidance off after this decode step (-1: always on).
        num_tokens / max_new_tokens: tokens to generate (default: the family's whole image;
            Chameleon's raw head has none and needs it).
        image_tokens_only: restrict sampling to the image-code tokens (families whose head is
            wider than the codebook).
        attention_mask: with prompt ids, (B, T) bool or 0/1, True on the real tokens of LEFT-
            padded prompts (transformers' name): the same as passing (ids, attention_mask).
        layout: the family's SequenceLayout of this request (overrides the three above).
        on_token: called with the number of tokens done after each step (progress bars).
        on_step: the per-step hook of every decode loop (run.py `run_method`).
        seeds: one seed per row instead of `seed`: each row draws from its own generator
            (sampling.RowGenerators), so a row's tokens do not depend on the rest of the batch.
    Returns:
        LongTensor (B, N) of token ids.
    """
    cond = with_mask(cond if cond is not None else input_ids, attention_mask)
    B = target.check_cond(cond)
    if layout is None:
        layout = layout_for(target, num_tokens if num_tokens is not None else max_new_tokens, image_tokens_only)
    N = layout.n_tokens
    cfg = cfg_active(cfg_scale)
    full = cfg_batch(target, cond, cfg_scale)
    cache = new_target_cache(target, 2 * B if cfg else B, full, N)
    if seeds is not None:
        from .sampling import RowGenerators

        if len(seeds) != B:
            raise InputError(f"{len(seeds)} seeds for {B} prompts; pass one seed per prompt")
        gen = RowGenerators(seeds, cache.lengths.device)
    else:
        gen = generator or make_generator(seed, cache.lengths.device)
    raw = target.prefill(full, cache).logits[:, -1]
    out = torch.empty(B, N, dtype=torch.long, device=raw.device)
    forced = None if layout.forced is None else layout.forced.tolist()

    entry = [True]  # the prefill's logits are checked (where data enters); later steps under the debug switch

    def process(x):
        check, entry[0] = (True if entry[0] else None), False
        return process_logits(x, temperature, top_k, top_p, check=check)

    for i in range(N):
        if i > 0:
            x = out[:, i - 1 : i]
            x = torch.cat([x, x]) if cfg else x
            pos, slots, mask = step_inputs(cache, x)
            raw = target.forward_tokens(x, pos, slots, mask, cache).logits[:, -1]
            cache.lengths += 1
        if forced is not None and forced[i] >= 0:  # never sampled: no random draw either
            out[:, i] = forced[i]
        else:
            # Official decode step index for z_i is i - 1; guidance stops when it exceeds cfg_interval.
            use_cfg = not (cfg_interval > -1 and i - 1 > cfg_interval)
            logits = layout.law(guided_logits(raw, cfg_scale, use_cfg), None, process)
            out[:, i] = sample_from_logits(logits, gen, greedy)
        if on_token is not None:
            on_token(i + 1)
        if on_step is not None:
            on_step(out, torch.full((B,), i + 1, dtype=torch.long, device=out.device))
    return out
