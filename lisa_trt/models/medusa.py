"""Medusa heads: a second drafter architecture (the paper's LISA-Medusa ablation).

k heads read the TARGET's last (normed) hidden state h_t, the one whose LM-head logits predict
token t+1. Head i is a residual block plus its own output layer and predicts token t + 2 + i:

    head_i(h) = W_i (h + SiLU(A_i h))        W_i warm-started from the target's output head

There is no drafter transformer and no drafter KV cache: every head reads the same h of the last
committed token, so a tree node at depth d (d >= 1 below the root) gets the distribution of head
d regardless of the drafted tokens above it.

Any family: h is the hidden state the target's head reads (`TargetOutput.hidden`, width
`target.output.in_features`), and where the family's layout restricts what may be generated
(`SequenceLayout.allowed`: Chameleon's image codes inside the whole-vocabulary head) the heads
predict those ids only (`d2t`, as the EAGLE-3 drafter's reduced vocabulary, models/draft_vocab.py)
and are scattered back to head-vocabulary logits, so the decode loop, the tree and the exported
graph keep logits (B, S, V). Forced tokens (row ends) need nothing of the heads: the loop's layout
law forces them, and head d still predicts the token d + 1 places ahead.

Through the decode loop (speculative/decode.py, the DrafterEngine protocol) the heads run as a
pair (`speculative/medusa.py`): a target proxy hands the final hidden state to the drafter in
place of the EAGLE taps, and the drafter carries, in its "hidden" channel, h together with the
node depth, so node (depth d) -> logits of head d. Saved as a `lisa-trt-medusa` safetensors
artifact with a config JSON beside it, checked against the target's hash like every drafter.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import CheckpointError, ConfigError
from .checkpoints import read_heads_artifact, target_hash
from .draft_vocab import check_d2t, to_full_vocab

SCHEMA_VERSION = 1
ARTIFACT_KIND = "lisa-trt-medusa"


@dataclass(frozen=True)
class MedusaConfig:
    """Shapes of Medusa heads and the target they were made for."""

    dim: int
    vocab_size: int
    n_heads: int = 4
    block_size: int = 256
    cls_token_num: int = 1
    target_name: str = ""
    target_hash: str = ""
    draft_vocab: int = 0  # 0: the heads predict every head id; N: only the d2t ids (the layout's allowed ids)

    def __post_init__(self):
        if self.n_heads < 1:
            raise ConfigError(f"Medusa needs >= 1 head, got {self.n_heads}")
        if self.dim < 1 or self.vocab_size < 2:
            raise ConfigError("Medusa dim must be >= 1 and vocab_size >= 2")
        if not 0 <= self.draft_vocab <= self.vocab_size:
            raise ConfigError(f"Medusa draft_vocab must lie in 0..{self.vocab_size}, got {self.draft_vocab}")

    @property
    def seq_len(self) -> int:
        return self.cls_token_num + self.block_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MedusaConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        if set(d) - known:
            raise ConfigError(f"unknown MedusaConfig fields {sorted(set(d) - known)}; valid: {sorted(known)}")
        return cls(**d)


class ResBlock(nn.Module):
    """h + SiLU(linear(h)); the linear starts at zero so a fresh head equals its output layer."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x):
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """k Medusa heads (ResBlock + output layer each) on the target's final hidden state.

    d2t: with cfg.draft_vocab = N, the (N,) head ids the heads predict (a persistent buffer)."""

    def __init__(self, cfg: MedusaConfig, d2t: Optional[torch.Tensor] = None):
        super().__init__()
        self.config = cfg
        if cfg.draft_vocab:
            d2t = torch.arange(cfg.draft_vocab) if d2t is None else check_d2t(d2t, cfg.vocab_size)
            if d2t.numel() != cfg.draft_vocab:
                raise ConfigError(f"d2t has {d2t.numel()} ids; the Medusa config says draft_vocab {cfg.draft_vocab}")
        elif d2t is not None:
            raise ConfigError("a d2t map needs MedusaConfig.draft_vocab = len(d2t)")
        self.register_buffer("d2t", d2t, persistent=True)  # None (not saved) for a full head
        n = cfg.draft_vocab or cfg.vocab_size
        self.blocks = nn.ModuleList(ResBlock(cfg.dim) for _ in range(cfg.n_heads))
        self.heads = nn.ModuleList(nn.Linear(cfg.dim, n, bias=False) for _ in range(cfg.n_heads))
        for h in self.heads:
            nn.init.normal_(h.weight, std=0.02)

    @classmethod
    def from_target(cls, target: nn.Module, n_heads: int = 4, target_name: str = "",
                    d2t: Optional[torch.Tensor] = None) -> "MedusaHeads":
        """Fresh heads for a target of any family, output layers warm-started from the target's head
        (its rows `d2t` when the heads predict only those ids: the layout's allowed ids)."""
        shape, out = target.drafter_shape(), target.output
        d2t = None if d2t is None else torch.as_tensor(d2t).long().cpu()
        cfg = MedusaConfig(dim=out.in_features, vocab_size=out.out_features, n_heads=n_heads,
                           block_size=shape["block_size"], cls_token_num=shape["cls_token_num"],
                           target_name=target_name, target_hash=target_hash(target),
                           draft_vocab=0 if d2t is None else int(d2t.numel()))
        m = cls(cfg, d2t).to(out.weight.device)
        with torch.no_grad():
            w = out.weight if m.d2t is None else out.weight.index_select(0, m.d2t)
            for h in m.heads:
                h.weight.copy_(w)
        return m

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, S, dim) final hidden -> (B, S, k, N) fp32 over the heads' own ids (d2t; N = V without)."""
        return torch.stack([head(blk(hidden)).float() for blk, head in zip(self.blocks, self.heads)], dim=2)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, S, dim) final hidden -> (B, S, k, V) fp32; [..., i, :] predicts token t + 2 + i."""
        return to_full_vocab(self.draft_logits(hidden), self.d2t, self.config.vocab_size)

    def head_logits(self, hidden: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        """Logits of head `depth` (B, S) long for each row: (B, S, V). Depths past the last head
        get flat logits (no information: the tree ranks those nodes last)."""
        allh = self.draft_logits(hidden)  # (B, S, k, N)
        # a one-hot select (Equal / Where / ReduceSum), exact (one value plus zeros): exports to
        # ONNX without an int64 Clip or a data-dependent Gather, which TensorRT's parser refuses
        sel = depth[..., None] == torch.arange(allh.shape[2], device=depth.device)  # (B, S, k)
        one = torch.where(sel[..., None], allh, torch.zeros((), dtype=allh.dtype, device=allh.device)).sum(2)
        return to_full_vocab(one, self.d2t, self.config.vocab_size)


def save_medusa(heads: MedusaHeads, path) -> None:
    """Write `path` (safetensors) + `path.json` (config with the target hash)."""
    from ..io import save_safetensors, write_json

    path = Path(path)
    meta = {"kind": ARTIFACT_KIND, "schema_version": SCHEMA_VERSION, "config": heads.config.to_dict()}
    save_safetensors(dict(heads.state_dict()), path, metadata=meta)
    write_json(path.with_suffix(".json"), meta)


def is_medusa_file(path) -> bool:
    """True when `path` is a Medusa artifact (reads only the metadata)."""
    from ..io import load_safetensors

    try:
        return load_safetensors(Path(path))[1].get("kind") == ARTIFACT_KIND
    except Exception:
        return False


def load_medusa(path, target: nn.Module, *, check_target: bool = True) -> MedusaHeads:
    """Load Medusa heads made for `target` (refused for another target)."""
    cfg, tensors = read_heads_artifact(path, target, kind=ARTIFACT_KIND, schema_version=SCHEMA_VERSION,
                                       label="Medusa", arch="medusa", check_target=check_target)
    cfg = MedusaConfig.from_dict(cfg)
    m = MedusaHeads(cfg, tensors.get("d2t"))
    try:
        m.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path} does not match its own Medusa config: {e}") from e
    return m.to(target.output.weight.device).eval()
