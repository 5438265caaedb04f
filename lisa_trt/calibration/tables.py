"""GASV / LANTERN calibration tables: format, save/load, binding to a target, checks.

One safetensors file holds every table plus JSON metadata (schema version, target hash,
vocabulary size, the GASV version (2) and knobs, seed, calibration settings). Version-1 tables
(GASV version 1, retired) are refused with a message to re-run `lisa-trt calibrate`.

Storage choice: the whitened head W~ = W * invstd (V x H, as large as the target's head) is
NOT stored. The file keeps invstd (H,) and the squared row norms of W~ (V,); W~ is recomputed
from the target's `output.weight` when the tables are bound to the target
(`tables.bind(target.output.weight)` or `load_tables(path, head_weight=...)`). The target hash
in the metadata guarantees that the head is the one the tables were made from.

Whitening choice: invstd[h] = 1 / std_h with the population std (correction 0) over the V rows
of W[:, h]; a dimension with zero spread gets invstd 0 (it carries no distance information, and
a huge invstd would destroy the ||a||^2 + ||b||^2 - 2 a.b evaluation).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..errors import ArtifactMismatchError, CheckpointError, InputError
from ..speculative.gasv import GASV_VERSION, GASVConfig

SCHEMA_VERSION = 2  # = the GASV version the tables are made for (spec/lisa.md GASV version 2)
FORMAT = "lisa-trt/gasv-tables"
_TENSORS = ("invstd", "w_tilde_norm2", "cluster", "centroids", "beta", "lantern_neighbors")


def whitening(weight: torch.Tensor) -> torch.Tensor:
    """invstd (H,) of the head weight (V, H): 1 / population std per dimension, 0 if std == 0."""
    std = weight.detach().float().std(dim=0, correction=0)               # (H,)
    return torch.where(std > 1e-12, 1.0 / std.clamp_min(1e-12), torch.zeros_like(std))


def whiten(weight: torch.Tensor, invstd: torch.Tensor) -> torch.Tensor:
    """W~ = W * invstd (rows scaled per dimension), fp32 (V, H)."""
    return weight.detach().float() * invstd.to(weight.device, torch.float32)[None, :]


def target_hash_of(target) -> str:
    """The target's hash (sha256 of output.weight, 16 hex): checkpoints.target_hash if present."""
    try:
        from ..models.checkpoints import target_hash
    except ImportError:  # lead's module not there yet: same definition via lisa_trt.io
        from ..io import tensor_hash
        return tensor_hash(target.output.weight)
    return target_hash(target)


