"""TensorRT runners over a built engine directory (engines/base.py protocols).

`TrtRunner` is the TensorRT `GraphRunner` (engines/base.py); `load_engines(dir, "trt")`
(engines/graph.py) wraps the runners in the same engines as every backend (the family's GraphTarget
subclass and decoder engine, GraphDrafter, GraphGASV): same methods, shapes, KVCache objects as the
torch models.

    engines = load_trt_engines("engines/demo")        # after `lisa-trt build engines/demo`
    cache = engines.target.new_cache(2, extra=60)
    out = engines.target.prefill(cond, cache, taps=True)

How a call runs (TrtRunner):
  - one IExecutionContext per optimisation profile (build.profiles_from_io_spec: "step" for
    S <= 16, "tree" up to the tree budget), created once; the profile is chosen once per
    input-shape signature (`select_profile`: the fitting profile with the smallest max volume).
    Every context of every engine of the bundle shares one torch-allocated activation buffer
    when the TensorRT version allows (USER_MANAGED allocation, `SharedActivations`), since they
    run one at a time on one stream;
  - binds once (`run_static`): the KV caches once per cache object and context, a shape or an
    address again only when it changed; outputs from a pool reused once the caller dropped them,
    made at the first call at the engine's largest output shapes (what `lisa-trt plan` counts);
  - inputs and outputs are torch CUDA tensors bound by address (`set_input_shape`,
    `set_tensor_address(name, t.data_ptr())`), then `execute_async_v3` on the current torch
    stream: no host copies, no synchronisation;
  - KV caches: the `past_key_values.*` buffers are bound as inputs only and the graph's
    `present.*` outputs are the call's new rows, which engines/graph.py `_run_kv` commits into the
    one cache (no output aliases an input, so nothing relies on TensorRT's aliasing rules);
  - checks TensorRT's contracts before enqueueing: `set_input_shape` returns False for a shape
    outside the context's profile (NvInferRuntime.h) -> TrtRuntimeError; every bound tensor has
    the engine's dtype (`get_tensor_dtype`); every address is 256-byte aligned
    (`setTensorAddress`: "The pointer must have at least 256-byte alignment"); a misaligned
    input is copied into an aligned buffer, a misaligned output is refused.
  - the standard plugins are registered (`trt.init_libnvinfer_plugins`) before any plan is
    deserialized: an engine holding one (e.g. ScatterElements with a reduction) fails to load
    otherwise.

TensorRT is imported lazily; constructing a runner without TensorRT or without a GPU raises
TensorRTUnavailableError / NoCudaDeviceError naming what is missing and the ONNX Runtime
alternative. Plans are loaded through build.load_plan (sha256 + TensorRT version + GPU checked
before deserialization). Nothing here has been run on a real TensorRT (not installable here);
the pure helpers are unit-tested on CPU.
"""

from __future__ import annotations

import contextlib
import weakref
from pathlib import Path
from typing import Optional

import torch

from ..errors import InputError, LisaError
from ..models.io_spec import Graph, GraphSpec
from .allocation import OUTPUT_POOL, AllocationLog, context_memory_bytes, output_capacity, pool_depth, storage_free
from .base import Backend, GraphRunner, register_backend, torch_dtype  # noqa: F401 (torch_dtype re-exported)
from .trt_plans import load_plan, require_tensorrt_gpu
from .profiles import ProfileSpec
from .graph import Engines, load_engines, refuse_removed_options

ALIGNMENT = 256  # NvInferRuntime.h IExecutionContext::setTensorAddress: at least 256-byte alignment
_LOGGERS = weakref.WeakKeyDictionary()  # per tensorrt module (one in practice; tests swap fake modules)
_PLUGINS_READY = weakref.WeakSet()


class TrtRuntimeError(LisaError):
    """TensorRT refused a call (shape outside every profile, failed enqueue)."""


# ----------------------------------------------------------------------------- pure helpers

