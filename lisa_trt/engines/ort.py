"""The ONNX Runtime backend: one `GraphRunner` per exported graph (engines/base.py protocol).

`load_engines(dir, "ort")` (engines/graph.py) wraps these runners in the family's GraphTarget
subclass and decoder engine, GraphDrafter and GraphGASV. Torch tensors are the array type: inputs and outputs are
bound to ONNX Runtime by address (IO binding). Each layer's K/V buffer is bound as the read-only
`past_key_values.{i}.*` input only (kept bound across steps by `run_static`); the graph returns the
step's new rows as `present.{i}.*` and engines/graph.py `_run_kv` commits them into the buffer, so
the caches are preallocated once (`new_cache`) and updated in place without relying on any
buffer reuse inside ONNX Runtime.

Sessions: intra-op threads = physical cores, sequential execution, every graph optimisation,
no thread spinning (several sessions alternate; see `session_options`). One-copy mode
(`one_copy=True` or LISA_TRT_ORT_ONE_COPY=1, `ExclusiveSessions`) keeps only one of the target's
prefill / verify sessions open, so the target's pre-packed weights are in memory once.
The host-side input checks of the torch models (token ids, positions, condition validity) run
here before each call, with the torch models' own messages.

    engines = load_engines("engines/demo", "ort")        # or load_ort_engines("engines/demo")
    cache = engines.target.new_cache(2, extra=32)
    out = engines.target.prefill(cond, cache, taps=True)

Thread safety: a runner owns one IO binding per graph, so one engine set must not be called
from two threads at once. A service loads the engines once and either serialises calls
(a lock around each generation) or opens one set of engines per worker thread.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..models.io_spec import Graph
from .base import Backend, GraphRunner, register_backend, torch_dtype
from .graph import Engines, load_engines

_WARNED: set = set()  # bundles whose int8 CPU-kind warning was given in this process
_NP = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.bool: np.bool_}


# ----------------------------------------------------------------------------- sessions

def physical_cores() -> int:
    """Physical cores available to this process (hyper-threads do not help GEMMs)."""
    avail = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        cores, cur = set(), {}
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, v = (s.strip() for s in line.split(":", 1))
                    cur[k] = v
                elif cur:
                    cores.add((cur.get("physical id"), cur.get("core id")))
                    cur = {}
        if cur:
            cores.add((cur.get("physical id"), cur.get("core id")))
        n = len(cores) if None not in {c[1] for c in cores} else avail
    except OSError:
        n = avail
    return max(1, min(n, avail))


def session_options(threads: Optional[int] = None, spin: bool = False, profile: Optional[str] = None):
    """Tuned ORT options: intra-op = physical cores, sequential, graph optimisation ALL.

    Args:
        threads: intra-op threads (default: lisa_trt.threads policy: usable CPUs).
        spin: let idle intra-op threads spin after each op. Off by default: the runtime
            alternates several sessions (drafter, target) and host torch code on few cores,
            and spinning pools steal the CPU from each other (measured on the 2-core dev box:
            drafter step + verify 7.2 ms without spinning vs 23 ms with it; see
            bench/ort_cost_curve.json "alternating_sessions").
        profile: a file prefix: write ORT's per-node profile (JSON) there (`end_profiling`).
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    from ..threads import ort_threads

    so.intra_op_num_threads = ort_threads(threads)  # --threads / LISA_TRT_THREADS / usable CPUs
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    so.log_severity_level = 3
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile)
    return so


