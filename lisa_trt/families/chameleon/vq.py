"""The Chameleon VQGAN (taming-transformers layout): VQ code grids -> pixels, and back.

Parameter names are the official ones of Chameleon's `vqgan.ckpt` (`encoder.down.0.block.0.conv1`,
`decoder.up.3.upsample.conv`, `quantize.embedding.weight`, `quant_conv`, `post_quant_conv`), which
HF's ChameleonVQVAE also uses for the encoder half. The model config comes from the `vqgan.yaml`
shipped beside the checkpoint (`model.params.{embed_dim, n_embed, ddconfig}`) or an HF-style
`vq_config` dict (config.json). Codes are plain row-major VQ indices 0..n_embed-1 (Lumina-mGPT
maps its image tokens to these with the tokenizer's IMGIMG* names; see lumina.py).
"""

from __future__ import annotations

import json
import pickle
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn

from ...errors import InputError, CheckpointError, ConfigError
from ...models.vqgan import Codebook, Level, Mid, VQDecoder, group_norm, swish

_TRAINING_ONLY = ("loss.",)  # discriminator / LPIPS weights some training checkpoints carry


@dataclass(frozen=True)
class ChameleonVQConfig:
    embed_dim: int = 256
    n_embed: int = 8192
    z_channels: int = 256
    ch: int = 128
    ch_mult: tuple = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple = ()
    resolution: int = 256
    in_channels: int = 3
    out_ch: int = 3
    double_z: bool = False
    attn_type: str = "vanilla"

    # the VQ settings generic decoders read (export/prompt_graphs.vq_settings)
    @property
    def n_codes(self) -> int:
        return self.n_embed

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def out_channels(self) -> int:
        """Channels of the decoded image."""
        return self.out_ch

    @classmethod
    def from_yaml_params(cls, params: dict) -> "ChameleonVQConfig":
        """`model.params` of a taming vqgan.yaml."""
        dd = dict(params.get("ddconfig", {}))
        try:
            return cls(embed_dim=int(params["embed_dim"]), n_embed=int(params["n_embed"]),
                       z_channels=int(dd["z_channels"]), ch=int(dd["ch"]), ch_mult=tuple(dd["ch_mult"]),
                       num_res_blocks=int(dd["num_res_blocks"]),
                       attn_resolutions=tuple(dd.get("attn_resolutions") or ()),
                       resolution=int(dd.get("resolution", 256)), in_channels=int(dd.get("in_channels", 3)),
                       out_ch=int(dd.get("out_ch", 3)), double_z=bool(dd.get("double_z", False)),
                       attn_type=str(dd.get("attn_type", "vanilla")))
        except KeyError as e:
            raise ConfigError(f"vqgan config lacks {e}: expected model.params.{{embed_dim, n_embed, ddconfig}}") from e

    @classmethod
    def from_hf(cls, vq: dict) -> "ChameleonVQConfig":
        """HF ChameleonVQVAEConfig fields (config.json `vq_config`)."""
        d = cls()
        return cls(embed_dim=vq.get("embed_dim", d.embed_dim), n_embed=vq.get("num_embeddings", d.n_embed),
                   z_channels=vq.get("latent_channels", d.z_channels), ch=vq.get("base_channels", d.ch),
                   ch_mult=tuple(vq.get("channel_multiplier", d.ch_mult)),
                   num_res_blocks=vq.get("num_res_blocks", d.num_res_blocks),
                   attn_resolutions=tuple(vq.get("attn_resolutions") or ()),
                   resolution=vq.get("resolution", d.resolution), in_channels=vq.get("in_channels", 3),
                   double_z=vq.get("double_latent", False), attn_type=vq.get("attn_type") or "none" if "attn_type" in vq else "vanilla")


class Encoder(nn.Module):
    def __init__(self, c: ChameleonVQConfig):
        super().__init__()
        self.conv_in = nn.Conv2d(c.in_channels, c.ch, 3, 1, 1)
        res, mults = c.resolution, (1,) + tuple(c.ch_mult)
        self.down = nn.ModuleList()
        for i in range(len(c.ch_mult)):
            last = i == len(c.ch_mult) - 1
            self.down.append(Level(c.ch * mults[i], c.ch * mults[i + 1], c.num_res_blocks,
                                   res in c.attn_resolutions, None if last else "down"))
            res = res if last else res // 2
        cin = c.ch * c.ch_mult[-1]
        self.mid = Mid(cin, c.attn_type == "vanilla")
        self.norm_out = group_norm(cin)
        self.conv_out = nn.Conv2d(cin, 2 * c.z_channels if c.double_z else c.z_channels, 3, 1, 1)

    def forward(self, x):
        h = self.conv_in(x)
        for level in self.down:
            h = level(h)
        return self.conv_out(swish(self.norm_out(self.mid(h))))


