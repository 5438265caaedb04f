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

import torch
import torch.nn as nn

from ...config import find_multiple
from ...errors import ConfigError, InputError
from ...models.hf import HFDecoderShape
from ...models.layers import (
    ACTIVATIONS,
    DecoderStack,
    KVCache,
    RMSNorm,
    RotaryTarget,
    TargetOutput,
    teacher_forcing_plan,
)
from ...models.prompts import Prompts, PromptTarget, prefill_plan  # noqa: F401 (Prompts re-exported)


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
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                              f"{self.num_attention_heads}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_attention_heads {self.num_attention_heads} is not divisible by "
                              f"num_key_value_heads {self.num_key_value_heads}")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported; valid: {', '.join(ACTIVATIONS)}")

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

class ChameleonTarget(PromptTarget, RotaryTarget, nn.Module):
    """Chameleon-architecture decoder with HF parameter names (see module docstring)."""

    family = "chameleon"

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

    @property
    def output(self) -> nn.Linear:
        """The output head (name shared with the LlamaGen target: hashes, GASV tables)."""
        return self.lm_head

    def _run(self, h, positions, mask, cache, slots, taps: bool, last_only: bool = False) -> TargetOutput:
        """The decoder stack; last_only: taps, norm and head at the last position only (prefill)."""
        cos, sin = self.rope(positions)
        h, tapped = self.model.run(h, cos, sin, mask, cache, slots, self.config.tap_layers if taps else (), last_only)
        hidden = self.model.norm(h[:, -1:] if last_only else h)
        return TargetOutput(self.lm_head(hidden).float(), tapped, hidden)

    # -- the generic loops' condition protocol (models/family.py) ------------------------

    def new_cache(self, batch: int, max_len: Optional[int] = None, dtype=None, *, extra: int = 0,
                  prompt_len: Optional[int] = None, n_tokens: Optional[int] = None) -> ChameleonCache:
        """A cache for `batch` rows of up to `max_len` tokens (prompt + generated + scratch).

        The generic loops pass prompt_len, n_tokens and extra instead (max_len = their sum)."""
        if max_len is None:
            if prompt_len is None or n_tokens is None:
                raise InputError("new_cache needs max_len, or prompt_len and n_tokens")
            max_len = int(prompt_len) + int(n_tokens) + int(extra)
        if max_len > self.config.max_position_embeddings:
            raise InputError(f"{max_len} tokens (the prompt and the tokens to generate) exceed "
                             f"max_position_embeddings {self.config.max_position_embeddings} of this checkpoint; "
                             "shorten the prompt or generate fewer tokens")
        p = self.lm_head.weight
        return ChameleonCache(self.config, batch, find_multiple(max_len, 8), dtype or p.dtype, p.device)

    def forward_full(self, input_ids: torch.Tensor, taps: bool = False) -> TargetOutput:
        """Full causal forward without a cache; logits[:, t] predicts input_ids[:, t + 1]."""
        self.check_ids(input_ids)
        B, T = input_ids.shape
        pos = torch.arange(T, device=input_ids.device)[None].expand(B, T)
        return self._run(self.model.embed_tokens(input_ids), pos, None, None, None, taps)

    @torch.no_grad()
    def teacher_forced_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T, V) fp32 raw head logits over the whole vocabulary."""
        return self.forward_full(input_ids).logits

    # -- the drafter / training protocol (models/drafter.py, train/trainer.py) ------------

    def forward_train(self, cond, tokens: torch.Tensor, taps: bool = False) -> TargetOutput:
        """Teacher forcing of generated tokens after a (left-padded) prompt, without a cache.

        Args:
            cond: the prompt (ids (B, T), (ids, valid) or Prompts; the span prefix included), as
                `prefill` takes it: positions count from each row's first real token.
            tokens: (B, N) the tokens generated after it (e.g. a Lumina image span).
        Returns:
            logits (B, N, V): [:, j] predicts tokens[:, j] from the prompt and tokens[:, :j]
            ([:, 0] from the prompt alone); taps / hidden aligned the same way. Equal to prefill +
            forward_tokens of tokens[:, :-1] (the decode loops' view).
        """
        p = Prompts.of(cond)
        ids, valid = p.ids, p.valid
        self.check_ids(ids)
        if not torch.is_tensor(tokens) or tokens.dim() != 2 or tokens.shape[0] != ids.shape[0] or tokens.shape[1] < 1:
            raise InputError(f"tokens must be (B={ids.shape[0]}, N>=1) token ids; got "
                             f"{tuple(tokens.shape) if torch.is_tensor(tokens) else type(tokens).__name__}")
        self.check_ids(tokens)
        T = ids.shape[1]
        x = self.model.embed_tokens(torch.cat([ids, tokens[:, :-1]], dim=1))
        L = x.shape[1]
        if L > self.config.max_position_embeddings:
            raise InputError(f"{L} tokens exceed max_position_embeddings {self.config.max_position_embeddings}")
        mask, pos = teacher_forcing_plan(valid, L)
        out = self._run(x, pos, mask, None, None, taps)
        sl = slice(T - 1, None)
        return TargetOutput(out.logits[:, sl], None if out.taps is None else out.taps[:, sl], out.hidden[:, sl])

    def start_positions(self, cond) -> torch.Tensor:
        """(B,) RoPE position of the first generated token of each row: its real prompt length."""
        return Prompts.of(cond).valid.sum(1).to(self.lm_head.weight.device)

    def token_embedding_table(self) -> torch.Tensor:
        """(V, dim) token embedding (the drafter's frozen E)."""
        return self.model.embed_tokens.weight

    @property
    def final_norm(self) -> RMSNorm:
        """The final norm: logits = lm_head(final_norm(h))."""
        return self.model.norm

    def drafter_shape(self) -> dict:
        """DrafterConfig fields of this target's drafter: 1-D RoPE over absolute positions (the
        prompt length varies, so no fixed condition prefix), full-vocabulary logits."""
        return self.config.rope_1d_drafter_shape(self.config.vocab_size, block_size=1, warm_head=True)

    def prefill(self, input_ids, cache: ChameleonCache, valid: Optional[torch.Tensor] = None,
                taps: bool = False) -> TargetOutput:
        """Write a prompt into slots 0..T-1; logits of its last position (B, 1, V).

        Args:
            input_ids: (B, T) prompt ids, LEFT-padded when rows differ in length (or the
                condition forms of `Prompts.of`: (ids, valid), Prompts).
            valid: (B, T) bool, False on padding (default: all valid). Padding slots are
                never attended to; positions count from each row's first real token.
        """
        p = Prompts.of(input_ids, valid)
        input_ids, valid = p.ids, p.valid
        self.check_ids(input_ids)
        T = input_ids.shape[1]
        slots, pos, mask = prefill_plan(input_ids, cache, valid)
        out = self._run(self.model.embed_tokens(input_ids), pos, mask[:, None], cache, slots, taps, last_only=True)
        cache.lengths.fill_(T)
        return out

    def forward_tokens(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                       mask: torch.Tensor, cache: ChameleonCache, taps: bool = False) -> TargetOutput:
        """New tokens (B, S) at absolute RoPE `positions`, K/V written at cache `slots`.

        mask: (B, S, Lmax) bool, True = may attend (see KVCache.attention_mask); trees verify
        through it exactly as for the LlamaGen target. Returns logits (B, S, V) fp32.
        """
        self.check_positions(positions)
        return self._run(self.model.embed_tokens(tokens), positions, mask[:, None], cache, slots, taps)
