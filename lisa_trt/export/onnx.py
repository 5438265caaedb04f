"""Export target + drafter + GASV + VQ decoder to ONNX (docs/spec/deploy.md), atomically, validated.

The family-independent graph wrappers (drafter, Medusa heads, GASV), what every family's wrappers
build on (`_NamedGraph`, `_ShimCache`, `_export_mode`) and the per-graph export loop
(`export_graphs`) of every engine directory (export/bundle.write_bundle writes it). A family's
target and VQ wrappers live in its package (families/<name>/export.py, handed over by its
ExportFamily's `bundle_graphs` / `graph_module`). LlamaGen's directory:

    target_prefill.onnx   condition prefix -> its K/V rows (present.*), committed by the runner
    target_verify.onnx    S new tokens / a draft tree over the static cache, taps + hidden
    drafter_project.onnx  drafter fc on the target taps
    drafter_step.onnx     one drafter step over its own static cache
    drafter_fused.onnx    every drafter call of the decode loop: a commit (fc on the taps inside)
                          or an expansion (the previous hidden), in one engine
    medusa_heads.onnx     (Medusa drafter, instead of the two above) k heads on the target's hidden
    gasv.onnx             GASV v2 per-node gates as plain ONNX ops (tables as initializers)
    vq_decode.onnx        VQ decoder
    conditions.safetensors  (t2i) the null caption for CFG
    manifest.json         graphs, precision, opset, io spec version, hashes, settings

Graph I/O names and axes come from `io_spec`. The KV caches `past_key_values.{i}.*` are read-only
graph inputs: each layer attends over the cache plus its new rows (models/layers.rows_attention,
through `_ShimCache`'s CacheRows) and the graph returns only the new rows as `present.{i}.*`; the
runner commits them into its one cache at the step's slots (engines/graph.py `_run_kv`), so no
graph writes a cache-sized tensor. The cache length Lmax is static per export:
round_up(seq_len + max_tree, 8) for LlamaGen (a family's bundle_graphs says its own).

Models are exported through thin wrappers that call the models' own code (the target's `_run`,
`Drafter.forward`, `gasv` functions, the decoder's `decode_code`), so the math has one
source. The host-side input checks those methods make (`int(tokens.min())` ...) cannot be traced;
`_export_mode` swaps them for check-free versions while exporting, and the runners do the checks
on the host instead.

The directory is written under a hidden temporary name next to `out_dir` and renamed at the end;
an interrupted or failed export leaves no directory that looks complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ArtifactMismatchError, InputError, LisaError
from ..models.layers import CacheRows
from .families import export_family, fused_hidden
from .memory import PrecisionCopy, resolve
from ..models.io_spec import EMPTY_AXES, GASV_K, GASV_PARAMS, Graph, GraphSpec, export_dims, gasv_params, graph_spec  # noqa: F401 (gasv_params, export_dims re-exported)


from .layout import DEFAULT_MAX_TREE, DEFAULT_OPSET  # noqa: F401 (the export defaults, defined once)
EXTERNAL_DATA_BYTES = 32 << 20  # graphs with more weight bytes than this use external data
_EXAMPLE = dict(batch=2, seq=3, nodes=3)  # trace sizes: never 1 on a dynamic axis (docs/spec/deploy.md)


class ExportError(LisaError):
    """An export step failed (tracing, validation beyond threshold, lint errors)."""


# ----------------------------------------------------------------------------- wrappers

class _ShimCache:
    """What the models' attention touches of a KVCache: the .k / .v lists, here of read-only
    CacheRows (models/layers.rows_attention) over the past buffers; `presents()` gives the new
    rows each layer left, in the io spec's present.* order (the runner commits them)."""

    def __init__(self, past: list):
        self.k = [CacheRows(b) for b in past[0::2]]
        self.v = [CacheRows(b) for b in past[1::2]]

    def presents(self) -> tuple:
        out = []
        for k, v in zip(self.k, self.v):
            out += [k.rows, v.rows]
        return tuple(out)


