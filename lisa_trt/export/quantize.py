"""Quantized ONNX Runtime graphs: `lisa-trt export --quantize none|int8|int4`.

Applied after `export_bundle` to the target and drafter graphs of an engine directory (prefill,
verify, drafter project, drafter step); the GASV and VQ graphs stay fp32.

    int8  dynamic quantization (onnxruntime.quantization.quantize_dynamic): the weights of every
          MatMul with a constant B become per-channel symmetric int8 with 7-bit range [-64, 63]
          (`reduce_range`); activations are quantized per call to uint8 (DynamicQuantizeLinear ->
          MatMulInteger, which ORT fuses into DynamicQuantizeMatMul). The 7-bit range is what makes
          the graph compute the same integers on every x86 CPU: without VNNI, ORT adds pairs of
          u8 x s8 products in saturating int16, and full-range weights overflow it
          (export/int8_isa.py, docs/quantization.md).
    int4  4-bit weight-only MatMulNBits (onnxruntime's MatMulNBitsQuantizer, RTN, blocks of
          `block_size` along K, symmetric). `accuracy_level` is the ORT compute type of the op
          (0 = fp32 dequantized compute, 4 = int8 activations; 4 is the fast CPU path).

Graph inputs/outputs (the read-only KV caches in, their new rows out) and the external-data
layout are unchanged, so the ORT runners load a
quantized directory as they load an fp32 one. Graphs whose quantized weights exceed
EXTERNAL_DATA_BYTES keep their weights in `<file>.data`.

Each quantized graph is validated against the fp32 PyTorch model on random valid inputs
(export/validate.py) with precision-appropriate thresholds (QUANT_THRESHOLDS; the error is
max |onnx - torch| / max(1, max |torch|) per output) and the raw max |logit diff| is reported.
int8 graphs are validated for every kind of x86 CPU, not only the one exporting: the static
bound of export/int8_isa.py proves that no pair sum can saturate (then every kind computes the
same integers); where it does not hold, the graph is also run as the other kind computes it
(int8_isa.emulate) and the worst kind counts. The manifest records which kinds were covered, and
the runtime warns when an int8 graph runs on a kind it was not validated for.
The manifest records the bundle's quantization, and per graph the mode, the op counts, the
sha256 of the quantized .onnx (and of its external data, checked on load) and the validation.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import tempfile
import time
from pathlib import Path
from typing import Optional

from ..errors import InputError
from .families import export_family
from ..models.io_spec import Graph

QUANT_MODES = ("none", "int8", "int4")
QUANTIZED_GRAPHS = (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY, Graph.DRAFTER_PROJECT, Graph.DRAFTER_STEP,
                    Graph.DRAFTER_COMMIT, Graph.DRAFTER_FUSED)
# Scaled error thresholds vs the fp32 torch model (random inputs, random caches). The logits of a
# trained model move by ~0.1 (int8) / ~0.3 (int4) at most; the KV-cache outputs by less.
QUANT_THRESHOLDS = {"int8": 0.1, "int4": 0.3}
QUANT_OPS = {"int8": ("MatMulInteger", "DynamicQuantizeLinear"), "int4": ("MatMulNBits",)}
DEFAULT_BLOCK_SIZE = 32
DEFAULT_ACCURACY_LEVEL = 4


class QuantizationError(InputError):
    """A graph could not be quantized or its quantized version is too far from PyTorch."""


def check_mode(mode: str) -> str:
    """Return `mode` if it is a known quantization mode, else raise a clear InputError."""
    if mode not in QUANT_MODES:
        raise InputError(f"unknown quantization {mode!r}; valid: {', '.join(QUANT_MODES)}")
    return mode


def op_counts(path) -> dict:
    """{op_type: count} of an ONNX file's main graph (weights not loaded)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    return dict(collections.Counter(n.op_type for n in m.graph.node))