@dataclass(frozen=True, eq=False)
class GASVTables:
    """Calibration tables for GASV and LANTERN (docs/spec/lisa.md "Calibration").

    Attributes:
        invstd: (H,) fp32 per-dimension whitening of the head weight.
        w_tilde_norm2: (V,) fp32 squared row norms of W~.
        cluster: (V,) int32 cluster id in [0, C).
        centroids: (C, d) fp32 k-means centroids (in `cluster_space`).
        beta: (C,) fp32 geometric drift budget per cluster.
        lantern_neighbors: (V, K) int16/int32 nearest codes by L2 on the normalised codebook,
            nearest first, self excluded.
        config: GASV constants; config.theta_geo is set (8 / median beta).
        target_hash: hash of the target's output.weight the tables were made for.
        vocab_size: V.
        seed: calibration seed.
        cluster_space: "codebook" or "w_tilde".
        settings: calibration settings (rollouts, sampling, quantile ...), informational.
        w_tilde: (V, H) fp32 whitened head, runtime only (never saved); set by `bind`.
    """

    invstd: torch.Tensor
    w_tilde_norm2: torch.Tensor
    cluster: torch.Tensor
    centroids: torch.Tensor
    beta: torch.Tensor
    lantern_neighbors: torch.Tensor
    config: GASVConfig
    target_hash: str
    vocab_size: int
    seed: int = 0
    cluster_space: str = "codebook"
    settings: dict = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    w_tilde: Optional[torch.Tensor] = None

    def __post_init__(self):
        V = self.vocab_size
        problems = []
        if self.w_tilde_norm2.shape != (V,):
            problems.append(f"w_tilde_norm2 {tuple(self.w_tilde_norm2.shape)} != ({V},)")
        if self.cluster.shape != (V,):
            problems.append(f"cluster {tuple(self.cluster.shape)} != ({V},)")
        if self.beta.dim() != 1 or self.centroids.shape[0] != self.beta.shape[0]:
            problems.append(f"beta {tuple(self.beta.shape)} / centroids {tuple(self.centroids.shape)}")
        if self.lantern_neighbors.dim() != 2 or self.lantern_neighbors.shape[0] != V:
            problems.append(f"lantern_neighbors {tuple(self.lantern_neighbors.shape)} not (V={V}, K)")
        if self.cluster.numel() and (int(self.cluster.min()) < 0 or int(self.cluster.max()) >= self.beta.shape[0]):
            problems.append("cluster ids outside [0, C)")
        if problems:
            raise CheckpointError("inconsistent GASV tables: " + "; ".join(problems)
                                  + ". Re-run `lisa-trt calibrate --model ...`.")

    @property
    def theta_geo(self) -> Optional[float]:
        return self.config.theta_geo

    @property
    def n_clusters(self) -> int:
        return int(self.beta.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.invstd.shape[0])

    def bind(self, head_weight: torch.Tensor) -> "GASVTables":
        """Return a copy with W~ = head_weight * invstd (on head_weight's device).

        Args:
            head_weight: the target's output.weight (V, H). Its identity is checked with
                `check_tables` (by hash) by whoever loads the target; here only shapes.
        """
        V, H = head_weight.shape
        if V != self.vocab_size or H != self.hidden_size:
            raise ArtifactMismatchError(
                f"GASV tables are for a head of shape ({self.vocab_size}, {self.hidden_size}), "
                f"got ({V}, {H}). Re-run `lisa-trt calibrate --model ...` for this target.")
        dev = head_weight.device
        return dataclasses.replace(self, w_tilde=whiten(head_weight, self.invstd.to(dev)),
                                   w_tilde_norm2=self.w_tilde_norm2.to(dev), cluster=self.cluster.to(dev),
                                   beta=self.beta.to(dev), invstd=self.invstd.to(dev))

    def with_config(self, **overrides) -> "GASVTables":
        """Copy with GASV constants overridden (e.g. kappa=1.1 from the CLI)."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config, **overrides))

    def metadata(self) -> dict:
        return {"format": FORMAT, "schema_version": self.schema_version, "gasv_version": GASV_VERSION,
                "target_hash": self.target_hash, "vocab_size": self.vocab_size,
                "n_clusters": self.n_clusters, "hidden_size": self.hidden_size,
                "lantern_k": int(self.lantern_neighbors.shape[1]), "seed": self.seed,
                "cluster_space": self.cluster_space, "gasv": self.config.to_dict(),
                "settings": self.settings}


def save_tables(tables: GASVTables, path) -> None:
    """Write the tables as one safetensors file with JSON metadata (atomic temp + rename)."""
    from ..io import save_safetensors

    tensors = {name: getattr(tables, name) for name in _TENSORS}
    save_safetensors(tensors, path, metadata=tables.metadata())


def load_tables(path, head_weight: Optional[torch.Tensor] = None) -> GASVTables:
    """Read tables written by `save_tables`; bind them to `head_weight` when given.

    Raises:
        CheckpointError: not a tables file, or a missing tensor.
        ArtifactMismatchError: another schema version.
    """
    from ..io import load_safetensors

    tensors, meta = load_safetensors(path)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a lisa-trt GASV tables file (format "
                              f"{meta.get('format')!r}); make one with `lisa-trt calibrate --model ...`")
    version = meta.get("schema_version")
    if version == 1 or (version == SCHEMA_VERSION and meta.get("gasv_version") != GASV_VERSION):
        raise ArtifactMismatchError(
            f"{path} holds GASV version-1 calibration tables (gate anchored on the target's top-1, "
            f"retired); this lisa-trt runs GASV version {GASV_VERSION}. Re-run `lisa-trt calibrate "
            "--model ...` to make version-2 tables (the budgets beta_c are measured differently).")
    if version != SCHEMA_VERSION:
        raise ArtifactMismatchError(
            f"{path} has tables schema version {version}, this lisa-trt reads "
            f"version {SCHEMA_VERSION}. Re-run `lisa-trt calibrate --model ...`.")
    missing = [n for n in _TENSORS if n not in tensors]
    if missing:
        raise CheckpointError(f"{path} lacks tensors {missing}; re-run `lisa-trt calibrate --model ...`")
    tables = GASVTables(**{n: tensors[n] for n in _TENSORS},
                        config=GASVConfig.from_dict(meta["gasv"]), target_hash=meta["target_hash"],
                        vocab_size=int(meta["vocab_size"]), seed=int(meta.get("seed", 0)),
                        cluster_space=meta.get("cluster_space", "codebook"),
                        settings=meta.get("settings", {}), schema_version=SCHEMA_VERSION)
    return tables.bind(head_weight) if head_weight is not None else tables


def head_rows(target, sub_vocab=None) -> torch.Tensor:
    """The head rows tables are bound to: output.weight (V, H), or the K code rows of a
    sub-vocabulary (models.family.SubVocab: Chameleon's image codes) (K, H)."""
    w = target.output.weight.detach()
    return w if sub_vocab is None else w[sub_vocab.code_ids.to(w.device)]


def tables_for(tables: GASVTables, target, sub_vocab=None) -> GASVTables:
    """`tables` checked against `target` (hash, codebook size) and bound to its head rows."""
    rows = head_rows(target, sub_vocab)
    check_tables(tables, target_hash_of(target), rows.shape[0])
    return tables.bind(rows)


def load_tables_for(path, target, sub_vocab=None) -> GASVTables:
    """Read tables made for `target` (hash checked) over its codebook, bound to its head rows."""
    return tables_for(load_tables(path), target, sub_vocab)


def check_tables(tables: GASVTables, target_hash: str, vocab: int) -> None:
    """Refuse tables made for another target or vocabulary.

    Args:
        tables: loaded tables.
        target_hash: hash of the target they are about to be used with.
        vocab: the target's vocabulary size.
    Raises:
        ArtifactMismatchError naming both hashes and the fix.
    """
    if tables.target_hash != target_hash or tables.vocab_size != vocab:
        raise ArtifactMismatchError(
            f"GASV tables were calibrated for target {tables.target_hash} (vocabulary "
            f"{tables.vocab_size}), but the loaded target is {target_hash} (vocabulary {vocab}). "
            "Tables only work with the target they were made for: run "
            "`lisa-trt calibrate --model ...` with this target to make matching tables.")
    if tables.theta_geo is None:
        raise InputError("GASV tables carry no theta_geo; re-run `lisa-trt calibrate --model ...`")