@contextlib.contextmanager
def _export_mode(*models):
    """Replace the data-dependent host checks of the models with check-free versions.

    A target's host checks (its family's ExportFamily.export_patches: e.g. embed_tokens /
    check_cond) and Drafter.embed / _freqs raise InputError after reading tensor values
    (`int(x.max())`), which torch.export cannot trace. The runners run the same checks on the
    host before calling a graph.
    """
    from ..models.drafter import Drafter

    patched, seen = [], set()
    for m in models:
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        if isinstance(m, Drafter):
            patches = dict(embed=lambda tokens, _m=m: F.embedding(tokens, _m.embed_weight),
                           _freqs=lambda positions, _m=m: _m.freqs_cis[positions])
        elif getattr(m, "config", None) is not None and getattr(m.config, "model_type", None):
            patches = export_family(m).export_patches(m)  # the target's family (ExportFamily.export_patches)
        else:
            continue
        for name, fn in patches.items():
            setattr(m, name, fn)  # instance attribute shadows the method
            patched.append((m, name))
    try:
        yield
    finally:
        for m, name in patched:
            delattr(m, name)


class _NamedGraph(nn.Module):
    """forward(*flat inputs in spec order) -> tuple of outputs in spec order."""

    def __init__(self, spec: GraphSpec):
        super().__init__()
        self.spec = spec

    def compute(self, x: dict) -> dict:
        raise NotImplementedError

    def forward(self, *flat):
        out = self.compute(dict(zip(self.spec.input_names, flat)))
        return tuple(out[n] for n in self.spec.output_names)


class DrafterProjectGraph(_NamedGraph):
    def __init__(self, drafter):
        super().__init__(graph_spec(Graph.DRAFTER_PROJECT))
        self.drafter = drafter

    def compute(self, x):
        return dict(hidden=self.drafter.project_taps(x["taps"]))


class DrafterStepGraph(_NamedGraph):
    """Drafter.forward over its own static cache."""

    def __init__(self, drafter):
        super().__init__(graph_spec(Graph.DRAFTER_STEP))
        self.drafter = drafter

    def compute(self, x):
        cache = _ShimCache([x["past_key_values.0.key"], x["past_key_values.0.value"]])
        logits, hidden = self.drafter(x["hidden_in"], x["input_ids"], x["position_ids"], x["cache_slots"],
                                      x["attention_mask"], cache)
        k, v = cache.presents()
        return {"logits": logits, "hidden": hidden, "present.0.key": k, "present.0.value": v}


class DrafterCommitGraph(_NamedGraph):
    """The decode loop's drafter commit in one graph: Drafter.forward(project_taps(taps), ...)."""

    def __init__(self, drafter):
        super().__init__(graph_spec(Graph.DRAFTER_COMMIT))
        self.drafter = drafter

    def compute(self, x):
        cache = _ShimCache([x["past_key_values.0.key"], x["past_key_values.0.value"]])
        logits, hidden = self.drafter(self.drafter.project_taps(x["taps"]), x["input_ids"], x["position_ids"],
                                      x["cache_slots"], x["attention_mask"], cache)
        k, v = cache.presents()
        return {"logits": logits, "hidden": hidden, "present.0.key": k, "present.0.value": v}


class DrafterFusedGraph(_NamedGraph):
    """Every drafter call of the decode loop in one graph: a commit (fc on the taps inside, no
    hidden rows) or an expansion (the previous hidden, no taps rows), so the commit is one call
    and a backend whose engines share no weights (TensorRT) holds the drafter's layer once."""

    def __init__(self, drafter):
        super().__init__(graph_spec(Graph.DRAFTER_FUSED))
        self.drafter = drafter

    def compute(self, x):
        cache = _ShimCache([x["past_key_values.0.key"], x["past_key_values.0.value"]])
        ids = x["input_ids"]
        h_in = fused_hidden(self.drafter, x["taps"], x["hidden_in"], ids.shape[1])
        logits, hidden = self.drafter(h_in, ids, x["position_ids"], x["cache_slots"], x["attention_mask"], cache)
        k, v = cache.presents()
        return {"logits": logits, "hidden": hidden, "present.0.key": k, "present.0.value": v}


