"""TensorRT Q/DQ graphs through NVIDIA ModelOpt, run in an isolated virtual environment.

`lisa-trt quantize-trt ENGINE_DIR --mode int8|fp8|int4 --out DIR` turns the fp32 target and
drafter graphs of an engine directory into explicitly quantized ONNX for TensorRT:

    int8 / fp8  QuantizeLinear/DequantizeLinear pairs on the weights and activations of the
                GEMMs (ModelOpt calibration: entropy for int8, max for fp8);
    int4        4-bit weight-only (blockwise DequantizeLinear on int4 weights, RTN).

ModelOpt (`nvidia-modelopt[onnx]`) pins its own onnx / onnxruntime-gpu (1.21 / 1.24 for 0.47),
which must not replace the versions lisa-trt runs with. So this module creates and drives a
separate venv (default ~/.cache/lisa-trt/modelopt-venv, or $LISA_TRT_MODELOPT_VENV):
`python -m venv --system-site-packages` (torch, numpy are reused from the main environment)
plus `pip install nvidia-modelopt[onnx]==MODELOPT_VERSION`, whose packages shadow the shared
onnx / onnxruntime inside that venv only. ModelOpt runs as a subprocess
(`python -m modelopt.onnx.quantization`), one graph at a time, calibrating on the CPU
execution provider with valid random inputs of each graph (export/validate.sample_inputs: ids
in range, distinct cache slots, non-empty masks; ModelOpt's own random data would index the
embedding out of range).

The result is a new engine directory: the fp32 bundle with the quantized graphs swapped in,
each recorded in the manifest (mode, ModelOpt version, Q/DQ op counts, sha256) and checked with
the CPU TensorRT-compatibility check (deploy/trt_lint.py). `lisa-trt build` then builds
strongly typed engines from it on a machine with TensorRT.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Callable, Optional

from ..errors import LisaError
from ..models.io_spec import Graph

MODELOPT_VERSION = "0.47.0"
MODELOPT_REQUIREMENT = f"nvidia-modelopt[onnx]=={MODELOPT_VERSION}"
TRT_MODES = ("int8", "fp8", "int4")
QDQ_GRAPHS = (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY, Graph.DRAFTER_PROJECT, Graph.DRAFTER_STEP,
              Graph.DRAFTER_COMMIT, Graph.DRAFTER_FUSED)
_MARKER = "lisa-trt-modelopt.json"
_CALIB_METHOD = {"int8": "entropy", "fp8": "max", "int4": "rtn_dq"}
_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


class ModelOptError(LisaError):
    """ModelOpt is not installable / not usable here, or it failed on a graph."""


def default_venv() -> Path:
    """$LISA_TRT_MODELOPT_VENV, else ~/.cache/lisa-trt/modelopt-venv."""
    env = os.environ.get("LISA_TRT_MODELOPT_VENV")
    return Path(env) if env else Path.home() / ".cache" / "lisa-trt" / "modelopt-venv"


def venv_python(venv: Path) -> Path:
    return Path(venv) / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _probe(py: Path) -> Optional[dict]:
    """Versions of modelopt / onnx / onnxruntime inside the venv, or None when it is not usable."""
    code = ("import json, modelopt, onnx, onnxruntime; print(json.dumps({'modelopt': modelopt.__version__, "
            "'onnx': onnx.__version__, 'onnxruntime': onnxruntime.__version__}))")
    try:
        out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def ensure_venv(venv: Optional[Path] = None, *, install: bool = True, echo: Callable = print,
                requirement: str = MODELOPT_REQUIREMENT, timeout: float = 3600.0) -> dict:
    """Create (once) the isolated ModelOpt venv and return its versions.

    Raises:
        ModelOptError: the venv does not exist and `install` is False, or pip could not install
            ModelOpt (no network / no wheel for this platform); the message says how to fix it.
    """
    venv = Path(venv or default_venv())
    py = venv_python(venv)
    if py.is_file():
        v = _probe(py)
        if v is not None:
            return v
    if not install:
        raise ModelOptError(f"no usable ModelOpt venv at {venv}; run `lisa-trt quantize-trt ... --install` once "
                            f"(it runs pip install '{requirement}' into that venv)")
    echo(f"creating the ModelOpt venv {venv} (pip install '{requirement}'; once, several minutes) ...")
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [[sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
             [str(py), "-m", "pip", "install", "--no-input", requirement]]
    for cmd in steps:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ModelOptError(f"`{' '.join(cmd[:4])} ...` failed ({e}); {_HOWTO}") from e
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise ModelOptError(f"`{' '.join(cmd[:4])} ...` failed (exit {proc.returncode}):\n{tail}\n{_HOWTO}")
    v = _probe(py)
    if v is None:
        raise ModelOptError(f"ModelOpt was installed into {venv} but does not import; {_HOWTO}")
    (venv / _MARKER).write_text(json.dumps({**v, "requirement": requirement}, indent=2) + "\n")
    return v


_HOWTO = ("ModelOpt needs network access to PyPI (or a local wheel mirror) and Python >= 3.10. Prepare a venv "
          "by hand (python -m venv --system-site-packages DIR && DIR/bin/pip install "
          f"'{MODELOPT_REQUIREMENT}') and point LISA_TRT_MODELOPT_VENV at it, or use the ONNX Runtime path "
          "(`lisa-trt export --quantize int8|int4`).")


# ----------------------------------------------------------------------------- calibration

def calibration_inputs(graph: Graph, man, samples: int = 4, seed: int = 0, seq: int = 4) -> tuple[dict, str]:
    """Valid random inputs for ModelOpt: ({name: array (samples * 2, ...)}, per-step shapes spec).

    Each step is a batch of 2 (CFG) with `seq` new tokens / tree nodes; steps are concatenated
    on the batch axis, which every graph input has first.
    """
    import numpy as np

    from ..export.validate import sample_inputs, to_numpy

    spec, dims = man.spec(graph), man.dims  # the family's (export/families.py)
    refs = {"target": types.SimpleNamespace(config=man.target_config)}
    steps = [sample_inputs(graph, spec, dims, refs, seed=seed + i, batch=2, seq=seq, nodes=seq,
                           family=man.export_family) for i in range(samples)]
    data = {n: np.concatenate([to_numpy(s[n]) for s in steps], axis=0) for n in spec.input_names}
    shapes = ",".join(f"{n}:{'x'.join(str(d) for d in steps[0][n].shape)}" for n in spec.input_names)
    return data, shapes


def qdq_counts(path) -> dict:
    """{op: count} of the Q/DQ (and remaining MatMul / Gemm) nodes of a graph."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    c = collections.Counter(n.op_type for n in m.graph.node)
    return {k: c[k] for k in _QDQ_OPS + ("MatMul", "Gemm") if c.get(k)}


