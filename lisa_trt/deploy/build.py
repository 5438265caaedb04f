"""`lisa-trt build`: TensorRT engines for every graph of an engine directory (Polygraphy loaders).

    man = read_manifest(dir) ──▶ profiles_from_io_spec(man)  (pure: prefill, tree verification
         │                        S = 1..max_tree in two buckets, batch 1..2*max_batch for CFG)
         ├─▶ attention_probe.choose_attention  (one-node Attention builds, seconds: --attention
         │                        auto|op|plain; a refused probe -> plain ops or a stop)
         ├─▶ check_trt_compat(dir)      (CPU: ops, dtypes, io spec, profiles)
         ├─▶ gasv.trt.onnx              (plugins/graph_rewrite: lisa::gasv2 plugin node)
         ├─▶ <graph>.trt.onnx           (fp16: the export without Attention softmax_precision,
         │                               which the parser refuses; engines/parser_checks.py;
         │                               plain attention: engines/attention_ops.plain_attention)
         └─▶ per graph: network_from_onnx_path(strongly_typed=True) ─▶ CreateConfig(profiles,
             timing cache, refit, workspace) ─▶ engine_from_network ─▶ save_engine(<graph>.plan)
    manifest.json["engines"] = {TensorRT version, GPU, profiles, plan sha256, per-profile device
                                memory, aliased outputs ...}  (atomic; `lisa-trt plan` reads them)

Engines are strongly typed: the ONNX already carries its precision (fp16 export = fp16 weights
and casts), TensorRT 10 builds it with NetworkDefinitionCreationFlag.STRONGLY_TYPED and 11 is
strongly typed natively (docs/spec/deploy.md); no FP16/BF16 builder flags are used.

Plans are loaded only after their checks (engines/trt_plans.py, which also holds the record).

Without TensorRT or without a CUDA device `build_engines` raises a LisaError that says which is
missing and how to run on ONNX Runtime instead (`lisa-trt run ... --backend ort`).
Nothing in this module has been run against a real TensorRT (not installable here).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from ..errors import InputError, LisaError
from ..models.io_spec import Graph
from ..engines.plugins.trt_plugin import TensorRTUnavailableError
from ..engines.profiles import (SEQ_SPLIT, ProfileSpec, profiles_from_io_spec, trt_graph_model,  # noqa: F401
                               trt_onnx_path, write_trt_copies)
from ..engines.trt_plans import (
    ENGINES_FORMAT,
    ENGINES_KEY,
    ENGINES_SCHEMA,
    PLAN_SUFFIX,
    EngineBuildError,
    NoCudaDeviceError,
    _sha256,
    built_graphs,
    device_info,
    engines_built,
    engines_record,
    load_plan,
    require_tensorrt_gpu,
    write_engines_record,
)


def _network_flags(trt) -> Optional[bool]:
    """strongly_typed=True wherever TensorRT has the flag: 10.x needs it; 11.x keeps it (deprecated,
    ignored: 11 is strongly typed natively). None for a build without it."""
    return True if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED") else None


def build_plan(onnx_path: Path, profiles: list, plan_path: Path, *, timing_cache=None, refit: bool = False,
               workspace: Optional[int] = None, tf32: bool = True) -> float:
    """Build one strongly typed engine with Polygraphy's loaders and save it atomically.

    tf32: keep TensorRT's TF32 tactics for fp32 matmuls/convolutions. TensorRT enables
    BuilderFlag.TF32 by default, but Polygraphy's CreateConfig CLEARS it unless `tf32=True`
    (polygraphy/backend/trt/config.py: `self.tf32 = util.default(tf32, False)`, then
    `config.clear_flag(TF32)`), so it is passed explicitly. It is allowed in strongly typed
    networks (it only affects fp32 tensors; fp16 exports are unaffected).
    Returns {"build_seconds", "device_memory": per-profile bytes, "aliased": {output: input}}
    (engine_memory_facts). Raises EngineBuildError with TensorRT's message.
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
            memory_pool_limits={trt.MemoryPoolType.WORKSPACE: int(workspace)} if workspace else None,
            # DETAILED: the engine inspector's layer list names each layer's type and tactic, which
            # bench/gpu_check.py reads to see whether attention was fused (no runtime cost)
            profiling_verbosity=getattr(getattr(trt, "ProfilingVerbosity", None), "DETAILED", None))
        engine = engine_from_network(network, config=config, save_timing_cache=str(tc) if tc is not None else None)
    except LisaError:
        raise
    except Exception as e:
        raise EngineBuildError(f"TensorRT could not build {onnx_path.name}: {type(e).__name__}: {e} (TensorRT's "
                               "parser / builder messages are logged above)") from e
    with atomic_write(plan_path) as tmp:
        save_engine(engine, str(tmp))
    return {"build_seconds": round(time.perf_counter() - t0, 2), **engine_memory_facts(engine)}


