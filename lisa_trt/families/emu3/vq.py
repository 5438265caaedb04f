"""Emu3's VQ-VAE decoder for still images, with transformers' Emu3VQVAE parameter names.

transformers decodes an image as a 4-frame video (the temporal stack upsamples 1 -> 4 frames)
and keeps frame 0. Every temporal convolution is causal (2 zero frames padded before), nearest
upsampling repeats frames, and BatchNorm (eval) is per frame, so frame 0 depends on the single
input frame only: a causal 3-tap Conv3d on it is a Conv2d with the last temporal tap, and the
upsampling is the identity. This decoder computes frame 0 that way (one frame, 2-D ops only,
a quarter of the work); tests/families/test_emu3.py checks it against transformers'
`decode_image_tokens`. No torch.chunk over the batch: the two halves (post-quant latents and
the quantised codes that condition every SpatialNorm) run the temporal stack separately, so an
exported graph keeps its batch axis dynamic.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...errors import InputError
from ...models.vqgan import grid_of, swish
from .config import Emu3VQConfig


class FrameConv3d(nn.Module):
    """transformers' causal `Emu3VQVAEConv3d` (`conv`: the Conv3d) applied to one frame."""

    def __init__(self, cin: int, cout: int, kernel: tuple):
        super().__init__()
        self.conv = nn.Conv3d(cin, cout, kernel)
        self.pad = kernel[-1] // 2

    def forward(self, x):  # (B, C, h, w)
        return F.conv2d(x, self.conv.weight[:, :, -1], self.conv.bias, padding=self.pad)


class TimeResBlock(nn.Module):
    """Temporal resnet block (BatchNorm3d, causal 3x3x3 convs) on one frame."""

    def __init__(self, ch: int):
        super().__init__()
        self.norm1, self.norm2 = nn.BatchNorm3d(ch), nn.BatchNorm3d(ch)
        self.conv1, self.conv2 = FrameConv3d(ch, ch, (3, 3, 3)), FrameConv3d(ch, ch, (3, 3, 3))

    @staticmethod
    def _bn(norm: nn.BatchNorm3d, x):
        return F.batch_norm(x, norm.running_mean, norm.running_var, norm.weight, norm.bias, False, 0.0, norm.eps)

    def forward(self, x):
        h = self.conv1(swish(self._bn(self.norm1, x)))
        return x + self.conv2(swish(self._bn(self.norm2, h)))


class TimeUpsample(nn.Module):
    """Nearest temporal upsampling (identity on frame 0) + a causal conv."""

    def __init__(self, ch: int):
        super().__init__()
        self.conv = FrameConv3d(ch, ch, (3, 3, 3))

    def forward(self, x):
        return self.conv(x)