def float_matmuls(path) -> int:
    """MatMul nodes whose B input is a constant initializer (what quantization replaces)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    return sum(1 for n in m.graph.node if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in inits)


def head_matmuls(model) -> list[str]:
    """Names of the MatMul nodes that produce the `logits` output (the output head), walking back
    through elementwise / shape ops only."""
    producer = {o: n for n in model.graph.node for o in n.output}
    found, todo, seen = [], [o.name for o in model.graph.output if o.name == "logits"], set()
    while todo:
        t = todo.pop()
        n = producer.get(t)
        if n is None or n.name in seen:
            continue
        seen.add(n.name)
        if n.op_type == "MatMul":
            found.append(n.name)
        elif n.op_type in ("Reshape", "Transpose", "Cast", "Add", "Mul", "Slice", "Gather", "Squeeze", "Unsqueeze",
                           "Identity", "Div", "Where", "Concat"):
            todo.extend(n.input)
    return found


# ----------------------------------------------------------------------------- one graph

# int8 weights in [-64, 63]: 2 * 255 * 64 = 32,640 <= 32,767, so no u8 x s8 pair sum leaves int16 on
# any x86 CPU (bench/int8_isa.json compares the schemes on both kinds of CPU).
INT8_REDUCE_RANGE = True


def _quantize_int8(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                     reduce_range=INT8_REDUCE_RANGE, op_types_to_quantize=["MatMul"],
                     use_external_data_format=True, extra_options={"MatMulConstBOnly": True})


def _quantize_int4(src: Path, dst: Path, block_size: int, accuracy_level: int) -> None:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(src))  # with external data
    q = MatMulNBitsQuantizer(model, block_size=block_size, is_symmetric=True, accuracy_level=accuracy_level)
    q.process()
    q.model.save_model_to_file(str(dst), use_external_data_format=True)


def _save_like_export(tmp_model: Path, dst: Path, external_bytes: Optional[int]) -> Optional[str]:
    """Re-save a quantized model at `dst` with the exporter's external-data rule; -> data file name."""
    import onnx

    from .onnx import EXTERNAL_DATA_BYTES

    model = onnx.load(str(tmp_model))
    nbytes = sum(len(t.raw_data) for t in model.graph.initializer)
    external = nbytes > (EXTERNAL_DATA_BYTES if external_bytes is None else external_bytes)
    data = dst.with_name(dst.name + ".data")
    for p in (dst, data):
        if p.exists():
            p.unlink()
    if external:
        onnx.save(model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=data.name, size_threshold=1024)
        return data.name
    onnx.save(model, str(dst))
    return None


