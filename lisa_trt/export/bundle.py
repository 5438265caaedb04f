"""`lisa-trt export`: one engine directory for any model family, through one writer.

    man = export_bundle(target, drafter, tables, vq, out_dir, fp16=True)
        ├─ export_family(target).bundle_graphs(...)    (the family's ExportFamily, export/families.py:
        │      -> BundleGraphs                          its target / VQ graphs, cache length, static
        │                                               layout, the files it adds)
        └─ write_bundle(xf, ..., graphs, options)       (this module, every family)

`write_bundle` traces, validates and lints every graph (export/onnx.export_graphs), moves their
weights into one shared file (export/weights.py), writes the family's files, the tables and (for
families the torch backend runs) the optional fp32 PyTorch weights, then the manifest; quantized
exports quantize the graphs last (export/quantize.py). Everything happens in a hidden staging
directory next to `out_dir`, swapped in at the end: an interrupted export never leaves a
directory that looks complete, and an existing bundle at `out_dir` stays intact until the swap.

The directory's names are export/layout.py's.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..errors import InputError
from ..models.io_spec import Graph

from .layout import DEFAULT_MAX_TREE, DEFAULT_OPSET, MEDUSA_WEIGHTS, WEIGHT_FILES


@dataclass(frozen=True)
class ExportOptions:
    """How to export, whatever the family.

    fp16: fp16 target / drafter graphs (weights, activations, KV cache; RMSNorm statistics, RoPE,
        softmax and logits stay fp32); GASV and VQ graphs stay fp32.
    opset: ONNX opset (>= 23: ONNX Attention).
    max_tree: most new tokens one verification may add (sets the static cache length).
    quantize: "none", "int8" or "int4": the fp32 target / drafter graphs quantized for ONNX Runtime.
    validate: compare every graph with the fp32 PyTorch model (export/validate.py thresholds).
    lint: `polygraphy check lint` every graph (recorded in the manifest; a failure fails the export).
    torch_weights: also write the fp32 PyTorch weights (weights/*.safetensors) for the torch backend.
    share: move the graphs' weights into the one shared file (off: each graph keeps its own; for
        looking at graphs alone).
    external_data: force external weight files on / off while exporting (default: by size).
    """

    fp16: bool = False
    opset: int = DEFAULT_OPSET
    max_tree: int = DEFAULT_MAX_TREE
    quantize: str = "none"
    validate: bool = True
    lint: bool = True
    progress: bool = True
    torch_weights: bool = False
    share: bool = True
    external_data: Optional[bool] = None
    generation: Optional[dict] = None

    @property
    def precision(self) -> str:
        return "fp16" if self.fp16 else "fp32"

    def check(self) -> "ExportOptions":
        """InputError with the fix for an opset without ONNX Attention, a tree budget < 1, an unknown
        quantization mode, or quantization asked of fp16 graphs; before any work."""
        if self.opset < 23:
            raise InputError(f"opset {self.opset} is too old: the graphs use ONNX Attention (opset >= 23)")
        if self.max_tree < 1:
            raise InputError(f"max_tree must be >= 1, got {self.max_tree}")
        if self.quantize != "none":
            from .quantize import check_mode

            check_mode(self.quantize)
            if self.fp16:
                raise InputError(f"--quantize {self.quantize} quantizes fp32 graphs; drop --fp16")
        return self


@dataclass
class BundleGraphs:
    """What a family answers for one export (ExportFamily.bundle_graphs).

    target: (t_exp, precision) -> [(Graph, build() -> graph wrapper, precision)] for its target
        graphs; t_exp is the target to trace (an export.memory.PrecisionCopy: build wrappers over
        `export.memory.resolve(t_exp)`).
    max_cache_len: the static cache length of target and drafter.
    tables: the tables the GASV graph and the manifest use (bound to the head), or None.
    saved_tables: the tables written to tables.safetensors (None: none written).
    vq: build() -> the decoder graph wrapper, or None (no decoder graph).
    layout: the static sequence layout the manifest records (prompt budget, latent grid), or None.
    files: (staging dir) -> {role: file name} of the family's own files (tokenizer, null caption).
    codes: the GASV graph's code axis when the tables cover a sub-vocabulary.
    drafter_commit: export the drafter's one-call graph, drafter_fused (bundles before it exported
        drafter_commit here).
    torch_backend: the torch backend runs these bundles: the shared weights file indexes the models'
        state dicts, Medusa heads get their weights file, `torch_weights` writes the fp32 copies.
    """

    target: Callable
    max_cache_len: int
    tables: object = None
    saved_tables: object = None
    vq: Optional[Callable] = None
    layout: Optional[dict] = None
    files: Callable = field(default=lambda dest: {})
    codes: Optional[int] = None
    drafter_commit: bool = True
    torch_backend: bool = False


def write_bundle(xf, target, drafter, tables, vq, out_dir, graphs: BundleGraphs, opts: ExportOptions):
    """Write the engine directory of `target` (any family) atomically; returns its Manifest.

    Args:
        xf: the family's ExportFamily (graph specs, axes, validation inputs and references).
        target, drafter, tables, vq: the fp32 models (drafter: EAGLE-3 or Medusa heads; any may be
            None but the target).
        graphs: the family's BundleGraphs for this export.
        opts: ExportOptions (checked).
    Raises:
        ExportError: a graph failed to export, validate or lint.
    """
    from . import manifest as M
    from .onnx import staging_dir

    out_dir = Path(out_dir)
    with staging_dir(out_dir, echo=print if opts.progress else None) as stage:
        man = _write_graphs(xf, target, drafter, vq, stage, graphs, opts)
        files = {**(man.files or {}), **_write_files(target, drafter, vq, stage, graphs, opts, man.drafter_arch)}
        M.write_manifest(dataclasses.replace(man, files=files), stage)
        if opts.quantize != "none":
            from .quantize import quantize_bundle
            from .weights import share_bundle

            refs = dict(target=target, drafter=drafter, tables=graphs.tables, vq=vq)
            quantize_bundle(stage, opts.quantize, refs, validate=opts.validate)
            share_bundle(stage)  # the quantized weights once (prefill / verify / drafter graphs share them)
    return M.read_manifest(out_dir)


def _write_graphs(xf, target, drafter, vq, stage: Path, graphs: BundleGraphs, opts: ExportOptions):
    """Every graph into `stage` (shared weights unless quantizing); the manifest of the graphs alone."""
    from . import manifest as M
    from .memory import PrecisionCopy
    from .onnx import GASVGraph, drafter_builders, export_graphs, half_drafter

    tables, precision = graphs.tables, opts.precision
    dims = xf.export_dims(target.config, max_cache_len=graphs.max_cache_len,
                          drafter_cfg=drafter.config if drafter is not None else None,
                          vq_cfg=vq.config if vq is not None else None, codes=graphs.codes, layout=graphs.layout)
    refs = dict(target=target, drafter=drafter, tables=tables, vq=vq)
    started = time.time()
    t_exp = PrecisionCopy(target, opts.fp16)  # converted per graph, freed after each (export/memory.py)
    d_exp = half_drafter(drafter, opts.fp16)
    builders = list(graphs.target(t_exp, precision))
    builders += drafter_builders(drafter, d_exp, precision, commit=graphs.drafter_commit)
    if tables is not None:
        gspec = xf.graph_spec(Graph.GASV, target.config)
        builders.append((Graph.GASV, lambda: GASVGraph(tables, gspec), "fp32"))
    if vq is not None and graphs.vq is not None:
        builders.append((Graph.VQ_DECODE, graphs.vq, "fp32"))
    written = export_graphs(builders, stage, dims, refs, (t_exp, d_exp), opset=opts.opset,
                            external_data=opts.external_data, validate=opts.validate, lint=opts.lint,
                            progress=opts.progress)
    weights = None
    if opts.share and opts.quantize == "none":  # quantized: shared after quantizing
        from .weights import share_weights

        models = dict(target=t_exp, drafter=d_exp, vq=vq) if graphs.torch_backend else None
        written, weights = share_weights(stage, written, models=models)
    man = M.build_manifest(target=target, drafter=drafter, tables=tables, vq=vq, graphs=written,
                           precision=precision, opset=opts.opset, max_tree=opts.max_tree,
                           max_cache_len=graphs.max_cache_len, generation=opts.generation,
                           files=graphs.files(stage), layout=graphs.layout, weights=weights, started=started)
    M.write_manifest(man, stage)
    return man


def _write_files(target, drafter, vq, stage: Path, graphs: BundleGraphs, opts: ExportOptions, drafter_arch) -> dict:
    """The tables, Medusa heads' weights and (torch_weights) fp32 PyTorch weights; {role: file}."""
    files = {}
    if graphs.torch_backend:
        files.update(_torch_files(target, drafter, vq, stage, opts.torch_weights, drafter_arch))
    if graphs.saved_tables is not None:
        from ..calibration.tables import save_tables

        save_tables(graphs.saved_tables, stage / WEIGHT_FILES["tables"])
        files["tables"] = WEIGHT_FILES["tables"]
    return files


def _torch_files(target, drafter, vq, stage: Path, fp32_copy: bool, drafter_arch) -> dict:
    """What the torch backend reads beside the shared weights: the Medusa heads (small: always) and,
    with `fp32_copy`, the fp32 target / drafter / VQ weights."""
    from ..models.checkpoints import save_model

    files = {}
    if fp32_copy:
        save_model(target, target.config, stage / WEIGHT_FILES["target_weights"])
        files["target_weights"] = WEIGHT_FILES["target_weights"]
    if drafter is not None and drafter_arch == "medusa":
        from ..models.medusa import save_medusa

        save_medusa(drafter, stage / MEDUSA_WEIGHTS)  # + weights/medusa.json (its config)
        files["drafter_weights"] = MEDUSA_WEIGHTS
    elif drafter is not None and fp32_copy:
        from ..models.drafter import save_drafter

        save_drafter(drafter, stage / WEIGHT_FILES["drafter_weights"])
        files["drafter_weights"] = WEIGHT_FILES["drafter_weights"]
    if vq is not None and fp32_copy:
        save_model(vq, vq.config, stage / WEIGHT_FILES["vq_weights"])
        files["vq_weights"] = WEIGHT_FILES["vq_weights"]
    return files


def export_bundle(target, drafter=None, tables=None, vq=None, out_dir=None, *, source=None, image_size=None,
                  max_prompt=None, max_tree=None, opset=None, generation=None, validate=True, fp16=False,
                  quantize="none", lint=True, progress=True, torch_weights=False, share=True, external_data=None):
    """`lisa-trt export` for any family: a validated engine directory for `target`; its Manifest.

    The output directory and the options are checked before any work; then the target's family
    answers its graphs (ExportFamily.bundle_graphs) and `write_bundle` writes them.

    Args:
        target, drafter, tables, vq: the fp32 models (all but the target may be None).
        out_dir: the engine directory to write (replaced atomically if it is one).
        source: the checkpoint directory (tokenizer files of token-prompt families).
        image_size, max_prompt: the family's static layout (None: its defaults; families without
            one ignore them).
        the rest: ExportOptions (None: the defaults; max_tree: the family's default_max_tree).
    Raises:
        InputError: a bad option or output directory, before any work.
        ArtifactMismatchError: drafter or tables made for another target.
        ExportError: a graph failed to export, validate or lint.
    """
    from .families import export_family
    from .staging import check_replaceable

    if out_dir is None:
        raise InputError("export_bundle needs out_dir, the engine directory to write")
    check_replaceable(Path(out_dir))  # before any work: a directory holding files lisa-trt did not write
    xf = export_family(target)
    opts = ExportOptions(fp16=fp16, opset=opset or DEFAULT_OPSET, max_tree=max_tree or xf.default_max_tree
                         or DEFAULT_MAX_TREE, quantize=quantize, validate=validate, lint=lint, progress=progress,
                         torch_weights=torch_weights, share=share, external_data=external_data,
                         generation=generation).check()
    graphs = xf.bundle_graphs(target.eval(), drafter.eval() if drafter is not None else None, tables, vq, opts,
                              source=source, image_size=image_size, max_prompt=max_prompt)
    return write_bundle(xf, target, drafter, tables, vq, out_dir, graphs, opts)


__all__ = ["BundleGraphs", "DEFAULT_MAX_TREE", "DEFAULT_OPSET", "ExportOptions", "MEDUSA_WEIGHTS", "WEIGHT_FILES",
           "export_bundle", "write_bundle"]