def io_shapes(spec: GraphSpec, dims: dict, **dynamic) -> dict:
    """Concrete shapes of every input and output of a graph for given dynamic sizes.

    Args:
        spec: the graph's io spec.
        dims: static axis sizes (io_spec.export_dims).
        **dynamic: batch=, seq=, nodes= sizes.
    Returns:
        {tensor name: shape tuple}.
    """
    d = dict(dims, **dynamic)
    out = {}
    for t in tuple(spec.inputs) + tuple(spec.outputs):
        missing = [a for a in t.axes if a not in d]
        if missing:
            raise InputError(f"{spec.graph.value}: no size for axes {missing} of {t.name}")
        out[t.name] = t.shape(d)
    return out


def select_profile(profiles: list, shapes: dict) -> int:
    """Index of the profile to run `shapes` ({input name: shape}) with.

    The fitting profile with the smallest max volume wins (its kernels were tuned closest to
    the call). Raises TrtRuntimeError naming the ranges when no profile fits.
    """
    best, best_vol = None, None
    for i, p in enumerate(profiles):
        if p.contains(shapes):
            vol = p.max_volume()
            if best is None or vol < best_vol:
                best, best_vol = i, vol
    if best is None:
        ranges = "; ".join(f"{p.name}: " + ", ".join(f"{n} {p.shapes[n][0]}..{p.shapes[n][2]}" for n in shapes
                                                    if n in p.shapes) for p in profiles)
        got = ", ".join(f"{n} {tuple(s)}" for n, s in shapes.items())
        raise TrtRuntimeError(f"no optimisation profile of the engine accepts {got} ({ranges}); rebuild with "
                              "larger --max-batch / --max-tree (`lisa-trt build`)")
    return best


def seq_capacity(profiles: list, name: str = "input_ids", axis: int = 1) -> int:
    """Largest size of `name`'s axis any profile accepts (e.g. the tree budget of the engines)."""
    return max(p.shapes[name][2][axis] for p in profiles if name in p.shapes)


# ----------------------------------------------------------------------------- one engine

def _stream(device: torch.device) -> int:
    """The current torch stream's handle (execute_async_v3 enqueues on it); 0 off CUDA (tests)."""
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


