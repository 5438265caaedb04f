"""Reduced draft vocabulary (EAGLE-3's draft-to-target token map) for large codebooks.

The drafter's head is a (hidden x V) matmul at every drafted node; for a 16,384-code target it
dominates a one-layer drafter's step. With `--draft-vocab N` the head predicts only the N most
frequent codes of the training data; `d2t` (N,) maps draft index -> target id and is stored with
the drafter (a persistent buffer). The drafter's `forward` scatters the N logits back into a
full-vocabulary row (every other code gets OUT_OF_VOCAB_LOGIT, far below any real logit but
finite so that CFG's u + s (c - u) stays finite), so the decode loop, the tree, the export and
the ONNX Runtime / TensorRT runners keep their interface: logits (B, S, V). The tree can then
only propose codes of the draft vocabulary, which is what "mapped back to target ids" means.

Losses on a reduced head (`restrict`): target and draft logits are both gathered at d2t, so the
target distribution is renormalised over the draft vocabulary (its mass outside N cannot be
proposed and is dropped, as in EAGLE-3); the LISA codebook is gathered at d2t the same way.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import ConfigError, InputError

OUT_OF_VOCAB_LOGIT = -1.0e4  # exp(-1e4 - max) == 0 in fp32; representable in fp16/bf16


def build_d2t(tokens: torch.Tensor, vocab_size: int, n: int) -> torch.Tensor:
    """The `n` most frequent codes of `tokens` (ties: lower id first), sorted by id.

    Args:
        tokens: any-shaped long tensor of training image tokens in [0, vocab_size).
        vocab_size: V of the target.
        n: draft vocabulary size, 1..V.
    Returns:
        d2t (n,) long, ascending target ids.
    """
    if not 1 <= n <= vocab_size:
        raise ConfigError(f"--draft-vocab must lie in 1..{vocab_size} (the target vocabulary), got {n}")
    flat = tokens.reshape(-1).long().cpu()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= vocab_size):
        raise InputError(f"training tokens must lie in [0, {vocab_size})")
    counts = torch.bincount(flat, minlength=vocab_size).double()
    # stable tie-break: frequency first, then lower id (subtract a tiny id-proportional amount)
    score = counts - torch.arange(vocab_size, dtype=torch.double) / (2.0 * vocab_size)
    return score.topk(n).indices.sort().values


def coverage(tokens: torch.Tensor, d2t: torch.Tensor) -> float:
    """Fraction of `tokens` that lie in the draft vocabulary."""
    flat = tokens.reshape(-1).long().cpu()
    inside = torch.zeros(int(max(int(flat.max()) + 1 if flat.numel() else 0, int(d2t.max()) + 1)), dtype=torch.bool)
    inside[d2t.cpu()] = True
    return float(inside[flat].float().mean()) if flat.numel() else 1.0


def check_d2t(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Validate a draft-to-target map: 1-D, unique, ascending ids in [0, V)."""
    d2t = torch.as_tensor(d2t).long()
    if d2t.dim() != 1 or d2t.numel() == 0:
        raise ConfigError("d2t must be a non-empty 1-D tensor of target ids")
    if int(d2t.min()) < 0 or int(d2t.max()) >= vocab_size:
        raise ConfigError(f"d2t ids must lie in [0, {vocab_size})")
    if d2t.numel() > 1 and not bool((d2t[1:] > d2t[:-1]).all()):
        raise ConfigError("d2t must hold unique, ascending target ids (use build_d2t)")
    return d2t


def to_full_vocab(logits: torch.Tensor, d2t: Optional[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """Draft-vocabulary logits (..., N) -> target-vocabulary logits (..., V)."""
    if d2t is None:
        return logits
    full = logits.new_full((*logits.shape[:-1], vocab_size), OUT_OF_VOCAB_LOGIT)
    return full.scatter(-1, d2t.expand(*logits.shape[:-1], d2t.shape[0]), logits)


def restrict(t_logits: torch.Tensor, s_logits: torch.Tensor, d2t: Optional[torch.Tensor], codebook=None):
    """(target, draft, codebook) restricted to the draft vocabulary for the losses (no-op without d2t).

    t_logits, s_logits: (M, V) -> (M, N); codebook (V, d) -> (N, d).
    """
    if d2t is None:
        return t_logits, s_logits, codebook
    d2t = d2t.to(t_logits.device)
    cb = None if codebook is None else codebook.index_select(0, d2t)
    return t_logits.index_select(-1, d2t), s_logits.index_select(-1, d2t), cb


def in_vocab_mass(t_logits: torch.Tensor, d2t: Optional[torch.Tensor]) -> torch.Tensor:
    """(M,) target probability mass inside the draft vocabulary (1 without d2t)."""
    if d2t is None:
        return torch.ones(t_logits.shape[0], device=t_logits.device)
    return t_logits.float().softmax(-1).index_select(-1, d2t.to(t_logits.device)).sum(-1)


def drafter_step_flops(hidden: int, target_dim: int, ffn_hidden: int, tap_dim: int, head_size: int,
                       n_nodes: int, context: int, fc: bool = False) -> float:
    """Multiply-adds x 2 of one drafter call over `n_nodes` entries attending to `context` slots.

    q/k/v over (target_dim + hidden), o_proj, SwiGLU MLP, attention, the head (hidden x
    head_size: the part a reduced draft vocabulary shrinks) and optionally the fc projection.
    """
    per_node = (3 * (target_dim + hidden) * hidden + hidden * hidden + 3 * hidden * ffn_hidden
                + 2 * context * hidden + hidden * head_size + (tap_dim * hidden if fc else 0))
    return 2.0 * per_node * n_nodes


def config_step_flops(cfg, n_nodes: int, context: Optional[int] = None) -> float:
    """drafter_step_flops for a DrafterConfig (context: the full sequence by default)."""
    head = getattr(cfg, "draft_vocab", 0) or cfg.vocab_size
    return drafter_step_flops(cfg.hidden, cfg.target_dim, cfg.ffn_hidden, cfg.tap_dim, head, n_nodes,
                              cfg.seq_len if context is None else context)


def prune_head(drafter, d2t: torch.Tensor):
    """A copy of a full-head `drafter` whose head keeps only the rows `d2t` (no retraining).

    A quick lower bound on what `--draft-vocab N` gives (a drafter trained with the reduced
    head learns to put its mass on the kept codes); used by bench/draft_vocab.py.
    """
    import dataclasses

    cfg = drafter.config
    if cfg.draft_vocab:
        raise ConfigError("prune_head needs a full-vocabulary drafter")
    d2t = check_d2t(d2t, cfg.vocab_size)
    small = type(drafter)(dataclasses.replace(cfg, draft_vocab=int(d2t.numel())), drafter.embed_weight, d2t=d2t)
    state = dict(drafter.state_dict())
    state["lm_head.weight"] = state["lm_head.weight"].index_select(0, d2t.to(state["lm_head.weight"].device))
    state["d2t"] = d2t
    small.load_state_dict(state, strict=True)
    return small.to(drafter.lm_head.weight.device).train(drafter.training)
