"""TensorRT runners over a built engine directory (engines/base.py protocols).

`TrtRunner` is the TensorRT `GraphRunner` (engines/base.py); `load_engines(dir, "trt")`
(engines/graph.py) wraps the runners in the same generic GraphTarget / GraphDrafter / GraphGASV /
GraphVQ as every backend: same methods, shapes, KVCache objects as the torch models.

    engines = load_trt_engines("engines/demo")        # after `lisa-trt build engines/demo`
    cache = engines.target.new_cache(2, extra=60)
    out = engines.target.prefill(cond, cache, taps=True)

How a call runs (TrtRunner):
  - one IExecutionContext per optimisation profile (build.profiles_from_io_spec: "step" for
    S <= 16, "tree" up to the tree budget), created once; the profile is chosen per call from
    the input shapes (`select_profile`: the fitting profile with the smallest max volume). The
    contexts share one torch-allocated activation buffer when the TensorRT version allows
    (USER_MANAGED allocation), since they run one at a time on one stream;
  - inputs and outputs are torch CUDA tensors bound by address (`set_input_shape`,
    `set_tensor_address(name, t.data_ptr())`), then `execute_async_v3` on the current torch
    stream: no host copies, no synchronisation;
  - KV caches (`kv_binding="inplace"`, default): each layer's buffer is bound as BOTH
    `past_key_values.{i}.*` and `present.{i}.*`. Engines whose outputs TensorRT reports as
    aliased (IKVCacheUpdateLayer, TensorRT >= 10.15, `get_aliased_input_tensor`) require exactly
    that. For the exported ScatterElements graphs the same-buffer binding relies on the cache
    being read only by the scatter that writes it (true for these graphs; TensorRT does not
    document it). `kv_binding="swap"` binds `present.*` to a second buffer set and swaps the
    two after each call (always safe, one extra cache of memory, no copies).

TensorRT is imported lazily; constructing a runner without TensorRT or without a GPU raises
TensorRTUnavailableError / NoCudaDeviceError naming what is missing and the ONNX Runtime
alternative. Plans are loaded through build.load_plan (sha256 + TensorRT version + GPU checked
before deserialization). Nothing here has been run on a real TensorRT (not installable here);
the pure helpers are unit-tested on CPU.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import torch

from ..errors import InputError, LisaError
from ..export.io_spec import Graph, GraphSpec
from .base import Backend, GraphRunner, register_backend, torch_dtype  # noqa: F401 (torch_dtype re-exported)
from .build import load_plan, require_tensorrt_gpu
from .profiles import ProfileSpec
from .graph import Engines, load_engines

KV_BINDINGS = ("inplace", "swap")
_LOGGER = None


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
    global _LOGGER
    if _LOGGER is None:
        _LOGGER = trt.Logger(trt.Logger.WARNING)
    return _LOGGER


class TrtRunner(GraphRunner):
    """One deserialized engine with an execution context per optimisation profile.

    Args:
        engine_dir: the engine directory.
        spec, dims, precision: as GraphRunner.
        device: CUDA device of every bound tensor.
        share_memory: let the per-profile contexts share one activation buffer.
        kv_binding: "inplace" (past and present share the buffer) or "swap" (double buffer).
    """

    def __init__(self, engine_dir, spec: GraphSpec, dims: dict, precision: str, device, *,
                 share_memory: bool = True, kv_binding: str = "inplace"):
        trt = require_tensorrt_gpu()
        super().__init__(spec, dims, precision, device)
        graph = spec.graph
        self.trt, self.graph, self.kv_binding = trt, graph, kv_binding
        plan, rec = load_plan(engine_dir, graph)
        self.profiles = [ProfileSpec.from_dict(p) for p in rec["profiles"]]
        with _on(self.device):
            self.engine = trt.Runtime(_logger(trt)).deserialize_cuda_engine(plan)
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
            self.aliased = self._aliased_outputs()
            self._memory = None
            self.contexts = self._make_contexts(share_memory)

    def _aliased_outputs(self) -> dict:
        """{output: input} TensorRT itself aliases (IKVCacheUpdateLayer; TensorRT >= 10.15)."""
        get = getattr(self.engine, "get_aliased_input_tensor", None)
        out = {}
        if get is not None:
            for o in self.outputs:
                src = get(o)
                if src:
                    out[o] = src
        return out

    def _make_contexts(self, share: bool) -> list:
        trt, engine = self.trt, self.engine
        stream = _stream(self.device)
        n = engine.num_optimization_profiles
        strategy = getattr(trt, "ExecutionContextAllocationStrategy", None)
        sizes = None
        if share and strategy is not None and hasattr(engine, "get_device_memory_size_for_profile_v2"):
            sizes = [int(engine.get_device_memory_size_for_profile_v2(i)) for i in range(n)]
        contexts = []
        if sizes is not None:
            self._memory = torch.empty(max(sizes + [1]), dtype=torch.uint8, device=self.device)
        for i in range(n):
            if sizes is not None:
                ctx = engine.create_execution_context(strategy.USER_MANAGED)
                if hasattr(ctx, "set_device_memory"):
                    ctx.set_device_memory(self._memory.data_ptr(), sizes[i])
                else:
                    ctx.device_memory = self._memory.data_ptr()
            else:
                ctx = engine.create_execution_context()
            if ctx is None:
                raise TrtRuntimeError(f"TensorRT could not create an execution context for {self.graph.value}")
            ctx.set_optimization_profile_async(i, stream)
            contexts.append(ctx)
        return contexts

    @property
    def seq_capacity(self) -> int:
        """The tree budget the profiles accept (largest `input_ids` length)."""
        return seq_capacity(self.profiles)

    def _close(self) -> None:
        self.contexts, self.engine, self._memory = [], None, None

    def _execute(self, inputs: dict, outputs: dict) -> None:
        """Bind torch CUDA tensors by address and enqueue on the current torch stream."""
        k = select_profile(self.profiles, {n: tuple(inputs[n].shape) for n in self.inputs})
        ctx = self.contexts[k]
        for n in self.inputs:
            t = inputs[n]
            ctx.set_input_shape(n, tuple(t.shape))
            ctx.set_tensor_address(n, t.data_ptr())
        for n in self.outputs:
            ctx.set_tensor_address(n, outputs[n].data_ptr())
        if not ctx.execute_async_v3(_stream(self.device)):
            raise TrtRuntimeError(f"TensorRT failed to enqueue {self.graph.value} (profile {self.profiles[k].name})")


class TrtBackend(Backend):
    """Options: device (CUDA device, default "cuda"), kv_binding ("inplace" | "swap"),
    share_memory (per-profile contexts share one activation buffer)."""

    name = "trt"
    optional_graphs = (Graph.DRAFTER_COMMIT,)

    def __init__(self, manifest, *, device=None, kv_binding: str = "inplace", share_memory: bool = True):
        if kv_binding not in KV_BINDINGS:
            raise InputError(f"kv_binding must be one of {KV_BINDINGS}, got {kv_binding!r}")
        super().__init__(manifest, kv_binding=kv_binding, share_memory=share_memory)
        self._device = torch.device(device or "cuda")

    @property
    def device(self) -> torch.device:
        return self._device

    def check(self) -> None:
        require_tensorrt_gpu()

    def can_open(self, graph) -> bool:
        """Exported AND built (an optional graph added after `lisa-trt build` waits for a rebuild)."""
        from .build import engines_record

        rec = engines_record(self.manifest.dir) or {}
        return super().can_open(graph) and graph.value in rec.get("graphs", {})

    def open(self, graph, spec, dims):
        if graph is Graph.GASV:
            from .plugins import trt_plugin as tp

            tp.register()  # JIT plugins need the registration at run time; AOT ones do not mind
        return TrtRunner(Path(self.manifest.dir), spec, dims, self.manifest.precision, self._device, **self.options)


register_backend("trt", TrtBackend)


def load_trt_engines(engine_dir, *, device=None, kv_binding: str = "inplace", share_memory: bool = True,
                     target_hash: Optional[str] = None, drafter_hash: Optional[str] = None,
                     tables_hash: Optional[str] = None) -> Engines:
    """`load_engines(engine_dir, "trt", ...)` after `lisa-trt build`.

    Raises:
        TensorRTUnavailableError / NoCudaDeviceError: what is missing, and the ORT alternative.
        CheckpointError: no engines built; ArtifactMismatchError: plans changed, built for another
        TensorRT / GPU, or for other artifacts than the given hashes.
    """
    require_tensorrt_gpu()
    return load_engines(engine_dir, "trt", target_hash=target_hash, drafter_hash=drafter_hash,
                        tables_hash=tables_hash, device=device, kv_binding=kv_binding, share_memory=share_memory)


__all__ = ["KV_BINDINGS", "TrtBackend", "TrtRunner", "TrtRuntimeError", "io_shapes", "load_trt_engines",
           "select_profile", "seq_capacity", "torch_dtype"]