def _on(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _logger(trt):
    if trt not in _LOGGERS:
        _LOGGERS[trt] = trt.Logger(trt.Logger.WARNING)
    return _LOGGERS[trt]


def init_plugins(trt) -> None:
    """Register TensorRT's standard plugins once (`init_libnvinfer_plugins(logger, "")`, pyCore.cpp);
    Polygraphy's loaders do it before parsing, a bare Runtime does not before deserializing."""
    if trt not in _PLUGINS_READY:
        if not trt.init_libnvinfer_plugins(_logger(trt), ""):
            raise TrtRuntimeError("TensorRT could not register its standard plugins (init_libnvinfer_plugins "
                                  "returned False); check that libnvinfer_plugin is installed with tensorrt")
        _PLUGINS_READY.add(trt)


def trt_torch_dtypes(trt) -> dict:
    """{trt.DataType: torch dtype} for the types lisa-trt graphs bind."""
    d = trt.DataType
    pairs = [("FLOAT", torch.float32), ("HALF", torch.float16), ("BF16", torch.bfloat16), ("INT32", torch.int32),
             ("INT64", torch.int64), ("BOOL", torch.bool), ("INT8", torch.int8), ("UINT8", torch.uint8)]
    return {getattr(d, n): t for n, t in pairs if hasattr(d, n)}


def aligned(t: torch.Tensor, alignment: int = ALIGNMENT) -> bool:
    """Whether a tensor's address satisfies TensorRT's binding alignment."""
    return t.data_ptr() % alignment == 0


def aligned_input(t: torch.Tensor, alignment: int = ALIGNMENT) -> torch.Tensor:
    """`t`, or an aligned contiguous copy when its address is not (a view at an odd offset)."""
    if aligned(t, alignment):
        return t
    c = torch.empty_like(t, memory_format=torch.contiguous_format)
    if not aligned(c, alignment):  # the caching allocators give 512-byte aligned blocks; be explicit
        raw = torch.empty(t.numel() * t.element_size() + alignment, dtype=torch.uint8, device=t.device)
        off = (-raw.data_ptr()) % alignment
        c = raw[off: off + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
    return c.copy_(t)


class SharedActivations:
    """One activation buffer for every execution context of a bundle's engines.

    The engines of a bundle run one after another on one stream, so their contexts can share one
    scratch buffer sized to the largest need: each context is made with
    `ExecutionContextAllocationStrategy.USER_MANAGED` (ICudaEngine::createExecutionContext(
    kUSER_MANAGED): "the user supplies custom allocation to the execution context", TensorRT Python
    API, IRuntimeConfig page) and given the buffer with its size (IExecutionContext::
    setDeviceMemoryV2(memory, size), TensorRT 10.1+; the memory may be shared by contexts that never
    run concurrently). The buffer grows when a context needs more (every context given the old one
    is handed the new one), and is allocated through the AllocationLog as "activations".
    """

    def __init__(self, device, log: AllocationLog):
        self.device, self.log = torch.device(device), log
        self.tensor = None
        self.contexts: list = []  # [(context, bytes it needs)]

    @property
    def nbytes(self) -> int:
        return 0 if self.tensor is None else self.tensor.numel()

    def attach(self, ctx, need: int, owner: str) -> None:
        """Give `ctx` the shared buffer (grown to `need` bytes first when smaller)."""
        need = max(1, int(need))
        if self.tensor is None or self.tensor.numel() < need:
            self.tensor = self.log.empty("activations", owner, (need,), torch.uint8, self.device)
            for c, _ in self.contexts:
                _give_memory(c, self.tensor)
        _give_memory(ctx, self.tensor)
        self.contexts.append((ctx, need))

    def detach(self, contexts) -> None:
        ids = {id(c) for c in contexts}
        self.contexts = [(c, n) for c, n in self.contexts if id(c) not in ids]
        if not self.contexts:
            self.tensor = None


def _give_memory(ctx, buf: torch.Tensor) -> None:
    """Hand a buffer to a USER_MANAGED context with its size (IExecutionContext::setDeviceMemoryV2(
    memory, size), 10.1+; the size-less setter before)."""
    if hasattr(ctx, "set_device_memory"):
        ctx.set_device_memory(buf.data_ptr(), buf.numel())
    else:
        ctx.device_memory = buf.data_ptr()


class _Bound:
    """What one execution context has bound now: input shapes, tensor addresses, the static set."""

    __slots__ = ("shapes", "addr", "static")

    def __init__(self):
        self.shapes, self.addr, self.static = {}, {}, None


class TrtRunner(GraphRunner):
    """One deserialized engine with an execution context per optimisation profile.

    Binds once: the profile is chosen once per input-shape signature, the static tensors (KV
    caches) are bound on a context once per StaticTensors object (`run_static`), an input shape or
    address is set again only when it changed, and outputs come from a per-name pool of buffers
    reused once the caller has dropped them (allocation.storage_free), so a steady-state step
    makes no binding call for the caches and allocates nothing.

    Args:
        engine_dir: the engine directory.
        spec, dims, precision: as GraphRunner.
        device: CUDA device of every bound tensor.
        share_memory: the contexts share one activation buffer (`activations`, else one of its own).
        activations: the SharedActivations of the bundle (TrtBackend passes one to every runner).
        log: the AllocationLog every buffer is allocated through.
    """

    def __init__(self, engine_dir, spec: GraphSpec, dims: dict, precision: str, device, *,
                 share_memory: bool = True, record: Optional[dict] = None,
                 activations: Optional[SharedActivations] = None, log: Optional[AllocationLog] = None):
        trt = require_tensorrt_gpu()
        super().__init__(spec, dims, precision, device)
        graph = spec.graph
        self.trt, self.graph = trt, graph
        self.log = log if log is not None else (activations.log if activations is not None else AllocationLog())
        self._arena = None
        self._pool: dict = {}      # output name -> [flat buffers]
        self._choice: dict = {}    # (static signature, input names, shapes) -> (profile, [output (name, shape, dtype)])
        self._static, self._static_sig = None, ()
        plan, rec = load_plan(engine_dir, graph, record=record)
        self.profiles = [ProfileSpec.from_dict(p) for p in rec["profiles"]]
        self._capacity = output_capacity(spec, self.dims, [p.shapes for p in self.profiles])
        self.alignment = ALIGNMENT if self.device.type == "cuda" else 1  # CPU: only the tests' fake engine
        with _on(self.device):
            init_plugins(trt)
            self.engine = trt.Runtime(_logger(trt)).deserialize_cuda_engine(plan)
            if hasattr(plan, "close"):  # the mapped plan file (trt_plans.map_plan): not needed once deserialized
                plan.close()
            del plan
            if self.engine is None:
                raise TrtRuntimeError(f"TensorRT could not deserialize {rec['plan']}; rebuild with `lisa-trt build`")
            n = self.engine.num_optimization_profiles
            if n != len(self.profiles):
                raise TrtRuntimeError(f"{rec['plan']} has {n} profiles, the manifest records {len(self.profiles)}")
            names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
            self.inputs = [x for x in names if self.engine.get_tensor_mode(x) == trt.TensorIOMode.INPUT]
            self.outputs = [x for x in names if x not in self.inputs]
            if sorted(self.inputs) != sorted(self.input_names) or sorted(self.outputs) != sorted(self.output_names):
                raise TrtRuntimeError(f"{rec['plan']} has tensors {names}, the io spec {self.input_names} -> "
                                      f"{self.output_names}; rebuild with `lisa-trt build`")
            self.dtypes = self._check_dtypes(names, rec["plan"])
            self.contexts = self._make_contexts(share_memory, activations)
            self._bound = [_Bound() for _ in self.contexts]

    def _check_dtypes(self, names: list, plan: str) -> dict:
        """{tensor: torch dtype} of the engine (`get_tensor_dtype`), checked against the io spec."""
        table = trt_torch_dtypes(self.trt)
        out, bad = {}, []
        for n in names:
            dt = self.engine.get_tensor_dtype(n)
            t = self.spec.input(n) if n in self.input_names else self.spec.output(n)
            want = torch_dtype(t.dtype, self.precision)
            got = table.get(dt)
            if got != want:
                bad.append(f"{n}: engine {getattr(dt, 'name', dt)}, io spec {want}")
            out[n] = want
        if bad:
            raise TrtRuntimeError(f"{plan} does not have the io spec's tensor dtypes ({'; '.join(bad)}); rebuild it "
                                  "with `lisa-trt build` from this export")
        return out

    def _make_contexts(self, share: bool, activations: Optional[SharedActivations]) -> list:
        """One context per profile; with `share` (and USER_MANAGED allocation) all on the bundle's one
        activation buffer, at least allocation.context_memory_bytes of this engine (its largest
        profile), the size `lisa-trt plan` counts."""
        trt, engine = self.trt, self.engine
        stream = _stream(self.device)
        n = engine.num_optimization_profiles
        strategy = getattr(trt, "ExecutionContextAllocationStrategy", None)
        sizes = None
        if share and strategy is not None and hasattr(engine, "get_device_memory_size_for_profile_v2"):
            sizes = [int(engine.get_device_memory_size_for_profile_v2(i)) for i in range(n)]
            self._arena = activations if activations is not None else SharedActivations(self.device, self.log)
        need = context_memory_bytes(sizes) if sizes is not None else 0
        contexts = []
        for i in range(n):
            ctx = engine.create_execution_context(strategy.USER_MANAGED) if sizes is not None \
                else engine.create_execution_context()
            if ctx is None:
                raise TrtRuntimeError(f"TensorRT could not create an execution context for {self.graph.value}")
            if sizes is not None:
                self._arena.attach(ctx, need, self.name)
            if not ctx.set_optimization_profile_async(i, stream):
                raise TrtRuntimeError(f"TensorRT refused optimisation profile {i} ({self.profiles[i].name}) of "
                                      f"{self.graph.value}; rebuild with `lisa-trt build`")
            contexts.append(ctx)
        return contexts

    @property
    def _memory(self) -> Optional[torch.Tensor]:
        """The activation buffer the contexts use (shared by the bundle's engines), or None."""
        return None if self._arena is None else self._arena.tensor

    @property
    def device_memory(self) -> Optional[int]:
        """Bytes of the contexts' activation buffer (shared by the bundle's engines; None: TensorRT
        allocates per context)."""
        return None if self._arena is None else self._arena.nbytes

    @property
    def seq_capacity(self) -> int:
        """The tree budget the profiles accept (largest `input_ids` length)."""
        return seq_capacity(self.profiles)

    def _close(self) -> None:
        if self._arena is not None:
            self._arena.detach(self.contexts)
        self.contexts, self.engine, self._arena, self._pool, self._static = [], None, None, {}, None

    # -- outputs ------------------------------------------------------------------------------

    def _output(self, name: str, shape: tuple, dtype) -> torch.Tensor:
        """An output tensor of `shape`: a view of a pooled buffer no caller holds. The pool of an
        output is made at its first call: allocation.pool_depth buffers at the output's capacity (its
        largest shape over the engine's profiles, allocation.output_capacity), the sizes `lisa-trt
        plan` counts as io; a call finding every pooled buffer held adds one to the pool (then the
        run holds more than the plan counts: tests/deploy/test_plan_is_the_allocation_list.py)."""
        n = 1
        for d in shape:
            n *= int(d)
        pool = self._pool.get(name)
        if pool is None:
            cap = max(n, self._capacity.get(name, 0))
            pool = self._pool[name] = [self.log.empty("io", self.name, (cap,), dtype, self.device)
                                       for _ in range(pool_depth(name, self.name))]
        for buf in pool:
            if buf.numel() >= n and storage_free(buf):
                return buf[:n].view(shape)
        buf = self.log.empty("io", self.name, (max(n, self._capacity.get(name, 0)),), dtype, self.device)
        pool.append(buf)  # the loop holds more of these at once: keep it (the pool is as deep as the holds)
        return buf[:n].view(shape)

    def allocate(self, inputs: dict, names) -> dict:
        shapes = self.output_shapes(inputs)
        return {n: self._output(n, tuple(shapes[n]), self.dtypes[n]) for n in names}

    # -- binding ------------------------------------------------------------------------------

    def _check(self, name: str, t: torch.Tensor, output: bool) -> torch.Tensor:
        """`t` as bound: the engine's dtype, dense, aligned (a misaligned input view is copied)."""
        if t.dtype != self.dtypes[name]:
            raise TrtRuntimeError(f"{self.graph.value}: {name} is {t.dtype}, the engine takes {self.dtypes[name]}")
        if not t.is_contiguous():
            raise TrtRuntimeError(f"{self.graph.value}: {name} is not contiguous; TensorRT binds dense tensors")
        if not aligned(t, self.alignment):
            if output:
                raise TrtRuntimeError(f"{self.graph.value}: {name} at address {t.data_ptr():#x} is not "
                                      f"{self.alignment}-byte aligned (TensorRT setTensorAddress); pass a freshly "
                                      "allocated tensor")
            t = aligned_input(t, self.alignment)
            self.log.entries.append(("copies", self.name, t.numel() * t.element_size()))
        return t

    def _set(self, k: int, name: str, t: torch.Tensor, is_input: bool) -> None:
        """Set an input's shape and a tensor's address on context k, each only when it changed."""
        ctx, state = self.contexts[k], self._bound[k]
        if is_input:
            shape = tuple(t.shape)
            if state.shapes.get(name) != shape:
                state.shapes.pop(name, None)
                if not ctx.set_input_shape(name, shape):  # False: outside this context's profile
                    lo, _, hi = self.profiles[k].shapes.get(name, (None, None, None))
                    raise TrtRuntimeError(f"TensorRT refused {name} of shape {shape} for {self.graph.value} "
                                          f"(profile {self.profiles[k].name}: {lo}..{hi}); rebuild with larger "
                                          "--max-batch / --max-tree (`lisa-trt build`)")
                state.shapes[name] = shape
        ptr = t.data_ptr()
        if state.addr.get(name) != ptr:
            state.addr.pop(name, None)
            if not ctx.set_tensor_address(name, ptr):
                raise TrtRuntimeError(f"TensorRT refused the address of {name} ({self.graph.value})")
            state.addr[name] = ptr

    def _enqueue(self, k: int) -> None:
        if not self.contexts[k].execute_async_v3(_stream(self.device)):
            raise TrtRuntimeError(f"TensorRT failed to enqueue {self.graph.value} (profile {self.profiles[k].name})")

    def _execute(self, inputs: dict, outputs: dict) -> None:
        """Bind torch CUDA tensors by address (what changed since the context's last call) and
        enqueue on the current torch stream."""
        k = select_profile(self.profiles, {n: tuple(inputs[n].shape) for n in self.inputs})
        self._bound[k].static = None  # any name may be rebound here
        for n in self.inputs:
            self._set(k, n, self._check(n, inputs[n], False), True)
        for n in self.outputs:
            self._set(k, n, self._check(n, outputs[n], True), False)
        self._enqueue(k)

    def run_static(self, inputs: dict, outputs: dict, static) -> dict:
        """`run` with the static tensors (KV caches) bound once per StaticTensors object and context;
        the profile and the output shapes are worked out once per input-shape signature. Returns
        every output (the pooled ones reused once the caller dropped them)."""
        if self.closed:
            from .base import RunnerError

            raise RunnerError(f"{self.name}: the runner is closed")
        if static is not self._static:
            self._check_names({**inputs, **static.inputs}, {**outputs, **static.outputs})
            checked = {n: self._check(n, t, False) for n, t in static.inputs.items()}
            if any(checked[n] is not t for n, t in static.inputs.items()):
                raise TrtRuntimeError(f"{self.graph.value}: a static tensor is not {self.alignment}-byte aligned; "
                                      "make the cache with the engine's new_cache")
            for n, t in static.outputs.items():
                self._check(n, t, True)
            self._static = static
            self._static_sig = tuple((n, tuple(t.shape)) for n, t in static.inputs.items())
            self._choice = {}
        key = (tuple(inputs), tuple(outputs), tuple(tuple(t.shape) for t in inputs.values()))
        choice = self._choice.get(key)
        if choice is None:
            self._check_names({**inputs, **static.inputs}, {**outputs, **static.outputs})
            shapes = {n: tuple(t.shape) for n, t in inputs.items()}
            shapes.update(self._static_sig)
            k = select_profile(self.profiles, {n: shapes[n] for n in self.inputs})
            oshapes = self.output_shapes({**inputs, **static.inputs})
            todo = [(n, tuple(oshapes[n]), self.dtypes[n]) for n in self.output_names
                    if n not in outputs and n not in static.outputs]
            choice = self._choice[key] = (k, todo)
        k, todo = choice
        state = self._bound[k]
        if state.static is not static:
            for n, t in static.inputs.items():
                self._set(k, n, t, True)
            for n, t in static.outputs.items():
                self._set(k, n, t, False)
            state.static = static
        given = dict(outputs)
        for n, shape, dtype in todo:
            given[n] = self._output(n, shape, dtype)
        for n, t in inputs.items():
            self._set(k, n, self._check(n, t, False), True)
        for n, t in given.items():
            self._set(k, n, self._check(n, t, True), False)
        self._enqueue(k)
        return given

    def release_static(self) -> None:
        """Forget the static tensors bound last (the next run_static binds them again)."""
        self._static = None
        for b in self._bound:
            b.static = None


class TrtBackend(Backend):
    """Options: device (CUDA device, default "cuda"), share_memory (per-profile contexts share one
    activation buffer)."""

    name = "trt"
    # drafter_fused when built (it replaces drafter_step: every drafter call one engine, a commit one
    # call), with drafter_project when that was built too (project_taps). No drafter_commit: its engine
    # would be a second copy of the drafter's weights (engines share none; deploy/build.NOT_BUILT);
    # engines built from a bundle without drafter_fused commit through drafter_project + drafter_step.
    optional_graphs = (Graph.DRAFTER_FUSED, Graph.DRAFTER_PROJECT)
    prefill_via_verify = True  # one target engine (engines/build.default_build_graphs)

    def target_graphs(self) -> tuple:
        """Both target engines when `lisa-trt build` made a target_prefill engine (builds before
        one target engine, or asked for with --graphs), else the verify engine alone."""
        rec = self.manifest.engines
        if Graph.TARGET_PREFILL.value in rec.get("graphs", {}):
            return (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY)
        return super().target_graphs()

    def __init__(self, manifest, *, device=None, share_memory: bool = True):
        super().__init__(manifest, share_memory=share_memory)
        self._device = torch.device(device or "cuda")
        self.allocations = AllocationLog()  # every device buffer the bundle's runners allocate
        self.activations = SharedActivations(self._device, self.allocations)  # one buffer for every engine

    @property
    def device(self) -> torch.device:
        return self._device

    def check(self) -> None:
        require_tensorrt_gpu()

    def can_open(self, graph) -> bool:
        """Exported AND built (an optional graph added after `lisa-trt build` waits for a rebuild)."""
        rec = self.manifest.engines
        return super().can_open(graph) and graph.value in rec.get("graphs", {})

    def open(self, graph, spec, dims):
        if graph is Graph.GASV:
            from .plugins import trt_plugin as tp

            tp.register()  # JIT plugins need the registration at run time; AOT ones do not mind
        return TrtRunner(Path(self.manifest.dir), spec, dims, self.manifest.precision, self._device,
                         record=self.manifest.engines, activations=self.activations, log=self.allocations,
                         **self.options)


register_backend("trt", TrtBackend)


def load_trt_engines(engine_dir, *, device=None, share_memory: bool = True,
                     target_hash: Optional[str] = None, drafter_hash: Optional[str] = None,
                     tables_hash: Optional[str] = None, **options) -> Engines:
    """`load_engines(engine_dir, "trt", ...)` after `lisa-trt build` (other `options` go to it as well).

    Raises:
        TensorRTUnavailableError / NoCudaDeviceError: what is missing, and the ORT alternative.
        CheckpointError: no engines built; ArtifactMismatchError: plans changed, built for another
        TensorRT / GPU, or for other artifacts than the given hashes.
    """
    refuse_removed_options(options)  # before the TensorRT / GPU check: bad input first
    require_tensorrt_gpu()
    return load_engines(engine_dir, "trt", target_hash=target_hash, drafter_hash=drafter_hash,
                        tables_hash=tables_hash, device=device, share_memory=share_memory, **options)


__all__ = ["ALIGNMENT", "OUTPUT_POOL", "SharedActivations", "TrtBackend", "TrtRunner", "TrtRuntimeError", "io_shapes", "load_trt_engines",
           "aligned", "aligned_input", "init_plugins", "select_profile", "seq_capacity", "torch_dtype",
           "trt_torch_dtypes"]
