"""Frozen configuration dataclasses and name -> config registries.

Model shapes live here and nowhere else (docs/design.md principle 1). `TargetConfig` uses the field
names of LlamaGen's `ModelArgs` so that official settings carry over verbatim.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Optional

from .errors import ConfigError, unknown_name


def find_multiple(n: int, k: int) -> int:
    """Smallest multiple of k that is >= n (LlamaGen's helper)."""
    return n if n % k == 0 else n + k - (n % k)


@dataclass(frozen=True)
class TargetConfig:
    """An autoregressive image target (field names follow LlamaGen's ModelArgs).

    `model_type` selects the model family (models/family.py: "c2i" / "t2i" are LlamaGen; other
    families register their own types). `grid_shape` (height, width) in tokens describes a
    non-square image grid; None means a square grid of block_size tokens.
    """

    dim: int = 4096
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: Optional[int] = None
    vocab_size: int = 16384
    block_size: int = 256
    cls_token_num: int = 1
    num_classes: int = 1000
    model_type: str = "c2i"
    caption_dim: int = 2048
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    multiple_of: int = 256
    ffn_dim_multiplier: Optional[float] = None
    grid_shape: Optional[tuple] = None  # (height, width) in tokens; None: square

    def __post_init__(self):
        if not isinstance(self.model_type, str) or not self.model_type.isidentifier():
            raise ConfigError(f"model_type must be a family's type name such as 'c2i' or 't2i', got {self.model_type!r}")
        if self.grid_shape is not None:
            object.__setattr__(self, "grid_shape", tuple(int(x) for x in self.grid_shape))
        if self.dim % self.n_head:
            raise ConfigError(f"dim {self.dim} is not divisible by n_head {self.n_head}")
        if self.n_head % self.kv_heads:
            raise ConfigError(f"n_head {self.n_head} is not divisible by n_kv_head {self.kv_heads}")
        h, w = self.grid_hw
        if h * w != self.block_size:
            raise ConfigError(f"block_size {self.block_size} must be a square (grid x grid tokens) or match "
                              f"grid_shape {self.grid_shape}")
        if (self.dim // self.n_head) % 4:
            raise ConfigError("head_dim must be a multiple of 4 for 2D RoPE")

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def ffn_hidden(self) -> int:
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return find_multiple(hidden, self.multiple_of)

    @property
    def grid_hw(self) -> tuple[int, int]:
        """(height, width) of the token grid."""
        if self.grid_shape is not None:
            return self.grid_shape
        g = math.isqrt(self.block_size)
        return (g, g)

    @property
    def grid_size(self) -> int:
        """Side of a square token grid (ConfigError for a non-square grid: use grid_hw)."""
        h, w = self.grid_hw
        if h != w:
            raise ConfigError(f"this target has a {h} x {w} token grid; use grid_hw instead of grid_size")
        return h

    @property
    def n_positions(self) -> int:
        """Positions a sequence may use (the generic loops clamp drafter positions below it)."""
        return self.seq_len

    @property
    def seq_len(self) -> int:
        """Length of the full sequence [condition prefix] + [z_0 .. z_{N-1}]."""
        return self.cls_token_num + self.block_size

    @property
    def tap_layers(self) -> tuple[int, int, int]:
        """EAGLE-3 taps: residual stream entering layers {2, L//2, L-3} (0-based)."""
        L = self.n_layer
        return (min(2, L - 1), L // 2, max(L - 3, 0))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if d["grid_shape"] is None:
            del d["grid_shape"]  # square grids serialise as before
        else:
            d["grid_shape"] = list(d["grid_shape"])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TargetConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown TargetConfig fields {sorted(unknown)}; valid: {sorted(known)}")
        return cls(**d)


@dataclass(frozen=True)
class VQConfig:
    """LlamaGen VQ tokenizer (field names follow LlamaGen's vq_model.ModelArgs)."""

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    encoder_ch_mult: tuple = (1, 1, 2, 2, 4)
    decoder_ch_mult: tuple = (1, 1, 2, 2, 4)
    z_channels: int = 256
    ch: int = 128
    codebook_l2_norm: bool = True
    num_res_blocks: int = 2  # encoder; the decoder uses num_res_blocks + 1
    usage_buffer: int = 65536  # length of the `quantize.codebook_used` buffer

    def __post_init__(self):
        object.__setattr__(self, "encoder_ch_mult", tuple(self.encoder_ch_mult))
        object.__setattr__(self, "decoder_ch_mult", tuple(self.decoder_ch_mult))

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.encoder_ch_mult) - 1)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["encoder_ch_mult"] = list(self.encoder_ch_mult)
        d["decoder_ch_mult"] = list(self.decoder_ch_mult)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "VQConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown VQConfig fields {sorted(unknown)}; valid: {sorted(known)}")
        return cls(**d)


