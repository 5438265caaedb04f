"""Rotary position embeddings over a 2-D token grid (LlamaGen's layout; drafters reuse it)."""

from __future__ import annotations


import torch


def precompute_freqs_cis_2d(grid, n_elem: int, base: float = 10000.0,
                            cls_token_num: int = 1) -> torch.Tensor:
    """cos/sin table (cls_token_num + h * w, n_elem // 2, 2), fp32, over an (h, w) token grid.

    `grid` is the family's (height, width) in tokens (its config's `grid_hw`) or one int for a
    square grid. Token i is cell (i // w, i % w) (row-major). Half of the rotation pairs use the
    row index, half the column (row first). The first `cls_token_num` rows are all zero, so q
    and k of the condition prefix are exactly zero.
    """
    h, w = grid_hw(grid)
    half = n_elem // 2
    freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    rows = torch.outer(torch.arange(h, device=freqs.device), freqs)  # (h, half // 2)
    cols = torch.outer(torch.arange(w, device=freqs.device), freqs)  # (w, half // 2)
    cells = torch.cat([rows[:, None, :].expand(-1, w, -1),
                       cols[None, :, :].expand(h, -1, -1)], dim=-1)  # (h, w, half)
    cache = torch.stack([torch.cos(cells), torch.sin(cells)], dim=-1).flatten(0, 1)  # (h*w, half, 2)
    return torch.cat([torch.zeros(cls_token_num, half, 2), cache])


def grid_hw(grid) -> tuple[int, int]:
    """(height, width) of a token grid given as (h, w) or as the side of a square."""
    if isinstance(grid, int):
        return grid, grid
    h, w = (int(x) for x in grid)
    return h, w


def apply_rotary_emb(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs (2j, 2j+1). x (B, S, H, D); freqs (B or 1, S, D // 2, 2)."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)  # (B, S, H, D/2, 2)
    f = freqs.unsqueeze(2)  # (B, S, 1, D/2, 2)
    out = torch.stack([xs[..., 0] * f[..., 0] - xs[..., 1] * f[..., 1],
                       xs[..., 1] * f[..., 0] + xs[..., 0] * f[..., 1]], dim=-1)
    return out.flatten(3).type_as(x)


# ----------------------------------------------------------------------------- layers
