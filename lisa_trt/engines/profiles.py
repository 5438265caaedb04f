"""TensorRT optimisation profiles from the io spec, and the ONNX model TensorRT parses per graph.

Shared by deploy/build.py (building) and deploy/trt_lint.py (the CPU compatibility check);
both import from here, so neither imports the other's module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import InputError
from ..models.io_spec import Graph, shape_ranges

SEQ_SPLIT = 16  # the "step" profile covers S <= 16 (AR steps, drafter commits), "tree" the rest


@dataclass(frozen=True)
class ProfileSpec:
    """One TensorRT optimisation profile: input name -> (min, opt, max) shapes."""

    name: str
    shapes: dict

    def contains(self, shapes: dict) -> bool:
        """True when every given input shape lies within [min, max] of this profile."""
        for n, s in shapes.items():
            mn, _, mx = self.shapes[n]
            if len(s) != len(mn) or any(not a <= d <= b for a, d, b in zip(mn, s, mx)):
                return False
        return True

    def max_volume(self) -> int:
        v = 0
        for _, _, mx in self.shapes.values():
            n = 1
            for d in mx:
                n *= d
            v += n
        return v

    def to_dict(self) -> dict:
        return {"name": self.name, "shapes": {n: [list(s) for s in v] for n, v in self.shapes.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "ProfileSpec":
        return cls(d["name"], {n: tuple(tuple(int(x) for x in s) for s in v) for n, v in d["shapes"].items()})


def _axis_ranges(graph: Graph, *, max_batch: int, max_tree: int, cfg: bool, seq_split: int,
                 prefill_seq: Optional[int] = None, verify_prefill: int = 0) -> list:
    """[(profile name, {axis: (min, opt, max)})] for the dynamic axes of one graph.

    prefill_seq: most prompt tokens of a prefill graph with a "seq" axis (a text prompt:
    Chameleon), None for a fixed condition prefix (LlamaGen).
    verify_prefill: most tokens of a prefill run through target_verify (one target engine): a
    "prefill" profile 1..verify_prefill is added when the step / tree profiles do not cover it."""
    gb = max_batch * (2 if cfg else 1)  # graph batch: CFG runs [cond; uncond]
    batch = (1, min(2 if cfg else 1, gb), gb)
    if graph is Graph.VQ_DECODE:
        return [("images", {"batch": (1, 1, max_batch)})]
    if graph is Graph.TARGET_PREFILL:
        if prefill_seq:  # prompts of 1 .. max_prompt tokens, optimised for half of it
            return [("prefill", {"batch": batch, "seq": (1, max(1, prefill_seq // 2), prefill_seq)})]
        return [("prefill", {"batch": batch})]
    if graph is Graph.GASV:  # rows = real prompts x tree nodes (after CFG combine)
        return [("nodes", {"nodes": (1, max_tree, max_batch * max_tree)})]
    if max_tree <= seq_split:
        out = [("tree", {"batch": batch, "seq": (1, max_tree, max_tree)})]
    else:
        out = [("step", {"batch": batch, "seq": (1, 1, seq_split)}),
               ("tree", {"batch": batch, "seq": (1, max_tree, max_tree)})]
    if graph is Graph.TARGET_VERIFY and verify_prefill > max(max_tree, seq_split):
        out.append(("prefill", {"batch": batch, "seq": (1, max(1, verify_prefill // 2), verify_prefill)}))
    if graph is Graph.DRAFTER_FUSED:  # a commit's taps rows or an expansion's hidden rows: either may be 0
        out = [(n, dict(r, taps_seq=(0, 0, r["seq"][2]), hidden_seq=(0, r["seq"][1], r["seq"][2]))) for n, r in out]
    return out


def profiles_from_io_spec(manifest, *, max_batch: int = 1, max_tree: Optional[int] = None, cfg: bool = True,
                          seq_split: int = SEQ_SPLIT, graphs: Optional[list] = None) -> dict:
    """Optimisation profiles of every graph, derived from the io spec's dynamic axes.

    Static axes come from the export (the family's export_dims); the dynamic ones are:
      batch  1 .. max_batch x 2 (CFG batch), opt 2 (one prompt with CFG); VQ decode 1 .. max_batch;
      seq    target_verify / drafter graphs: a "step" profile S in 1..seq_split (opt 1: AR steps,
             drafter commits) and a "tree" profile S in 1..max_tree (opt max_tree: tree verification);
             a prefill that takes the prompt's tokens (Chameleon) 1..max_prompt (the family's
             prefill_max_seq of the manifest's layout); when the verify graph runs the prefill
             too (one target engine), target_verify gets a "prefill" profile 1..that prompt;
      nodes  GASV rows 1 .. max_batch x max_tree;
      taps_seq / hidden_seq  drafter_fused's taps and hidden rows: 0 .. the profile's largest seq
             (TensorRT takes empty tensors: a commit passes no hidden rows, an expansion no taps).

    Args:
        manifest: a Manifest (export.manifest.read_manifest).
        max_batch: prompts per call (real batch, before CFG doubling).
        max_tree: tree-token budget; default and upper bound the export's max_tree (the static
            cache has exactly that many scratch slots).
        cfg: include the CFG doubling of the batch.
        seq_split: largest S of the "step" profile.
        graphs: graph names (default: every graph of the manifest).
    Returns:
        {graph name: [ProfileSpec, ...]} with one entry per graph input in every profile.
    """
    if max_batch < 1:
        raise InputError(f"max_batch must be >= 1, got {max_batch}")
    max_tree = manifest.max_tree if max_tree is None else int(max_tree)
    if not 1 <= max_tree <= manifest.max_tree:
        raise InputError(f"max_tree {max_tree} is outside 1..{manifest.max_tree}: the exported cache holds "
                         f"{manifest.max_tree} tree slots; re-export with `lisa-trt export --max-tree N` for more")
    dims = manifest.dims  # the family's static axes and io specs (export/families.py)
    xf = manifest.export_family
    prefill_seq = xf.prefill_max_seq(manifest.layout)
    # one target engine: the verify engine also takes the prefill (its prompt, or the condition prefix)
    verify_prefill = 0
    if xf.bundle_prefill_ids(manifest) is not None:
        verify_prefill = prefill_seq or dims.get("prefix")
        if not verify_prefill:
            raise InputError("the verify graph of this bundle runs the prefill, but the export sizes no "
                             "prompt: the family's prefill_max_seq is empty and its dims have no 'prefix' "
                             "axis (the config's cond_dims()); give the config a fixed prefix or the "
                             "layout a max_prompt")
    out = {}
    for name in graphs or sorted(manifest.graphs):
        graph = Graph(name)
        spec = manifest.spec(graph)
        profs = []
        for pname, ranges in _axis_ranges(graph, max_batch=max_batch, max_tree=max_tree, cfg=cfg,
                                          seq_split=seq_split, prefill_seq=prefill_seq,
                                          verify_prefill=verify_prefill):
            try:
                shapes = shape_ranges(spec, dims, ranges)
            except KeyError as e:
                raise InputError(f"{name}: axis {e} has no size in the export (the family's export_dims)") from e
            profs.append(ProfileSpec(pname, shapes))
        out[name] = profs
    return out


# ----------------------------------------------------------------------------- graph files

def _export_needs_trt_copy(path: Path) -> bool:
    import onnx

    from .parser_checks import needs_trt_copy

    return needs_trt_copy(onnx.load(str(path), load_external_data=False))


def trt_onnx_path(manifest, graph: Graph, attention: Optional[str] = None) -> Path:
    """The ONNX file TensorRT builds for a graph: gasv.trt.onnx for GASV; <graph>.trt.onnx for a
    graph built with attention="plain" (attention_ops.plain_attention) or whose export carries what
    only ONNX Runtime takes (fp16 Attention softmax_precision, parser_checks.needs_trt_copy); the
    export otherwise."""
    from .plugins.graph_rewrite import trt_variant_path

    path = manifest.graph_path(graph)
    if graph is Graph.GASV or attention == "plain" or _export_needs_trt_copy(path):
        return trt_variant_path(path)
    return path


def trt_copy(path: Path, attention: Optional[str] = None):
    """The export's graph proto with what the parser refuses stripped (weights stay external);
    attention="plain": every Attention node as plain ops (attention_ops.plain_attention)."""
    import onnx

    from .parser_checks import strip_for_trt

    model = onnx.load(str(path), load_external_data=False)
    strip_for_trt(model)
    if attention == "plain":
        from .attention_ops import plain_attention

        plain_attention(model)
    return model


def write_trt_copies(manifest, graphs, attention: Optional[dict] = None) -> list:
    """Write <graph>.trt.onnx beside each export of `graphs` that needs one (not GASV: its plugin
    variant is graph_rewrite.write_trt_variant's). The copy references the export's weight file.
    attention: {graph: "op" | "plain"} (default "op"). Returns the paths written."""
    from ..io import atomic_write

    attention = attention or {}
    out = []
    for name in graphs:
        graph = Graph(name)
        dest = trt_onnx_path(manifest, graph, attention.get(name))
        if graph is Graph.GASV or dest == manifest.graph_path(graph):
            continue
        model = trt_copy(manifest.graph_path(graph), attention.get(name))
        with atomic_write(dest) as tmp:
            tmp.write_bytes(model.SerializeToString())
        out.append(dest)
    return out


def trt_graph_model(manifest, graph: Graph, *, tables=None, attention: Optional[str] = None):
    """(onnx.ModelProto, path) of what TensorRT would parse for `graph` (no external weights).

    attention None: the written TensorRT file when it exists, else made in memory: for GASV the
    plugin rewrite (tables: the given ones, else the bundle's tables.safetensors, else recovered
    from gasv.onnx), for another graph the export stripped of what the parser refuses.
    attention "op" / "plain": a graph other than GASV is made in memory with that attention
    (a written file may hold the other one).
    """
    import onnx

    from .plugins.graph_rewrite import rewrite_gasv, tables_from_bundle

    path = trt_onnx_path(manifest, graph, attention)
    if path.is_file() and (attention is None or graph is Graph.GASV):
        return onnx.load(str(path), load_external_data=False), path
    if graph is Graph.GASV:
        if tables is None:
            tables = tables_from_bundle(manifest)
        return rewrite_gasv(manifest.graph_path(graph), tables=tables), path
    return trt_copy(manifest.graph_path(graph), attention), path


__all__ = ["SEQ_SPLIT", "ProfileSpec", "profiles_from_io_spec", "trt_copy", "trt_graph_model", "trt_onnx_path",
           "write_trt_copies"]
