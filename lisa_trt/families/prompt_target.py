"""The shared torch target of whole-vocabulary prompt-id HF families (Chameleon / Lumina-mGPT,
Emu3): an HF-named `DecoderStack` plus `lm_head` over the whole vocabulary, a static KV cache,
token-id prompts (left-padded, positions counted from each row's first real token).

A family's target subclasses `VocabPromptTarget`, builds its `DecoderStack` (where its HF
checkpoint keeps it: `stack`) and `lm_head`, and inherits:
- `prefill(input_ids, cache, valid=None)`: a (left-padded) prompt into the cache;
- `forward_tokens(tokens, positions, slots, mask, cache)`: new tokens at absolute positions;
- `forward_full(input_ids)` / `teacher_forced_logits(input_ids)`: the cache-free forward;
- `forward_train(cond, tokens)`: teacher forcing after a prompt (drafter training, calibration);
- the drafter protocol (`token_embedding_table`, `final_norm`, `drafter_shape`, `start_positions`).
Logits are the RAW head over the whole vocabulary (the family's layout restricts them).
Its config checks its shapes with `check_decoder_shape`; its loader is `load_vocab_target`.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ..config import find_multiple
from ..errors import ConfigError, InputError
from ..models.family import FamilyTarget
from ..models.layers import KVCache, RMSNorm, RotaryTarget, TargetOutput, teacher_forcing_plan
from ..models.prompts import Prompts, PromptTarget, prefill_plan


def check_decoder_shape(cfg) -> None:
    """ConfigError naming the field when the heads do not divide the hidden size / one another or
    the activation is not one the decoder stack has (a config's __post_init__)."""
    from ..models.layers import ACTIVATIONS

    if cfg.hidden_size % cfg.num_attention_heads:
        raise ConfigError(f"hidden_size {cfg.hidden_size} is not divisible by num_attention_heads "
                          f"{cfg.num_attention_heads}")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ConfigError(f"num_attention_heads {cfg.num_attention_heads} is not divisible by "
                          f"num_key_value_heads {cfg.num_key_value_heads}")
    if cfg.hidden_act not in ACTIVATIONS:
        raise ConfigError(f"hidden_act {cfg.hidden_act!r} is not supported; valid: {', '.join(ACTIVATIONS)}")


def load_vocab_target(make, cfg, path, implied, *, head_key: str, skip, device="cpu", dtype=torch.float32):
    """`make(cfg)`'s target with an HF directory's weights streamed shard by shard (no random
    init of billions of weights): every needed key present with its shape, errors naming the
    config `implied(state_dict)` describes; `head_key` not read when the head is tied; keys for
    which `skip(key)` holds are not the target's. Eval mode, `source_dir` set."""
    from ..models.hf import empty_model, stream_weights

    model = empty_model(lambda: make(cfg), dtype)
    model.reset_buffers()
    tied = (head_key,) if cfg.tie_word_embeddings else ()
    stream_weights(model, path, str(path), cfg.describe(), implied, ignore=tied, skip=skip)
    model.source_dir = str(path)
    return model.eval().to(device)


class VocabPromptTarget(FamilyTarget, PromptTarget, RotaryTarget, nn.Module):
    """Base of an HF decoder target whose head is the whole vocabulary (see module docstring).

    Subclasses set `config` (an HFDecoderShape with vocab_size, max_position_embeddings,
    rope fields), `lm_head`, the `DecoderStack` returned by `stack`, and `cache_class`."""

    cache_class = KVCache

    @property
    def stack(self):
        """The HF `*Model` body (a models.layers.DecoderStack); default `self.model`."""
        return self.model

    def null_cond(self, cond) -> Prompts:
        """The CFG rows of `cond`: the family's rule (models/family.ModelFamily.null_cond), the one
        place it is written for the torch target, the exported graphs and the family."""
        return self.model_family.null_cond(self.config, cond)

    @property
    def output(self) -> nn.Linear:
        """The output head (name shared with the LlamaGen target: hashes, GASV tables)."""
        return self.lm_head

    def _run(self, h, positions, mask, cache, slots, taps: bool, last_only: bool = False) -> TargetOutput:
        """The decoder stack; last_only: taps, norm and head at the last position only (prefill)."""
        cos, sin = self.rope(positions)
        h, tapped = self.stack.run(h, cos, sin, mask, cache, slots, self.config.tap_layers if taps else (), last_only)
        hidden = self.stack.norm(h[:, -1:] if last_only else h)
        return TargetOutput(self.lm_head(hidden).float(), tapped, hidden)

    def new_cache(self, batch: int, max_len: Optional[int] = None, dtype=None, *, extra: int = 0,
                  prompt_len: Optional[int] = None, n_tokens: Optional[int] = None) -> KVCache:
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
        return self.cache_class(self.config, batch, find_multiple(max_len, 8), dtype or p.dtype, p.device)

    def forward_full(self, input_ids: torch.Tensor, taps: bool = False) -> TargetOutput:
        """Full causal forward without a cache; logits[:, t] predicts input_ids[:, t + 1]."""
        self.check_ids(input_ids)
        B, T = input_ids.shape
        pos = torch.arange(T, device=input_ids.device)[None].expand(B, T)
        return self._run(self.stack.embed_tokens(input_ids), pos, None, None, None, taps)

    @torch.no_grad()
    def teacher_forced_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T, V) fp32 raw head logits over the whole vocabulary."""
        return self.forward_full(input_ids).logits

    def forward_train(self, cond, tokens: torch.Tensor, taps: bool = False) -> TargetOutput:
        """Teacher forcing of generated tokens after a (left-padded) prompt, without a cache.

        Args:
            cond: the prompt (ids (B, T), (ids, valid) or Prompts), as `prefill` takes it:
                positions count from each row's first real token.
            tokens: (B, N) the tokens generated after it.
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
        x = self.stack.embed_tokens(torch.cat([ids, tokens[:, :-1]], dim=1))
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
        return self.stack.embed_tokens.weight

    @property
    def final_norm(self) -> RMSNorm:
        """The final norm: logits = lm_head(final_norm(h))."""
        return self.stack.norm

    def drafter_shape(self) -> dict:
        """DrafterConfig fields of this target's drafter: 1-D RoPE over absolute positions (the
        prompt length varies, so no fixed condition prefix), full-vocabulary logits."""
        return self.config.rope_1d_drafter_shape(self.config.vocab_size, block_size=1, warm_head=True)

    def prefill(self, input_ids, cache: KVCache, valid: Optional[torch.Tensor] = None,
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
        out = self._run(self.stack.embed_tokens(input_ids), pos, mask[:, None], cache, slots, taps, last_only=True)
        cache.lengths.fill_(T)
        return out

    def forward_tokens(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                       mask: torch.Tensor, cache: KVCache, taps: bool = False) -> TargetOutput:
        """New tokens (B, S) at absolute RoPE `positions`, K/V written at cache `slots`.

        mask: (B, S, Lmax) bool, True = may attend (see KVCache.attention_mask); trees verify
        through it. Returns logits (B, S, V) fp32.
        """
        self.check_positions(positions)
        return self._run(self.stack.embed_tokens(tokens), positions, mask[:, None], cache, slots, taps)
