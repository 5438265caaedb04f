"""Optional graphs added to an existing bundle (old bundles keep loading without them; how an older
manifest is read is export/legacy.py's).

`drafter_fused` (every drafter call in one graph: a commit runs the fc on the taps inside, an
expansion feeds the previous hidden state; engines.graph.GraphDrafter) is exported by
`export_bundle` since it exists; `add_graphs` gives a bundle exported before it the graph from the
bundle's own PyTorch weights, validated against PyTorch like a fresh export. The upgraded bundle
then runs the drafter as that one graph on every backend (ONNX Runtime, TensorRT: `lisa-trt build`
makes it the drafter's only engine), one engine call per commit instead of drafter_project +
drafter_step. An older bundle's `drafter_commit` is not added (`drafter_fused` replaces it):

    from lisa_trt.export.upgrade import add_graphs
    add_graphs("runs/demo/demo_run/engines")     # -> ["drafter_fused"]
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

from ..errors import InputError
from ..models.io_spec import Graph
from .onnx import DrafterFusedGraph, _export_graph, _half_copy

OPTIONAL_GRAPHS = (Graph.DRAFTER_FUSED,)


def add_graphs(engine_dir, graphs=OPTIONAL_GRAPHS, *, opset: Optional[int] = None, validate: bool = True,
               lint: bool = False) -> list:
    """Add optional graphs (drafter_fused) to an existing fp32/fp16 bundle from its own
    PyTorch weights, validated like a fresh export; the manifest gains their entries (every
    other key, a TensorRT build record included, is kept). Graphs already there are skipped.

    Returns:
        The names of the graphs added.
    Raises:
        InputError: no PyTorch weights in the bundle, a quantized bundle, or no drafter.
    """
    from ..io import write_json
    from . import manifest as M

    engine_dir = Path(engine_dir)
    man = M.read_manifest(engine_dir)
    todo = [g for g in graphs if not man.has(g)]
    if not todo:
        return []
    if man.quantization != "none":
        raise InputError(f"{engine_dir} is quantized ({man.quantization}); re-export it to add {[g.value for g in todo]}")
    if man.drafter_config is None:
        raise InputError(f"{engine_dir} has no drafter; {[g.value for g in todo]} need one")
    refs = _bundle_models(engine_dir, man)
    dims = man.export_family.export_dims(man.target_config, max_cache_len=man.max_cache_len,
                                         drafter_cfg=man.drafter_config)
    fp16 = man.precision == "fp16"
    t_exp = _half_copy(refs["target"]) if fp16 else refs["target"]
    d_exp = _half_copy(refs["drafter"]) if fp16 else refs["drafter"]
    build = {Graph.DRAFTER_FUSED: lambda: DrafterFusedGraph(d_exp)}
    raw = json.loads((engine_dir / M.MANIFEST_NAME).read_text())
    for g in todo:
        if g not in build:
            raise InputError(f"{g.value} is not an optional graph; re-export the bundle")
        entry = _export_graph(g, build[g], man.precision, engine_dir, dims, refs, (t_exp, d_exp),
                              opset=opset or man.opset, external_data=None, validate=validate, lint=lint)
        raw["graphs"][g.value] = dataclasses.asdict(entry)
    write_json(engine_dir / M.MANIFEST_NAME, raw)
    return [g.value for g in todo]


def _bundle_models(engine_dir: Path, man) -> dict:
    """The bundle's own fp32 PyTorch target / drafter / tables (weights/ written by `lisa-trt export`)."""
    from ..calibration.tables import load_tables
    from .weights import has_index, model_from_bundle

    files = man.files or {}
    if "target_weights" not in files and not has_index(man, "target"):
        raise InputError(f"{engine_dir} carries no PyTorch weights (weights/); re-export it with `lisa-trt export` "
                         "(which bundles them and writes every graph)")
    if man.precision != "fp32" and "target_weights" not in files:
        raise InputError(f"{engine_dir} is an {man.precision} bundle without fp32 PyTorch weights; re-export it with "
                         "`lisa-trt export` (which writes every graph)")
    target = model_from_bundle(man, "target").float().eval()
    refs = dict(target=target, drafter=model_from_bundle(man, "drafter", target).float().eval(), tables=None, vq=None)
    if "tables" in files:
        refs["tables"] = load_tables(engine_dir / files["tables"], target.output.weight.float())
    return refs


__all__ = ["OPTIONAL_GRAPHS", "add_graphs"]
