"""Janus-Pro target in image-generation mode, with a static KV cache.

Module and parameter names follow transformers' `JanusForConditionalGeneration`, so an HF
checkpoint loads strictly (checkpoint.py):

    model.language_model.{embed_tokens, layers.N.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
                          input_layernorm, post_attention_layernorm}, norm}      Llama decoder
    model.generation_embeddings                  codebook ids -> code_dim vectors
    model.generation_aligner.{fc1, hidden_layers.N}   code_dim -> hidden (Linear, then act + Linear ...)
    model.generation_head.{proj_out, vision_head}     hidden -> projection_dim -> act -> codebook logits

The math is Llama's (transformers' LlamaModel): RMSNorm in fp32, rotate-half RoPE on absolute
positions, GQA, SwiGLU MLP. A prompt is embedded with the TEXT embedding; every image token with
the generation path `aligner(generation_embeddings(code))`; logits come from the generation
head over the final normed hidden state. Logits are fp32 (B, S, codebook).

Protocol (the one ChameleonTarget and the LlamaGen Transformer offer, so generic loops drive it):
- `check_cond(cond)`, `null_cond(cond)`, `cfg_rows(cond, null)`: conditions are prompt ids, (ids,
  left-padding mask) or Prompts carrying a negative text's rows (cond.py).
- `new_cache(batch, max_len=None, dtype=None, *, extra=0, prompt_len=None, n_tokens=None)` (every target's
  signature): sized for the prompt budget + one image + `extra`.
- `prefill(cond, cache)`: writes the prompt, logits of its last position (B, 1, codebook).
- `forward_tokens(tokens, positions, slots, mask, cache)`: image codes at RoPE `positions`,
  written at `slots`, attending through an explicit (tree) mask.
- `forward_train(cond, image_tokens)` / `teacher_forced_logits`: no cache, teacher forcing.

For a drafter: `embed_image_tokens(codes)` is the target's embedding of image codes (B, S, dim),
`final_norm` its final RMSNorm, `head_features(normed)` the generation head up to its last
Linear, and `output` that Linear: `output(head_features(final_norm(h)))` are the logits, and
`TargetOutput.hidden` holds `head_features(...)` so `output(out.hidden) == out.logits`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch
import torch.nn as nn

from ...config import find_multiple
from ...errors import InputError
from ...models.layers import (
    ACTIVATIONS,
    DecoderStack,
    KVCache,
    RMSNorm,
    RotaryTarget,
    TargetOutput,
    teacher_forcing_plan,
)
from ...models.family import FamilyTarget
from ...models.prompts import prefill_plan
from . import cond as C
from .config import JanusConfig


# ----------------------------------------------------------------------------- layers

class GenerationAligner(nn.Module):
    """code_dim -> projection_dim: fc1, then (act, Linear) per hidden layer (HF JanusVQVAEAlignerMLP)."""

    def __init__(self, cfg: JanusConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.code_dim, cfg.projection_dim)
        self.hidden_layers = nn.ModuleList(nn.Linear(cfg.projection_dim, cfg.projection_dim)
                                           for _ in range(1, cfg.aligner_layers))
        self.act = ACTIVATIONS[cfg.gen_act]

    def forward(self, x):
        x = self.fc1(x)
        for layer in self.hidden_layers:
            x = layer(self.act(x))
        return x


class GenerationHead(nn.Module):
    """hidden -> proj_out -> act -> vision_head (codebook logits) (HF JanusVQVAEHead)."""

    def __init__(self, cfg: JanusConfig):
        super().__init__()
        self.proj_out = nn.Linear(cfg.head_input_dim, cfg.projection_dim)
        self.vision_head = nn.Linear(cfg.projection_dim, cfg.codebook_size)
        self.act = ACTIVATIONS[cfg.gen_act]

    def features(self, x):
        return self.act(self.proj_out(x))


class JanusBody(nn.Module):
    def __init__(self, cfg: JanusConfig):
        super().__init__()
        self.language_model = DecoderStack(cfg, cfg.text_vocab_size)  # transformers' LlamaModel
        self.generation_embeddings = nn.Embedding(cfg.codebook_size, cfg.code_dim)
        self.generation_aligner = GenerationAligner(cfg)
        self.generation_head = GenerationHead(cfg)


# ----------------------------------------------------------------------------- cache

class JanusCache(KVCache):
    """KVCache (per-row left padding `pad`, positions(slots) = slots - pad) that also
    records `prompt_budget`, the longest prompt `prefill` accepts (max_len - block_size - extra)."""

    def __init__(self, cfg: JanusConfig, batch: int, max_len: int, prompt_budget: int, dtype, device):
        super().__init__(cfg, batch, max_len, dtype, device)
        self.prompt_budget = prompt_budget


# ----------------------------------------------------------------------------- model

class JanusTarget(FamilyTarget, RotaryTarget, nn.Module):
    """Janus-Pro image generator: Llama decoder + generation embeddings / aligner / head."""

    family = "janus"

    def __init__(self, config: JanusConfig):
        super().__init__()
        self.config = cfg = config
        self.model = JanusBody(cfg)
        self._init_rope_and_weights()

    def set_max_prompt_tokens(self, n: int) -> None:
        """Change the prompt budget (caches made afterwards reserve `n` prompt slots)."""
        self.config = replace(self.config, max_prompt_tokens=int(n))

    # -- drafter-facing pieces ----------------------------------------------------------
    @property
    def output(self) -> nn.Linear:
        """The generation head's final Linear (hashes, GASV tables): logits = output(hidden)."""
        return self.model.generation_head.vision_head

    @property
    def final_norm(self) -> RMSNorm:
        return self.model.language_model.norm

    def embed_image_tokens(self, codes: torch.Tensor) -> torch.Tensor:
        """Image codes (B, S) -> input embeddings (B, S, dim) through the generation path."""
        V = self.config.codebook_size
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= V):
            raise InputError(f"image token ids must lie in [0, {V}) (the codebook); got "
                             f"{int(codes.min())}..{int(codes.max())}")
        return self.model.generation_aligner(self.model.generation_embeddings(codes))

    def head_features(self, normed: torch.Tensor) -> torch.Tensor:
        """The generation head up to its last Linear: act(proj_out(normed))."""
        return self.model.generation_head.features(normed)

    def token_embedding_table(self) -> torch.Tensor:
        """(codebook, dim) embedding of every image code through the generation path (the
        drafter's frozen E; the aligner acts per token, so the table is exact). No grad."""
        with torch.no_grad():
            codes = torch.arange(self.config.codebook_size, device=self.output.weight.device)
            return self.embed_image_tokens(codes[None])[0]

    def drafter_shape(self) -> dict:
        """DrafterConfig fields of this target's drafter: 1-D RoPE over absolute positions (the
        prompt length varies: no fixed prefix), codebook logits. The target's logits pass the
        generation head's proj_out + act before `output`, so a drafter head does not warm-start."""
        c = self.config
        return c.rope_1d_drafter_shape(c.codebook_size, block_size=c.block_size, warm_head=False)

    def start_positions(self, cond) -> torch.Tensor:
        """(B,) RoPE position of the first image token of each row: its real prompt length."""
        return C.split_cond(cond)[1].sum(1).to(self.output.weight.device)

    # -- conditions ---------------------------------------------------------------------
    def check_cond(self, cond) -> int:
        """Validate prompt_ids (B, T) or (prompt_ids, mask); returns B (InputError with the fix).

        Any prompt that fits the model's positions beside one image is accepted (the public calls
        size their caches per prompt, as transformers does); `max_prompt_tokens` is the budget of
        default caches (`new_cache` without prompt_len) and of exported engines."""
        return C.check_cond(self.config, cond, budget=False)

    def null_cond(self, cond):
        """Unconditional rows for CFG: the family's rule (JanusFamily.null_cond, cond.py)."""
        return self.model_family.null_cond(self.config, cond)

    @staticmethod
    def cfg_rows(cond, null):
        """[cond; null] as one left-padded batch (cond.cfg_rows: a negative text's rows re-padded to
        the shared width)."""
        return C.cfg_rows(cond, null)

    # -- core ---------------------------------------------------------------------------
    def _run(self, h, positions, mask, cache, slots, taps: bool, last_only: bool = False) -> TargetOutput:
        """Decoder stack + generation head; last_only: taps / head at the last position (prefill)."""
        cos, sin = self.rope(positions)
        lm = self.model.language_model
        h, tapped = lm.run(h, cos, sin, mask, cache, slots, self.config.tap_layers if taps else (), last_only)
        feats = self.head_features(self.final_norm(h[:, -1:] if last_only else h))
        return TargetOutput(self.output(feats).float(), tapped, feats)

    def _embed_prompt(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.language_model.embed_tokens(ids)

    def prompt_len(self, cond) -> int:
        """Cache slots the prefill of `cond` writes (its padded width)."""
        from .cond import split_cond

        return split_cond(cond)[0].shape[1]

    def new_cache(self, batch: int, max_len: Optional[int] = None, dtype=None, *, extra: int = 0,
                  prompt_len: Optional[int] = None, n_tokens: Optional[int] = None) -> JanusCache:
        """A cache for `batch` rows: prompt + one image (+ `extra` scratch slots for trees).

        Args:
            extra: scratch slots past the committed sequence (draft trees).
            max_len: committed tokens to hold (prompt + image); default prompt budget + block_size.
            prompt_len: the prompt budget instead of config.max_prompt_tokens (ignored with max_len).
            n_tokens: image tokens the caller generates (the generic loops pass it; <= block_size).
        """
        cfg = self.config
        if max_len is None:
            max_len = (cfg.max_prompt_tokens if prompt_len is None else int(prompt_len)) + cfg.block_size
        if max_len > cfg.max_position_embeddings:
            raise InputError(f"{max_len} tokens exceed max_position_embeddings {cfg.max_position_embeddings}")
        budget = max_len - cfg.block_size
        if budget < 1:
            raise InputError(f"max_len {max_len} leaves no room for a prompt before {cfg.block_size} image tokens")
        p = self.output.weight
        return JanusCache(cfg, batch, find_multiple(max_len + extra, 8), budget, dtype or p.dtype, p.device)

    def prefill(self, cond, cache: JanusCache, taps: bool = False) -> TargetOutput:
        """Write a (left-padded) prompt into slots 0..T-1; logits of its last position (B, 1, codebook).

        Padding slots are never attended to; RoPE positions count from each row's first real
        token (cache.positions). Prompts longer than the cache's prompt budget are refused.
        """
        B = self.check_cond(cond)
        ids, valid = C.split_cond(cond)
        T = ids.shape[1]
        budget = getattr(cache, "prompt_budget", cache.max_len)
        if T > budget:
            raise InputError(f"prompt of {T} tokens exceeds this cache's prompt budget of {budget}; make the "
                             f"cache with target.new_cache(batch, prompt_len={T}) or raise max_prompt_tokens")
        if B != cache.batch:
            raise InputError(f"prompt batch {B} does not match the cache batch {cache.batch}")
        slots, pos, mask = prefill_plan(ids, cache, valid)
        out = self._run(self._embed_prompt(ids), pos, mask[:, None], cache, slots, taps, last_only=True)
        cache.lengths.fill_(T)
        return out

    def forward_tokens(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                       mask: torch.Tensor, cache: JanusCache, taps: bool = False) -> TargetOutput:
        """Image codes (B, S) at absolute RoPE `positions`, K/V written at cache `slots`.

        mask: (B, S, Lmax) bool, True = may attend (KVCache.attention_mask); trees verify
        through it as for ChameleonTarget. Returns logits (B, S, codebook) fp32.
        """
        self.check_positions(positions)
        return self._run(self.embed_image_tokens(tokens), positions, mask[:, None], cache, slots, taps)

    def forward_train(self, cond, image_tokens: torch.Tensor, taps: bool = False) -> TargetOutput:
        """Full causal forward without a cache (teacher forcing).

        Returns logits (B, N, codebook): [:, k] predicts image_tokens[:, k] from the prompt and
        image_tokens[:, :k] ([:, 0] from the prompt alone); taps / hidden aligned the same way.
        """
        self.check_cond(cond)
        ids, valid = C.split_cond(cond)
        if not torch.is_tensor(image_tokens) or image_tokens.dim() != 2 or image_tokens.shape[0] != ids.shape[0] \
                or image_tokens.shape[1] < 1:
            raise InputError(f"image_tokens must be (B={ids.shape[0]}, N>=1) codes; got "
                             f"{tuple(image_tokens.shape) if torch.is_tensor(image_tokens) else type(image_tokens)}")
        T = ids.shape[1]
        x = torch.cat([self._embed_prompt(ids), self.embed_image_tokens(image_tokens[:, :-1])], dim=1)
        L = x.shape[1]
        mask, pos = teacher_forcing_plan(valid, L)
        out = self._run(x, pos, mask, None, None, taps)
        sl = slice(T - 1, None)
        return TargetOutput(out.logits[:, sl], None if out.taps is None else out.taps[:, sl], out.hidden[:, sl])

    @torch.no_grad()
    def teacher_forced_logits(self, prompt_ids, image_tokens: torch.Tensor) -> torch.Tensor:
        """(B, N, codebook) fp32 raw generation-head logits (no CFG); see forward_train."""
        return self.forward_train(prompt_ids, image_tokens).logits

    image_logits = teacher_forced_logits  # lisa_trt.image_logits(target, prompt_ids, image_tokens)


def image_logits(target: JanusTarget, prompt_ids, image_tokens: torch.Tensor) -> torch.Tensor:
    """Raw per-row generation-head logits (B, N, codebook): [:, k] predicts image_tokens[:, k].

    prompt_ids: (B, T) ids or (ids, mask); rows may be unconditional rows (null_cond)."""
    return target.teacher_forced_logits(prompt_ids, image_tokens)
