"""VQGAN building blocks shared by the families' image decoders (resnet / attention / resampling
blocks, GroupNorm(32), swish) and the token-grid helper of `tokens_to_pixels`."""

from __future__ import annotations

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
        q = q.reshape(b, c, hh * ww).permute(0, 2, 1)  # (B, HW, C)
        k = k.reshape(b, c, hh * ww)  # (B, C, HW)
        w = torch.bmm(q, k) * (int(c) ** -0.5)
        w = F.softmax(w, dim=2)
        v = v.reshape(b, c, hh * ww)
        out = torch.bmm(v, w.permute(0, 2, 1)).reshape(b, c, hh, ww)
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
