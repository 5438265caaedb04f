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

from ...errors import InputError
from ...models.vqgan import Codebook, VQDecoder
from .config import JanusVQConfig


class JanusVQ(nn.Module):
    """Codebook + post_quant_conv + decoder of Janus' VQ model (decode only)."""

    def __init__(self, config: JanusVQConfig):
        super().__init__()
        self.config = c = config
        self.quantize = Codebook(c.codebook_size, c.embed_dim)
        self.post_quant_conv = nn.Conv2d(c.embed_dim, c.latent_channels, 1)
        n = len(c.channel_multiplier)  # transformers' JanusVQVAEDecoder: attention at the coarsest level
        self.decoder = VQDecoder(c.latent_channels, c.base_channels, c.channel_multiplier, c.num_res_blocks,
                                 c.out_channels, attn_at=lambda i: i == n - 1)

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