class MedusaHeadsGraph(_NamedGraph):
    """MedusaHeads.head_logits: (hidden, depth) -> logits of head `depth` (always fp32, also in --fp16 bundles)."""

    def __init__(self, heads):
        super().__init__(graph_spec(Graph.MEDUSA_HEADS))
        self.heads = heads

    def compute(self, x):
        return dict(logits=self.heads.head_logits(x["hidden"], x["depth"]))


def is_medusa(drafter) -> bool:
    """True for Medusa heads (exported as one medusa_heads graph instead of the drafter graphs)."""
    from .manifest import drafter_arch

    return drafter is not None and drafter_arch(drafter) == "medusa"


class GASVGraph(_NamedGraph):
    """GASV v2 per-node gates (docs/spec/lisa.md steps 1-4): calls `gasv.gasv_core`, the reference.

    The first GASV_K codebook neighbours of every token are baked in (-1 padded when the tables
    hold fewer); the `neighbours` entry of gasv_params masks columns >= K_n (scope "neighbours";
    the other scopes are PyTorch-reference ablations).
    """

    def __init__(self, tables, spec: Optional[GraphSpec] = None):
        super().__init__(spec or graph_spec(Graph.GASV))  # a family may name the vocabulary axis (Chameleon: codes)
        if tables.w_tilde is None:
            raise InputError("GASV tables are not bound to the target head; call tables.bind(target.output.weight)")
        nb = tables.lantern_neighbors.detach().long().cpu()[:, :GASV_K]
        if nb.shape[1] < GASV_K:
            nb = torch.cat([nb, torch.full((nb.shape[0], GASV_K - nb.shape[1]), -1, dtype=torch.long)], 1)
        self.register_buffer("nb", nb)
        self.register_buffer("w_tilde", tables.w_tilde.detach().float().cpu())
        self.register_buffer("n2", tables.w_tilde_norm2.detach().float().cpu())
        self.register_buffer("cluster", tables.cluster.detach().long().cpu())
        self.register_buffer("beta", tables.beta.detach().float().cpu())

    def compute(self, x):
        from ..speculative.gasv import gasv_core

        prm = dict(zip(GASV_PARAMS, x["gasv_params"].unbind(0)))
        tok = x["node_tokens"]
        cols = torch.arange(GASV_K, device=tok.device)[None, :].to(torch.float32)
        # no int64 Clip here: this subgraph stays in the TensorRT variant (TensorRT's Clip is float-only)
        cand = torch.where(cols < prm["neighbours"], self.nb[torch.where(tok >= 0, tok, 0)], -1)
        p, delta_eff, gate = gasv_core(x["guided_logits"], tok, x["node_parents"], cand, self.w_tilde, self.n2,
                                       self.cluster, self.beta, prm)
        return dict(p=p, delta_eff=delta_eff, cand=cand, gate=gate)


# ----------------------------------------------------------------------------- loaders

def onnx_from_torch(module: _NamedGraph, example: dict, path: Path, *, opset: int = DEFAULT_OPSET,
                    external_data: Optional[bool] = None, optimize: bool = True) -> Path:
    """Trace `module` with the dynamo exporter and save it to `path`.

    Args:
        module: a graph wrapper (inputs/outputs named by its io spec).
        example: named example inputs (trace sizes, never 1 on a dynamic axis).
        path: destination .onnx; external data goes to `<path>.data` next to it.
        opset: ONNX opset (>= 23 for the Attention op).
        external_data: None -> only when the weights exceed EXTERNAL_DATA_BYTES.
    Returns:
        path.
    """
    from torch.export import Dim

    spec = module.spec
    dims: dict = {}

    def dyn(t):  # an EMPTY_AXES axis may be 0 long at run time (traced at a size >= 2)
        return {i: dims.setdefault(a, Dim(a, min=0 if a in EMPTY_AXES else 1))
                for i, a in t.dynamic_axes().items()} or None

    flat = tuple(example[n] for n in spec.input_names)
    dynamic = (tuple(dyn(t) for t in spec.inputs),)
    if external_data is None:
        nbytes = sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))
        external_data = nbytes > EXTERNAL_DATA_BYTES
    try:
        with torch.no_grad(), _quiet_exporter():
            prog = torch.onnx.export(module.eval(), flat, dynamo=True, opset_version=opset,
                                     dynamic_shapes=dynamic, input_names=spec.input_names,
                                     output_names=spec.output_names, optimize=optimize, verbose=False)
    except Exception as e:
        raise ExportError(f"torch.onnx.export failed for {spec.graph.value}: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}") from e
    fixed = fixed_dynamic_axes(prog.model_proto, spec)
    if fixed:
        raise ExportError(f"{spec.graph.value}: {fixed_axes_message(prog.model_proto, fixed)}")
    prog.save(str(path), external_data=external_data)
    return path