# ----------------------------------------------------------------------------- one graph

def modelopt_command(py: Path, src: Path, dst: Path, mode: str, calib: Path, shapes: str) -> list:
    """The `python -m modelopt.onnx.quantization` command line for one graph."""
    cmd = [str(py), "-m", "modelopt.onnx.quantization", "--onnx_path", str(src), "--quantize_mode", mode,
           "--calibration_method", _CALIB_METHOD[mode], "--calibration_data_path", str(calib),
           "--calibration_shapes", shapes, "--calibration_eps", "cpu", "--output_path", str(dst),
           "--high_precision_dtype", "fp32",  # keep the io-spec dtypes of an fp32 bundle
           "--use_external_data_format"]
    return cmd


def quantize_graph_modelopt(src: Path, dst: Path, mode: str, graph: Graph, man, *, venv: Path,
                            samples: int = 4, timeout: float = 1800.0) -> dict:
    """Run ModelOpt on one graph in the venv; -> {"mode", "method", "qdq", "seconds", ...}."""
    import numpy as np

    py = venv_python(venv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lisa-modelopt-") as tmp:
        data, shapes = calibration_inputs(graph, man, samples=samples)
        calib = Path(tmp) / "calib.npz"
        np.savez(calib, **data)
        out = Path(tmp) / dst.name
        cmd = modelopt_command(py, src, out, mode, calib, shapes)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp)
        except subprocess.TimeoutExpired as e:
            raise ModelOptError(f"ModelOpt {mode} on {src.name} took more than {timeout:.0f} s") from e
        if proc.returncode != 0 or not out.is_file():
            lines = [ln for ln in (proc.stderr + proc.stdout).strip().splitlines() if ln.strip()]
            raise ModelOptError(f"ModelOpt {mode} failed on {src.name} (exit {proc.returncode}): "
                                f"{lines[-1] if lines else 'no output'}")
        _move_graph(out, dst)
    counts = qdq_counts(dst)
    if not counts.get("DequantizeLinear"):
        raise ModelOptError(f"ModelOpt {mode} produced no DequantizeLinear node in {src.name}")
    return {"mode": f"trt-{mode}", "method": f"nvidia-modelopt {_CALIB_METHOD[mode]}", "qdq": counts,
            "calibration": f"{samples} steps of valid random inputs (batch 2)",
            "seconds": round(time.perf_counter() - t0, 2)}


