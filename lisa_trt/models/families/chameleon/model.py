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
import torch.nn.functional as F

from ....config import find_multiple
from ....errors import ConfigError, InputError
from ...layers import KVCache, RMSNorm, TargetOutput, cached_attention
from ...prompts import Prompts, PromptTarget, prefill_plan, rotate_half  # noqa: F401 (Prompts re-exported)

_ACTS = {"silu": F.silu, "swish": F.silu, "gelu": F.gelu, "relu": F.relu}


@dataclass(frozen=True)
class ChameleonConfig:
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
        if self.hidden_act not in _ACTS:
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported; valid: {', '.join(_ACTS)}")

    # -- names the shared KVCache / decode loop read ------------------------------------
    model_type = "chameleon"  # the family registry key (models/family.py)

    @property
    def n_layer(self) -> int:
        return self.num_hidden_layers

    @property
    def n_positions(self) -> int:
        return self.max_position_embeddings

    @property
    def n_head(self) -> int:
        return self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads

    @property
    def dim(self) -> int:
        return self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def tap_layers(self) -> tuple[int, int, int]:
        """EAGLE-3 taps: residual stream entering layers {2, L//2, L-3} (0-based)."""
        L = self.num_hidden_layers
        return (min(2, L - 1), L // 2, max(L - 3, 0))

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



# ----------------------------------------------------------------------------- layers

class HeadLayerNorm(nn.Module):
    """LayerNorm over head_dim with one gamma/beta per head: weight/bias (H, D) (HF layout)."""

    def __init__(self, heads: int, head_dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim))

    def forward(self, x):  # x (..., H, D)
        return F.layer_norm(x, (x.shape[-1],), None, None, self.eps) * self.weight + self.bias


class ChameleonAttention(nn.Module):
    def __init__(self, cfg: ChameleonConfig):
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_dim
        b = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.dim, cfg.n_head * self.head_dim, bias=b)
        self.k_proj = nn.Linear(cfg.dim, cfg.kv_heads * self.head_dim, bias=b)
        self.v_proj = nn.Linear(cfg.dim, cfg.kv_heads * self.head_dim, bias=b)
        self.o_proj = nn.Linear(cfg.dim, cfg.dim, bias=b)
        self.q_norm = HeadLayerNorm(cfg.n_head, self.head_dim)
        self.k_norm = HeadLayerNorm(cfg.kv_heads, self.head_dim)

    def forward(self, x, cos, sin, mask, kv=None, slots=None):
        """x (B, S, dim); cos/sin (B, S, D); mask (B, 1, S, L) bool or None (causal)."""
        B, S, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, S, self.n_head, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, S, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.n_kv, self.head_dim).transpose(1, 2)  # (B, Hkv, S, D)
        c, s = cos[:, None].to(q.dtype), sin[:, None].to(q.dtype)
        q, k = q * c + rotate_half(q) * s, k * c + rotate_half(k) * s
        y = cached_attention(q, k, v, mask, kv, slots)
        return self.o_proj(y.transpose(1, 2).reshape(B, S, -1))


class ChameleonMLP(nn.Module):
    def __init__(self, cfg: ChameleonConfig):
        super().__init__()
        b = cfg.mlp_bias
        self.gate_proj = nn.Linear(cfg.dim, cfg.intermediate_size, bias=b)
        self.up_proj = nn.Linear(cfg.dim, cfg.intermediate_size, bias=b)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.dim, bias=b)
        self.act = _ACTS[cfg.hidden_act]

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class ChameleonDecoderLayer(nn.Module):
    """Pre-norm block; with swin_norm the norms apply to the attention / MLP outputs."""

    def __init__(self, cfg: ChameleonConfig):
        super().__init__()
        self.swin = cfg.swin_norm
        self.self_attn = ChameleonAttention(cfg)
        self.mlp = ChameleonMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.dim, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, kv=None, slots=None):
        if self.swin:
            h = x + self.input_layernorm(self.self_attn(x, cos, sin, mask, kv, slots))
            return h + self.post_attention_layernorm(self.mlp(h))
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, kv, slots)
        return h + self.mlp(self.post_attention_layernorm(h))


