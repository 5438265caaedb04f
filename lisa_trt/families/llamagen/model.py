"""LlamaGen GPT target with a static KV cache and explicit entry points.

Parameter names follow LlamaGen's autoregressive/models/gpt.py so that official checkpoints load
strictly. The math follows docs/spec/llamagen.md: RMSNorm in fp32, SwiGLU FFN, plain SDPA, 2D RoPE
on adjacent pairs with ZERO rows for the condition prefix, logits in fp32.

Entry points (docs/design.md principle 4, explicit modes):
- `prefill(cond, cache)`: writes the condition prefix into the cache.
- `forward_tokens(tokens, positions, slots, mask, cache)`: any set of new tokens at absolute
  sequence positions, written at cache slots, attending through an explicit mask. The reference
  AR loop (S = 1) and tree verification (S = tree size) both call it.
- `cache.compact(src_slots, counts)`: moves the accepted path's K/V into contiguous slots.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...config import find_multiple
from ...errors import ConfigError, InputError
from ...models.family import FamilyTarget
from ...models.layers import (  # noqa: F401 (KVCache re-exported)
    Attention,
    KVCache,
    RMSNorm,
    Rope,
    SwiGLU,
    TargetOutput,
    pair_rope,
)
from ...models.rope import precompute_freqs_cis_2d
from .config import TargetConfig

Cond = Union[torch.Tensor, tuple]


def committed_len(cfg, max_len: Optional[int]) -> int:
    """The committed tokens a LlamaGen cache holds: the whole sequence (condition prefix + image,
    seq_len) unless `max_len` asks for more; InputError for less (the loops commit them all)."""
    if max_len is None:
        return cfg.seq_len
    if int(max_len) < cfg.seq_len:
        raise InputError(f"max_len {max_len} is shorter than the sequence ({cfg.seq_len}: the condition prefix and "
                         "the image): a LlamaGen cache holds the whole sequence; leave max_len out")
    return int(max_len)


class TransformerBlock(nn.Module):
    """Pre-norm block with LlamaGen's names: `attention` (fused `wqkv`, `wo`), `feed_forward`
    (`w1`, `w3`, `w2`), `attention_norm`, `ffn_norm`."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.attention = Attention(cfg.dim, cfg.n_head, cfg.kv_heads, cfg.head_dim, fused=True)
        self.feed_forward = SwiGLU(cfg.dim, cfg.ffn_hidden, names=("w1", "w3", "w2"))
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x, rope: Rope, mask, kv=None, slots=None):
        h = x + self.attention(self.attention_norm(x), rope, mask, kv, slots)
        return h + self.feed_forward(self.ffn_norm(h))


class LabelEmbedder(nn.Module):
    """c2i condition: one row per class plus the null class (= num_classes)."""

    def __init__(self, num_classes: int, dim: int):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + 1, dim)

    def forward(self, labels):
        return self.embedding_table(labels).unsqueeze(1)  # (B, 1, dim)


class CaptionMLP(nn.Module):
    def __init__(self, cin: int, dim: int):
        super().__init__()
        self.fc1 = nn.Linear(cin, dim, bias=False)
        self.fc2 = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    """t2i condition: T5 features through an MLP; `uncond_embedding` is the null caption."""

    def __init__(self, caption_dim: int, dim: int, token_num: int):
        super().__init__()
        self.cap_proj = CaptionMLP(caption_dim, dim)
        self.register_buffer("uncond_embedding", torch.randn(token_num, caption_dim) / caption_dim ** 0.5)

    def forward(self, features):
        return self.cap_proj(features)


# ----------------------------------------------------------------------------- model