class SpatialNorm(nn.Module):
    """GroupNorm(32) of h, scaled and shifted by 1x1 convs of the (resized) quantised codes."""

    def __init__(self, quant_ch: int, ch: int):
        super().__init__()
        self.norm_layer = nn.GroupNorm(32, ch, eps=1e-6, affine=True)
        self.conv_y = nn.Conv2d(quant_ch, ch, 1)
        self.conv_b = nn.Conv2d(quant_ch, ch, 1)

    def forward(self, h, q):
        q = F.interpolate(q, size=h.shape[-2:], mode="nearest")
        return self.norm_layer(h) * self.conv_y(q) + self.conv_b(q)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, quant_ch: int):
        super().__init__()
        self.norm1, self.norm2 = SpatialNorm(quant_ch, cin), SpatialNorm(quant_ch, cout)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x, q):
        h = self.conv1(swish(self.norm1(x, q)))
        h = self.conv2(swish(self.norm2(h, q)))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class SpatialAttention(nn.Module):
    """The decoder's non-causal multi-head self-attention over the h*w positions of a feature map
    (Linear projections with bias; not the targets' causal, cached models/layers.Attention)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):  # (B, N, C)
        B, N, C = x.shape

        def split(t):
            return t.view(B, N, self.heads, C // self.heads).transpose(1, 2)  # (B, H, N, D)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        w = torch.softmax((q * (C // self.heads) ** -0.5) @ k.transpose(-1, -2), dim=-1)  # scale on Q (TensorRT's fused form)
        return self.out_proj((w @ v).transpose(1, 2).reshape(B, N, C))


def attend(attn: SpatialAttention, norm: SpatialNorm, h, q):
    """h + attention over the normalised h (B, C, hh, ww)."""
    B, C, hh, ww = h.shape
    x = norm(h, q).view(B, C, hh * ww).transpose(1, 2)
    return h + attn(x).reshape(B, hh, ww, C).permute(0, 3, 1, 2)


class MiddleBlock(nn.Module):
    def __init__(self, c: Emu3VQConfig, ch: int):
        super().__init__()
        self.block_1 = ResBlock(ch, ch, c.embed_dim)
        self.attn_1 = SpatialAttention(c.hidden_size, c.num_attention_heads)
        self.attn_norm = SpatialNorm(c.embed_dim, ch)
        self.block_2 = ResBlock(ch, ch, c.embed_dim)

    def forward(self, h, q):
        h = attend(self.attn_1, self.attn_norm, self.block_1(h, q), q)
        return self.block_2(h, q)


class Upsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, 1, 1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def _up_levels(c: Emu3VQConfig) -> nn.ModuleList:
    """`up.N` (N the resolution level, run from the deepest): res blocks, attention, upsample."""
    levels, cin = [], c.base_channels * c.channel_multiplier[-1]
    for lvl in reversed(range(len(c.channel_multiplier))):
        up, cout = nn.Module(), c.base_channels * c.channel_multiplier[lvl]
        up.block = nn.ModuleList(ResBlock(cin if i == 0 else cout, cout, c.embed_dim)
                                 for i in range(c.num_res_blocks + 1))
        with_attn = lvl in c.attn_resolutions
        up.attn = nn.ModuleList(SpatialAttention(c.hidden_size, c.num_attention_heads)
                                for _ in range(c.num_res_blocks + 1 if with_attn else 0))
        up.attn_norms = nn.ModuleList(SpatialNorm(c.embed_dim, cout) for _ in range(len(up.attn)))
        if lvl != 0:
            up.upsample = Upsample(cout)
        levels.insert(0, up)
        cin = cout
    return nn.ModuleList(levels)


class Decoder(nn.Module):
    def __init__(self, c: Emu3VQConfig):
        super().__init__()
        ch = c.base_channels * c.channel_multiplier[-1]
        self.time_res_stack = nn.ModuleList(TimeResBlock(c.latent_channels) for _ in range(c.num_res_blocks))
        n_time = max(int(c.temporal_downsample_factor).bit_length() - 1, 0)  # log2
        self.time_conv = nn.ModuleList(TimeUpsample(c.latent_channels) for _ in range(n_time))
        self.conv_in = nn.Conv2d(c.latent_channels, ch, 3, 1, 1)
        self.middle_block = MiddleBlock(c, ch)
        self.up_block = nn.Module()
        self.up_block.up = _up_levels(c)
        self.norm_out = SpatialNorm(c.embed_dim, c.base_channels * c.channel_multiplier[0])
        self.conv_out = nn.Conv2d(c.base_channels * c.channel_multiplier[0], c.out_channels, 3, 1, 1)

    def temporal(self, x):
        for block in self.time_res_stack:
            x = block(x)
        for up in self.time_conv:
            x = swish(up(x))
        return x

    def forward(self, post_quant, quant):
        h, q = self.temporal(post_quant), self.temporal(quant)
        h = self.middle_block(self.conv_in(h), q)
        for i, up in enumerate(reversed(self.up_block.up)):
            for j, block in enumerate(up.block):
                h = block(h, q)
                if len(up.attn):
                    h = attend(up.attn[j], up.attn_norms[j], h, q)
            if hasattr(up, "upsample"):
                h = up.upsample(h)
        return self.conv_out(swish(self.norm_out(h, q)))


class Emu3VQ(nn.Module):
    """Codebook + post-quant conv + decoder (frame 0 of transformers' Emu3VQVAE.decode)."""

    def __init__(self, config: Emu3VQConfig):
        super().__init__()
        self.config = c = config
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(c.codebook_size, c.embed_dim)
        self.post_quant_conv = FrameConv3d(c.embed_dim, c.latent_channels, (3, 1, 1))
        self.decoder = Decoder(c)
        self.token_codes = None  # (V,) vocabulary id -> code, set from a model directory
        self.eol_id = None

    @property
    def codebook(self) -> torch.Tensor:
        return self.quantize.embedding.weight

    def token_codes_from(self, cfg) -> None:
        """Map vocabulary ids to codes (so `tokens_to_pixels` takes what `generate` returns)."""
        from ..prompt_family import token_code_lut

        self.token_codes = token_code_lut(cfg.image_vocab(), cfg.vocab_size)
        self.eol_id = cfg.end_tokens()[0]

    def decode_code(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, h, w) -> (B, out_channels, h*s, w*s), the raw decoder output."""
        if codes.dim() != 3:
            raise InputError(f"codes must be (B, h, w); got shape {tuple(codes.shape)}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.config.codebook_size):
            raise InputError(f"VQ codes must be in 0..{self.config.codebook_size - 1}")
        return self.decode_grid(codes)

    def decode_grid(self, codes: torch.Tensor) -> torch.Tensor:
        """decode_code without the host-side check (the exported VQ graph)."""
        quant = self.quantize.embedding(codes).permute(0, 3, 1, 2)  # (B, C, h, w)
        return self.decoder(self.post_quant_conv(quant), quant)

    @torch.no_grad()
    def tokens_to_pixels(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) raw decoder output of code grids (B, h, w), or of vocabulary ids (B, L) as
        `generate` returns them (rows of visual tokens each closed by end-of-line, then any of
        end-of-frame / end-of-image / end-of-sequence) when the VQ came from a model directory."""
        if tokens.dim() == 2 and self.token_codes is not None:
            return self.decode_code(span_codes(tokens, self.token_codes.to(tokens.device), self.eol_id))
        return self.decode_code(grid_of(tokens))


def span_codes(tokens: torch.Tensor, lut: torch.Tensor, eol: int) -> torch.Tensor:
    """Vocabulary ids (B, L) of generated image spans -> codes (B, h, w)."""
    if int(tokens.min()) < 0 or int(tokens.max()) >= lut.numel():
        raise InputError(f"token ids must be in 0..{lut.numel() - 1}")
    ends = (tokens[0] == eol).nonzero().flatten()
    if ends.numel() == 0:
        codes = lut[tokens]
        if bool((codes < 0).any()):
            raise InputError("tokens hold ids that are neither visual tokens nor end-of-line: pass what generate "
                             "returns, or VQ codes as (B, h, w)")
        return grid_of(codes)
    h, last = int(ends.numel()), int(ends[-1]) + 1
    w = last // h - 1
    span = tokens[:, :last]
    if last % h or w < 1:
        raise InputError(f"{h} end-of-line tokens over {last} ids: the rows differ in length")
    grid = span.reshape(tokens.shape[0], h, w + 1)
    codes = lut[grid[:, :, :w]]
    if not bool((grid[:, :, w] == eol).all()) or bool((codes < 0).any()) or bool((lut[tokens[:, last:]] >= 0).any()):
        raise InputError("the image span is not rows of visual tokens each closed by end-of-line (then the end "
                         "tokens): pass the tokens generate returned")
    return codes