def fixed_dynamic_axes(model, spec) -> list:
    """(input name, axis name, size) of every io-spec dynamic axis an exported graph made static."""
    have = {i.name: list(i.type.tensor_type.shape.dim) for i in model.graph.input}
    out = []
    for t in spec.inputs:
        dims = have.get(t.name, [])
        for i, a in t.dynamic_axes().items():
            if i < len(dims) and dims[i].HasField("dim_value"):
                out.append((t.name, a, int(dims[i].dim_value)))
    return out


def fixed_axes_message(model, fixed: list) -> str:
    """What fixed the axes, naming the torch.chunk pitfall when the graph splits its axis 0."""
    axes = ", ".join(f"{n} axis {a!r} = {v}" for n, a, v in fixed)
    splits = [n.name or n.op_type for n in model.graph.node if n.op_type == "Split"
              and next((a.i for a in n.attribute if a.name == "axis"), 0) == 0]
    msg = f"the exporter fixed dynamic axes to their trace sizes ({axes}); profiles and batches cannot vary them"
    if splits and any(a == "batch" for _, a, _ in fixed):
        msg += (f". The graph splits axis 0 ({', '.join(splits[:3])}): the torch.chunk / torch.split-over-the-batch "
                "pitfall (chunking a [x; y] batch concatenation makes the exporter fix the batch); run the parts "
                "separately instead of concatenating and chunking them")
    return msg


@contextlib.contextmanager
def _quiet_exporter():
    """The dynamo exporter prints progress and warnings per graph; keep the CLI output readable."""
    import io
    import warnings
    from contextlib import redirect_stdout

    noisy = logging.getLogger("torch.onnx._internal.exporter._registration")  # "torchvision is not installed"
    level = noisy.level
    noisy.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        noisy.setLevel(level)


