"""Built TensorRT plans: the manifest's `engines` record and loading a plan only after its checks.

Plans are only ever deserialized after their sha256 matches the manifest record and the
record's TensorRT version and GPU match the running ones (`load_plan`): a plan is code for the
GPU, never load an untrusted one. `lisa-trt build` (deploy/build.py) writes the record.

Without TensorRT or without a CUDA device `require_tensorrt_gpu` raises a LisaError that says which
is missing and how to run on ONNX Runtime instead (`lisa-trt run ... --backend ort`).
Nothing in this module has been run against a real TensorRT (not installable here).
"""

from __future__ import annotations

import hashlib
import mmap
import json
from pathlib import Path
from typing import Optional

from ..errors import ArtifactMismatchError, CheckpointError, LisaError
from ..models.io_spec import Graph
from .plugins.trt_plugin import TensorRTUnavailableError

ENGINES_KEY = "engines"
ENGINES_FORMAT = "lisa-trt/trt-engines"
ENGINES_SCHEMA = 1
PLAN_SUFFIX = ".plan"
ORT_HINT = ("run on ONNX Runtime instead: `lisa-trt run ... --backend ort` (CPU, or CUDA with "
            "onnxruntime-gpu), or on PyTorch with `--backend torch`")


class NoCudaDeviceError(LisaError):
    """TensorRT engines need a CUDA device, and none is visible."""


class EngineBuildError(LisaError):
    """TensorRT failed to parse or build a graph."""


# ----------------------------------------------------------------------------- environment

def require_tensorrt_gpu():
    """Import tensorrt and check for a CUDA device; returns the tensorrt module.

    Raises:
        TensorRTUnavailableError: `import tensorrt` fails (names the import error).
        NoCudaDeviceError: torch sees no CUDA device.
    """
    try:
        import tensorrt as trt
    except Exception as e:  # ImportError, or a stub wheel raising something else
        raise TensorRTUnavailableError(
            f"TensorRT is not available: `import tensorrt` failed ({type(e).__name__}: {e}). Building and running "
            "engines needs the TensorRT >= 10.14 Python bindings (pip install tensorrt from NVIDIA's index) and a "
            f"CUDA GPU. Or {ORT_HINT}.") from e
    import torch

    if not torch.cuda.is_available():
        raise NoCudaDeviceError(f"TensorRT {getattr(trt, '__version__', '?')} is installed but no CUDA device is "
                                f"visible (torch.cuda.is_available() is False; check CUDA_VISIBLE_DEVICES and the "
                                f"driver). Or {ORT_HINT}.")
    return trt


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(torch.cuda.current_device())


def device_info() -> dict:
    """GPU name, compute capability and CUDA version recorded with the engines."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    return {"gpu": gpu_name(), "compute_capability": f"{major}.{minor}", "cuda": torch.version.cuda}


def _sha256(path: Path) -> str:
    from ..export.manifest import file_sha256

    return file_sha256(path)


# ----------------------------------------------------------------------------- manifest record

def _raw_manifest(engine_dir) -> dict:
    from ..export.manifest import MANIFEST_NAME

    path = Path(engine_dir) / MANIFEST_NAME
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as e:
        raise CheckpointError(f"{engine_dir} has no {MANIFEST_NAME}; export it with `lisa-trt export`") from e


def engines_record(engine_dir) -> Optional[dict]:
    """The `engines` record of an engine directory's manifest, or None before `lisa-trt build`."""
    return _raw_manifest(engine_dir).get(ENGINES_KEY)


def built_graphs(manifest) -> dict:
    """{graph name: its build record} of the engines `lisa-trt build` recorded; {} before a build.

    The one answer to "are engines built?" (engines_built, the memory plan's runtime record).
    manifest: a Manifest (export/manifest.py) or a manifest's raw dict."""
    rec = manifest.engines if hasattr(manifest, "engines") else (manifest or {}).get(ENGINES_KEY)
    return dict((rec or {}).get("graphs") or {})


def engines_built(engine_dir, manifest=None) -> bool:
    """True when `lisa-trt build` recorded engines for this directory (for `--backend auto`); from its
    Manifest when the caller has read it."""
    if manifest is None:
        try:
            manifest = _raw_manifest(engine_dir)
        except LisaError:
            return False
    return bool(built_graphs(manifest))


