"""Building blocks every target family shares: RMSNorm, the static KV cache (per-row positions
through `pad`), cached attention over explicit (tree) masks, and the targets' output record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import TargetConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        out = xf * torch.rsqrt(torch.mean(xf * xf, dim=-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


def cached_attention(q, k, v, mask, kv: Optional[tuple] = None, slots=None):
    """SDPA of q (B, H, S, D) over k / v (B, Hkv, S, D); with a static cache kv = (k_cache,
    v_cache) (B, Hkv, L, D) the new K/V are first written at cache `slots` (B, S) and attention
    reads the whole cache. GQA: query head h reads kv head h // (H / Hkv). mask (B, 1, S, L)
    bool, or None for causal attention over the new tokens alone."""
    B, n_kv, S, D = k.shape
    if kv is not None:
        k_cache, v_cache = kv
        idx = slots[:, None, :, None].expand(B, n_kv, S, D)
        k_cache.scatter_(2, idx, k.to(k_cache.dtype))
        v_cache.scatter_(2, idx, v.to(v_cache.dtype))
        k, v = k_cache, v_cache
    rep = q.shape[1] // n_kv
    if rep != 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)


@dataclass
class TargetOutput:
    logits: torch.Tensor  # (B, S, V) fp32
    taps: Optional[torch.Tensor] = None  # (B, S, 3H): residual stream entering the tap layers
    hidden: Optional[torch.Tensor] = None  # (B, S, H): final normed hidden state


class KVCache:
    """Static, preallocated K/V per layer, (B, H_kv, Lmax, D), written at absolute slots.

    `lengths` (B,) is the committed length of each row (prefix included); `col_valid` (B, Lmax)
    is False for padded t2i text slots, which no query may attend to (except themselves).
    `pad` (B,) is the number of left-padding slots of each row whose positions count from its
    first real token (prompt-id families); `positions(slots)` = slots - pad is the RoPE position
    of a token at those slots (LlamaGen: pad 0, positions are the slots).
    """

    def __init__(self, cfg: TargetConfig, batch: int, max_len: int, dtype, device):
        shape = (batch, cfg.kv_heads, max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layer)]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.col_valid = torch.ones(batch, max_len, dtype=torch.bool, device=device)
        self.pad = torch.zeros(batch, dtype=torch.long, device=device)
        self.max_len = max_len

    def positions(self, slots: torch.Tensor) -> torch.Tensor:
        """RoPE positions (B, S) of tokens at cache `slots` (B, S): slots - pad."""
        return slots - self.pad[:, None]

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    def attention_mask(self, slots: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
        """(B, S, Lmax) bool: committed columns plus each node's ancestors' slots (self included).

        Args:
            slots: (B, S) cache slots of the new nodes.
            ancestors: (B, S, S) bool, ancestors[b, i, j] = node j is an ancestor of i (or i == j).
        """
        B, S = slots.shape
        cols = torch.arange(self.max_len, device=slots.device)
        mask = (cols[None, :] < self.lengths[:, None]) & self.col_valid  # (B, L)
        mask = mask[:, None, :].expand(B, S, self.max_len).clone()
        tree = torch.zeros(B, S, self.max_len, dtype=torch.bool, device=slots.device)
        tree.scatter_(2, slots[:, None, :].expand(B, S, S), ancestors)
        return mask | tree

    def compact(self, src_slots: torch.Tensor, counts: torch.Tensor) -> None:
        """Copy rows src_slots[b, :counts[b]] to lengths[b] + (0..counts[b]-1); lengths += counts.

        Entries past counts[b] are padding: they are written past the new length, where no
        mask can see them and the next step overwrites them.
        """
        B, A = src_slots.shape
        if A == 0:
            return
        src = src_slots.clamp(min=0)
        dst = (self.lengths[:, None] + torch.arange(A, device=src.device)[None, :]).clamp(max=self.max_len - 1)
        if src.device.type == "cpu":
            # Only entries that move matter: the root and an accepted first child usually sit at
            # their destination already, and padding (j >= counts) is never read.
            moved = ((src != dst) & (torch.arange(A)[None, :] < counts[:, None])).any(0).nonzero().flatten()
            if not moved.numel():
                self.lengths += counts
                return
            A = int(moved.max()) + 1
            src, dst = src[:, :A], dst[:, :A]
        for buf in self.k + self.v:
            H, D = buf.shape[1], buf.shape[3]
            rows = buf.gather(2, src[:, None, :, None].expand(B, H, A, D))
            buf.scatter_(2, dst[:, None, :, None].expand(B, H, A, D), rows)
        self.lengths += counts

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only batch rows `index` (e.g. drop finished prompts)."""
        self.k = [t[index] for t in self.k]
        self.v = [t[index] for t in self.v]
        self.lengths = self.lengths[index]
        self.col_valid = self.col_valid[index]
        self.pad = self.pad[index]
