"""`lisa-trt build`: TensorRT engines for every graph of an engine directory (Polygraphy loaders).

    man = read_manifest(dir) ──▶ profiles_from_io_spec(man)  (pure: prefill, tree verification
         │                        S = 1..max_tree in two buckets, batch 1..2*max_batch for CFG)
         ├─▶ check_trt_compat(dir)      (CPU: ops, dtypes, io spec, profiles)
         ├─▶ gasv.trt.onnx              (plugins/graph_rewrite: lisa::gasv2 plugin node)
         └─▶ per graph: network_from_onnx_path(strongly_typed=True) ─▶ CreateConfig(profiles,
             timing cache, refit, workspace) ─▶ engine_from_network ─▶ save_engine(<graph>.plan)
    manifest.json["engines"] = {TensorRT version, GPU, profiles, plan sha256 ...}  (atomic)

Engines are strongly typed: the ONNX already carries its precision (fp16 export = fp16 weights
and casts), TensorRT 10 builds it with NetworkDefinitionCreationFlag.STRONGLY_TYPED and 11 is
strongly typed natively (docs/spec/deploy.md); no FP16/BF16 builder flags are used.

Plans are only ever deserialized after their sha256 matches the manifest record and the
record's TensorRT version and GPU match the running ones (`load_plan`): a plan is code for the
GPU, never load an untrusted one.

Without TensorRT or without a CUDA device `build_engines` raises a LisaError that says which is
missing and how to run on ONNX Runtime instead (`lisa-trt run ... --backend ort`).
Nothing in this module has been run against a real TensorRT (not installable here).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Optional

from ..errors import ArtifactMismatchError, CheckpointError, InputError, LisaError
from ..export.io_spec import Graph
from .plugins.trt_plugin import TensorRTUnavailableError
from .profiles import (SEQ_SPLIT, ProfileSpec, profiles_from_io_spec, trt_graph_model,  # noqa: F401 (re-exported)
                       trt_onnx_path)

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


def engines_built(engine_dir) -> bool:
    """True when `lisa-trt build` recorded engines for this directory (for `--backend auto`)."""
    try:
        rec = engines_record(engine_dir)
    except LisaError:
        return False
    return bool(rec and rec.get("graphs"))


def write_engines_record(engine_dir, record: dict) -> None:
    """Store `record` as manifest.json["engines"], keeping every other key (atomic rewrite)."""
    from ..export.manifest import MANIFEST_NAME
    from ..io import write_json

    d = _raw_manifest(engine_dir)
    d[ENGINES_KEY] = record
    write_json(Path(engine_dir) / MANIFEST_NAME, d)


def load_plan(engine_dir, graph: Graph, *, check_env: bool = True) -> tuple:
    """Read a plan file after checking it against the manifest (never deserialize unchecked plans).

    Checks: an engines record exists; the plan's sha256 is the recorded one; the ONNX file it
    was built from is unchanged; and (check_env) the running TensorRT version and GPU are the
    recorded ones (a plan is tied to both).
    Returns:
        (plan bytes, the graph's record dict).
    Raises:
        CheckpointError: no engines / no plan for the graph.
        ArtifactMismatchError: hash, TensorRT version or GPU mismatch.
    """
    engine_dir = Path(engine_dir)
    rec = engines_record(engine_dir)
    if not rec or graph.value not in rec.get("graphs", {}):
        raise CheckpointError(f"{engine_dir} has no TensorRT engine for {graph.value}; build them with "
                              f"`lisa-trt build {engine_dir}` (needs TensorRT and a GPU), or {ORT_HINT}")
    g = rec["graphs"][graph.value]
    plan_path = engine_dir / g["plan"]
    if not plan_path.is_file():
        raise CheckpointError(f"{plan_path} is listed in the manifest but missing; rebuild with `lisa-trt build`")
    data = plan_path.read_bytes()
    have = hashlib.sha256(data).hexdigest()
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

def _network_flags(trt) -> Optional[bool]:
    """strongly_typed=True on TensorRT 10 (flag exists); None on 11 (strongly typed natively)."""
    return True if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED") else None


def build_plan(onnx_path: Path, profiles: list, plan_path: Path, *, timing_cache=None, refit: bool = False,
               workspace: Optional[int] = None, tf32: bool = True) -> float:
    """Build one strongly typed engine with Polygraphy's loaders and save it atomically.

    tf32: keep TensorRT's TF32 tactics for fp32 matmuls/convolutions. TensorRT enables
    BuilderFlag.TF32 by default, but Polygraphy's CreateConfig CLEARS it unless `tf32=True`
    (polygraphy/backend/trt/config.py: `self.tf32 = util.default(tf32, False)`, then
    `config.clear_flag(TF32)`), so it is passed explicitly. It is allowed in strongly typed
    networks (it only affects fp32 tensors; fp16 exports are unaffected).
    Returns the build time in seconds. Raises EngineBuildError with TensorRT's message.
    """
    import tensorrt as trt
    from polygraphy.backend.trt import CreateConfig, Profile, engine_from_network, network_from_onnx_path, save_engine

    from ..io import atomic_write

    t0 = time.perf_counter()
    try:
        network = network_from_onnx_path(str(onnx_path), strongly_typed=_network_flags(trt))
        trt_profiles = []
        for p in profiles:
            prof = Profile()
            for name, (mn, opt, mx) in p.shapes.items():
                prof.add(name, min=list(mn), opt=list(opt), max=list(mx))
            trt_profiles.append(prof)
        tc = Path(timing_cache) if timing_cache else None
        config = CreateConfig(
            tf32=bool(tf32),
            profiles=trt_profiles,
            load_timing_cache=str(tc) if tc is not None and tc.is_file() else None,
            refittable=True if refit else None,
            memory_pool_limits={trt.MemoryPoolType.WORKSPACE: int(workspace)} if workspace else None)
        engine = engine_from_network(network, config=config, save_timing_cache=str(tc) if tc is not None else None)
    except LisaError:
        raise
    except Exception as e:
        raise EngineBuildError(f"TensorRT could not build {onnx_path.name}: {type(e).__name__}: {e} (TensorRT's "
                               "parser / builder messages are logged above)") from e
    with atomic_write(plan_path) as tmp:
        save_engine(engine, str(tmp))
    return time.perf_counter() - t0


def default_build_graphs(man) -> list:
    """The graphs `lisa-trt build` makes engines for by default: every graph of the bundle, except
    target_prefill when its verify graph runs the prefill too (ExportFamily.bundle_prefill_ids):
    one target engine, whose "prefill" profile covers the prompt (profiles_from_io_spec), so the
    target's weights are on the GPU once."""
    names = sorted(man.graphs)
    if man.export_family.bundle_prefill_ids(man) is not None and Graph.TARGET_VERIFY.value in names:
        names.remove(Graph.TARGET_PREFILL.value)
    return names


def build_engines(engine_dir, *, profiles: Optional[dict] = None, timing_cache=None, refit: bool = False,
                  workspace: Optional[int] = None, max_batch: int = 1, max_tree: Optional[int] = None,
                  graphs: Optional[list] = None, tables=None,
                  check: bool = True, dry_run: bool = False, progress: bool = True) -> dict:
    """Build a TensorRT engine for every graph of an exported engine directory.

    Args:
        engine_dir: directory written by `lisa-trt export`.
        profiles: {graph: [ProfileSpec]}; default profiles_from_io_spec(manifest, max_batch, max_tree).
        timing_cache: path of a TensorRT timing cache, loaded when present and saved (merged) after
            each build, so rebuilds and other graphs reuse measured tactics.
        refit: build refittable engines (weights can be swapped without a rebuild).
        workspace: builder workspace limit in bytes (default: TensorRT's).
        max_batch / max_tree: ranges of the default profiles.
        graphs: graph names to build (default: default_build_graphs, every graph but a
            target_prefill that the verify engine replaces).
        tables: GASV tables for the plugin rewrite (default: the bundle's tables.safetensors, else
            recovered from gasv.onnx); checked against the plain graph in ONNX Runtime.
        check: run check_trt_compat first (fails before any TensorRT work).
        dry_run: check and plan only: no TensorRT needed, nothing written; returns the plan.
    Returns:
        The engines record written to manifest.json["engines"] (dry_run: the plan, unwritten).
    Raises:
        TensorRTUnavailableError / NoCudaDeviceError (what is missing + the ORT alternative),
        TrtCompatError, EngineBuildError, CheckpointError / ArtifactMismatchError for the directory.
    """
    from ..export.manifest import read_manifest
    from .trt_compat import check_trt_compat

    engine_dir = Path(engine_dir)
    man = read_manifest(engine_dir)
    names = list(graphs) if graphs else default_build_graphs(man)
    unknown = [n for n in names if n not in man.graphs]
    if unknown:
        raise InputError(f"{engine_dir} has no graph(s) {unknown}; it has {sorted(man.graphs)}")
    profiles = profiles or profiles_from_io_spec(man, max_batch=max_batch, max_tree=max_tree, graphs=names)
    from .plugins import trt_plugin as tp
    from .plugins.graph_rewrite import tables_from_bundle, write_trt_variant

    trt = None if dry_run else require_tensorrt_gpu()
    if tables is None and Graph.GASV.value in names:
        tables = tables_from_bundle(man)  # the bundle's tables.safetensors (None: recover from gasv.onnx)
    if not dry_run and Graph.GASV.value in names:  # gasv.trt.onnx: what the check and the build read
        write_trt_variant(man.graph_path(Graph.GASV), tables=tables)
    if check:
        check_trt_compat(engine_dir, profiles=profiles, max_batch=max_batch, graphs=names, tables=tables)
    plan = {n: {"onnx": trt_onnx_path(man, Graph(n)).name, "plan": f"{n}{PLAN_SUFFIX}",
                "profiles": [p.to_dict() for p in profiles[n]]} for n in names}
    if dry_run:
        return {"format": ENGINES_FORMAT, "dry_run": True, "graphs": plan}
    if Graph.GASV.value in names:
        tp.register()  # the parser maps the lisa::gasv2 node to the registered plugin
    bar = _progress(len(names), progress)
    for n in names:
        bar.set_description(f"build {n}")
        onnx_path = engine_dir / plan[n]["onnx"]
        secs = build_plan(onnx_path, profiles[n], engine_dir / plan[n]["plan"], timing_cache=timing_cache,
                          refit=refit, workspace=workspace)
        plan[n].update(plan_sha256=_sha256(engine_dir / plan[n]["plan"]), onnx_sha256=_sha256(onnx_path),
                       build_seconds=round(secs, 2))
        bar.update(1)
    bar.close()
    record = {"format": ENGINES_FORMAT, "schema_version": ENGINES_SCHEMA, "tensorrt_version": trt.__version__,
              **device_info(), "strongly_typed": True, "refit": bool(refit), "workspace": workspace,
              "timing_cache": str(timing_cache) if timing_cache else None, "max_batch": max_batch,
              "max_tree": max_tree or man.max_tree,
              "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "graphs": plan}
    old = engines_record(engine_dir) or {}
    if old.get("graphs") and graphs:  # partial rebuild: keep the other graphs' entries
        record["graphs"] = {**old["graphs"], **plan}
    write_engines_record(engine_dir, record)
    return record


def _progress(total: int, enabled: bool):
    from ..progress import progress_bar

    return progress_bar(total, enabled, unit="engine")


__all__ = ["ENGINES_KEY", "EngineBuildError", "NoCudaDeviceError", "ProfileSpec", "TensorRTUnavailableError",
           "build_engines", "default_build_graphs", "build_plan", "engines_built", "engines_record", "load_plan",
           "profiles_from_io_spec", "require_tensorrt_gpu", "trt_graph_model", "trt_onnx_path",
           "write_engines_record"]
