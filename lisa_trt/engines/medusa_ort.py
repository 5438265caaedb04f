"""The exported Medusa heads (export/medusa_onnx.py) through ONNX Runtime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from ..errors import ArtifactMismatchError, InputError
from ..export.medusa_onnx import CONFIG, GRAPH
from ..models.medusa import MedusaConfig
from .ort import make_session


class OrtMedusaHeads:
    """`head_logits` through ONNX Runtime (drop-in for MedusaHeads inside MedusaDrafter)."""

    is_medusa = True  # speculative/medusa.speculative_engines pairs it with the target

    def __init__(self, path, config: MedusaConfig, threads: Optional[int] = 1, device="cpu"):
        self.config, self.device = config, torch.device(device)
        self._sess = make_session(path, threads=threads)

    def head_logits(self, hidden: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        if hidden.shape[-1] != self.config.dim or hidden.shape[:2] != depth.shape:
            raise InputError(f"Medusa heads take hidden (B, S, {self.config.dim}) and depth (B, S); "
                             f"got {tuple(hidden.shape)} and {tuple(depth.shape)}")
        out = self._sess.run(["logits"], {"hidden": hidden.detach().float().cpu().contiguous().numpy(),
                                          "depth": depth.detach().long().cpu().contiguous().numpy()})[0]
        return torch.from_numpy(out).to(hidden.device)


def load_ort_medusa(out_dir, target=None, threads: Optional[int] = 1) -> OrtMedusaHeads:
    """OrtMedusaHeads from an export directory, refused if made for another target."""
    out_dir = Path(out_dir)
    if not (out_dir / GRAPH).is_file() or not (out_dir / CONFIG).is_file():
        raise InputError(f"{out_dir} holds no exported Medusa heads ({GRAPH} + {CONFIG}); "
                         "make them with lisa_trt.export.medusa_onnx.export_medusa_onnx")
    cfg = MedusaConfig.from_dict(json.loads((out_dir / CONFIG).read_text())["config"])
    if target is not None:
        from ..models.checkpoints import target_hash

        if cfg.target_hash != target_hash(target):
            raise ArtifactMismatchError(f"Medusa heads in {out_dir} were made for target hash {cfg.target_hash}")
    return OrtMedusaHeads(out_dir / GRAPH, cfg, threads=threads)


__all__ = ["OrtMedusaHeads", "load_ort_medusa"]
