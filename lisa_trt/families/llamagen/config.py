"""LlamaGen's configurations: the GPT target (`TargetConfig`, LlamaGen's ModelArgs fields), the
VQ tokenizer (`VQConfig`), the official GPT shapes and the named configs GPT-B ... GPT-7B, tiny,
VQ-16 and VQ-8.

Importing this module (the family package does) registers the names with
models/target_config.py, where the commands above the families look them up
(`target_config("GPT-B", image_size=384)`), and publishes the two classes as the public
`TargetConfig` / `VQConfig` (`lisa_trt.TargetConfig`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Optional

from ...config import find_multiple, strict_from_dict
from ...errors import ConfigError
from ...models.target_config import publish_config_type, register_target, register_vq


@dataclass(frozen=True)
class TargetConfig:
    """A LlamaGen GPT target (field names follow LlamaGen's ModelArgs, so official settings carry
    over verbatim); a models/target_config.TargetShape.

    `model_type` is "c2i" (one class token) or "t2i" (cls_token_num T5 caption slots of width
    caption_dim); the validation accepts any identifier, so a config names the type it was made
    for and models/family.family_of answers which family serves it. `grid_shape` (height, width) in tokens describes a
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

    def cond_dims(self) -> dict:
        """The condition's static axes (models/target_config.TargetShape.cond_dims): the prefix of
        cls_token_num slots and the caption width (both model types carry both fields)."""
        return {"prefix": self.cls_token_num, "caption_dim": self.caption_dim}

    def drafter_shape(self) -> dict:
        """The drafter's shape of a target of this config (models/drafter.DrafterConfig.for_shape):
        2-D RoPE over its grid with the cls_token_num prefix rows; the head warm-starts from
        output(norm(h))."""
        return dict(target_dim=self.dim, n_head=self.n_head, head_dim=self.head_dim, ffn_hidden=self.ffn_hidden,
                    vocab_size=self.vocab_size, block_size=self.block_size, cls_token_num=self.cls_token_num,
                    rope_base=self.rope_base, norm_eps=self.norm_eps, rope="2d", max_positions=0, warm_head=True,
                    grid_hw=self.grid_hw)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if d["grid_shape"] is None:
            del d["grid_shape"]  # square grids serialise as before
        else:
            d["grid_shape"] = list(d["grid_shape"])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TargetConfig":
        return strict_from_dict(cls, d)


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
        return strict_from_dict(cls, d)



# Official GPT shapes: (n_layer, n_head, dim).
GPT_SHAPES = {
    "GPT-B": (12, 12, 768),
    "GPT-L": (24, 16, 1024),
    "GPT-XL": (36, 20, 1280),
    "GPT-XXL": (48, 24, 1536),
    "GPT-XXXL": (48, 40, 2560),
    "GPT-1B": (22, 32, 2048),
    "GPT-3B": (24, 32, 3200),
    "GPT-7B": (32, 32, 4096),
}
CAPTION_SLOTS = 120  # t2i: T5 caption tokens in the condition prefix (LlamaGen's t5 max length)


def gpt_config(name: str, image_size: int = 256, model_type: Optional[str] = None,
               downsample: int = 16, **overrides) -> TargetConfig:
    """An official GPT shape as a TargetConfig.

    Args:
        name: "GPT-B" ... "GPT-7B".
        image_size: pixels; block_size = (image_size / downsample) ** 2.
        model_type: "c2i" (1 class token, 1000 classes; default) or "t2i" (120 caption tokens).
        overrides: any TargetConfig field.
    """
    model_type = model_type or "c2i"
    if image_size % downsample:
        raise ConfigError(f"image_size {image_size} is not a multiple of the VQ downsampling {downsample}")
    n_layer, n_head, dim = GPT_SHAPES[name]
    grid = image_size // downsample
    kw = dict(n_layer=n_layer, n_head=n_head, dim=dim, block_size=grid * grid, model_type=model_type,
              cls_token_num=1 if model_type == "c2i" else CAPTION_SLOTS)
    kw.update(overrides)
    return TargetConfig(**kw)


def tiny_config(**overrides) -> TargetConfig:
    """"tiny": a 4-layer, 64-wide c2i target over a 4 x 4 grid of 256 codes (tests, smoke runs)."""
    kw = dict(dim=64, n_layer=4, n_head=4, vocab_size=256, block_size=16, num_classes=10,
              multiple_of=32)
    kw.update(overrides)
    return TargetConfig(**kw)


VQ_CONFIGS = {
    "VQ-16": dict(encoder_ch_mult=(1, 1, 2, 2, 4), decoder_ch_mult=(1, 1, 2, 2, 4)),
    "VQ-8": dict(encoder_ch_mult=(1, 2, 2, 4), decoder_ch_mult=(1, 2, 2, 4)),
}


def _vq(name: str, **overrides) -> VQConfig:
    return VQConfig(**{**VQ_CONFIGS[name], **overrides})


for _name in GPT_SHAPES:
    register_target(_name, functools.partial(gpt_config, _name), sized=True)
register_target("tiny", tiny_config)
for _name in VQ_CONFIGS:
    register_vq(_name, functools.partial(_vq, _name))
publish_config_type(TargetConfig)
publish_config_type(VQConfig)

__all__ = ["CAPTION_SLOTS", "GPT_SHAPES", "TargetConfig", "VQConfig", "VQ_CONFIGS", "gpt_config", "tiny_config"]
