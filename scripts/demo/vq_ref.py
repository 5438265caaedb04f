"""Fallback LlamaGen VQ (official module and state-dict names) used only if lisa_trt.models.vq is absent.

train_vq.py prefers the project's `lisa_trt.families.llamagen.vq.VQModel`; this file lets the recipe run
before that module exists. The state dict is key-for-key the official one, so the weights load
strictly into the project's VQModel (checked by train_vq.py --check-compat).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def _norm(c):
    return nn.GroupNorm(32, c, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.norm1, self.conv1 = _norm(cin), nn.Conv2d(cin, cout, 3, 1, 1)
        self.norm2, self.conv2 = _norm(cout), nn.Conv2d(cout, cout, 3, 1, 1)
        self.cin, self.cout = cin, cout
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.nin_shortcut(x) if self.cin != self.cout else x) + h


class AttnBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = _norm(c)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x):
        b, c, h, w = x.shape
        n = self.norm(x)
        q = self.q(n).reshape(b, c, h * w).transpose(1, 2)  # (B, HW, C)
        k = self.k(n).reshape(b, c, h * w).transpose(1, 2)
        v = self.v(n).reshape(b, c, h * w).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v)  # scale c ** -0.5
        return x + self.proj_out(o.transpose(1, 2).reshape(b, c, h, w))


class Downsample(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 2, 0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 1, 1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Encoder(nn.Module):
    def __init__(self, ch, ch_mult, num_res_blocks, z_channels):
        super().__init__()
        self.conv_in = nn.Conv2d(3, ch, 3, 1, 1)
        in_mult = (1,) + tuple(ch_mult)
        self.conv_blocks = nn.ModuleList()
        n = len(ch_mult)
        for i in range(n):
            blk = nn.Module()
            bin_, bout = ch * in_mult[i], ch * ch_mult[i]
            blk.res, blk.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(num_res_blocks):
                blk.res.append(ResnetBlock(bin_, bout))
                bin_ = bout
                if i == n - 1:
                    blk.attn.append(AttnBlock(bin_))
            if i != n - 1:
                blk.downsample = Downsample(bin_)
            self.conv_blocks.append(blk)
        self.mid = nn.ModuleList([ResnetBlock(bin_, bin_), AttnBlock(bin_), ResnetBlock(bin_, bin_)])
        self.norm_out = _norm(bin_)
        self.conv_out = nn.Conv2d(bin_, z_channels, 3, 1, 1)

    def forward(self, x):
        h = self.conv_in(x)
        for i, blk in enumerate(self.conv_blocks):
            for j, r in enumerate(blk.res):
                h = r(h)
                if len(blk.attn):
                    h = blk.attn[j](h)
            if hasattr(blk, "downsample"):
                h = blk.downsample(h)
        for m in self.mid:
            h = m(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, ch, ch_mult, num_res_blocks, z_channels):
        super().__init__()
        n = len(ch_mult)
        bin_ = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, bin_, 3, 1, 1)
        self.mid = nn.ModuleList([ResnetBlock(bin_, bin_), AttnBlock(bin_), ResnetBlock(bin_, bin_)])
        self.conv_blocks = nn.ModuleList()
        for i in reversed(range(n)):
            blk = nn.Module()
            bout = ch * ch_mult[i]
            blk.res, blk.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(num_res_blocks + 1):
                blk.res.append(ResnetBlock(bin_, bout))
                bin_ = bout
                if i == n - 1:
                    blk.attn.append(AttnBlock(bin_))
            if i != 0:
                blk.upsample = Upsample(bin_)
            self.conv_blocks.append(blk)
        self.norm_out = _norm(bin_)
        self.conv_out = nn.Conv2d(bin_, 3, 3, 1, 1)

    def forward(self, z):
        h = self.conv_in(z)
        for m in self.mid:
            h = m(h)
        for blk in self.conv_blocks:
            for j, r in enumerate(blk.res):
                h = r(h)
                if len(blk.attn):
                    h = blk.attn[j](h)
            if hasattr(blk, "upsample"):
                h = blk.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    def __init__(self, n_e, e_dim, usage_buffer=65536):
        super().__init__()
        self.embedding = nn.Embedding(n_e, e_dim)
        self.embedding.weight.data.uniform_(-1.0 / n_e, 1.0 / n_e)
        self.embedding.weight.data = F.normalize(self.embedding.weight.data, dim=-1)
        self.register_buffer("codebook_used", torch.zeros(usage_buffer))


class VQModel(nn.Module):
    """Official-layout VQ; forward(x) -> (recon, codebook_loss, commit_loss, indices)."""

    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.encoder = Encoder(cfg.ch, cfg.encoder_ch_mult, cfg.num_res_blocks, cfg.z_channels)
        self.decoder = Decoder(cfg.ch, cfg.decoder_ch_mult, cfg.num_res_blocks, cfg.z_channels)
        self.quantize = VectorQuantizer(cfg.codebook_size, cfg.codebook_embed_dim, cfg.usage_buffer)
        self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(cfg.codebook_embed_dim, cfg.z_channels, 1)

    def codebook(self):
        return F.normalize(self.quantize.embedding.weight, dim=-1)

    def _quant(self, x):
        z = F.normalize(self.quant_conv(self.encoder(x)).permute(0, 2, 3, 1), dim=-1)  # (B, h, w, d)
        e = self.codebook()
        d = (z.pow(2).sum(-1, keepdim=True) + e.pow(2).sum(-1) - 2 * z @ e.t())  # (B, h, w, V)
        idx = d.argmin(-1)
        return z, e[idx], idx

    def encode(self, x):
        _, _, idx = self._quant(x)
        return idx.flatten(1)

    def decode_code(self, indices, shape):
        b, c, h, w = shape
        zq = self.codebook()[indices].reshape(b, h, w, c).permute(0, 3, 1, 2)
        return self.decoder(self.post_quant_conv(zq))

    def forward(self, x):
        z, zq, idx = self._quant(x)
        codebook_loss = (zq - z.detach()).pow(2).mean()
        commit_loss = (zq.detach() - z).pow(2).mean()
        zq = (z + (zq - z).detach()).permute(0, 3, 1, 2)
        return self.decoder(self.post_quant_conv(zq)), codebook_loss, commit_loss, idx.flatten(1)
