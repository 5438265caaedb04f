"""Medusa heads: a second drafter architecture (issue 11 item 4; the paper's LISA-Medusa ablation).

k heads read the TARGET's last (normed) hidden state h_t, the one whose LM-head logits predict
token t+1. Head i is a residual block plus its own output layer and predicts token t + 2 + i:

    head_i(h) = W_i (h + SiLU(A_i h))        W_i warm-started from the target's output head

There is no drafter transformer and no drafter KV cache: every head reads the same h of the last
committed token, so a tree node at depth d (d >= 1 below the root) gets the distribution of head
d regardless of the drafted tokens above it.

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

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ArtifactMismatchError, CheckpointError, ConfigError
from .checkpoints import target_hash

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

    def __post_init__(self):
        if self.n_heads < 1:
            raise ConfigError(f"Medusa needs >= 1 head, got {self.n_heads}")
        if self.dim < 1 or self.vocab_size < 2:
            raise ConfigError("Medusa dim must be >= 1 and vocab_size >= 2")

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
    """k Medusa heads (ResBlock + output layer each) on the target's final hidden state."""

    def __init__(self, cfg: MedusaConfig):
        super().__init__()
        self.config = cfg
        self.blocks = nn.ModuleList(ResBlock(cfg.dim) for _ in range(cfg.n_heads))
        self.heads = nn.ModuleList(nn.Linear(cfg.dim, cfg.vocab_size, bias=False) for _ in range(cfg.n_heads))
        for h in self.heads:
            nn.init.normal_(h.weight, std=0.02)

    @classmethod
    def from_target(cls, target: nn.Module, n_heads: int = 4, target_name: str = "") -> "MedusaHeads":
        """Fresh heads for `target`, output layers warm-started from the target's head."""
        tc = target.config
        cfg = MedusaConfig(dim=tc.dim, vocab_size=tc.vocab_size, n_heads=n_heads, block_size=tc.block_size,
                           cls_token_num=tc.cls_token_num, target_name=target_name,
                           target_hash=target_hash(target))
        m = cls(cfg).to(target.output.weight.device)
        with torch.no_grad():
            for h in m.heads:
                h.weight.copy_(target.output.weight)
        return m

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, S, dim) final hidden -> (B, S, k, V) fp32; [..., i, :] predicts token t + 2 + i."""
        return torch.stack([head(blk(hidden)).float() for blk, head in zip(self.blocks, self.heads)], dim=2)

    def head_logits(self, hidden: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        """Logits of head `depth` (B, S) long for each row: (B, S, V). Depths past the last head
        get flat logits (no information: the tree ranks those nodes last)."""
        allh = self.forward(hidden)  # (B, S, k, V)
        # a one-hot select (Equal / Where / ReduceSum), exact (one value plus zeros): exports to
        # ONNX without an int64 Clip or a data-dependent Gather, which TensorRT's parser refuses
        sel = depth[..., None] == torch.arange(allh.shape[2], device=depth.device)  # (B, S, k)
        return torch.where(sel[..., None], allh, torch.zeros((), dtype=allh.dtype, device=allh.device)).sum(2)


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
    from ..io import load_safetensors

    path = Path(path)
    tensors, meta = load_safetensors(path)
    if meta.get("kind") != ARTIFACT_KIND or "config" not in meta:
        raise CheckpointError(f"{path} is not a lisa-trt Medusa artifact; make one with `lisa-trt train --arch medusa`")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise ArtifactMismatchError(f"{path} has Medusa schema version {meta.get('schema_version')}; this "
                                    f"lisa-trt reads version {SCHEMA_VERSION}")
    cfg = MedusaConfig.from_dict(meta["config"])
    if check_target and cfg.target_hash != target_hash(target):
        raise ArtifactMismatchError(f"Medusa heads {path} were trained for target hash {cfg.target_hash}, not "
                                    f"{target_hash(target)}: load that target or train heads for this one")
    m = MedusaHeads(cfg)
    try:
        m.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path} does not match its own Medusa config: {e}") from e
    return m.to(target.output.weight.device).eval()


def read_medusa_config(path) -> MedusaConfig:
    cp = Path(path).with_suffix(".json")
    if not cp.is_file():
        raise CheckpointError(f"no Medusa config {cp} next to {path}")
    return MedusaConfig.from_dict(json.loads(cp.read_text())["config"])