# Official GPT shapes: (n_layer, n_head, dim).
_GPT_SHAPES = {
    "GPT-B": (12, 12, 768),
    "GPT-L": (24, 16, 1024),
    "GPT-XL": (36, 20, 1280),
    "GPT-XXL": (48, 24, 1536),
    "GPT-XXXL": (48, 40, 2560),
    "GPT-1B": (22, 32, 2048),
    "GPT-3B": (24, 32, 3200),
    "GPT-7B": (32, 32, 4096),
}

# Extra registered target factories (e.g. the bundled demo model, tiny test models).
_EXTRA_TARGETS: dict[str, Callable[..., TargetConfig]] = {}


def register_target(name: str, factory: Callable[..., TargetConfig]) -> None:
    """Register a named target config factory `factory(**overrides) -> TargetConfig`."""
    _EXTRA_TARGETS[name] = factory


def target_names() -> list[str]:
    return sorted(list(_GPT_SHAPES) + list(_EXTRA_TARGETS))


def target_config(name: str, image_size: int = 256, model_type: Optional[str] = None,
                  downsample: int = 16, **overrides) -> TargetConfig:
    """Look up an official (or registered) target config.

    Args:
        name: "GPT-B" ... "GPT-7B", or a registered name such as "tiny".
        image_size: pixels; block_size = (image_size / downsample) ** 2.
        model_type: "c2i" (1 class token, 1000 classes; default) or "t2i" (120 caption tokens).
        overrides: any TargetConfig field.
    """
    if name in _EXTRA_TARGETS:
        if model_type is not None:
            overrides["model_type"] = model_type
        return _EXTRA_TARGETS[name](**overrides)
    model_type = model_type or "c2i"
    if name not in _GPT_SHAPES:
        raise unknown_name("target config", name, target_names())
    if image_size % downsample:
        raise ConfigError(f"image_size {image_size} is not a multiple of the VQ downsampling {downsample}")
    n_layer, n_head, dim = _GPT_SHAPES[name]
    grid = image_size // downsample
    kw = dict(n_layer=n_layer, n_head=n_head, dim=dim, block_size=grid * grid, model_type=model_type,
              cls_token_num=1 if model_type == "c2i" else 120)
    kw.update(overrides)
    return TargetConfig(**kw)


def _tiny(**overrides) -> TargetConfig:
    kw = dict(dim=64, n_layer=4, n_head=4, vocab_size=256, block_size=16, num_classes=10,
              multiple_of=32)
    kw.update(overrides)
    return TargetConfig(**kw)


register_target("tiny", _tiny)


_VQ_CONFIGS = {
    "VQ-16": dict(encoder_ch_mult=(1, 1, 2, 2, 4), decoder_ch_mult=(1, 1, 2, 2, 4)),
    "VQ-8": dict(encoder_ch_mult=(1, 2, 2, 4), decoder_ch_mult=(1, 2, 2, 4)),
}
_EXTRA_VQ: dict[str, Callable[..., VQConfig]] = {}


def register_vq(name: str, factory: Callable[..., VQConfig]) -> None:
    _EXTRA_VQ[name] = factory


def vq_config(name: str, **overrides) -> VQConfig:
    """Look up a VQ config: "VQ-16", "VQ-8", or a registered name."""
    if name in _EXTRA_VQ:
        return _EXTRA_VQ[name](**overrides)
    if name not in _VQ_CONFIGS:
        raise unknown_name("VQ config", name, list(_VQ_CONFIGS) + list(_EXTRA_VQ))
    return VQConfig(**{**_VQ_CONFIGS[name], **overrides})


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings of the reference loop (LlamaGen generate.py semantics)."""

    cfg_scale: float = 1.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    cfg_interval: int = -1