def _decoder(c: ChameleonVQConfig) -> VQDecoder:
    """taming's decoder: `up[0]` is the finest level; attention at `attn_resolutions`."""
    n = len(c.ch_mult)
    coarsest = c.resolution // 2 ** (n - 1)
    return VQDecoder(c.z_channels, c.ch, c.ch_mult, c.num_res_blocks, c.out_ch,
                     attn_at=lambda i: coarsest * 2 ** (n - 1 - i) in c.attn_resolutions,
                     finest_first=True, mid_attn=c.attn_type == "vanilla")


class ChameleonVQGAN(nn.Module):
    """Encoder + codebook + decoder with Chameleon's official parameter names."""

    def __init__(self, config: ChameleonVQConfig):
        super().__init__()
        self.config = c = config
        self.encoder = Encoder(c)
        self.decoder = _decoder(c)
        self.quantize = Codebook(c.n_embed, c.embed_dim)
        self.quant_conv = nn.Conv2d(c.z_channels, c.embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(c.embed_dim, c.z_channels, 1)

    @property
    def codebook(self) -> torch.Tensor:
        return self.quantize.embedding.weight

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [-1, 1] -> codes (B, H/ds, W/ds) (nearest codebook entry)."""
        z = self.quant_conv(self.encoder(images)).permute(0, 2, 3, 1)  # (B, h, w, C)
        flat = z.reshape(-1, z.shape[-1])
        e = self.codebook
        d = (flat ** 2).sum(1, keepdim=True) + (e ** 2).sum(1) - 2 * flat @ e.t()
        return d.argmin(1).view(z.shape[:3])

    @torch.no_grad()
    def decode_code(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, h, w) -> images (B, 3, h*ds, w*ds), about [-1, 1]."""
        if codes.dim() != 3:
            raise ConfigError(f"codes must be (B, h, w); got shape {tuple(codes.shape)}")
        if int(codes.min()) < 0 or int(codes.max()) >= self.config.n_embed:
            raise ConfigError(f"VQ codes must be in 0..{self.config.n_embed - 1}")
        return self.decode_grid(codes)

    def decode_grid(self, codes: torch.Tensor) -> torch.Tensor:
        """decode_code without the host-side check (the exported VQ graph)."""
        quant = self.quantize.embedding(codes).permute(0, 3, 1, 2)  # (B, C, h, w)
        return self.decoder(self.post_quant_conv(quant))


    @torch.no_grad()
    def tokens_to_pixels(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) raw decoder output of VQ codes (B, h, w) / (B, N square), or, when the VQ
        carries a model's `token_codes` (vocabulary id -> code, -1 elsewhere; set by
        load_decoder from a model directory), of vocabulary ids: a generated image span (codes
        with row-end tokens between rows: the rows are the row ends) or plain code tokens."""
        from ...models.vqgan import grid_of

        lut = getattr(self, "token_codes", None)
        if lut is not None and tokens.dim() == 2:
            lut = lut.to(tokens.device)
            if int(tokens.min()) < 0 or int(tokens.max()) >= lut.numel():
                raise InputError(f"token ids must be in 0..{lut.numel() - 1}")
            codes = lut[tokens]
            is_code = codes >= 0
            n = int(is_code[0].sum())
            if not bool((is_code.sum(1) == n).all()) or n == 0:
                raise InputError("every row must hold the same number of image-code tokens")
            rows = int((~is_code[0]).sum())
            if rows:  # a generated span: w codes then one row-end token, per latent row
                w = n // rows
                ends = torch.arange(1, rows + 1, device=tokens.device) * (w + 1) - 1
                if n % rows or tokens.shape[1] != rows * (w + 1) or not bool((~is_code[:, ends]).all()):
                    raise InputError(
                        f"tokens hold {rows} ids per row that are not image codes, and not one after each row "
                        "of codes (a generated span's row ends): this VQ, loaded from a model directory, takes "
                        "vocabulary ids (what generate returns); decode plain VQ codes with the VQGAN folder "
                        "itself (load_vq(DIR/vqgan))")
                return self.decode_code(codes[is_code].view(tokens.shape[0], rows, w))
            tokens = codes.view(tokens.shape[0], n)
        elif lut is not None:
            tokens = lut.to(tokens.device)[tokens]
        return self.decode_code(grid_of(tokens))


def to_uint8(images: torch.Tensor):
    """Decoder output (B, 3, H, W) -> uint8 (B, H, W, 3) numpy, Chameleon's conversion:
    clamp to [-1, 1], map to [0, 1], times 255, truncated."""
    x = (images.detach().float().clamp(-1.0, 1.0) + 1.0) / 2.0
    return (x.permute(0, 2, 3, 1).cpu().numpy() * 255).astype("uint8")


def _read_vq_config(path: Path) -> ChameleonVQConfig:
    js, ym = path / "vqgan.json", path / "vqgan.yaml"
    if js.is_file():
        return ChameleonVQConfig(**{k: tuple(v) if isinstance(v, list) else v
                                    for k, v in json.loads(js.read_text()).items()})
    if not ym.is_file():
        raise ConfigError(f"{path} has neither vqgan.yaml nor vqgan.json (the VQGAN's model config); "
                          "Chameleon's tokenizer folder ships vqgan.yaml next to vqgan.ckpt")
    try:
        import yaml
    except ImportError as e:
        raise ConfigError("reading vqgan.yaml needs PyYAML (pip install pyyaml), or write vqgan.json") from e
    raw = yaml.safe_load(ym.read_text())
    return ChameleonVQConfig.from_yaml_params(raw.get("model", {}).get("params", raw))


def _read_vq_weights(ckpt: Path) -> dict:
    if ckpt.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(ckpt))
    try:
        obj = torch.load(str(ckpt), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"refusing to load {ckpt}: its pickle needs more than tensors ({str(e).splitlines()[0]}); "
                              "re-save its state_dict as safetensors elsewhere") from e
    sd = obj.get("state_dict", obj) if isinstance(obj, dict) else None
    if not isinstance(sd, dict):
        raise CheckpointError(f"{ckpt} does not hold a state dict")
    return {k: v for k, v in sd.items() if torch.is_tensor(v) and not k.startswith(_TRAINING_ONLY)}


def load_chameleon_vq(path, device="cpu") -> ChameleonVQGAN:
    """Load the VQGAN from a folder with vqgan.yaml (or vqgan.json) and vqgan.ckpt (or
    vqgan.safetensors); strict apart from training-only `loss.*` entries."""
    from ...models.checkpoints import strict_load

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"VQGAN not found: {path} (a folder with vqgan.yaml and vqgan.ckpt)")
    folder = path if path.is_dir() else path.parent
    ckpt = path if path.is_file() else next((folder / n for n in ("vqgan.safetensors", "vqgan.ckpt")
                                             if (folder / n).is_file()), None)
    if ckpt is None:
        raise CheckpointError(f"no vqgan.ckpt or vqgan.safetensors in {folder}")
    cfg = _read_vq_config(folder)
    model = ChameleonVQGAN(cfg)
    strict_load(model, _read_vq_weights(ckpt), f"Chameleon VQGAN {asdict(cfg)} (from {folder})")
    return model.float().eval().to(device)


def find_vq_dir(model_dir) -> Optional[Path]:
    """Where a VQGAN is expected beside a checkpoint (docs/chameleon.md): DIR/vqgan/ or DIR."""
    model_dir = Path(model_dir)
    for d in (model_dir / "vqgan", model_dir):
        if any((d / n).is_file() for n in ("vqgan.ckpt", "vqgan.safetensors")):
            return d
    return None


def save_chameleon_vq(model: ChameleonVQGAN, folder) -> None:
    """Write vqgan.safetensors + vqgan.json (atomic)."""
    from ...io import save_safetensors, write_json

    folder = Path(folder)
    save_safetensors(model.state_dict(), folder / "vqgan.safetensors")
    write_json(folder / "vqgan.json", asdict(model.config))
