"""LlamaGen VQ tokenizer (VQGAN-style encoder/decoder, L2-normalised codebook lookup).

Module and parameter names match LlamaGen's tokenizer/tokenizer_image/vq_model.py so that the
official `vq_ds16_c2i.pt` / `vq_ds16_t2i.pt` load strictly (docs/spec/llamagen.md, "VQ tokenizer").
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import VQConfig
from ...errors import InputError
from ...models.vqgan import AttnBlock, Level, ResnetBlock, grid_of, group_norm, swish


def _Level(cin, cout, n_res, with_attn, resample=None) -> Level:
    """One resolution level (`conv_blocks.N`): `res.M`, `attn.M`, `downsample` / `upsample`."""
    return Level(cin, cout, n_res, with_attn, resample, blocks="res")


def _mid(ch: int) -> nn.ModuleList:
    return nn.ModuleList([ResnetBlock(ch, ch), AttnBlock(ch), ResnetBlock(ch, ch)])


class Encoder(nn.Module):
    def __init__(self, ch: int, ch_mult, z_channels: int, num_res_blocks: int = 2, in_channels: int = 3):
        super().__init__()
        self.conv_in = nn.Conv2d(in_channels, ch, 3, 1, 1)
        in_mult = (1,) + tuple(ch_mult)
        n = len(ch_mult)
        self.conv_blocks = nn.ModuleList()
        for i in range(n):
            last = i == n - 1
            self.conv_blocks.append(_Level(ch * in_mult[i], ch * ch_mult[i], num_res_blocks,
                                           with_attn=last, resample=None if last else "down"))
        block_in = ch * ch_mult[-1]
        self.mid = _mid(block_in)
        self.norm_out = group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, z_channels, 3, 1, 1)

    def forward(self, x):
        h = self.conv_in(x)
        for level in self.conv_blocks:
            h = level(h)
        for m in self.mid:
            h = m(h)
        return self.conv_out(swish(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, ch: int, ch_mult, z_channels: int, num_res_blocks: int = 2, out_channels: int = 3):
        super().__init__()
        n = len(ch_mult)
        block_in = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, block_in, 3, 1, 1)
        self.mid = _mid(block_in)
        # Built in reversed level order: conv_blocks.0 is the lowest resolution (with attention).
        self.conv_blocks = nn.ModuleList()
        for i in reversed(range(n)):
            self.conv_blocks.append(_Level(block_in, ch * ch_mult[i], num_res_blocks + 1,
                                           with_attn=i == n - 1, resample="up" if i != 0 else None))
            block_in = ch * ch_mult[i]
        self.norm_out = group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, out_channels, 3, 1, 1)

    def forward(self, z):
        h = self.conv_in(z)
        for m in self.mid:
            h = m(h)
        for level in self.conv_blocks:
            h = level(h)
        return self.conv_out(swish(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    """Nearest-neighbour lookup in an L2-normalised codebook (stored un-normalised)."""

    def __init__(self, n_e: int, e_dim: int, l2_norm: bool = True, usage_buffer: int = 65536):
        super().__init__()
        self.n_e, self.e_dim, self.l2_norm = n_e, e_dim, l2_norm
        self.embedding = nn.Embedding(n_e, e_dim)
        self.embedding.weight.data.uniform_(-1.0 / n_e, 1.0 / n_e)
        if l2_norm:
            self.embedding.weight.data = F.normalize(self.embedding.weight.data, p=2, dim=-1)
        # Present in the official files (usage statistics); kept for strict loading.
        self.register_buffer("codebook_used", torch.zeros(usage_buffer))

    def codebook(self) -> torch.Tensor:
        w = self.embedding.weight
        return F.normalize(w, p=2, dim=-1) if self.l2_norm else w

    def lookup(self, z: torch.Tensor) -> torch.Tensor:
        """Indices of the nearest codebook rows for z (..., e_dim)."""
        flat = z.reshape(-1, self.e_dim)
        emb = self.codebook()
        if self.l2_norm:
            flat = F.normalize(flat, p=2, dim=-1)
        d = (flat ** 2).sum(1, keepdim=True) + (emb ** 2).sum(1) - 2 * flat @ emb.t()
        return d.argmin(dim=1).reshape(z.shape[:-1])

    def forward(self, z: torch.Tensor):
        """z (B, C, h, w) -> (z_q straight-through (B,C,h,w), codebook loss, commit loss, idx (B,h*w))."""
        z = z.permute(0, 2, 3, 1).contiguous()  # (B, h, w, C)
        if self.l2_norm:
            z = F.normalize(z, p=2, dim=-1)
        idx = self.lookup(z)
        z_q = self.codebook()[idx]
        codebook_loss = F.mse_loss(z_q, z.detach())
        commit_loss = F.mse_loss(z_q.detach(), z)
        z_q = z + (z_q - z).detach()
        return z_q.permute(0, 3, 1, 2), codebook_loss, commit_loss, idx.flatten(1)

    def get_codebook_entry(self, indices: torch.Tensor, shape) -> torch.Tensor:
        """indices (B, h*w) -> (B, C, h, w) with shape = (B, C, h, w)."""
        b, c, h, w = shape
        z_q = self.codebook()[indices.reshape(-1)]
        return z_q.reshape(b, h, w, c).permute(0, 3, 1, 2).contiguous()


class VQModel(nn.Module):
    """LlamaGen VQModel: encoder -> quant_conv -> quantize -> post_quant_conv -> decoder."""

    def __init__(self, config: VQConfig):
        super().__init__()
        self.config = config
        c = config
        self.encoder = Encoder(c.ch, c.encoder_ch_mult, c.z_channels, c.num_res_blocks)
        self.decoder = Decoder(c.ch, c.decoder_ch_mult, c.z_channels, c.num_res_blocks)
        self.quantize = VectorQuantizer(c.codebook_size, c.codebook_embed_dim, c.codebook_l2_norm,
                                        c.usage_buffer)
        self.quant_conv = nn.Conv2d(c.z_channels, c.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(c.codebook_embed_dim, c.z_channels, 1)

    def codebook(self) -> torch.Tensor:
        """The L2-normalised codebook E (V, d): the geometry LANTERN and GASV use."""
        return self.quantize.codebook()

    def encode_latent(self, images: torch.Tensor) -> torch.Tensor:
        return self.quant_conv(self.encoder(images))

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) in [-1, 1] -> indices (B, h*w), row-major."""
        z = self.encode_latent(images).permute(0, 2, 3, 1)
        return self.quantize.lookup(z).flatten(1)

    def decode(self, quant: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(quant))

    def decode_code(self, indices: torch.Tensor, shape) -> torch.Tensor:
        """indices (B, h*w), shape (B, C, h, w) -> images (B, 3, H, W) in about [-1, 1]."""
        return self.decode(self.quantize.get_codebook_entry(indices, shape))

    @torch.no_grad()
    def tokens_to_pixels(self, tokens: torch.Tensor) -> torch.Tensor:
        """Codes (B, N) (a square grid, row-major) or (B, h, w) -> (B, 3, H, W), raw decoder output."""
        tokens = grid_of(tokens)
        B, h, w = tokens.shape
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.quantize.embedding.weight.shape[0]):
            raise InputError(f"VQ codes must be in 0..{self.quantize.embedding.weight.shape[0] - 1}; got "
                             f"{int(tokens.min())}..{int(tokens.max())}")
        return self.decode_code(tokens.reshape(B, h * w), (B, self.quantize.embedding.weight.shape[1], h, w))

    def forward(self, images: torch.Tensor):
        """Training forward: (recon, codebook_loss, commit_loss, indices)."""
        z_q, cb_loss, commit_loss, idx = self.quantize(self.encode_latent(images))
        return self.decode(z_q), cb_loss, commit_loss, idx

