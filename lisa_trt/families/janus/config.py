"""Janus-Pro shapes and prompt protocol, read from an HF checkpoint directory.

An HF Janus directory (`JanusForConditionalGeneration`, e.g. deepseek-community/Janus-Pro-1B)
holds `config.json` with `model_type: "janus"` and three nested configs:

    text_config    the Llama language model (hidden size, layers, heads, RoPE)
    vision_config  the understanding tower; only `image_size // patch_size` (the token grid)
                   and `num_image_tokens` (tokens per generated image) matter here
    vq_config      the VQ model and the generation path: codebook (`num_embeddings` x
                   `embed_dim`), aligner / head widths (`projection_dim`,
                   `image_token_embed_dim`, `num_hidden_layers`, `hidden_act`) and the decoder

transformers' `save_pretrained` may leave out sub-config keys that equal the class defaults, so
missing keys take transformers' defaults (LlamaConfig, JanusVisionConfig, JanusVQVAEConfig).
The tokens image generation needs (bos, pad and `generation_kwargs.boi_token_id`) come from
`generation_config.json` as transformers' `generate` reads them, falling back to config.json.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Optional, Union

from ...models.hf import HFDecoderShape, rope_params as _rope
from ...errors import ConfigError

PathLike = Union[str, Path]
MODEL_TYPE = "janus"
DEFAULT_PROMPT_TOKENS = 128  # the prompt budget a KV cache reserves unless set
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_pytorch_tanh", "relu")

# transformers' defaults for keys a config.json may omit (LlamaConfig, JanusVisionConfig, JanusVQVAEConfig)
_LLAMA = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
              num_attention_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-6, hidden_act="silu",
              attention_bias=False, mlp_bias=False)
_VISION = dict(image_size=384, patch_size=16, num_image_tokens=576)
_VQ = dict(embed_dim=8, num_embeddings=16384, latent_channels=256, base_channels=128,
           channel_multiplier=(1, 1, 2, 2, 4), num_res_blocks=2, out_channels=3, projection_dim=2048,
           num_hidden_layers=2, hidden_act="gelu", image_token_embed_dim=2048)


@dataclass(frozen=True)
class JanusVQConfig:
    """The VQ decoder (`model.vqmodel.*`): codes (grid x grid) -> pixels."""

    codebook_size: int = 16384
    embed_dim: int = 8
    latent_channels: int = 256
    base_channels: int = 128
    channel_multiplier: tuple = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    out_channels: int = 3
    grid: int = 24  # tokens per side (vision image_size // patch_size)

    def __post_init__(self):
        object.__setattr__(self, "channel_multiplier", tuple(int(m) for m in self.channel_multiplier))
        bad = [self.base_channels * m for m in self.channel_multiplier if (self.base_channels * m) % 32]
        if bad:
            raise ConfigError(f"VQ decoder channels {bad} are not multiples of 32 (its GroupNorms use 32 groups)")

    @property
    def n_codes(self) -> int:
        """Codes the decoder takes (the VQ setting generic decoders read: export/prompt_graphs.vq_settings)."""
        return self.codebook_size

    @property
    def downsample(self) -> int:
        """Pixels per token side: one 2x upsampling per level but the last."""
        return 2 ** (len(self.channel_multiplier) - 1)

    @property
    def image_size(self) -> int:
        return self.grid * self.downsample


@dataclass(frozen=True)
class JanusConfig(HFDecoderShape):
    """A Janus-Pro target in image-generation mode (Llama decoder + generation path).

    `vocab_size` is the CODEBOOK size (the generation head's width), as the decode loops read
    it; the text vocabulary is `text_vocab_size`. `max_prompt_tokens` is the prompt budget a
    KV cache reserves (JanusTarget.new_cache), settable: `replace(cfg, max_prompt_tokens=256)`.
    """

    # language model (text_config: Llama)
    text_vocab_size: int = 102400
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    max_position_embeddings: int = 16384
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_linear_factor: float = 1.0
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    # generation path (vq_config): codes -> embeddings -> aligner MLP; hidden -> head MLP -> codes
    codebook_size: int = 16384
    code_dim: int = 8
    aligner_layers: int = 2
    projection_dim: int = 2048
    head_input_dim: int = 2048  # vq_config.image_token_embed_dim (must equal hidden_size)
    gen_act: str = "gelu"
    num_image_tokens: int = 576
    vq: JanusVQConfig = field(default_factory=JanusVQConfig)
    # prompt protocol (generation_config.json) and the cache's prompt budget
    bos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    boi_token_id: Optional[int] = None
    max_prompt_tokens: int = 128  # read_janus_config: DEFAULT_PROMPT_TOKENS, or less for short max_positions

    def __post_init__(self):
        if not self.head_dim:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                                  f"{self.num_attention_heads}")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        checks = [
            (self.num_attention_heads % self.num_key_value_heads == 0,
             f"num_attention_heads {self.num_attention_heads} is not divisible by num_key_value_heads "
             f"{self.num_key_value_heads}"),
            (self.head_dim % 2 == 0, f"head_dim {self.head_dim} must be even (rotate-half RoPE)"),
            (self.hidden_act in ACTIVATIONS, f"text hidden_act {self.hidden_act!r} is not supported; valid: "
                                             f"{', '.join(ACTIVATIONS)}"),
            (self.gen_act in ACTIVATIONS, f"vq_config hidden_act {self.gen_act!r} is not supported; valid: "
                                          f"{', '.join(ACTIVATIONS)}"),
            (self.head_input_dim == self.hidden_size,
             f"vq_config.image_token_embed_dim {self.head_input_dim} must equal text hidden_size "
             f"{self.hidden_size} (the generation head reads the language model's hidden state)"),
            (self.projection_dim == self.hidden_size,
             f"vq_config.projection_dim {self.projection_dim} must equal text hidden_size {self.hidden_size} "
             "(the generation aligner feeds image-code embeddings to the language model)"),
            (self.aligner_layers >= 1, "vq_config.num_hidden_layers (aligner depth) must be >= 1"),
            (self.num_image_tokens >= 1, f"vision_config.num_image_tokens must be >= 1, got {self.num_image_tokens}"),
            (self.vq.codebook_size == self.codebook_size,
             f"VQ codebook {self.vq.codebook_size} != generation codebook {self.codebook_size}"),
            (self.max_prompt_tokens >= 1, f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}"),
            (self.max_prompt_tokens + self.num_image_tokens <= self.max_position_embeddings,
             f"max_prompt_tokens {self.max_prompt_tokens} + {self.num_image_tokens} image tokens exceed "
             f"max_position_embeddings {self.max_position_embeddings}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)

    # -- names the shared KVCache / decode loops read -----------------------------------
    @property
    def model_type(self) -> str:
        return MODEL_TYPE

    @property
    def vocab_size(self) -> int:
        """Width of the logits the target returns: the image codebook."""
        return self.codebook_size

    @property
    def block_size(self) -> int:
        """Image tokens per image (grid h * w)."""
        return self.num_image_tokens

    def check_grid(self) -> None:
        """ConfigError unless one generated image (num_image_tokens) is the VQ's token grid.

        transformers generates `vision_config.num_image_tokens` codes and its VQ decodes
        (image_size // patch_size)^2 of them; the two are independent config keys. A checkpoint
        where they differ still generates (load_target, image_logits, generate: N codes, as
        transformers does), but nothing that needs the image grid (decoding what was generated,
        prompts for an image size, export, spatial rules) can run."""
        g = self.vq.grid
        if g * g != self.num_image_tokens:
            raise ConfigError(f"this Janus checkpoint generates {self.num_image_tokens} image tokens "
                              f"(vision_config.num_image_tokens) but its VQ decodes a {g} x {g} grid "
                              f"(vision_config image_size // patch_size); set num_image_tokens to {g * g} "
                              "in config.json so that generated images can be decoded")

    @property
    def grid_hw(self) -> tuple[int, int]:
        """(height, width) of the token grid (row-major raster order)."""
        self.check_grid()
        return (self.vq.grid, self.vq.grid)

    @property
    def grid_size(self) -> int:
        self.check_grid()
        return self.vq.grid

    @property
    def image_size(self) -> int:
        """Side of the decoded image in pixels (grid * VQ downsampling)."""
        self.check_grid()
        return self.vq.image_size

    @property
    def seq_len(self) -> int:
        """Committed tokens a default cache holds: prompt budget + one image."""
        return self.max_prompt_tokens + self.num_image_tokens

    def to_dict(self) -> dict:
        """JSON-able fields (manifests); from_dict inverts it."""
        d = asdict(self)
        d["vq"]["channel_multiplier"] = list(self.vq.channel_multiplier)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "JanusConfig":
        d = dict(d)
        return cls(**{**d, "vq": JanusVQConfig(**d.get("vq", {}))})

    def with_overrides(self, **kw) -> "JanusConfig":
        names = {f.name for f in fields(self)}
        bad = sorted(set(kw) - names)
        if bad:
            raise ConfigError(f"unknown JanusConfig field(s) {', '.join(bad)}; valid: {', '.join(sorted(names))}")
        return replace(self, **kw)

    def describe(self) -> str:
        return (f"janus {self.num_hidden_layers} layers x hidden {self.hidden_size}, heads "
                f"{self.num_attention_heads}/{self.num_key_value_heads} kv, head_dim {self.head_dim}, "
                f"text vocab {self.text_vocab_size}, codebook {self.codebook_size} x {self.code_dim}, "
                f"projection {self.projection_dim}, {self.vq.grid}x{self.vq.grid} tokens")


# ----------------------------------------------------------------------------- reading

_WRONG_DIR = ("a Janus-Pro checkpoint is an HF directory with config.json (model_type 'janus') and "
              "model.safetensors, as `JanusForConditionalGeneration.save_pretrained` writes it "
              "(e.g. deepseek-community/Janus-Pro-1B)")


def _load_json(path: Path, what: str) -> dict:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is not valid JSON ({e}); {what}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} does not hold a JSON object; {what}")
    return raw


def read_raw_config(path: PathLike) -> dict:
    """config.json of a Janus directory, with a clear error for anything else."""
    path = Path(path)
    cfg_path = path / "config.json"
    if not path.is_dir() or not cfg_path.is_file():
        raise ConfigError(f"{path} is not a directory with config.json: {_WRONG_DIR}")
    raw = _load_json(cfg_path, _WRONG_DIR)
    mt = raw.get("model_type")
    if mt == "multi_modality":
        raise ConfigError(f"{cfg_path} is DeepSeek's original Janus layout (model_type 'multi_modality'); "
                          "convert it with transformers' models/janus/convert_janus_weights_to_hf.py or use "
                          "the converted deepseek-community/Janus-Pro-* checkpoints")
    if mt != MODEL_TYPE:
        raise ConfigError(f"{cfg_path} has model_type {mt!r}, not 'janus': {_WRONG_DIR}")
    for key in ("text_config", "vq_config"):
        if not isinstance(raw.get(key), dict):
            raise ConfigError(f"{cfg_path} has no {key} object; {_WRONG_DIR}")
    return raw


def _special_tokens(path: Path, raw: dict, text: dict) -> dict:
    """bos / pad / boi ids as transformers' image generation reads them (generation_config first)."""
    gen_path = path / "generation_config.json"
    gen = _load_json(gen_path, "re-save it with model.generation_config.save_pretrained") if gen_path.is_file() else {}

    def pick(key):
        for src in (gen, raw, text):
            if src.get(key) is not None:
                return src[key]
        return None

    boi = (gen.get("generation_kwargs") or {}).get("boi_token_id")
    return dict(bos_token_id=pick("bos_token_id"), pad_token_id=pick("pad_token_id"), boi_token_id=boi)


def _default_budget(max_positions: int, n_image: int) -> int:
    """The default prompt budget: DEFAULT_PROMPT_TOKENS, or what max_position_embeddings leaves
    beside one image when that is less (small checkpoints); none left is refused."""
    room = max_positions - n_image
    if room < 1:
        raise ConfigError(f"max_position_embeddings {max_positions} leaves no room for a prompt before the "
                          f"{n_image} image tokens (vision_config.num_image_tokens); the checkpoint cannot "
                          "generate an image")
    return min(DEFAULT_PROMPT_TOKENS, room)


def read_janus_config(path: PathLike, **overrides) -> JanusConfig:
    """Parse a Janus directory's config.json (+ generation_config.json) into a JanusConfig.

    Args:
        path: the checkpoint directory.
        overrides: JanusConfig fields to replace (e.g. max_prompt_tokens=256).
    """
    path = Path(path)
    raw = read_raw_config(path)
    text = {**_LLAMA, **{k: v for k, v in raw["text_config"].items() if v is not None}}
    if text.get("model_type", "llama") != "llama":
        raise ConfigError(f"{path / 'config.json'}: text_config model_type {text['model_type']!r} is not supported; "
                          "the Janus target is transformers' Llama language model (text_config model_type "
                          "'llama', as in every Janus-Pro checkpoint)")
    vis = {**_VISION, **{k: v for k, v in (raw.get("vision_config") or {}).items() if v is not None}}
    vq = {**_VQ, **{k: v for k, v in raw["vq_config"].items() if v is not None}}
    if not isinstance(vis["image_size"], int) or not isinstance(vis["patch_size"], int):
        raise ConfigError(f"vision_config image_size / patch_size must be integers (square images), got "
                          f"{vis['image_size']!r} / {vis['patch_size']!r}")
    try:
        theta, factor = _rope(text)
        vq_cfg = JanusVQConfig(codebook_size=int(vq["num_embeddings"]), embed_dim=int(vq["embed_dim"]),
                               latent_channels=int(vq["latent_channels"]), base_channels=int(vq["base_channels"]),
                               channel_multiplier=tuple(vq["channel_multiplier"]),
                               num_res_blocks=int(vq["num_res_blocks"]), out_channels=int(vq["out_channels"]),
                               grid=vis["image_size"] // vis["patch_size"])
        cfg = JanusConfig(
            text_vocab_size=int(text["vocab_size"]), hidden_size=int(text["hidden_size"]),
            intermediate_size=int(text["intermediate_size"]), num_hidden_layers=int(text["num_hidden_layers"]),
            num_attention_heads=int(text["num_attention_heads"]),
            num_key_value_heads=int(text.get("num_key_value_heads") or text["num_attention_heads"]),
            head_dim=int(text.get("head_dim") or 0), max_position_embeddings=int(text["max_position_embeddings"]),
            rms_norm_eps=float(text["rms_norm_eps"]), rope_theta=theta, rope_linear_factor=factor,
            hidden_act=str(text["hidden_act"]), attention_bias=bool(text["attention_bias"]),
            mlp_bias=bool(text["mlp_bias"]), codebook_size=int(vq["num_embeddings"]), code_dim=int(vq["embed_dim"]),
            aligner_layers=max(1, int(vq["num_hidden_layers"])),  # 0 builds fc1 only in transformers, as 1 does
            projection_dim=int(vq["projection_dim"]),
            head_input_dim=int(vq["image_token_embed_dim"]), gen_act=str(vq["hidden_act"]),
            num_image_tokens=int(vis["num_image_tokens"]), vq=vq_cfg,
            max_prompt_tokens=_default_budget(int(text["max_position_embeddings"]), int(vis["num_image_tokens"])),
            **_special_tokens(path, raw, text))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path / 'config.json'}: {e}") from e
    except ConfigError as e:
        raise ConfigError(f"{path / 'config.json'}: {e}") from e
    return cfg.with_overrides(**overrides) if overrides else cfg


def is_janus_dir(path) -> bool:
    """True for a directory whose config.json says model_type "janus"."""
    if not isinstance(path, (str, Path)):
        return False
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False