def write_engines_record(engine_dir, record: dict) -> None:
    """Store `record` as manifest.json["engines"], keeping every other key (atomic rewrite)."""
    from ..export.manifest import MANIFEST_NAME
    from ..io import write_json

    d = _raw_manifest(engine_dir)
    d[ENGINES_KEY] = record
    write_json(Path(engine_dir) / MANIFEST_NAME, d)


HASH_CHUNK = 16 << 20


class _MappedPlan(mmap.mmap):
    """A read-only mapped plan that compares and concatenates like the bytes it holds."""

    __hash__ = None

    def __eq__(self, other):
        return bytes(self) == other if isinstance(other, (bytes, bytearray)) else NotImplemented

    def __add__(self, other):
        return bytes(self) + other


def map_plan(path: Path):
    """The plan file mapped read-only (mmap): hashed and deserialized from the file's pages, so
    loading holds no second whole copy of a plan in process memory (a 7B target's plan is ~13 GB;
    on a Jetson host memory is the GPU's). An empty file maps to b"". The mapping follows the file:
    `lisa-trt build` replaces plans atomically (a new file renamed over the old), which leaves a
    mapped plan intact; rewriting a plan file in place while it is mapped would fault the reader."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            return b""
        return _MappedPlan(f.fileno(), 0, access=mmap.ACCESS_READ)


def _sha256_of(buf) -> str:
    """sha256 of a buffer in HASH_CHUNK slices (no copy of the whole buffer)."""
    h, view = hashlib.sha256(), memoryview(buf)
    for i in range(0, len(view), HASH_CHUNK):
        h.update(view[i: i + HASH_CHUNK])
    view.release()
    return h.hexdigest()


def load_plan(engine_dir, graph: Graph, *, check_env: bool = True, record: Optional[dict] = None) -> tuple:
    """Read a plan file after checking it against the manifest (never deserialize unchecked plans).

    Checks: an engines record exists; the plan's sha256 is the recorded one; the ONNX file it
    was built from is unchanged; and (check_env) the running TensorRT version and GPU are the
    recorded ones (a plan is tied to both).
    Returns:
        (the plan as a read-only buffer (the file mapped, `map_plan`), the graph's record dict).
    record: the manifest's engines record when the caller has read it (else read here).
    Raises:
        CheckpointError: no engines / no plan for the graph.
        ArtifactMismatchError: hash, TensorRT version or GPU mismatch.
    """
    engine_dir = Path(engine_dir)
    rec = record if record is not None else engines_record(engine_dir)
    if not rec or graph.value not in rec.get("graphs", {}):
        raise CheckpointError(f"{engine_dir} has no TensorRT engine for {graph.value}; build them with "
                              f"`lisa-trt build {engine_dir}` (needs TensorRT and a GPU), or {ORT_HINT}")
    g = rec["graphs"][graph.value]
    plan_path = engine_dir / g["plan"]
    if not plan_path.is_file():
        raise CheckpointError(f"{plan_path} is listed in the manifest but missing; rebuild with `lisa-trt build`")
    data = map_plan(plan_path)
    have = _sha256_of(data)
    if have != g["plan_sha256"]:
        raise ArtifactMismatchError(f"{plan_path} has sha256 {have[:16]}, the manifest records "
                                    f"{g['plan_sha256'][:16]}: the plan was changed after the build. Refusing to "
                                    "deserialize it; rebuild with `lisa-trt build`.")
    onnx_path = engine_dir / g["onnx"]
    if not onnx_path.is_file() or _sha256(onnx_path) != g["onnx_sha256"]:
        raise ArtifactMismatchError(f"{g['onnx']} changed since {g['plan']} was built from it (re-export?); "
                                    f"rebuild with `lisa-trt build {engine_dir}`")
    if check_env:
        import tensorrt as trt

        if rec.get("tensorrt_version") != trt.__version__:
            raise ArtifactMismatchError(f"the engines in {engine_dir} were built with TensorRT "
                                        f"{rec.get('tensorrt_version')}, this is TensorRT {trt.__version__}; "
                                        f"rebuild them with `lisa-trt build {engine_dir}`")
        if rec.get("gpu") != gpu_name():
            raise ArtifactMismatchError(f"the engines in {engine_dir} were built for {rec.get('gpu')}, this GPU is "
                                        f"{gpu_name()}; rebuild them with `lisa-trt build {engine_dir}`")
    return data, g


# ----------------------------------------------------------------------------- build