class Transformer(FamilyTarget, nn.Module):
    """LlamaGen GPT (c2i or t2i) with official parameter names."""

    def __init__(self, config: TargetConfig):
        super().__init__()
        self.config = cfg = config
        if cfg.model_type not in ("c2i", "t2i"):
            raise ConfigError(f"the LlamaGen Transformer serves model_type c2i / t2i, not {cfg.model_type!r} "
                              "(another family builds its own model: models/family.py)")
        if cfg.model_type == "c2i":
            self.cls_embedding = LabelEmbedder(cfg.num_classes, cfg.dim)
        else:
            self.cls_embedding = CaptionEmbedder(cfg.caption_dim, cfg.dim, cfg.cls_token_num)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        freqs = precompute_freqs_cis_2d(cfg.grid_hw, cfg.head_dim, cfg.rope_base, cfg.cls_token_num)
        self.register_buffer("freqs_cis", freqs, persistent=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    # -- conditions ---------------------------------------------------------------------

    def null_cond(self, cond: Cond) -> Cond:
        """The unconditional condition for CFG, same batch size as `cond` (models/family.py)."""
        u = getattr(self.cls_embedding, "uncond_embedding", None)
        return self.model_family.null_cond(self.config, cond, u)

    def check_cond(self, cond: Cond) -> int:
        """Validate a condition; returns the batch size. Raises InputError with the fix."""
        return self.model_family.check_cond(self.config, cond)

    def _left_pad(self, cond):
        """Move the valid caption tokens to the end (LlamaGen's left padding); zero the rest."""
        feats, mask = cond
        mask = mask.to(torch.bool)
        n_valid = mask.sum(1)  # (B,)
        T = feats.shape[1]
        # new[j] = old[(j + n_valid) mod T]: the valid tokens (first n_valid) land at the end.
        src = (torch.arange(T, device=feats.device)[None, :] + n_valid[:, None]) % T
        feats = feats.gather(1, src[:, :, None].expand_as(feats))
        new_mask = torch.arange(T, device=feats.device)[None, :] >= (T - n_valid)[:, None]
        return feats * new_mask[:, :, None].to(feats.dtype), new_mask

    def cond_embeddings(self, cond: Cond):
        """(prefix embeddings (B, cls, dim), prefix column validity (B, cls) bool)."""
        self.check_cond(cond)
        if self.config.model_type == "c2i":
            emb = self.cls_embedding(cond)[:, : self.config.cls_token_num]
            return emb, torch.ones(emb.shape[:2], dtype=torch.bool, device=emb.device)
        feats, valid = self._left_pad(cond)
        w = self.cls_embedding.cap_proj.fc1.weight
        return self.cls_embedding(feats.to(w.dtype)), valid

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        V = self.config.vocab_size
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= V):
            raise InputError(f"image token ids must lie in [0, {V}); got {int(tokens.min())}..{int(tokens.max())}")
        return self.tok_embeddings(tokens)

    # -- the drafter / training protocol (models/drafter.py, train/trainer.py) ------------

    def drafter_shape(self) -> dict:
        """DrafterConfig fields of this target's drafter (TargetConfig.drafter_shape: 2-D RoPE)."""
        return self.config.drafter_shape()

    def token_embedding_table(self) -> torch.Tensor:
        """(V, dim) embedding of the image tokens (the drafter's frozen E)."""
        return self.tok_embeddings.weight

    @property
    def final_norm(self) -> RMSNorm:
        """The final norm: logits = output(final_norm(h))."""
        return self.norm

    def start_positions(self, cond: Cond) -> torch.Tensor:
        """(B,) position of the first image token of each row: cls_token_num (no padding)."""
        B = self.check_cond(cond)
        return torch.full((B,), self.config.cls_token_num, dtype=torch.long, device=self.output.weight.device)

    # -- core ---------------------------------------------------------------------------

    def _run(self, h, freqs, mask, cache: Optional[KVCache], slots, taps: bool) -> TargetOutput:
        tap_ids = self.config.tap_layers if taps else ()
        rope, tapped = pair_rope(freqs), []
        for i, layer in enumerate(self.layers):
            if i in tap_ids:
                tapped.extend([h] * tap_ids.count(i))
            kv = (cache.k[i], cache.v[i]) if cache is not None else None
            h = layer(h, rope, mask, kv, slots)
        hidden = self.norm(h)
        logits = self.output(hidden).float()
        return TargetOutput(logits, torch.cat(tapped, dim=-1) if taps else None, hidden)

    def prompt_len(self, cond: Cond) -> int:
        """Cache slots the prefill of `cond` writes (the class / caption prefix)."""
        return self.config.cls_token_num

    def new_cache(self, batch: int, max_len: Optional[int] = None, dtype=None, *, extra: int = 0,
                  prompt_len: Optional[int] = None, n_tokens: Optional[int] = None) -> KVCache:
        """A cache for `batch` rows holding `max_len` committed tokens (default: the full sequence,
        condition prefix + image) plus `extra` scratch slots (the targets' one new_cache signature).

        prompt_len / n_tokens (the generic loops pass them) are implied by the config here."""
        p = self.output.weight
        return KVCache(self.config, batch, find_multiple(committed_len(self.config, max_len) + extra, 8),
                       dtype or p.dtype, p.device)

    def prefill(self, cond: Cond, cache: KVCache, taps: bool = False) -> TargetOutput:
        """Write the condition prefix into the cache; logits of the last prefix position."""
        emb, valid = self.cond_embeddings(cond)
        B, T, _ = emb.shape
        if B != cache.batch:
            raise InputError(f"condition batch {B} does not match the cache batch {cache.batch}")
        cache.col_valid[:] = True
        cache.col_valid[:, :T] = valid
        cache.lengths.zero_()
        slots = torch.arange(T, device=emb.device)[None, :].expand(B, T)
        eye = torch.eye(T, dtype=torch.bool, device=emb.device)[None].expand(B, T, T)
        mask = cache.attention_mask(slots, torch.tril(torch.ones(T, T, dtype=torch.bool, device=emb.device))[None].expand(B, T, T))
        mask = mask & cache.col_valid[:, None, :]
        mask[:, :, :T] |= eye  # diagonal forced on (padded text rows see themselves)
        out = self._run(emb.to(self.output.weight.dtype), self.freqs_cis[:T][None], mask[:, None], cache, slots, taps)
        cache.lengths.fill_(T)
        return TargetOutput(out.logits[:, -1:], None if out.taps is None else out.taps[:, -1:], out.hidden[:, -1:])

    def forward_tokens(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                       mask: torch.Tensor, cache: KVCache, taps: bool = False) -> TargetOutput:
        """New image tokens at absolute sequence `positions`, written at cache `slots`.

        Args:
            tokens: (B, S) image token ids.
            positions: (B, S) absolute sequence positions (prefix included) -> RoPE rows.
            slots: (B, S) cache slots to write K/V to.
            mask: (B, S, Lmax) bool, True = may attend (see KVCache.attention_mask).
        Returns:
            TargetOutput with logits (B, S, V) fp32.
        """
        if int(positions.max()) >= self.freqs_cis.shape[0]:
            raise InputError(f"position {int(positions.max())} is past the end of the image "
                             f"(sequence length {self.freqs_cis.shape[0]})")
        h = self.embed_tokens(tokens)
        return self._run(h, self.freqs_cis[positions], mask[:, None], cache, slots, taps)

    def forward_train(self, cond: Cond, tokens: torch.Tensor, taps: bool = False) -> TargetOutput:
        """Full causal forward without a cache (teacher forcing, training).

        Returns logits (B, N, V) where [:, j] predicts tokens[:, j] from cond and tokens[:, :j];
        taps/hidden aligned the same way.
        """
        emb, valid = self.cond_embeddings(cond)
        B, T, _ = emb.shape
        x = torch.cat([emb, self.embed_tokens(tokens[:, :-1])], dim=1)  # (B, T + N - 1, dim)
        L = x.shape[1]
        mask = None
        if self.config.model_type == "t2i":
            col = torch.ones(B, L, dtype=torch.bool, device=x.device)
            col[:, :T] = valid
            mask = torch.tril(torch.ones(L, L, dtype=torch.bool, device=x.device))[None] & col[:, None, :]
            mask = (mask | torch.eye(L, dtype=torch.bool, device=x.device)[None])[:, None]
        out = self._run(x, self.freqs_cis[:L][None], mask, None, None, taps)
        sl = slice(T - 1, None)
        return TargetOutput(out.logits[:, sl], None if out.taps is None else out.taps[:, sl], out.hidden[:, sl])

    @torch.no_grad()
    def teacher_forced_logits(self, cond: Cond, tokens: torch.Tensor) -> torch.Tensor:
        """(B, N, V) fp32 logits; [:, j] predicts tokens[:, j] from cond and tokens[:, :j]."""
        return self.forward_train(cond, tokens).logits

    image_logits = teacher_forced_logits  # the head is the codebook: lisa_trt.image_logits
