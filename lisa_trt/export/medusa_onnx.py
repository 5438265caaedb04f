"""Medusa heads as one ONNX graph (`medusa_heads.onnx`) and its ONNX Runtime runner.

Graph: hidden (B, S, H) fp32, depth (B, S) int64 -> logits (B, S, V) fp32, the math of
`MedusaHeads.head_logits` (every head evaluated, head `depth` gathered, flat logits past the
last head). B and S are dynamic. `OrtMedusaHeads` has the same `head_logits` method and
`config`, so `speculative.medusa.medusa_pair(target, OrtMedusaHeads(...))` runs the heads through
ORT with any target engine (torch, OrtTarget, TrtTarget).

The artifact sits next to its config: `<dir>/medusa_heads.onnx` + `<dir>/medusa_heads.json`
(the MedusaConfig, target hash included, checked by `load_ort_medusa`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn

from ..errors import ArtifactMismatchError, InputError
from ..io import atomic_write, write_json
from ..models.medusa import MedusaConfig, MedusaHeads

GRAPH = "medusa_heads.onnx"
CONFIG = "medusa_heads.json"


class _HeadsGraph(nn.Module):
    def __init__(self, heads: MedusaHeads):
        super().__init__()
        self.heads = heads

    def forward(self, hidden, depth):
        return self.heads.head_logits(hidden, depth)


def export_medusa_onnx(heads: MedusaHeads, out_dir, *, opset: int = 18) -> Path:
    """Export `heads` to out_dir/medusa_heads.onnx (+ its config JSON); returns the graph path."""
    from torch.export import Dim

    from .onnx import ExportError

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = heads.config
    dev = next(heads.parameters()).device
    hidden = torch.randn(2, 3, cfg.dim, device=dev)
    depth = torch.tensor([[0, 1, 2], [1, 2, cfg.n_heads]], device=dev)
    b, s = Dim("batch", min=1), Dim("nodes", min=1)
    path = out_dir / GRAPH
    try:
        with torch.no_grad():
            prog = torch.onnx.export(_HeadsGraph(heads.eval()).eval(), (hidden, depth), dynamo=True, opset_version=opset,
                                     dynamic_shapes=({0: b, 1: s}, {0: b, 1: s}), input_names=["hidden", "depth"],
                                     output_names=["logits"], verbose=False)
    except Exception as e:
        raise ExportError(f"torch.onnx.export failed for the Medusa heads: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}") from e
    with atomic_write(path) as tmp:
        prog.save(str(tmp))
    write_json(out_dir / CONFIG, {"kind": "lisa-trt-medusa-onnx", "config": cfg.to_dict()})
    return path


class OrtMedusaHeads:
    """`head_logits` through ONNX Runtime (drop-in for MedusaHeads inside MedusaDrafter)."""

    def __init__(self, path, config: MedusaConfig, threads: Optional[int] = 1, device="cpu"):
        from ..engines.ort import make_session

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
