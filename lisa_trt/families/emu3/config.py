"""Emu3's checkpoint configuration: transformers' layout (`config.json` of model_type "emu3" with
`text_config`, `vq_config` and `vocabulary_map`; transformers 4.x / 5.x field names), read
into frozen dataclasses.

Facts (transformers' Emu3Config / Emu3ImageVocabularyMapping / Emu3Processor; read, not copied):
- the decoder is a Llama-style stack (GQA, SwiGLU, RMSNorm, rotate-half RoPE, no q/k norm) under
  `model.text_model.*`, the head `lm_head`, the VQ-VAE under `model.vqmodel.*`;
- the visual tokens are named `<|visual token NNNNNN|>` (NNNNNN the VQ code);
- an image is generated as rows of visual tokens each followed by end-of-line `<|extra_200|>`,
  then end-of-frame `<|extra_201|>`, end-of-image `<|image end|>` and end-of-sequence (the
  tokenizer's eos `<|extra_204|>`, text_config.eos_token_id);
- the prompt ends with `<|image start|>H*W<|image token|>` (H, W the code grid, as text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ...errors import ConfigError
from ...models.hf import HFDecoderShape, rope_params

MODEL_TYPES = ("emu3",)
VISUAL_PREFIX = "<|visual token"
EOL, EOF, EOI, BOI, IMAGE_WRAPPER, EOS = ("<|extra_200|>", "<|extra_201|>", "<|image end|>", "<|image start|>",
                                          "<|image token|>", "<|extra_204|>")
_TEXT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "max_position_embeddings", "rms_norm_eps", "hidden_act", "attention_bias", "mlp_bias",
                "bos_token_id", "eos_token_id", "pad_token_id")


@dataclass(frozen=True)
class Emu3Config(HFDecoderShape):
    """Shapes of Emu3's decoder (`text_config`) and its vocabulary map."""

    vocab_size: int = 184622
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    max_position_embeddings: int = 9216
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1000000.0
    rope_linear_factor: float = 1.0
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: Optional[int] = 151849
    eos_token_id: Optional[int] = 151850
    pad_token_id: Optional[int] = 151643
    vocabulary_map: Optional[dict] = field(default=None, compare=False, repr=False)

    model_type = "emu3"  # the family registry key (models/family.py)

    def __post_init__(self):
        from ..prompt_target import check_decoder_shape

        check_decoder_shape(self)
        if not self.vocabulary_map:
            raise ConfigError("config.json has no vocabulary_map: Emu3 needs it (the visual token names and the "
                              "image protocol tokens); re-save the checkpoint with transformers' Emu3 classes")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def token_id(self, name: str) -> int:
        """Id of a protocol token of the vocabulary map; ConfigError naming it when absent."""
        i = self.vocabulary_map.get(name)
        if i is None:
            raise ConfigError(f"the vocabulary_map has no token {name!r}: is this an Emu3 checkpoint?")
        return int(i)

    def image_vocab(self) -> dict:
        """{token id: VQ code} of every `<|visual token NNNNNN|>`."""
        return {int(i): int(n[-8:-2]) for n, i in self.vocabulary_map.items() if n.startswith(VISUAL_PREFIX)}

    def end_tokens(self) -> tuple:
        """(end-of-line, end-of-frame, end-of-image, end-of-sequence) ids of an image span."""
        eos = self.vocabulary_map.get(EOS, self.eos_token_id)
        return self.token_id(EOL), self.token_id(EOF), self.token_id(EOI), int(eos)

    def describe(self) -> str:
        return (f"emu3 {self.num_hidden_layers} layers x hidden {self.hidden_size}, heads "
                f"{self.num_attention_heads}/{self.num_key_value_heads} kv, vocab {self.vocab_size}, "
                f"intermediate {self.intermediate_size}")


@dataclass(frozen=True)
class Emu3VQConfig:
    """The VQ-VAE decoder's shapes (`vq_config`); the family's declared VQ settings."""

    codebook_size: int = 32768
    embed_dim: int = 4
    latent_channels: int = 4
    out_channels: int = 3
    temporal_downsample_factor: int = 4
    base_channels: int = 256
    channel_multiplier: tuple = (1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple = (3,)
    hidden_size: int = 1024
    num_attention_heads: int = 1

    @property
    def n_codes(self) -> int:
        return self.codebook_size

    @property
    def downsample(self) -> int:
        """Pixels per code along each side (2 ** (levels - 1))."""
        return 2 ** (len(self.channel_multiplier) - 1)

    @classmethod
    def from_hf(cls, raw: dict) -> "Emu3VQConfig":
        kw = {k: raw[k] for k in cls.__dataclass_fields__ if raw.get(k) is not None}
        for k in ("channel_multiplier", "attn_resolutions"):
            if k in kw:
                kw[k] = tuple(kw[k])
        return cls(**kw)


def read_raw(path) -> dict:
    """DIR/config.json of model_type emu3, parsed; ConfigError naming the fix otherwise."""
    from ..prompt_family import read_config_json

    cfg_path, raw = read_config_json(path, "an Emu3 checkpoint is a transformers directory with config.json "
                                     "(text_config, vq_config, vocabulary_map) and model*.safetensors")
    if raw.get("model_type") not in MODEL_TYPES:
        raise ConfigError(f"{cfg_path} has model_type {raw.get('model_type')!r}; the Emu3 family loads transformers' "
                          "Emu3ForConditionalGeneration directories (model_type \"emu3\"; the original BAAI/Emu3-Gen "
                          "remote-code layout: convert it with transformers' convert_emu3_weights_to_hf.py)")
    return raw


def read_emu3_config(path) -> Emu3Config:
    """The decoder's Emu3Config of an Emu3 directory."""
    raw = read_raw(path)
    text = raw.get("text_config") or {}
    kw = {k: text[k] for k in _TEXT_FIELDS if text.get(k) is not None}
    kw["num_key_value_heads"] = text.get("num_key_value_heads") or kw.get("num_attention_heads", 32)
    if isinstance(kw.get("eos_token_id"), list):
        kw["eos_token_id"] = kw["eos_token_id"][0]
    kw["rope_theta"], kw["rope_linear_factor"] = rope_params({"rope_theta": 1000000.0, **text})
    kw["tie_word_embeddings"] = bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    try:
        return Emu3Config(vocabulary_map=raw.get("vocabulary_map"), **kw)
    except TypeError as e:
        raise ConfigError(f"{path}: {e}") from e


def read_emu3_vq_config(path) -> Emu3VQConfig:
    return Emu3VQConfig.from_hf(read_raw(path).get("vq_config") or {})
