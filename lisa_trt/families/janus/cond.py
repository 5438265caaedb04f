"""Janus prompt conditions: validation, the unconditional rows of CFG, random examples.

A condition is `prompt_ids` (B, T) LongTensor, or `(prompt_ids, attention_mask)` with a
(B, T) bool mask (1/0 integers are accepted) for LEFT-padded batches: padding first, then each
row's real tokens, or a models/prompts.Prompts (ids, valid) that may carry its own unconditional
rows (`uncond`: the prompter's negative texts). A prompt is already in Janus' image-generation
format (chat template, ending in `<begin_of_image>`); tokenising text is not this module's job.

The unconditional rows are the ones the condition carries, else built exactly as transformers'
`JanusForConditionalGeneration.generate(generation_mode="image")` builds them: a copy of the
prompt in which every token that is neither BOS nor BOI becomes PAD, with the same attention mask.
`cfg_rows` joins [cond; null]: by concatenation when both are plain (ids, mask) forms (always the
same width), re-left-padded to one shared width (Prompts.cat) when either carries rows of its own.
"""

from __future__ import annotations

from typing import Union

import torch

from ...errors import ConfigError, InputError
from ...models.prompts import Prompts

Cond = Union[torch.Tensor, tuple]
_INT = (torch.int64, torch.int32, torch.int16, torch.uint8)


def split_cond(cond: Cond) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt_ids (B, T) long, valid (B, T) bool) of a condition (all valid for bare ids)."""
    if isinstance(cond, Prompts):
        ids, mask = cond.ids, cond.valid
    elif isinstance(cond, (tuple, list)):
        if len(cond) != 2:
            raise InputError("a Janus condition is prompt_ids (B, T) or a pair (prompt_ids, attention_mask)")
        ids, mask = cond
    else:
        ids, mask = cond, None
    if not torch.is_tensor(ids) or ids.dim() != 2 or ids.dtype not in _INT:
        raise InputError("prompt_ids must be a 2-D integer tensor (B, T) of text token ids")
    if mask is None:
        return ids.long(), torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
    if not torch.is_tensor(mask) or tuple(mask.shape) != tuple(ids.shape):
        got = tuple(mask.shape) if torch.is_tensor(mask) else type(mask).__name__
        raise InputError(f"attention_mask must be a (B, T) tensor like prompt_ids {tuple(ids.shape)}; got {got}")
    if mask.dtype != torch.bool:
        if mask.dtype not in _INT or ((mask != 0) & (mask != 1)).any():
            raise InputError("attention_mask must be bool (or 0/1 integers): True on real prompt tokens")
        mask = mask.bool()
    return ids.long(), mask.to(ids.device)


def check_cond(cfg, cond: Cond, budget: bool = True) -> int:
    """Validate a prompt condition for `cfg` (JanusConfig); returns the batch size B.

    budget: prompts must fit `cfg.max_prompt_tokens` (the prompt slots of exported engines and
    of default caches); False: only what the model's positions allow (a prompt plus one image
    within max_position_embeddings), for a torch target whose caches are sized per prompt."""
    ids, valid = split_cond(cond)
    B, T = ids.shape
    if B == 0 or T == 0:
        raise InputError(f"prompt_ids has shape {(B, T)}: need at least one row of at least one token")
    room = cfg.max_position_embeddings - cfg.num_image_tokens
    if not budget and T > room:
        raise InputError(f"prompt of {T} tokens + {cfg.num_image_tokens} image tokens exceed this checkpoint's "
                         f"max_position_embeddings {cfg.max_position_embeddings}; shorten the prompt to at most "
                         f"{room} tokens")
    if budget and T > cfg.max_prompt_tokens:
        raise InputError(f"prompt of {T} tokens exceeds the prompt budget max_prompt_tokens={cfg.max_prompt_tokens}; "
                         "shorten the prompt or raise the budget (load the target with "
                         f"config={{'max_prompt_tokens': {T}}}, or target.set_max_prompt_tokens({T}))")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= cfg.text_vocab_size:
        raise InputError(f"prompt token ids must be in 0..{cfg.text_vocab_size - 1} (the text vocabulary); "
                         f"got {lo}..{hi}")
    if (valid[:, 1:].int() < valid[:, :-1].int()).any() or not valid[:, -1].all():
        raise InputError("prompts must be LEFT-padded: attention_mask False on the padding first, then True "
                         "on every real token up to the end of the row")
    return B


def null_ids(cfg, ids: torch.Tensor) -> torch.Tensor:
    """Unconditional prompt ids: BOS and BOI kept, every other token replaced by PAD."""
    missing = [n for n in ("bos_token_id", "boi_token_id", "pad_token_id") if getattr(cfg, n) is None]
    if missing:
        raise ConfigError(f"classifier-free guidance needs {', '.join(missing)} (generation_config.json: "
                          "bos_token_id, pad_token_id, generation_kwargs.boi_token_id); add them there or "
                          "load with config={...} overrides, or generate with cfg_scale=1")
    keep = (ids == cfg.bos_token_id) | (ids == cfg.boi_token_id)
    return torch.where(keep, ids, torch.full_like(ids, cfg.pad_token_id))


def null_cond(cfg, cond: Cond) -> Cond:
    """The unconditional condition for CFG: the rows a Prompts carries (`uncond`, the same batch,
    their own width), else the same form and shape as `cond` (null_ids)."""
    if isinstance(cond, Prompts):
        if cond.uncond is not None:
            if cond.uncond.batch != cond.batch:
                raise InputError(f"the condition carries {cond.uncond.batch} unconditional rows for {cond.batch} "
                                 "prompts; pass one per prompt")
            return cond.uncond
        return Prompts(null_ids(cfg, cond.ids), cond.valid)
    if isinstance(cond, (tuple, list)):
        ids, mask = cond
        return null_ids(cfg, ids), mask
    return null_ids(cfg, cond)


def cfg_rows(cond: Cond, null: Cond) -> Cond:
    """[cond; null] as one batch: concatenated (the form of `cond`) when neither is a Prompts,
    else one left-padded Prompts of the wider width (a negative text's rows may differ in width)."""
    if isinstance(cond, Prompts) or isinstance(null, Prompts):
        return Prompts(*split_cond(cond)).cat(Prompts(*split_cond(null)))
    if isinstance(cond, (tuple, list)):
        return tuple(torch.cat([c, n]) for c, n in zip(split_cond(cond), split_cond(null)))
    return torch.cat([cond, null])


def example_cond(cfg, batch: int, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random left-padded prompts (ids, mask): [BOS] random text [BOI] when those ids are known."""
    T = min(12, cfg.max_prompt_tokens)
    ids = torch.randint(0, cfg.text_vocab_size, (batch, T), generator=generator)
    n = torch.randint(max(1, T // 2), T + 1, (batch,), generator=generator)
    mask = torch.arange(T)[None, :] >= (T - n)[:, None]
    if cfg.pad_token_id is not None:
        ids = ids.masked_fill(~mask, cfg.pad_token_id)
    if cfg.boi_token_id is not None:
        ids[:, -1] = cfg.boi_token_id
    if cfg.bos_token_id is not None:
        rows = (n > 1).nonzero().flatten()  # a one-token row keeps just BOI
        ids[rows, T - n[rows]] = cfg.bos_token_id
    return ids, mask
