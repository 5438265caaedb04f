"""Chameleon-architecture target (Chameleon, Lumina-mGPT) with a static KV cache.

Module and parameter names follow HF transformers' `ChameleonForConditionalGeneration`
(`model.embed_tokens`, `model.layers.N.self_attn.q_proj`, ..., `model.norm`, `lm_head`), so HF
checkpoint directories load strictly (see chameleon_io.py). The math follows HF's reference:
RMSNorm in fp32, per-head q/k LayerNorm (statistics over head_dim, one gamma/beta per head)
applied before RoPE, rotate-half RoPE on absolute positions, GQA, SwiGLU MLP, and the
`swin_norm` variant that normalises the sub-layer OUTPUT instead of its input.

Entry points mirror the LlamaGen target (models/llamagen.py), so the decode loop can drive it:
- `prefill(input_ids, cache, valid=None)`: writes a (left-padded) text prompt into the cache.
- `forward_tokens(tokens, positions, slots, mask, cache)`: new tokens at absolute positions,
  written at cache slots, attending through an explicit (tree) mask.
- `forward_full(input_ids)`: full causal forward without a cache (teacher forcing).
Logits are the RAW lm_head output over the whole vocabulary (HF's forward masks image tokens
for text generation; image generation needs them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch.nn as nn

from ...errors import InputError
from ...models.hf import HFDecoderShape
from ...models.layers import DecoderStack, KVCache
from ...models.prompts import Prompts  # noqa: F401 (re-exported)
from ..prompt_target import VocabPromptTarget, check_decoder_shape


@dataclass(frozen=True)
class ChameleonConfig(HFDecoderShape):
    """Shapes of a Chameleon-architecture decoder, read from an HF config.json."""

    vocab_size: int = 65536
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_linear_factor: float = 1.0  # HF rope_type "linear": positions / factor
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    swin_norm: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: Optional[int] = 1
    eos_token_id: Optional[int] = 2
    vocabulary_map: Optional[dict] = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        check_decoder_shape(self)

    # -- names the shared KVCache / decode loop read ------------------------------------
    model_type = "chameleon"  # the family registry key (models/family.py)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def describe(self) -> str:
        return (f"chameleon {self.num_hidden_layers} layers x hidden {self.hidden_size}, heads "
                f"{self.num_attention_heads}/{self.num_key_value_heads} kv, vocab {self.vocab_size}, "
                f"intermediate {self.intermediate_size}, swin_norm={self.swin_norm}")


# ----------------------------------------------------------------------------- image vocabulary

LUMINA_IMAGE_CODES = range(4, 8196)  # the 8,192 VQ codes of the Chameleon / Lumina-mGPT tokenizer


def _img_name_to_code(name: str) -> int:
    """'IMGIMG' + digits spelt A..J + one closing char -> VQ code (HF's bpe2img rule)."""
    return int("".join(str(ord(c) - ord("A")) if "A" <= c <= "J" else c for c in name[len("IMGIMG"):-1]))


def image_vocab(vocabulary_map: Optional[dict], vocab_size: int) -> dict[int, int]:
    """{token id: VQ code} for every image-code token of the vocabulary."""
    if vocabulary_map:
        found = {int(i): _img_name_to_code(n) for n, i in vocabulary_map.items() if n.startswith("IMGIMG")}
        if found:
            return found
    if vocab_size >= LUMINA_IMAGE_CODES.stop:
        return {t: t - LUMINA_IMAGE_CODES.start for t in LUMINA_IMAGE_CODES}
    raise InputError("this checkpoint's config.json has no vocabulary_map with IMGIMG* image tokens and "
                     f"its vocabulary ({vocab_size}) is too small for Lumina-mGPT's image codes 4..8195")


# ----------------------------------------------------------------------------- cache

class ChameleonCache(KVCache):
    """KVCache (its `pad` (B,): left-padding slots of each row's prompt).

    A token at cache slot j of row b has RoPE position j - pad[b] (HF's left-padded batches
    number positions from each row's first real token)."""


# ----------------------------------------------------------------------------- model

class ChameleonTarget(VocabPromptTarget):
    """Chameleon-architecture decoder with HF parameter names (see module docstring); the
    prompt / cache / teacher-forcing protocol is the shared families/prompt_target.py."""

    family = "chameleon"
    cache_class = ChameleonCache

    def __init__(self, config: ChameleonConfig):
        super().__init__()
        self.config = cfg = config
        self.model = DecoderStack(cfg, cfg.vocab_size, qk_norm=True, swin_norm=cfg.swin_norm)  # HF `model.*`
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self._init_rope_and_weights()

    def reset_buffers(self) -> None:
        """Recompute RoPE frequencies (after `to_empty`) and re-tie the head if configured."""
        super().reset_buffers()
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
