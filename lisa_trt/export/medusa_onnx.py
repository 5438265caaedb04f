"""Medusa heads as one ONNX graph (`medusa_heads.onnx`) and its ONNX Runtime runner.

Graph: hidden (B, S, H) fp32, depth (B, S) int64 -> logits (B, S, V) fp32, the math of
`MedusaHeads.head_logits` (every head evaluated, head `depth` gathered, flat logits past the
last head). B and S are dynamic. `engines.medusa_ort.OrtMedusaHeads` has the same `head_logits` method and
`config`, so `speculative.medusa.medusa_pair(target, OrtMedusaHeads(...))` runs the heads through
ORT with any target engine (torch, OrtTarget, TrtTarget).

The artifact sits next to its config: `<dir>/medusa_heads.onnx` + `<dir>/medusa_heads.json`
(the MedusaConfig, target hash included, checked by `load_ort_medusa`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from ..io import atomic_write, write_json
from ..models.medusa import MedusaHeads

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