class ChameleonBody(nn.Module):
    def __init__(self, cfg: ChameleonConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(ChameleonDecoderLayer(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.rms_norm_eps)


# ----------------------------------------------------------------------------- cache

class ChameleonCache(KVCache):
    """KVCache (its `pad` (B,): left-padding slots of each row's prompt).

    A token at cache slot j of row b has RoPE position j - pad[b] (HF's left-padded batches
    number positions from each row's first real token)."""


# ----------------------------------------------------------------------------- conditions

# ----------------------------------------------------------------------------- model

class ChameleonTarget(PromptTarget, nn.Module):
    """Chameleon-architecture decoder with HF parameter names (see module docstring)."""

    family = "chameleon"

    def __init__(self, config: ChameleonConfig):
        super().__init__()
        self.config = cfg = config
        self.model = ChameleonBody(cfg)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.register_buffer("inv_freq", torch.empty(cfg.head_dim // 2), persistent=False)
        self.reset_buffers()
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def reset_buffers(self) -> None:
        """Recompute RoPE frequencies (after `to_empty`) and re-tie the head if configured."""
        cfg, hd = self.config, self.config.head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float) / hd))
        self.inv_freq = (inv_freq / cfg.rope_linear_factor).to(self.lm_head.weight.device)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def output(self) -> nn.Linear:
        """The output head (name shared with the LlamaGen target: hashes, GASV tables)."""
        return self.lm_head

    def rope(self, positions: torch.Tensor):
        """cos, sin (B, S, head_dim) fp32 for absolute positions (B, S), as HF computes them."""
        freqs = positions[..., None].float() * self.inv_freq  # (B, S, D/2)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos(), emb.sin()

    def _run(self, h, positions, mask, cache, slots, taps: bool, last_only: bool = False) -> TargetOutput:
        """The decoder stack; last_only: taps, norm and head at the last position only (prefill)."""
        cos, sin = self.rope(positions)
        tap_ids = self.config.tap_layers if taps else ()
        tapped = []
        for i, layer in enumerate(self.model.layers):
            if i in tap_ids:
                tapped.extend([h[:, -1:] if last_only else h] * tap_ids.count(i))
            kv = (cache.k[i], cache.v[i]) if cache is not None else None
            h = layer(h, cos, sin, mask, kv, slots)
        hidden = self.model.norm(h[:, -1:] if last_only else h)
        logits = self.lm_head(hidden).float()
        return TargetOutput(logits, torch.cat(tapped, dim=-1) if taps else None, hidden)

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
            raise InputError(f"{max_len} tokens exceed max_position_embeddings "
                             f"{self.config.max_position_embeddings} of this checkpoint")
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
        B, T = ids.shape
        x = self.model.embed_tokens(torch.cat([ids, tokens[:, :-1]], dim=1))
        L = x.shape[1]
        if L > self.config.max_position_embeddings:
            raise InputError(f"{L} tokens exceed max_position_embeddings {self.config.max_position_embeddings}")
        col = torch.ones(B, L, dtype=torch.bool, device=x.device)
        col[:, :T] = valid
        eye = torch.eye(L, dtype=torch.bool, device=x.device)
        mask = (torch.tril(torch.ones(L, L, dtype=torch.bool, device=x.device))[None] & col[:, None, :]) | eye
        pos = (torch.arange(L, device=x.device)[None] - (~valid).sum(1, keepdim=True)).clamp(min=0)
        out = self._run(x, pos, mask[:, None], None, None, taps)
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
        c = self.config
        return dict(target_dim=c.dim, n_head=c.n_head, head_dim=c.head_dim, ffn_hidden=c.intermediate_size,
                    vocab_size=c.vocab_size, block_size=1, cls_token_num=0, rope_base=c.rope_theta,
                    norm_eps=c.rms_norm_eps, rope="1d", max_positions=c.max_position_embeddings, warm_head=True)

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
        if int(positions.max()) >= self.config.max_position_embeddings:
            raise InputError(f"position {int(positions.max())} is past max_position_embeddings "
                             f"{self.config.max_position_embeddings}")
        return self._run(self.model.embed_tokens(tokens), positions, mask[:, None], cache, slots, taps)