def set_softmax_fp32(path: Path) -> int:
    """fp16 graphs: ask every ONNX Attention node for an fp32 softmax (softmax_precision = FLOAT).

    Only the graph proto is rewritten; external weight files are left as they are.
    Returns the number of Attention nodes changed.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    n = 0
    for node in model.graph.node:
        if node.op_type == "Attention" and node.domain in ("", "ai.onnx"):
            kept = [a for a in node.attribute if a.name != "softmax_precision"]
            del node.attribute[:]
            node.attribute.extend(kept + [onnx.helper.make_attribute("softmax_precision", onnx.TensorProto.FLOAT)])
            n += 1
    if n:
        onnx.save(model, str(path))
    return n


# ----------------------------------------------------------------------------- bundle

# RoPE tables of the models (LlamaGen / drafters: freqs_cis, Chameleon: inv_freq): kept fp32 in fp16
# exports (an fp16 frequency is off by ~1e-3 relative: a radian at position 1000)
_FP32_BUFFERS = ("freqs_cis", "inv_freq")


def _half_copy(module: nn.Module) -> nn.Module:
    """fp16 copy for `--fp16`; the RoPE tables stay fp32 (norm statistics and logits already are).
    Made tensor by tensor (export/memory.py): no intermediate fp32 copy."""
    from .memory import half_copy

    return half_copy(module)


def staging_dir(out_dir: Path, echo=None):
    """io.atomic_dir for an engine directory (an existing one must carry manifest.json).

    Leftovers of killed exports next to `out_dir` are removed first; an existing `out_dir` holding
    files lisa-trt did not write is refused before any work (export/staging.py).
    """
    from ..io import atomic_dir
    from .manifest import MANIFEST_NAME
    from .staging import check_replaceable, clean_stale_staging, staging_dir_name

    clean_stale_staging(Path(out_dir), echo=echo)
    return atomic_dir(out_dir, marker=MANIFEST_NAME, what="engine directory", check=check_replaceable,
                      stage_name=staging_dir_name)


def check_inputs(target, drafter, tables, code_ids: Optional[torch.Tensor] = None) -> None:
    """ArtifactMismatchError when the drafter or the tables were made for another target: the one
    check of an export's inputs, every family's (prompt_graphs.check_bundle_artifacts binds after it).

    code_ids: the head ids the tables' vocabulary covers (a sub-vocabulary's codes); None: the
    whole head (its `output.out_features`, the target's vocabulary).
    Raises:
        ArtifactMismatchError: a drafter trained for another target (a drafter without a recorded
            target hash passes), tables calibrated for another target or vocabulary (naming both).
        InputError: tables without theta_geo (calibration.tables.check_tables).
    """
    from ..calibration.tables import check_tables
    from ..models.checkpoints import target_hash

    th = target_hash(target)
    if drafter is not None:
        dh = drafter.config.target_hash
        if dh and dh != th:
            raise ArtifactMismatchError(
                f"the drafter was trained for target {dh}, but the target being exported is {th}. "
                "Export the drafter together with the target it was distilled from.")
    if tables is not None:
        check_tables(tables, th, target.output.out_features if code_ids is None else int(code_ids.numel()))


def half_drafter(drafter, fp16: bool):
    """The drafter module the drafter graphs are traced from (a PrecisionCopy: the fp16 copy for
    --fp16 is made per graph; None for none or for Medusa heads, whose one graph is traced from
    the fp32 heads)."""
    if drafter is None or is_medusa(drafter):
        return None
    return PrecisionCopy(drafter, fp16)


def drafter_builders(drafter, d_exp, precision: str, *, commit: bool = True) -> list:
    """[(graph, build, precision)] of the drafter graphs: Medusa's fp32 heads graph, or the EAGLE-3
    drafter's project / step (+ fused, `commit`) graphs traced from `d_exp` (half_drafter). Family-independent."""
    if drafter is None:
        return []
    if is_medusa(drafter):  # fp32 like GASV / VQ: the decode loop hands the heads an fp32 hidden state
        return [(Graph.MEDUSA_HEADS, lambda: MedusaHeadsGraph(drafter.eval()), "fp32")]
    out = [(Graph.DRAFTER_PROJECT, lambda: DrafterProjectGraph(resolve(d_exp)), precision),
           (Graph.DRAFTER_STEP, lambda: DrafterStepGraph(resolve(d_exp)), precision)]
    if commit:  # drafter_fused (not the older drafter_commit): the loop's every drafter call in one graph
        out.append((Graph.DRAFTER_FUSED, lambda: DrafterFusedGraph(resolve(d_exp)), precision))
    return out


def export_graphs(builders, dest: Path, dims: dict, refs: dict, models: tuple, *, opset: int,
                  external_data: Optional[bool] = None, validate: bool = True, lint: bool = True,
                  progress: bool = True) -> dict:
    """Export, validate and lint every graph of `builders` into `dest` (the loop of every family's export).

    Args:
        builders: [(Graph, build() -> graph wrapper module, precision)].
        dims: static axis sizes (the family's export_dims).
        refs: the fp32 models {"target", "drafter", "tables", "vq"}: the validation reference.
        models: the (possibly fp16) modules the wrappers trace, for _export_mode; a large
            PrecisionCopy among them keeps its fp16 copy in files in `dest` (the staging directory),
            as does a large fp32 reference built on the heap (export.memory.spill_reference).
    Returns:
        {graph name: GraphEntry}.
    """
    from ..progress import WorkEta, fmt_seconds
    from .memory import peak_rss_bytes, spill_reference

    for m in models:  # a large target's fp16 copy lives in files in `dest` (export.memory.Spill) ...
        if isinstance(m, PrecisionCopy):
            m.spill_dir = dest
    spill_reference(refs.get("target"), dest)  # ... and a heap-built fp32 reference, so its pages can be dropped
    graphs = {}
    bar = _progress(len(builders), progress)
    eta = WorkEta([_graph_work(g, refs) for g, _, _ in builders], floor=1 << 20)  # ETA by weight bytes
    for i, (graph, build, prec) in enumerate(builders):
        bar.set_description(f"export {graph.value}")
        bar.set_postfix_str(f"graph ~{fmt_seconds(eta.step_eta(i))}, all ~{fmt_seconds(eta.eta())} left")
        t0 = time.perf_counter()
        graphs[graph.value] = _export_graph(graph, build, prec, dest, dims, refs, models, opset=opset,
                                            external_data=external_data, validate=validate, lint=lint)
        eta.finish(i, time.perf_counter() - t0)
        bar.write(f"{graph.value}: {fmt_seconds(time.perf_counter() - t0)}, peak RSS "
                  f"{peak_rss_bytes() / 2**30:.2f} GiB; ~{fmt_seconds(eta.eta())} left")
        bar.update(1)
    bar.close()
    return graphs


def _graph_work(graph, refs: dict) -> int:
    """The weight bytes a graph's export handles (its ETA weight): its model's parameters + buffers."""
    from ..models.io_spec import GraphKind
    from .memory import module_bytes

    what = {GraphKind.PREFILL: "target", GraphKind.VERIFY_TREE: "target", GraphKind.DRAFT_STEP: "drafter",
            GraphKind.VQ_DECODE: "vq"}.get(graph.kind)
    m = refs.get(what) if what else None
    return module_bytes(m) if hasattr(m, "parameters") else 0


def _export_graph(graph, build, prec: str, dest: Path, dims: dict, refs: dict, models: tuple, *, opset: int,
                  external_data, validate: bool, lint: bool):
    """Export, validate and lint one graph into `dest`; its manifest GraphEntry."""
    from . import manifest as M
    from .validate import lint_graph, sample_inputs, validate_graph

    from .memory import free_all, peak_rss_bytes, release_file_pages

    t0 = time.perf_counter()
    module = build()
    spec = module.spec
    example = sample_inputs(graph, spec, dims, refs, precision=prec, seed=0, **_EXAMPLE)
    live = [m.peek() if isinstance(m, PrecisionCopy) else m for m in models]  # never builds a copy
    with _export_mode(*module.children(), *live):
        path = onnx_from_torch(module, example, dest / graph.filename, opset=opset, external_data=external_data)
    del module, example, live
    free_all(models)  # the graph is written: its precision copy goes before the validation session opens
    if not validate:  # the traced fp32 reference's pages too (validate_graph drops them before ORT runs)
        release_file_pages(*refs.values())
    if prec == "fp16":
        set_softmax_fp32(path)
    entry = M.GraphEntry(name=graph.value, kind=graph.kind.value, file=graph.filename, precision=prec,
                         sha256=M.file_sha256(path), external_data=_external_file(path),
                         export_seconds=round(time.perf_counter() - t0, 2))
    if validate:
        report = validate_graph(graph, path, spec, dims, refs, precision=prec)
        entry = entry.with_validation(report.to_dict())
        if not report.ok:
            raise ExportError(f"{graph.value} does not match PyTorch: {report.summary()}")
    if lint:
        lres = lint_graph(path, sample_inputs(graph, spec, dims, refs, precision=prec, seed=1, **_EXAMPLE))
        entry = entry.with_lint(lres)
        if lres["status"] == "failed":
            raise ExportError(f"polygraphy lint found errors in {graph.value}: {lres.get('errors')}")
    free_all(models)  # what validation and lint opened (returned to the system for large models)
    return dataclasses.replace(entry, peak_rss_bytes=peak_rss_bytes())


def _external_file(path: Path) -> Optional[str]:
    data = path.with_name(path.name + ".data")
    return data.name if data.is_file() else None


def _progress(total: int, enabled: bool):
    from ..progress import progress_bar

    return progress_bar(total, enabled, unit="graph", own_eta=True)