def engine_memory_facts(engine) -> dict:
    """What `lisa-trt plan` reads of a built engine: each profile's device memory
    (ICudaEngine.get_device_memory_size_for_profile_v2, TensorRT 10.1+ and 11; the engine-wide
    device_memory_size_v2 for every profile where the per-profile call is missing) and the outputs
    the engine aliases to inputs (get_aliased_input_tensor, 10.15+; none for lisa-trt's graphs,
    which return only the new K/V rows: a non-empty record means a graph writes its cache)."""
    n = int(engine.num_optimization_profiles)
    per = getattr(engine, "get_device_memory_size_for_profile_v2", None)
    if per is not None:
        sizes = [int(per(i)) for i in range(n)]
    else:
        sizes = [int(getattr(engine, "device_memory_size_v2", getattr(engine, "device_memory_size", 0)))] * n
    aliased = {}
    get = getattr(engine, "get_aliased_input_tensor", None)
    if get is not None:
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        aliased = {o: get(o) for o in names if get(o)}
    return {"device_memory": sizes, "aliased": aliased}


def default_build_graphs(man) -> list:
    """The graphs `lisa-trt build` makes engines for by default: every graph of the bundle, except
    - target_prefill when its verify graph runs the prefill too (ExportFamily.bundle_prefill_ids):
      one target engine, whose "prefill" profile covers the prompt (profiles_from_io_spec);
    - drafter_commit (NOT_BUILT): TensorRT engines share no weights, so its engine would be a
      second copy of the drafter's layer and head;
    - drafter_step and drafter_project when the bundle has drafter_fused (FUSED_REPLACES): that one
      engine runs every drafter call of the loop (a commit, fc inside, is one call) and holds the
      fc, layer and head; a bundle exported before it commits through drafter_project + drafter_step.
    Each model's weights are on the GPU once."""
    names = [n for n in sorted(man.graphs) if n not in NOT_BUILT]
    if Graph.DRAFTER_FUSED.value in names:
        names = [n for n in names if n not in FUSED_REPLACES]
    if man.export_family.bundle_prefill_ids(man) is not None and Graph.TARGET_VERIFY.value in names:
        names.remove(Graph.TARGET_PREFILL.value)
    return names


# Exported graphs never built into an engine, and why (docs/tensorrt.md "One copy of each model").
NOT_BUILT = {Graph.DRAFTER_COMMIT.value: "its engine would hold a second copy of the drafter's weights (TensorRT "
                                         "engines share none); the TensorRT runtime commits through "
                                         "drafter_project + drafter_step, which hold them once"}


# Graphs drafter_fused makes redundant on TensorRT: built only when --graphs names them (drafter_project
# for callers of project_taps on their own: its fc is a second copy of the fused engine's).
FUSED_REPLACES = (Graph.DRAFTER_STEP.value, Graph.DRAFTER_PROJECT.value)


def _check_buildable(engine_dir, man, names: list) -> None:
    unknown = [n for n in names if n not in man.graphs]
    if unknown:
        raise InputError(f"{engine_dir} has no graph(s) {unknown}; it has {sorted(man.graphs)}")
    refused = [n for n in names if n in NOT_BUILT]
    if refused:
        raise InputError(f"{refused[0]} is not built for TensorRT: {NOT_BUILT[refused[0]]}. Leave it out of "
                         f"--graphs (default: {', '.join(default_build_graphs(man))})")


