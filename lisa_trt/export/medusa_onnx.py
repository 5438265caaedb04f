"""Medusa heads as one ONNX graph (`medusa_heads.onnx`), outside an engine bundle.

Graph (io_spec Graph.MEDUSA_HEADS, wrapper export.onnx.MedusaHeadsGraph): hidden (B, S, H) fp32,
depth (B, S) int64 -> logits (B, S, V) fp32, the math of `MedusaHeads.head_logits` (every head
evaluated, head `depth` selected, flat logits past the last head). B and S are dynamic.

Inside an engine bundle (`export_bundle(target, heads, ...)`, `lisa-trt export --drafter
demo-medusa-lisa`) the same graph is written, validated and recorded in the manifest, and
`load_engines` returns it as the drafter (engines/medusa_graph.py). This standalone export is
for attaching heads to an existing directory: `<dir>/medusa_heads.onnx` + `<dir>/medusa_heads.json`
(the MedusaConfig, target hash included), read by `engines.medusa_ort.load_ort_medusa`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..io import atomic_write, write_json
from ..models.medusa import MedusaHeads
from ..models.io_spec import Graph

GRAPH = Graph.MEDUSA_HEADS.filename
CONFIG = "medusa_heads.json"


def export_medusa_onnx(heads: MedusaHeads, out_dir, *, opset: int = 23) -> Path:
    """Export `heads` to out_dir/medusa_heads.onnx (+ its config JSON); returns the graph path."""
    from .onnx import MedusaHeadsGraph, onnx_from_torch

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = heads.config
    dev = next(heads.parameters()).device
    example = dict(hidden=torch.randn(2, 3, cfg.dim, device=dev),
                   depth=torch.tensor([[0, 1, 2], [1, 2, cfg.n_heads]], device=dev))
    path = out_dir / GRAPH
    with atomic_write(path) as tmp:
        onnx_from_torch(MedusaHeadsGraph(heads.eval()), example, Path(tmp), opset=opset, external_data=False)
    write_json(out_dir / CONFIG, {"kind": "lisa-trt-medusa-onnx", "config": cfg.to_dict()})
    return path
