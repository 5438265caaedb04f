"""VQGAN building blocks shared by the families' image decoders (resnet / attention / resampling
blocks, GroupNorm(32), swish, resolution levels, the mid block, the codebook, the decoder stack)
and the token-grid helper of `tokens_to_pixels`."""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import InputError


def grid_of(tokens: torch.Tensor) -> torch.Tensor:
    """(B, h, w) unchanged; (B, N) with N a square -> (B, sqrt N, sqrt N); anything else refused."""
    import math

    if not torch.is_tensor(tokens) or tokens.dtype not in (torch.long, torch.int32, torch.int64):
        raise InputError("tokens must be an integer tensor (B, N) or (B, h, w)")
    if tokens.dim() == 3:
        return tokens.long()
    if tokens.dim() == 2:
        n = math.isqrt(tokens.shape[1])
        if n * n == tokens.shape[1]:
            return tokens.long().view(tokens.shape[0], n, n)
        raise InputError(f"{tokens.shape[1]} tokens per image are not a square grid; pass them as (B, h, w)")
    raise InputError(f"tokens must be (B, N) or (B, h, w); got shape {tuple(tokens.shape)}")


def swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def group_norm(ch: int) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=32, num_channels=ch, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.in_channels, self.out_channels = cin, cout
        self.norm1 = group_norm(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1)
        self.norm2 = group_norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1, 1, 0)

    def forward(self, x):
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(swish(self.norm2(h)))
        if self.in_channels != self.out_channels:
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    """Single-head spatial self-attention with 1x1 conv projections."""

    def __init__(self, ch: int):
        super().__init__()
        self.norm = group_norm(ch)
        self.q = nn.Conv2d(ch, ch, 1)
        self.k = nn.Conv2d(ch, ch, 1)
        self.v = nn.Conv2d(ch, ch, 1)
        self.proj_out = nn.Conv2d(ch, ch, 1)

    def forward(self, x):
        h = self.norm(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        b, c, hh, ww = q.shape
        # TensorRT's fused-attention form (docs/tensorrt.md): scale on Q before BMM1, P x V
        q = q.reshape(b, c, hh * ww).permute(0, 2, 1) * (int(c) ** -0.5)  # (B, HW, C)
        k = k.reshape(b, c, hh * ww)  # (B, C, HW)
        w = F.softmax(torch.bmm(q, k), dim=-1)
        v = v.reshape(b, c, hh * ww).permute(0, 2, 1)  # (B, HW, C)
        out = torch.bmm(w, v).permute(0, 2, 1).reshape(b, c, hh, ww)
        return x + self.proj_out(out)


class Downsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, 2, 0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1), mode="constant", value=0))


class Upsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, 1, 1)

    def forward(self, x):
        dtype = x.dtype
        x = F.interpolate(x.float(), scale_factor=2.0, mode="nearest").to(dtype)
        return self.conv(x)


class Level(nn.Module):
    """One resolution level: `n_res` ResnetBlocks, each followed by an AttnBlock when `with_attn`,
    then an optional 2x resampler (`downsample` / `upsample`). `blocks` names the ResnetBlock list
    in the state dict (taming / transformers: "block", LlamaGen: "res")."""

    def __init__(self, cin: int, cout: int, n_res: int, with_attn: bool, resample: Optional[str] = None,
                 blocks: str = "block"):
        super().__init__()
        self._blocks = blocks
        setattr(self, blocks, nn.ModuleList())
        self.attn = nn.ModuleList()
        for _ in range(n_res):
            getattr(self, blocks).append(ResnetBlock(cin, cout))
            cin = cout
            if with_attn:
                self.attn.append(AttnBlock(cout))
        if resample == "down":
            self.downsample = Downsample(cout)
        elif resample == "up":
            self.upsample = Upsample(cout)

    def forward(self, h):
        for j, block in enumerate(getattr(self, self._blocks)):
            h = block(h)
            if len(self.attn):
                h = self.attn[j](h)
        if hasattr(self, "downsample"):
            h = self.downsample(h)
        if hasattr(self, "upsample"):
            h = self.upsample(h)
        return h


class Mid(nn.Module):
    """`block_1`, `attn_1` (an AttnBlock, or Identity without attention), `block_2`."""

    def __init__(self, ch: int, attn: bool = True):
        super().__init__()
        self.block_1, self.attn_1, self.block_2 = ResnetBlock(ch, ch), AttnBlock(ch) if attn else nn.Identity(), \
            ResnetBlock(ch, ch)

    def forward(self, h):
        return self.block_2(self.attn_1(self.block_1(h)))


class Codebook(nn.Module):
    """`embedding` (n, d): the VQ codebook under the name `quantize.embedding`."""

    def __init__(self, n: int, d: int):
        super().__init__()
        self.embedding = nn.Embedding(n, d)


class VQDecoder(nn.Module):
    """conv_in -> mid -> `up` levels (ResnetBlocks (+ attention), 2x upsampling but the finest) ->
    swish(norm_out) -> conv_out.

    Args:
        attn_at: level index i (0 = finest) -> whether its blocks carry attention.
        finest_first: `up[0]` is the finest level (taming's layout, run in reverse), else the
            coarsest (transformers' Janus layout, run in order).
        mid_attn: the mid block's attention (Identity without).
    """

    def __init__(self, z_channels: int, ch: int, ch_mult, num_res_blocks: int, out_channels: int,
                 attn_at: Callable[[int], bool], finest_first: bool = False, mid_attn: bool = True):
        super().__init__()
        n = len(ch_mult)
        cin = ch * ch_mult[-1]
        self.finest_first = finest_first
        self.conv_in = nn.Conv2d(z_channels, cin, 3, 1, 1)
        self.mid = Mid(cin, mid_attn)
        levels = []
        for i in reversed(range(n)):  # coarsest first
            levels.append(Level(cin, ch * ch_mult[i], num_res_blocks + 1, attn_at(i), "up" if i else None))
            cin = ch * ch_mult[i]
        self.up = nn.ModuleList(levels[::-1] if finest_first else levels)
        self.norm_out = group_norm(cin)
        self.conv_out = nn.Conv2d(cin, out_channels, 3, 1, 1)

    def forward(self, z):
        h = self.mid(self.conv_in(z))
        for level in (reversed(self.up) if self.finest_first else self.up):
            h = level(h)
        return self.conv_out(swish(self.norm_out(h)))