def build_engines(engine_dir, *, profiles: Optional[dict] = None, timing_cache=None, refit: bool = False,
                  workspace: Optional[int] = None, max_batch: int = 1, max_tree: Optional[int] = None,
                  graphs: Optional[list] = None, tables=None, attention: str = "auto",
                  check: bool = True, dry_run: bool = False, progress: bool = True, warn=None) -> dict:
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
            target_prefill that the verify engine replaces, drafter_commit (NOT_BUILT), and
            drafter_step / drafter_project where drafter_fused replaces them).
        tables: GASV tables for the plugin rewrite (default: the bundle's tables.safetensors, else
            recovered from gasv.onnx); checked against the plain graph in ONNX Runtime.
        attention: "auto" (probe each distinct Attention node with a one-node build, plain ops for a
            graph whose probe TensorRT refuses, with a warning), "op" (probe; a refusal stops the
            build) or "plain" (attention as MatMul / Softmax ops, no probe): deploy/attention_probe.py.
        check: run check_trt_compat first (fails before any TensorRT work).
        dry_run: check and plan only: no TensorRT needed, nothing written; returns the plan
            (the probes run the parser's static checks only).
        warn: callable for the fall-back warning (default: print to stderr).
    Returns:
        The engines record written to manifest.json["engines"] (dry_run: the plan, unwritten).
    Raises:
        TensorRTUnavailableError / NoCudaDeviceError (what is missing + the ORT alternative),
        TrtCompatError, EngineBuildError (AttentionRefusedError under attention="op"),
        CheckpointError / ArtifactMismatchError for the directory.
    """
    from ..export.manifest import read_manifest
    from .attention_probe import choose_attention
    from .trt_lint import check_trt_compat

    engine_dir = Path(engine_dir)
    man = read_manifest(engine_dir)
    names = list(graphs) if graphs else default_build_graphs(man)
    _check_buildable(engine_dir, man, names)
    profiles = profiles or profiles_from_io_spec(man, max_batch=max_batch, max_tree=max_tree, graphs=names)
    from ..engines.plugins import trt_plugin as tp
    from ..engines.plugins.graph_rewrite import tables_from_bundle, write_trt_variant

    trt = None if dry_run else require_tensorrt_gpu()
    if tables is None and Graph.GASV.value in names:
        tables = tables_from_bundle(man)  # the bundle's tables.safetensors (None: recover from gasv.onnx)
    if not dry_run and Graph.GASV.value in names:  # gasv.trt.onnx: what the check and the build read
        write_trt_variant(man.graph_path(Graph.GASV), tables=tables)
    if trt is not None and Graph.GASV.value in names:
        tp.register()  # the parser maps the lisa::gasv2 node to the registered plugin
    modes, probes = choose_attention(man, names, profiles, attention, build=None if dry_run else build_plan,
                                     warn=warn or _stderr)
    if not dry_run:  # <graph>.trt.onnx: plain attention, or fp16 without the softmax_precision TensorRT refuses
        write_trt_copies(man, names, attention=modes)
    if check:
        check_trt_compat(engine_dir, profiles=profiles, max_batch=max_batch, graphs=names, tables=tables,
                         attention=modes)
    plan = {n: {"onnx": trt_onnx_path(man, Graph(n), modes.get(n)).name, "plan": f"{n}{PLAN_SUFFIX}",
                "profiles": [p.to_dict() for p in profiles[n]], "attention": modes.get(n),
                **({"attention_probes": probes[n]} if n in probes else {})} for n in names}
    if dry_run:
        return {"format": ENGINES_FORMAT, "dry_run": True, "graphs": plan}
    bar = _progress(len(names), progress)
    for n in names:
        bar.set_description(f"build {n}")
        onnx_path = engine_dir / plan[n]["onnx"]
        facts = build_plan(onnx_path, profiles[n], engine_dir / plan[n]["plan"], timing_cache=timing_cache,
                           refit=refit, workspace=workspace)
        plan[n].update(plan_sha256=_sha256(engine_dir / plan[n]["plan"]), onnx_sha256=_sha256(onnx_path), **facts)
        bar.update(1)
    bar.close()
    record = {"format": ENGINES_FORMAT, "schema_version": ENGINES_SCHEMA, "tensorrt_version": trt.__version__,
              **device_info(), "strongly_typed": True, "refit": bool(refit), "workspace": workspace,
              "timing_cache": str(timing_cache) if timing_cache else None, "max_batch": max_batch,
              "max_tree": max_tree or man.max_tree,
              "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "graphs": plan}
    return _write_record(engine_dir, record, partial=bool(graphs))


def build_verdict(record: dict, engine_dir=None) -> str:
    """One line saying what `lisa-trt build` did (or, dry run, would do): the graphs, their
    profiles and attention form; the full record is JSON behind `--json`."""
    graphs = record.get("graphs") or {}
    names = ", ".join(f"{n} ({len(g.get('profiles') or [])} profile{'s' if len(g.get('profiles') or []) != 1 else ''}"
                      + (f", {g['attention']} attention" if g.get("attention") else "") + ")"
                      for n, g in graphs.items())
    where = f" in {engine_dir}" if engine_dir is not None else ""
    if record.get("dry_run"):
        return (f"dry run: {len(graphs)} graph(s){where} pass the TensorRT compatibility check and would be built: "
                f"{names}; nothing was written (--json FILE or - for the plan)")
    secs = sum(float(g.get("build_seconds") or 0) for g in graphs.values())
    return (f"built {len(graphs)} engine(s){where} with TensorRT {record.get('tensorrt_version')} in {secs:.0f} s: "
            f"{names} (--json FILE or - for the record)")


def _write_record(engine_dir: Path, record: dict, *, partial: bool) -> dict:
    """Write the engines record; a partial rebuild keeps the other graphs' entries."""
    old = built_graphs({ENGINES_KEY: engines_record(engine_dir)})
    if old and partial:
        record["graphs"] = {**old, **record["graphs"]}
    write_engines_record(engine_dir, record)
    return record


def _stderr(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr)


def _progress(total: int, enabled: bool):
    from ..progress import progress_bar

    return progress_bar(total, enabled, unit="engine")


__all__ = ["ENGINES_KEY", "EngineBuildError", "FUSED_REPLACES", "NOT_BUILT", "NoCudaDeviceError", "ProfileSpec",
           "TensorRTUnavailableError", "build_engines", "build_plan", "build_verdict", "built_graphs",
           "default_build_graphs",
           "engine_memory_facts", "engines_built", "engines_record", "load_plan", "profiles_from_io_spec",
           "require_tensorrt_gpu", "trt_graph_model", "trt_onnx_path", "write_engines_record"]
