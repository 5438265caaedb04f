"""Rotary position embeddings over a 2-D token grid (LlamaGen's layout; drafters reuse it)."""

from __future__ import annotations


import torch


def precompute_freqs_cis_2d(grid_size: int, n_elem: int, base: float = 10000.0,
                            cls_token_num: int = 1) -> torch.Tensor:
    """cos/sin table (cls_token_num + grid^2, n_elem // 2, 2), fp32.

    Half of the rotation pairs use the row index, half the column (row first). The first
    `cls_token_num` rows are all zero, so q and k of the condition prefix are exactly zero.
    """
    half = n_elem // 2
    freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    t = torch.arange(grid_size, device=freqs.device)
    freqs = torch.outer(t, freqs)  # (grid, half // 2)
    grid = torch.cat([freqs[:, None, :].expand(-1, grid_size, -1),
                      freqs[None, :, :].expand(grid_size, -1, -1)], dim=-1)  # (g, g, half)
    cache = torch.stack([torch.cos(grid), torch.sin(grid)], dim=-1).flatten(0, 1)  # (g*g, half, 2)
    return torch.cat([torch.zeros(cls_token_num, half, 2), cache])


def apply_rotary_emb(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs (2j, 2j+1). x (B, S, H, D); freqs (B or 1, S, D // 2, 2)."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)  # (B, S, H, D/2, 2)
    f = freqs.unsqueeze(2)  # (B, S, 1, D/2, 2)
    out = torch.stack([xs[..., 0] * f[..., 0] - xs[..., 1] * f[..., 1],
                       xs[..., 1] * f[..., 0] + xs[..., 0] * f[..., 1]], dim=-1)
    return out.flatten(3).type_as(x)


# ----------------------------------------------------------------------------- layers