def quantize_graph(src, dst, mode: str, *, block_size: int = DEFAULT_BLOCK_SIZE,
                   accuracy_level: int = DEFAULT_ACCURACY_LEVEL, external_bytes: Optional[int] = None) -> dict:
    """Quantize one ONNX graph file (`src` -> `dst`; they may be the same path).

    Args:
        src: fp32 graph (external data next to it is followed).
        dst: where the quantized graph goes (its weights in `<dst>.data` when large).
        mode: "int8" or "int4".
        block_size / accuracy_level: MatMulNBits settings (int4).
        external_bytes: weight size above which external data is used (default: the exporter's).
    Returns:
        {"mode", "method", "ops", "quantized_matmuls", "float_matmuls_left", "external_data", "seconds", ...}
    Raises:
        QuantizationError: nothing to quantize, or the quantizer failed.
    """
    check_mode(mode)
    if mode == "none":
        raise InputError("quantize_graph needs mode int8 or int4 ('none' leaves the graph as exported)")
    src, dst = Path(src), Path(dst)
    n_float = float_matmuls(src)
    if n_float == 0:
        raise QuantizationError(f"{src.name} has no MatMul with constant weights: nothing to quantize")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lisa-quant-", dir=dst.parent) as tmp:
        out = Path(tmp) / "q.onnx"
        try:
            if mode == "int8":
                _quantize_int8(src, out)
            else:
                _quantize_int4(src, out, block_size, accuracy_level)
        except Exception as e:  # the quantizers raise assorted errors; say which graph failed
            raise QuantizationError(f"onnxruntime could not quantize {src.name} to {mode}: "
                                    f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
        old_data = src.with_name(src.name + ".data")
        if src == dst and old_data.exists():
            old_data.unlink()
        data = _save_like_export(out, dst, external_bytes)
    ops = op_counts(dst)
    wanted = QUANT_OPS[mode][0]
    info = {"mode": mode, "ops": {k: ops[k] for k in sorted(ops) if k in QUANT_OPS[mode] or k == "MatMul"},
            "quantized_matmuls": ops.get(wanted, 0), "float_matmuls_left": float_matmuls(dst),
            "external_data": data, "seconds": round(time.perf_counter() - t0, 2)}
    if mode == "int8":
        from .int8_isa import saturation_bound

        info.update(method="onnxruntime.quantize_dynamic", weight_type="QInt8", per_channel=True,
                    reduce_range=INT8_REDUCE_RANGE, bound=saturation_bound(dst))
    else:
        info.update(method="onnxruntime.MatMulNBitsQuantizer (RTN)", bits=4, block_size=block_size,
                    symmetric=True, accuracy_level=accuracy_level)
    if info["quantized_matmuls"] == 0:
        raise QuantizationError(f"quantizing {src.name} to {mode} produced no {wanted} node")
    return info


# ----------------------------------------------------------------------------- validation

def validate_quantized(graph: Graph, path, refs: dict, dims: dict, mode: str, *, seed: int = 123,
                       threshold: Optional[float] = None) -> dict:
    """Quantized graph vs the fp32 PyTorch model on random valid inputs.

    Returns the ValidationReport dict (scaled errors per output, `ok`) plus `max_abs_logit_diff`
    (raw max |logits_onnx - logits_torch|) and `top1_agreement` (argmax equality of the logits).
    int8 graphs also get `isa` (see `_isa_validation`): the errors hold for every x86 CPU kind
    listed in `isa["covered"]`, and `ok` requires all of them.
    """
    from .validate import reference_outputs, run_onnx, sample_inputs, validate_graph

    spec = export_family(refs["target"]).graph_spec(graph, refs["target"].config)
    thr = QUANT_THRESHOLDS[mode] if threshold is None else threshold
    rep = validate_graph(graph, path, spec, dims, refs, precision="fp32", seed=seed, threshold=thr).to_dict()
    rep["precision"] = mode
    if mode == "int8":
        rep["isa"] = _isa_validation(graph, path, spec, dims, refs, seed, rep)
        rep["max_error"] = max(rep["isa"]["max_error_by_kind"].values())
        rep["ok"] = rep["max_error"] <= thr
    if "logits" in spec.output_names:
        inputs = sample_inputs(graph, spec, dims, refs, precision="fp32", seed=seed + 1, batch=2, seq=6, nodes=6)
        have = run_onnx(path, inputs)["logits"].float()
        want = reference_outputs(graph, refs, inputs)["logits"].float()
        rep["max_abs_logit_diff"] = float((have - want).abs().max())
        rep["top1_agreement"] = float((have.argmax(-1) == want.argmax(-1)).float().mean())
    return rep


def _isa_validation(graph: Graph, path, spec, dims: dict, refs: dict, seed: int, rep: dict) -> dict:
    """What an int8 graph computes on each x86 CPU kind, checked on this CPU.

    If the static bound holds (no u8 x s8 pair sum can leave int16), every kind computes the same
    integers as this CPU and the measured error stands for all. Otherwise the graph is also run as
    each other x86 kind computes it (int8_isa.emulate, on the same validation inputs).
    """
    from .int8_isa import cpu_kind, run_emulated, saturation_bound
    from .validate import output_error, reference_outputs, sample_inputs

    here, bound = cpu_kind(), saturation_bound(path)
    out = {"validated_on": here, "bound": bound}
    if bound["exact_on_every_x86"]:
        out.update(how="bound: no pair sum can saturate, every x86 kind computes the same integers",
                   covered=["vnni", "avx2"], max_error_by_kind={"vnni": rep["max_error"], "avx2": rep["max_error"]})
        return out
    errs = {}
    if here in ("vnni", "avx2"):
        errs[here] = rep["max_error"]
    inputs = sample_inputs(graph, spec, dims, refs, precision="fp32", seed=seed, batch=3, seq=5, nodes=4)
    want = reference_outputs(graph, refs, inputs)
    for kind, emu in (("vnni", "exact"), ("avx2", "avx2")):
        if kind in errs:
            continue
        have = run_emulated(path, inputs, emu)
        errs[kind] = max(output_error(have[n], want[n]) for n in spec.output_names)
    out.update(how="emulated: the bound does not hold, so each other x86 kind's arithmetic was run here",
               covered=["vnni", "avx2"], max_error_by_kind=errs)
    return out


def passing_alternative(graph: Graph, fp32_path, refs: dict, dims: dict, mode: str, *,
                        block_size: int = DEFAULT_BLOCK_SIZE, accuracy_level: int = DEFAULT_ACCURACY_LEVEL) -> str:
    """Advice after `mode` failed on `graph`: a precision that was checked to pass on it."""
    for alt in ("int4",) if mode == "int8" else ("int8",):
        with tempfile.TemporaryDirectory(prefix="lisa-alt-", dir=Path(fp32_path).parent) as tmp:
            q = Path(tmp) / Path(fp32_path).name
            try:
                quantize_graph(fp32_path, q, alt, block_size=block_size, accuracy_level=accuracy_level,
                               external_bytes=0)
                rep = validate_quantized(graph, q, refs, dims, alt)
            except QuantizationError:
                continue
            if rep["ok"]:
                return (f"--quantize {alt} passes on {graph.value} (checked: max scaled error "
                        f"{rep['max_error']:.3g} <= {rep['threshold']:.3g}); or keep fp32 (drop --quantize: "
                        "the fp32 graphs passed validation)")
    return f"keep fp32 for this model (drop --quantize: the fp32 graphs passed validation; {graph.value} fails " \
           + ("int4 too)" if mode == "int8" else "int8 too)")


# ----------------------------------------------------------------------------- bundle

def quantize_bundle(engine_dir, mode: str, refs: dict, *, block_size: int = DEFAULT_BLOCK_SIZE,
                    accuracy_level: int = DEFAULT_ACCURACY_LEVEL, validate: bool = True,
                    external_bytes: Optional[int] = None, threshold: Optional[float] = None):
    """Quantize the target and drafter graphs of an exported engine directory in place.

    Meant for a staging directory (export/bundle.write_bundle calls it before the
    directory is published): a failure leaves a half-quantized directory behind.

    Args:
        engine_dir: directory written by export_bundle (fp32 graphs).
        mode: "none" (no-op), "int8" or "int4".
        refs: {"target", "drafter", "tables", "vq"}: the fp32 models the graphs were exported from.
        validate: compare each quantized graph with PyTorch (fail beyond QUANT_THRESHOLDS[mode]).
        external_bytes: weight size above which a graph keeps external data (default: exporter's).
        threshold: override QUANT_THRESHOLDS[mode] (scaled error on random inputs).
    Returns:
        The updated Manifest.
    Raises:
        InputError: fp16 export (quantize an fp32 export), unknown mode.
        QuantizationError: a graph failed to quantize or validate.
    """
    from . import manifest as M

    check_mode(mode)
    engine_dir = Path(engine_dir)
    man = M.read_manifest(engine_dir)
    if mode == "none":
        return man
    if man.precision != "fp32":
        raise InputError(f"--quantize {mode} quantizes fp32 graphs; this export is {man.precision}. "
                         "Export without --fp16.")
    from .memory import release_file_pages, release_if_large

    dims = man.dims  # the family's static axes (export/families.py)
    graphs = dict(man.graphs)
    for graph in QUANTIZED_GRAPHS:
        if graph.value not in graphs:
            continue
        # the quantizer holds the fp32 graph about twice (onnxruntime reloads it with inferred shapes):
        # the fp32 reference's file pages are not needed meanwhile (read again by the validation)
        release_file_pages(*refs.values())
        release_if_large(refs.values())
        entry = graphs[graph.value]
        path = engine_dir / entry.file
        src_sha = entry.sha256
        with tempfile.TemporaryDirectory(prefix="lisa-fp32-", dir=engine_dir) as keep:
            # the fp32 graph moves aside (no copy) and stays readable for the advice after a failure
            if entry.external_data and entry.external_data == (man.weights or {}).get("file"):
                src = _detach_graph(path, Path(keep))  # the shared weights file stays for the other graphs
            else:
                src = _move_graph(path, Path(keep), entry.external_data)
            info = quantize_graph(src, path, mode, block_size=block_size, accuracy_level=accuracy_level,
                                  external_bytes=external_bytes)
            info["source_sha256"] = src_sha
            if info["external_data"]:
                info["data_sha256"] = M.file_sha256(engine_dir / info["external_data"])
            new = dataclasses.replace(entry, sha256=M.file_sha256(path), external_data=info["external_data"],
                                      quantization=info)
            if validate:
                rep = validate_quantized(graph, path, refs, dims, mode, threshold=threshold)
                new = new.with_validation(rep)
                if not rep["ok"]:
                    kinds = (rep.get("isa") or {}).get("max_error_by_kind")
                    where = ("" if not kinds else " (per CPU kind: "
                             + ", ".join(f"{k} {v:.3g}" for k, v in sorted(kinds.items())) + ")")
                    advice = passing_alternative(graph, src, refs, dims, mode, block_size=block_size,
                                                 accuracy_level=accuracy_level)
                    raise QuantizationError(
                        f"{graph.value} [{mode}] is too far from PyTorch: max scaled error {rep['max_error']:.3g} > "
                        f"{rep['threshold']:.3g}{where}. Fix: {advice}.")
        graphs[graph.value] = new
    man = dataclasses.replace(man, graphs=graphs, quantization=mode)
    M.write_manifest(man, engine_dir)
    _drop_stale_data(engine_dir, man)
    if man.weights:  # it shared its weights: share them again, quantized (no torch index: not fp32 any more)
        from .weights import share_bundle

        return share_bundle(engine_dir)
    return M.read_manifest(engine_dir)


def _detach_graph(path: Path, folder: Path) -> Path:
    """A graph over the shared weights file, copied into `folder` with its own weights (the
    quantizers rewrite one graph's data file); -> the copy."""
    import onnx

    model = onnx.load(str(path))
    dst = folder / path.name
    onnx.save(model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
              location=dst.name + ".data", size_threshold=1024)
    os.unlink(path)
    return dst

def _move_graph(path: Path, folder: Path, external_data: Optional[str]) -> Path:
    """Move a graph file and its external data into `folder` (same file system: a rename, no copy;
    onnx refuses hard-linked external data); -> the moved graph. Its relative data location holds."""
    for p in [path] + ([path.with_name(external_data)] if external_data else []):
        os.replace(p, folder / p.name)
    return folder / path.name


def _drop_stale_data(engine_dir: Path, man) -> None:
    """Remove `*.onnx.data` files no graph references any more (fp32 weights replaced in place)."""
    used = {g.external_data for g in man.graphs.values() if g.external_data}
    for p in engine_dir.glob("*.onnx.data"):
        if p.name not in used:
            os.unlink(p)


def quantization_summary(man) -> list[str]:
    """One line per quantized graph: mode, quantized op count, max |logit diff| (for the CLI)."""
    lines = []
    for name, g in sorted(man.graphs.items()):
        q = getattr(g, "quantization", None)
        if not q:
            continue
        v = g.validation or {}
        diff = v.get("max_abs_logit_diff")
        lines.append(f"{name:16s} {q['mode']}  {q['quantized_matmuls']} quantized MatMuls"
                     + (f", max|logit diff| {diff:.3g}" if diff is not None else "")
                     + (f", max scaled error {v['max_error']:.3g}" if "max_error" in v else "")
                     + (f", valid on x86 {'+'.join(v['isa']['covered'])} ({v['isa']['how'].split(':')[0]})"
                        if v.get("isa") else ""))
    return lines


__all__ = ["QUANT_MODES", "QUANT_THRESHOLDS", "QuantizationError", "check_mode", "head_matmuls", "op_counts",
           "passing_alternative", "quantize_bundle", "quantize_graph", "quantization_summary", "validate_quantized"]
