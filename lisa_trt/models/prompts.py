"""Token-id prompts, the condition of prompt-id families (Chameleon, Janus), and the pieces of a
left-padded prefill every such family shares (per-row positions through KVCache.pad)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..errors import InputError


@dataclass
class Prompts:
    """A batch of token-id prompts: the condition of prompt-id families (Chameleon, Janus).

    ids (B, T) LEFT-padded, valid (B, T) False on padding; uncond: the unconditional rows of
    CFG when the protocol defines them (Lumina-mGPT: the image span's prefix alone), else None
    (CFG needs them)."""

    ids: torch.Tensor
    valid: torch.Tensor
    uncond: Optional["Prompts"] = None

    @property
    def batch(self) -> int:
        return self.ids.shape[0]

    @classmethod
    def of(cls, cond, valid: Optional[torch.Tensor] = None) -> "Prompts":
        """ids (B, T), (ids, valid) or Prompts -> Prompts."""
        if isinstance(cond, Prompts):
            return cond
        if isinstance(cond, (tuple, list)) and len(cond) == 2:
            cond, valid = cond
        if not torch.is_tensor(cond) or cond.dim() != 2 or cond.dtype not in (torch.long, torch.int32):
            raise InputError("a prompt must be a 2-D integer tensor of token ids (B, T), optionally with a "
                             "(B, T) bool mask of real tokens: (ids, valid)")
        valid = torch.ones(cond.shape, dtype=torch.bool, device=cond.device) if valid is None else valid.to(torch.bool)
        if tuple(valid.shape) != tuple(cond.shape):
            raise InputError(f"prompt mask shape {tuple(valid.shape)} does not match the ids {tuple(cond.shape)}")
        return cls(cond.long(), valid)

    @classmethod
    def from_rows(cls, rows, device) -> "Prompts":
        """Left-pad lists of ids -> Prompts."""
        T = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), T, dtype=torch.long, device=device)
        valid = torch.zeros(len(rows), T, dtype=torch.bool, device=device)
        for i, r in enumerate(rows):
            ids[i, T - len(r):] = torch.tensor(list(r), dtype=torch.long)
            valid[i, T - len(r):] = True
        return cls(ids, valid)

    def cat(self, other: "Prompts") -> "Prompts":
        """Rows of self then other, re-left-padded to one width."""
        T = max(self.ids.shape[1], other.ids.shape[1])

        def pad(p):
            n = T - p.ids.shape[1]
            return (torch.nn.functional.pad(p.ids, (n, 0)), torch.nn.functional.pad(p.valid, (n, 0)))

        (a, av), (b, bv) = pad(self), pad(other)
        return Prompts(torch.cat([a, b]), torch.cat([av, bv]))


def negative_texts(negative, n: int) -> Optional[list]:
    """A negative prompt -> one entry per prompt (str, or None: the prompter's own unconditional
    row), or None when no row has one.

    negative: None, one text for all `n` prompts, or a sequence of n texts (None or blank: none
    for that prompt). InputError for anything else."""
    if negative is None:
        return None
    rows = [negative] * n if isinstance(negative, str) else negative
    if not isinstance(rows, (list, tuple)) or not all(t is None or isinstance(t, str) for t in rows):
        raise InputError(f"negative_prompt must be a text or a list of texts (one per prompt); got {negative!r}")
    if len(rows) != n:
        raise InputError(f"negative_prompt has {len(rows)} texts for {n} prompts; pass one text for all, "
                         "or one per prompt")
    rows = [t if t is not None and t.strip() else None for t in rows]
    return rows if any(t is not None for t in rows) else None


def with_mask(cond, attention_mask=None):
    """Prompt ids (B, T) and an attention mask -> the condition pair (ids, mask); `cond` as is
    without a mask. InputError when a pair that already carries its mask gets another."""
    if attention_mask is None:
        return cond
    if not torch.is_tensor(cond):
        raise InputError("attention_mask goes with prompt ids (B, T) passed alone; a condition pair "
                         "(ids, mask) already carries its mask")
    return cond, attention_mask


def prefill_plan(input_ids: torch.Tensor, cache, valid: Optional[torch.Tensor] = None):
    """Reset `cache` for a (left-padded) prompt; (slots, positions, mask (B, T, Lmax)) of its tokens.

    Shared by the torch target and the exported-graph runners (engines/prompt_graph.py)."""
    B, T = input_ids.shape
    if B != cache.batch:
        raise InputError(f"prompt batch {B} does not match the cache batch {cache.batch}")
    if T > cache.max_len:
        raise InputError(f"prompt of {T} tokens does not fit a cache of {cache.max_len}")
    dev = input_ids.device
    valid = torch.ones(B, T, dtype=torch.bool, device=dev) if valid is None else valid.to(torch.bool)
    if (valid[:, 1:].int() < valid[:, :-1].int()).any() or not valid[:, -1].all():
        raise InputError("prompts must be left-padded: padding first, then the real tokens")
    cache.pad = (~valid).sum(1)
    cache.col_valid[:] = True
    cache.col_valid[:, :T] = valid
    cache.lengths.zero_()
    slots = torch.arange(T, device=dev)[None].expand(B, T)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=dev))[None].expand(B, T, T)
    mask = cache.attention_mask(slots, causal) & cache.col_valid[:, None, :]
    mask[:, :, :T] |= torch.eye(T, dtype=torch.bool, device=dev)  # padded rows see themselves
    return slots, cache.positions(slots).clamp(min=0), mask


class PromptTarget:
    """The condition protocol of a prompt-id target (models/family.py), shared by the torch model
    and its exported-graph runners: `config.vocab_size` is all it reads."""

    def check_ids(self, ids: torch.Tensor) -> None:
        if not torch.is_tensor(ids) or ids.dim() != 2 or ids.dtype not in (torch.long, torch.int32):
            raise InputError("input_ids must be a 2-D integer tensor (B, T)")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise InputError(f"token ids must be in 0..{self.config.vocab_size - 1}; got "
                             f"{int(ids.min())}..{int(ids.max())}")

    def check_cond(self, cond) -> int:
        """Validate a prompt condition (ids, (ids, valid) or Prompts); returns the batch size."""
        p = Prompts.of(cond)
        self.check_ids(p.ids)
        return p.batch

    def null_cond(self, cond) -> Prompts:
        """The CFG unconditional rows the prompt carries (Prompts.uncond)."""
        p = Prompts.of(cond)
        if p.uncond is None:
            raise InputError("classifier-free guidance needs the unconditional rows: build the prompt with the "
                             "family's prompter (family_of(cfg).prompter(target).encode(..., cfg=True)), or use cfg_scale 1")
        return p.uncond

    @staticmethod
    def cfg_rows(cond, null) -> Prompts:
        """[cond; null] as one left-padded batch."""
        return Prompts.of(cond).cat(Prompts.of(null))

    def prompt_len(self, cond) -> int:
        """Cache slots the prefill of `cond` writes (its padded width)."""
        return Prompts.of(cond).ids.shape[1]
