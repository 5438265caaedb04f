"""The reference autoregressive loop (LlamaGen generate.py semantics) on the static KV cache.

One loop for every family: the family answers what is generated (models/family.py
`SequenceLayout`: how many tokens, which ids may be sampled, which are forced) and what the
condition and its CFG rows are; the loop only prefills, steps and samples.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..config import SamplingConfig
from ..models.family import SequenceLayout
from ..models.prompts import with_mask
from .methods import Method, register_method
from .sampling import sample_from_logits
from .session import DecodeSession, Decoder, cfg_batch, layout_for, new_target_cache  # noqa: F401 (re-exported)


def step_inputs(cache, tokens: torch.Tensor):
    """Positions, slots and mask for one new token per row appended at `cache.lengths`."""
    B = tokens.shape[0]
    slots = cache.lengths[:, None]  # (B, 1)
    ones = torch.ones(B, 1, 1, dtype=torch.bool, device=tokens.device)
    return cache.positions(slots), slots, cache.attention_mask(slots, ones)


class ARDecoder(Decoder):
    """The plain loop: one target forward per token (forced tokens are written, never drawn)."""

    name = "vanilla"

    def __init__(self, target):
        self.target = target

    @torch.no_grad()
    def decode(self, session: DecodeSession, *, on_step=None, on_progress=None) -> tuple:
        target, cache, guide, out, stats = session.target, session.cache, session.guide, session.out, session.stats
        B, N, dev = session.B, session.N, session.device
        forced = None if session.layout.forced is None else session.layout.forced.tolist()
        for i in range(N):
            if i > 0:
                x = guide.dup(out[:, i - 1 : i])
                pos, slots, mask = step_inputs(cache, x)
                with session.timer.measure("target"):
                    raw = target.forward_tokens(x, pos, slots, mask, cache).logits[:, -1]
                stats.target_forwards += 1
                cache.lengths += 1
            if forced is not None and forced[i] >= 0:  # never sampled: no random draw either
                out[:, i] = forced[i]
            elif i == 0:
                out[:, 0] = session.first_token()
            else:  # guidance stops after cfg_interval (Guide: the official decode step of z_i is i - 1)
                law = guide(raw, torch.full((B,), i, dtype=torch.long, device=dev))
                out[:, i] = sample_from_logits(law, session.gen, session.sampling.greedy)
            session.report(out, torch.full((B,), i + 1, dtype=torch.long, device=dev), on_step, on_progress)
        n = B * (N - 1)
        stats.committed, stats.rows = [torch.ones(n)], [torch.arange(B).repeat_interleave(N - 1)]
        return session.finish()


@torch.no_grad()
def generate(target, cond=None, *, cfg_scale: float = 1.0, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, greedy: bool = False, seed: Optional[int] = None,
             cfg_interval: int = -1, num_tokens: Optional[int] = None,
             generator: Optional[torch.Generator] = None,
             on_token: Optional[Callable[[int], None]] = None, seeds=None, max_new_tokens: Optional[int] = None,
             image_tokens_only: bool = False, input_ids: Optional[torch.Tensor] = None,
             attention_mask: Optional[torch.Tensor] = None,
             layout: Optional[SequenceLayout] = None, on_step=None) -> torch.Tensor:
    """Sample tokens with the plain AR loop (ARDecoder on a decode session).

    Args:
        target: a target of any family (torch model or engines.graph target), eval mode.
        cond: the family's condition: LlamaGen c2i class ids (B,), t2i (caption_features
            (B, 120, C), caption_mask (B, 120)); prompt-id families (Chameleon, Janus) the prompt
            ids (B, T) (also as `input_ids=`), (ids, valid) or models.chameleon.Prompts.
        cfg_scale: guidance scale; CFG runs as batch [cond; uncond] when > 1.
        greedy: argmax of the guided logits instead of sampling.
        seed: seeds a private torch.Generator (the global RNG is untouched).
        cfg_interval: guidance off after this decode step (-1: always on).
        num_tokens / max_new_tokens: tokens to generate (default: the family's whole image;
            Chameleon's raw head has none and needs it).
        image_tokens_only: restrict sampling to the image-code tokens (families whose head is
            wider than the codebook).
        attention_mask: with prompt ids, (B, T) bool or 0/1, True on the real tokens of LEFT-
            padded prompts (transformers' name): the same as passing (ids, attention_mask).
        layout: the family's SequenceLayout of this request (overrides the three above).
        on_token: called with the number of tokens done after each step (progress bars).
        on_step: the per-step hook of every decode loop (run.py `run_method`).
        seeds: one seed per row instead of `seed`: each row draws from its own generator
            (sampling.RowGenerators), so a row's tokens do not depend on the rest of the batch.
    Returns:
        LongTensor (B, N) of token ids.
    """
    cond = with_mask(cond if cond is not None else input_ids, attention_mask)
    if layout is None:
        target.check_cond(cond)  # a bad condition is refused before the layout is asked for
        layout = layout_for(target, num_tokens if num_tokens is not None else max_new_tokens, image_tokens_only)
    sampling = SamplingConfig(cfg_scale=cfg_scale, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                              cfg_interval=cfg_interval)
    dec = ARDecoder(target)
    session = dec.open(cond, sampling=sampling, layout=layout, seed=seed, seeds=seeds, generator=generator)
    progress = None if on_token is None else (lambda n: on_token(n // session.B))
    return dec.decode(session, on_step=on_step, on_progress=progress)[0]


register_method(Method("vanilla", "ar", "the autoregressive reference loop (one target forward per token)",
                       decoder=lambda target, drafter, tables, gasv, spec: ARDecoder(target)))