def _move_graph(src: Path, dst: Path) -> None:
    """Re-save `src` (and its external data) as `dst` with data in `<dst>.data` when large."""
    from ..export.quantize import _save_like_export

    _save_like_export(src, dst, None)


# ----------------------------------------------------------------------------- bundle

def quantize_trt(engine_dir, out_dir, mode: str, *, venv: Optional[Path] = None, install: bool = True,
                 samples: int = 4, check: bool = True, echo: Callable = print):
    """Write a copy of `engine_dir` whose target and drafter graphs are ModelOpt Q/DQ graphs.

    Args:
        engine_dir: fp32 engine directory (`lisa-trt export`).
        out_dir: new engine directory (written atomically).
        mode: int8 | fp8 | int4.
        venv: the ModelOpt venv (default `default_venv()`); created when missing and `install`.
        samples: calibration steps per graph.
        check: run the CPU TensorRT-compatibility check on the quantized graphs.
    Returns:
        The new Manifest.
    Raises:
        ModelOptError: ModelOpt unavailable or failing; TrtCompatError: a graph TensorRT cannot parse.
    """
    from ..export import manifest as M
    from ..export.onnx import staging_dir

    if mode not in TRT_MODES:
        raise ModelOptError(f"unknown TensorRT quantization {mode!r}; valid: {', '.join(TRT_MODES)}")
    man = M.read_manifest(engine_dir)
    if man.precision != "fp32" or man.quantization != "none":
        raise ModelOptError(f"{engine_dir} is {man.precision}/{man.quantization}; quantize-trt needs an fp32, "
                            "unquantized export (`lisa-trt export` without --fp16 / --quantize)")
    venv = Path(venv or default_venv())
    versions = ensure_venv(venv, install=install, echo=echo)
    with staging_dir(Path(out_dir)) as tmp:
        for p in Path(engine_dir).iterdir():
            (shutil.copytree if p.is_dir() else shutil.copy2)(p, tmp / p.name)
        graphs = dict(man.graphs)
        for graph in QDQ_GRAPHS:
            if graph.value not in graphs:
                continue
            entry = graphs[graph.value]
            echo(f"ModelOpt {mode}: {graph.value} ...")
            # ModelOpt reads the staging copy, never the user's bundle (with the bundle's own file as its
            # input, drafter_fused's hash changed under the source manifest)
            src = tmp / entry.file
            info = quantize_graph_modelopt(src, tmp / entry.file, mode, graph, man, venv=venv, samples=samples)
            info.update(modelopt=versions, source_sha256=entry.sha256)
            data = _data_name(tmp / entry.file)
            shared = any(g.external_data == entry.external_data for n, g in graphs.items() if n != graph.value)
            if entry.external_data and entry.external_data != data and not shared:  # keep a shared weights file
                (tmp / entry.external_data).unlink(missing_ok=True)
            if data:
                info["data_sha256"] = M.file_sha256(tmp / data)
            graphs[graph.value] = dataclasses.replace(entry, sha256=M.file_sha256(tmp / entry.file),
                                                      external_data=data, quantization=info, validation=None)
        new = dataclasses.replace(man, graphs=graphs, quantization=f"trt-{mode}")
        M.write_manifest(new, tmp)
        if check:
            from .trt_lint import check_trt_compat

            check_trt_compat(tmp, graphs=[g.value for g in QDQ_GRAPHS if g.value in graphs])
    return M.read_manifest(out_dir)


def _data_name(path: Path) -> Optional[str]:
    d = path.with_name(path.name + ".data")
    return d.name if d.is_file() else None


__all__ = ["MODELOPT_REQUIREMENT", "ModelOptError", "TRT_MODES", "calibration_inputs", "default_venv", "ensure_venv",
           "modelopt_command", "qdq_counts", "quantize_trt"]
