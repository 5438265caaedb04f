"""The Janus VQ decoder: image codes -> pixels (HF `model.vqmodel.*` minus the encoder).

Parameter names are transformers' JanusVQVAE ones with the `model.vqmodel.` prefix removed:
`quantize.embedding`, `post_quant_conv`, `decoder.{conv_in, mid.{block_1, attn_1, block_2},
up.N.{block.M, attn.M, upsample}, norm_out, conv_out}`. Unlike taming's layout, `up[0]` is the
COARSEST level (the one with attention blocks) and levels run in forward order.

Decoding (transformers' `JanusVQVAE.decode`): look the codes up in the codebook, L2-normalise
each vector, lay them out as (B, C, grid, grid) in row-major raster order, `post_quant_conv`,
then the decoder. The result is the RAW decoder output (B, 3, H, W), roughly in [-1, 1]; no clamp
or rescale. transformers' `decode_image_tokens` returns the same tensor channels-last
(B, H, W, 3): `tokens_to_pixels(vq, t) == decode_image_tokens(t).permute(0, 3, 1, 2)`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ....errors import InputError
from ...vqgan import AttnBlock, ResnetBlock, Upsample, group_norm, swish
from .config import JanusVQConfig


class _Mid(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.block_1, self.attn_1, self.block_2 = ResnetBlock(ch, ch), AttnBlock(ch), ResnetBlock(ch, ch)

    def forward(self, h):
        return self.block_2(self.attn_1(self.block_1(h)))


class JanusVQDecoder(nn.Module):
    def __init__(self, c: JanusVQConfig):
        super().__init__()
        n = len(c.channel_multiplier)
        cin = c.base_channels * c.channel_multiplier[-1]
        self.conv_in = nn.Conv2d(c.latent_channels, cin, 3, 1, 1)
        self.mid = _Mid(cin)
        self.up = nn.ModuleList()
        for i_level in reversed(range(n)):  # coarsest first
            level, cout = nn.Module(), c.base_channels * c.channel_multiplier[i_level]
            level.block, level.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(c.num_res_blocks + 1):
                level.block.append(ResnetBlock(cin, cout))
                cin = cout
                if i_level == n - 1:
                    level.attn.append(AttnBlock(cout))
            if i_level != 0:
                level.upsample = Upsample(cout)
            self.up.append(level)
        self.norm_out = group_norm(cin)
        self.conv_out = nn.Conv2d(cin, c.out_channels, 3, 1, 1)

    def forward(self, z):
        h = self.mid(self.conv_in(z))
        for level in self.up:
            for j, block in enumerate(level.block):
                h = block(h)
                if len(level.attn):
                    h = level.attn[j](h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


class _Codebook(nn.Module):
    def __init__(self, n: int, d: int):
        super().__init__()
        self.embedding = nn.Embedding(n, d)


class JanusVQ(nn.Module):
    """Codebook + post_quant_conv + decoder of Janus' VQ model (decode only)."""

    def __init__(self, config: JanusVQConfig):
        super().__init__()
        self.config = c = config
        self.quantize = _Codebook(c.codebook_size, c.embed_dim)
        self.post_quant_conv = nn.Conv2d(c.embed_dim, c.latent_channels, 1)
        self.decoder = JanusVQDecoder(c)

    def _grid(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, N) or (B, h, w) codes -> (B, grid, grid) after checks."""
        g, V = self.config.grid, self.config.codebook_size
        if not torch.is_tensor(tokens) or tokens.dim() not in (2, 3) or tokens.is_floating_point():
            raise InputError("image tokens must be an integer tensor (B, N) or (B, h, w)")
        if tokens.dim() == 2 and tokens.shape[1] != g * g or tokens.dim() == 3 and tuple(tokens.shape[1:]) != (g, g):
            raise InputError(f"image tokens have shape {tuple(tokens.shape)}; this VQ decodes (B, {g * g}) or "
                             f"(B, {g}, {g}) codes")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= V):
            raise InputError(f"image codes must be in 0..{V - 1}; got {int(tokens.min())}..{int(tokens.max())}")
        return tokens.long().reshape(tokens.shape[0], g, g)

    @torch.no_grad()
    def tokens_to_pixels(self, tokens: torch.Tensor) -> torch.Tensor:
        """Codes (B, N) or (B, h, w) -> raw decoder output (B, 3, H, W) (module docstring)."""
        codes = self._grid(tokens).to(self.quantize.embedding.weight.device)
        quant = F.normalize(self.quantize.embedding(codes), p=2, dim=-1)  # (B, h, w, C)
        return self.decoder(self.post_quant_conv(quant.permute(0, 3, 1, 2).contiguous()))


def tokens_to_pixels(vq: JanusVQ, tokens: torch.Tensor) -> torch.Tensor:
    """Codes (B, N) or (B, h, w) -> raw decoder output (B, 3, H, W), equal to transformers'
    `decode_image_tokens(tokens)` permuted from (B, H, W, 3)."""
    return vq.tokens_to_pixels(tokens)