def default_providers() -> list:
    """CUDA when onnxruntime-gpu and a GPU are present, else CPU."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers() and torch.cuda.is_available():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def make_session(path, providers=None, threads: Optional[int] = None, spin: bool = False,
                 profile: Optional[str] = None):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), session_options(threads, spin, profile),
                                providers=providers or default_providers())


class OrtRunner(GraphRunner):
    """One ORT session + a reusable IO binding; torch tensors are bound by address.

    A name is rebound only when its tensor changed (address, shape, dtype), so long-lived
    buffers (the KV caches, passed on every call) cost nothing after the first call. Outputs
    are preallocated (by the caller or `GraphRunner.run`), so ORT allocates nothing.
    """

    def __init__(self, path, spec, dims, precision, *, providers=None, threads: Optional[int] = None,
                 spin: bool = False, profile: Optional[str] = None, exclusive: Optional["ExclusiveSessions"] = None):
        self.path = Path(path)
        self._make = lambda: make_session(path, providers, threads, spin, profile)
        self._exclusive = exclusive  # one-copy mode: the session is opened on use, the group's other one closed
        self.session = None
        self._devices: dict = {}
        self._shapes: dict = {}  # per-call input shapes -> [(output name, shape, dtype)] to allocate
        if exclusive is None:
            self._open()
            on_cuda = self.session.get_providers()[0] == "CUDAExecutionProvider"
        else:
            on_cuda = (providers or default_providers())[0] == "CUDAExecutionProvider"
            self._forget()
        super().__init__(spec, dims, precision, torch.device("cuda", 0) if on_cuda else torch.device("cpu"))

    def _open(self) -> None:
        self.session = self._make()
        self._io = self.session.io_binding()
        # The public IOBinding.bind_* rebuild an OrtDevice per call (~10 us each); bind through
        # the underlying C binding with a cached device when this onnxruntime exposes it.
        self._raw = getattr(self._io, "_iobinding", None)
        self._bound: dict = {}  # name -> (address, shape, dtype) currently bound
        self._static = None  # the StaticTensors bound now (run_static)
        self._checked: set = set()  # (input names, output names) signatures checked with _static
        # The C session's run skips the Python wrapper's (WebGPU graph capture) bookkeeping.
        self._run_raw = getattr(self.session, "_sess", None) if self._raw is not None and \
            self.session.get_providers()[0] in ("CPUExecutionProvider", "CUDAExecutionProvider") else None

    def _forget(self) -> None:
        """Drop the session (and its weights) and every binding; the next call opens it again."""
        self.session = self._io = self._raw = self._run_raw = self._static = None
        self._bound, self._checked = {}, set()

    def _ensure(self) -> None:
        if self._exclusive is not None:
            self._exclusive.acquire(self)
        if self.session is None:
            self._open()

    def _bind(self, name: str, t: torch.Tensor, output: bool) -> None:
        key = (t.data_ptr(), tuple(t.shape), t.dtype)
        if self._bound.get(name) == key:
            return
        dev = t.device
        if self._raw is None:
            args = (name, dev.type, dev.index or 0, _NP[t.dtype], tuple(t.shape), t.data_ptr())
            (self._io.bind_output if output else self._io.bind_input)(*args)
        else:
            dkey = (dev.type, dev.index or 0)
            cdev = self._devices.get(dkey)
            if cdev is None:
                from onnxruntime.capi.onnxruntime_inference_collection import OrtDevice

                cdev = self._devices[dkey] = OrtDevice.make(*dkey)._get_c_device()
            (self._raw.bind_output if output else self._raw.bind_input)(name, cdev, _NP[t.dtype], tuple(t.shape),
                                                                        t.data_ptr())
        self._bound[name] = key

    def _execute(self, inputs: dict, outputs: dict) -> None:
        self._ensure()
        self._static = None  # any name may be rebound here: run_static binds its tensors again
        for name, t in inputs.items():
            self._bind(name, t, output=False)
        for name, t in outputs.items():
            self._bind(name, t, output=True)
        self._launch()

    def _launch(self) -> None:
        if self.device.type == "cuda":  # ORT runs on its own stream: inputs must be ready
            torch.cuda.current_stream().synchronize()
        if self._run_raw is not None:
            self._run_raw.run_with_iobinding(self._raw, None)
        else:
            self.session.run_with_iobinding(self._io)

    def run_static(self, inputs: dict, outputs: dict, static) -> dict:
        """`run` with the static tensors (KV caches) bound once per StaticTensors object: a call
        with the object bound last binds only the per-call inputs and outputs (the names are
        checked once per signature, output shapes computed once per input shapes)."""
        if self.closed:
            from .base import RunnerError

            raise RunnerError(f"{self.name}: the runner is closed")
        self._ensure()
        if static is not self._static:
            self._check_names({**inputs, **static.inputs}, {**outputs, **static.outputs})
            for name, t in static.inputs.items():
                self._bind(name, t, output=False)
            for name, t in static.outputs.items():
                self._bind(name, t, output=True)
            self._static, self._shapes = static, {}
            self._checked = {(tuple(inputs), tuple(outputs))}
        sig = (tuple(inputs), tuple(outputs))
        if sig not in self._checked:
            self._check_names({**inputs, **static.inputs}, {**outputs, **static.outputs})
            self._checked.add(sig)
        key = tuple(tuple(t.shape) for t in inputs.values())
        todo = self._shapes.get(key)
        if todo is None:
            shapes = self.output_shapes({**inputs, **static.inputs})
            todo = self._shapes[key] = [(n, shapes[n], torch_dtype(self.spec.output(n).dtype, self.precision))
                                        for n in self.output_names if n not in outputs and n not in static.outputs]
        given = dict(outputs)
        for n, shape, dtype in todo:
            given[n] = torch.empty(shape, dtype=dtype, device=self.device)
        for name, t in inputs.items():
            self._bind(name, t, output=False)
        for name, t in given.items():
            self._bind(name, t, output=True)
        self._launch()
        return given

    def release_static(self) -> None:
        """Drop the reference to the static tensors bound last (the next run_static binds again)."""
        self._static = None

    def _close(self) -> None:
        if self._exclusive is not None:
            self._exclusive.release(self)
        self._forget()


class ExclusiveSessions:
    """One-copy mode (`OrtBackend(..., one_copy=True)`, or LISA_TRT_ORT_ONE_COPY=1): the target's
    prefill and verify sessions are never open at the same time.

    ONNX Runtime's CPU sessions each keep a pre-packed copy of their MatMul weights, and its Python
    API cannot share pre-packed weights between sessions, so two open target sessions hold the
    target twice. Here a runner opens its session when called and closes the other one first:
    the same graphs and kernels (identical outputs), one copy of the target in memory, at the cost
    of a session load per switch (two per generation: prefill, then the decode loop).
    """

    def __init__(self):
        self.active = None
        self.switches = 0

    def acquire(self, runner) -> None:
        if self.active is runner:
            return
        if self.active is not None:
            self.active._forget()
            self.switches += 1
        self.active = runner

    def release(self, runner) -> None:
        if self.active is runner:
            self.active = None



# graphs ORT opens only when their switch is on: graph -> (option, environment variable, its default)
_OPTIONAL_GRAPHS = {Graph.DRAFTER_FUSED: ("fused_drafter", "LISA_TRT_ORT_FUSED_DRAFTER", "1"),
                    Graph.DRAFTER_COMMIT: ("fused_commit", "LISA_TRT_ORT_FUSED_COMMIT", "")}


class OrtBackend(Backend):
    """Options: providers (default CUDA if available, else CPU), threads (intra-op threads per
    session, default physical cores), spin (intra-op thread spinning), profile (file prefix),
    one_copy (default: env LISA_TRT_ORT_ONE_COPY): never keep the target's prefill and verify
    sessions open together (ExclusiveSessions: one copy of the target's weights in memory)."""

    name = "ort"
    optional_graphs = (Graph.DRAFTER_COMMIT, Graph.DRAFTER_FUSED)
    prefill_via_verify = True  # one target session: its pre-packed weights are the only copy

    def can_open(self, graph) -> bool:
        """drafter_fused by default (it replaces drafter_step: one session holds the drafter's
        layer and head, and a commit is one call); off with option fused_drafter=False or
        LISA_TRT_ORT_FUSED_DRAFTER=0 (then project + step, as a bundle exported before it runs).
        drafter_commit (such older bundles) only when asked (option fused_commit=True or
        LISA_TRT_ORT_FUSED_COMMIT=1): its session would pre-pack a second copy of the drafter's
        layer and head next to drafter_step's (docs/deployment.md, bench/memory.json "drafter_commit")."""
        switch = _OPTIONAL_GRAPHS.get(graph)
        if switch is not None:
            option, env, default = switch
            want = self.options.get(option)
            if want is None:
                want = os.environ.get(env, default) not in ("", "0")
            if not want:
                return False
        return super().can_open(graph)

    def check(self) -> None:
        """Warn (once per bundle) when int8 graphs run on a CPU kind their validation did not cover."""
        from ..export.int8_isa import isa_warning

        msg = isa_warning(self.manifest)
        if msg and str(self.manifest.dir) not in _WARNED:
            import warnings

            _WARNED.add(str(self.manifest.dir))
            warnings.warn(msg, RuntimeWarning, stacklevel=3)

    def target_graphs(self) -> tuple:
        """(verify,) when the bundle's verify graph runs the prefill too (Backend.target_graphs);
        LISA_TRT_ORT_PREFILL_GRAPH=1 (or the option prefill_via_verify=False) opens the prefill graph
        as well, as before: two target sessions, each with its own pre-packed copy of the target."""
        if "prefill_via_verify" not in self.options and os.environ.get("LISA_TRT_ORT_PREFILL_GRAPH", "") not in ("", "0"):
            return (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY)
        return super().target_graphs()

    def open(self, graph, spec, dims):
        m = self.manifest
        opts = dict(self.options)
        opts.pop("prefill_via_verify", None)  # read by target_graphs
        opts.pop("fused_commit", None)  # read by can_open
        opts.pop("fused_drafter", None)
        one_copy = opts.pop("one_copy", None)
        if one_copy is None:
            one_copy = os.environ.get("LISA_TRT_ORT_ONE_COPY", "") not in ("", "0")
        if one_copy and graph in (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY):
            opts["exclusive"] = self.__dict__.setdefault("_exclusive", ExclusiveSessions())
        return OrtRunner(m.graph_path(graph), spec, dims, m.precision, **opts)


register_backend("ort", OrtBackend)


def load_ort_engines(engine_dir, providers=None, threads: Optional[int] = None, *, spin: bool = False,
                     target_hash: Optional[str] = None, drafter_hash: Optional[str] = None,
                     tables_hash: Optional[str] = None, **options) -> Engines:
    """`load_engines(engine_dir, "ort", ...)` (kept for callers of the ORT-only loader); options:
    one_copy, prefill_via_verify, fused_drafter, fused_commit (OrtBackend)."""
    return load_engines(engine_dir, "ort", target_hash=target_hash, drafter_hash=drafter_hash,
                        tables_hash=tables_hash, providers=providers, threads=threads, spin=spin, **options)


__all__ = ["ExclusiveSessions", "OrtBackend", "OrtRunner", "load_ort_engines", "make_session", "physical_cores", "session_options"]
