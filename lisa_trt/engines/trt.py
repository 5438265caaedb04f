"""TensorRT runners over a built engine directory (engines/base.py protocols).

`TrtTarget` / `TrtDrafter` (and `TrtGASV`, `TrtVQDecoder`) mirror the ONNX Runtime runners in
engines/ort.py and the torch `Transformer` / `Drafter`: same methods, shapes, KVCache objects.

    engines = load_trt_engines("engines/demo")        # after `lisa-trt build engines/demo`
    cache = engines.target.new_cache(2, extra=60)
    out = engines.target.prefill(cond, cache, taps=True)

How a call runs (TrtGraph):
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
from typing import NamedTuple, Optional

import torch

from ..errors import InputError, LisaError
from ..export.io_spec import Graph, GraphSpec, export_dims
from .base import GraphGASV, GraphVQDecoder, StaticCacheDrafter, StaticCacheTarget
from .build import ProfileSpec, load_plan, require_tensorrt_gpu

KV_BINDINGS = ("inplace", "swap")
_TORCH_DTYPES = {"int64": torch.int64, "bool": torch.bool, "float32": torch.float32}
_LOGGER = None


class TrtRuntimeError(LisaError):
    """TensorRT refused a call (shape outside every profile, failed enqueue)."""


# ----------------------------------------------------------------------------- pure helpers

def torch_dtype(code: str, precision: str) -> torch.dtype:
    """io-spec dtype code -> torch dtype ("act" is the export precision)."""
    if code == "act":
        return torch.float16 if precision == "fp16" else torch.float32
    return _TORCH_DTYPES[code]


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


def _contig(t: torch.Tensor, dtype, device) -> torch.Tensor:
    return t.to(device=device, dtype=dtype).contiguous()


def _check_step(tokens, positions, slots, mask, batch: int, max_len: int) -> None:
    B, S = tokens.shape
    if tuple(positions.shape) != (B, S) or tuple(slots.shape) != (B, S) or tuple(mask.shape) != (B, S, max_len):
        raise InputError(f"tokens {tuple(tokens.shape)}, positions {tuple(positions.shape)}, slots "
                         f"{tuple(slots.shape)} and mask {tuple(mask.shape)} do not fit (B, S), (B, S), (B, S), "
                         f"(B, S, Lmax={max_len})")
    if B != batch:
        raise InputError(f"batch {B} does not match the cache batch {batch}")
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= max_len):
        raise InputError(f"cache slots must lie in [0, {max_len}); got {int(slots.min())}..{int(slots.max())}")


def _check_cache(cache, shape: tuple, dtype, device, what: str) -> None:
    for buf in cache.k + cache.v:
        if tuple(buf.shape) != shape or buf.dtype != dtype or buf.device != device or not buf.is_contiguous():
            raise InputError(f"{what} cache buffer {tuple(buf.shape)} {buf.dtype} on {buf.device} does not fit the "
                             f"engine ({shape} {dtype} on {device}, contiguous); make it with the engine's new_cache")


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


class TrtGraph:
    """One deserialized engine with an execution context per optimisation profile.

    Args:
        engine_dir: the engine directory.
        graph: which graph.
        device: CUDA device of every bound tensor.
        share_memory: let the per-profile contexts share one activation buffer.
    """

    def __init__(self, engine_dir, graph: Graph, device, *, share_memory: bool = True):
        trt = require_tensorrt_gpu()
        self.trt, self.graph, self.device = trt, graph, torch.device(device)
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

    def run(self, inputs: dict, outputs: dict) -> None:
        """Bind torch CUDA tensors by address and enqueue on the current torch stream.

        Args:
            inputs: {input name: contiguous tensor}, every engine input.
            outputs: {output name: contiguous tensor of the output's shape}, every output
                (KV outputs: the same tensor as their past input for in-place updates).
        """
        missing = [n for n in self.inputs if n not in inputs] + [n for n in self.outputs if n not in outputs]
        if missing:
            raise TrtRuntimeError(f"{self.graph.value}: tensors {missing} are not bound")
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


# ----------------------------------------------------------------------------- shared base

class _TrtRunner:
    def __init__(self, manifest, *, device=None, kv_binding: str = "inplace", share_memory: bool = True):
        if kv_binding not in KV_BINDINGS:
            raise InputError(f"kv_binding must be one of {KV_BINDINGS}, got {kv_binding!r}")
        require_tensorrt_gpu()
        self.manifest = manifest
        self.dir = Path(manifest.dir)
        self.device = torch.device(device or "cuda")
        self.kv_binding, self.share_memory = kv_binding, share_memory
        self.dtype = torch_dtype("act", manifest.precision)
        self.max_cache_len = manifest.max_cache_len
        self.dims = export_dims(manifest.target_config, max_cache_len=manifest.max_cache_len,
                                drafter_cfg=manifest.drafter_config, vq_cfg=manifest.vq_config)
        self._shadow = {}

    def _graph(self, graph: Graph) -> TrtGraph:
        return TrtGraph(self.dir, graph, self.device, share_memory=self.share_memory)

    def _bind_kv(self, runner: TrtGraph, cache, n_layer: int, inputs: dict, outputs: dict) -> list:
        """Bind the cache buffers; returns the (layer, part, shadow) swaps to apply after the call."""
        swaps = []
        for i in range(n_layer):
            for part, bufs in (("key", cache.k), ("value", cache.v)):
                past, present = f"past_key_values.{i}.{part}", f"present.{i}.{part}"
                inputs[past] = bufs[i]
                if self.kv_binding == "inplace" or present in runner.aliased:
                    outputs[present] = bufs[i]
                else:
                    key = (id(runner), present, tuple(bufs[i].shape))
                    shadow = self._shadow.get(key)
                    if shadow is None:
                        shadow = self._shadow[key] = torch.empty_like(bufs[i])
                    outputs[present] = shadow
                    swaps.append((bufs, i, key))
        return swaps

    def _apply_swaps(self, swaps: list) -> None:
        for bufs, i, key in swaps:  # the engine wrote the updated cache into the shadow buffer
            bufs[i], self._shadow[key] = self._shadow[key], bufs[i]


# ----------------------------------------------------------------------------- target

class TrtTarget(StaticCacheTarget, _TrtRunner):
    """The target through TensorRT (TargetEngine protocol; drop-in for `Transformer`).

    Args:
        manifest: the engine directory's Manifest (after `lisa-trt build`).
        device: CUDA device (default the current one).
        kv_binding: "inplace" (past and present share the buffer) or "swap" (double buffer).
        share_memory: per-profile contexts share one activation buffer.
    """

    def __init__(self, manifest, **kw):
        super().__init__(manifest, **kw)
        self.config = manifest.target_config
        self.hash = manifest.target_hash
        self._prefill = self._graph(Graph.TARGET_PREFILL)
        self._verify = self._graph(Graph.TARGET_VERIFY)
        self.max_tree = seq_capacity(self._verify.profiles)
        self.load_conditions(manifest)

    def _outputs(self, B: int, S: int) -> dict:
        cfg, dev = self.config, self.device
        return dict(logits=torch.empty(B, S, cfg.vocab_size, dtype=torch.float32, device=dev),
                    taps=torch.empty(B, S, 3 * cfg.dim, dtype=self.dtype, device=dev),
                    hidden=torch.empty(B, S, cfg.dim, dtype=self.dtype, device=dev))

    def _cache_ok(self, cache) -> None:
        cfg = self.config
        _check_cache(cache, (cache.batch, cfg.kv_heads, self.max_cache_len, cfg.head_dim), self.dtype, self.device,
                     "target")

    # -- entry points ---------------------------------------------------------------------

    def prefill(self, cond, cache, taps: bool = False):
        """Write the condition prefix into the cache; logits of the last prefix position."""
        inputs, out = self._prefill_io(cond, cache)
        self._cache_ok(cache)
        swaps = self._bind_kv(self._prefill, cache, self.config.n_layer, inputs, out)
        self._prefill.run(inputs, out)
        self._apply_swaps(swaps)
        return self._prefill_done(cache, out, taps)

    def forward_tokens(self, tokens, positions, slots, mask, cache, taps: bool = False):
        """New tokens at absolute `positions`, K/V written at cache `slots` (see Transformer)."""
        from ..models.llamagen import TargetOutput
        from .ort import check_positions, check_tokens

        _check_step(tokens, positions, slots, mask, cache.batch, self.max_cache_len)
        check_positions(positions, self.config.seq_len)
        check_tokens(tokens, self.config.vocab_size)
        self._cache_ok(cache)
        dev = self.device
        inputs = dict(input_ids=_contig(tokens, torch.int64, dev), position_ids=_contig(positions, torch.int64, dev),
                      cache_slots=_contig(slots, torch.int64, dev), attention_mask=_contig(mask, torch.bool, dev))
        B, S = tokens.shape
        out = self._outputs(B, S)
        swaps = self._bind_kv(self._verify, cache, self.config.n_layer, inputs, out)
        self._verify.run(inputs, out)
        self._apply_swaps(swaps)
        return TargetOutput(out["logits"], out["taps"] if taps else None, out["hidden"])




# ----------------------------------------------------------------------------- drafter

class TrtDrafter(StaticCacheDrafter, _TrtRunner):
    """The EAGLE-3 drafter through TensorRT (DrafterEngine protocol; drop-in for `Drafter`).

    Args: as TrtTarget.
    """

    def __init__(self, manifest, **kw):
        super().__init__(manifest, **kw)
        self.config = manifest.drafter_config
        if self.config is None:
            raise InputError(f"{manifest.dir} has no drafter graphs; export with a drafter")
        self.hash = manifest.drafter["hash"]
        self._project = self._graph(Graph.DRAFTER_PROJECT)
        self._step = self._graph(Graph.DRAFTER_STEP)

    def project_taps(self, taps: torch.Tensor) -> torch.Tensor:
        """fc on the target taps: (B, S, 3H_t) -> (B, S, hidden)."""
        B, S, _ = taps.shape
        out = torch.empty(B, S, self.config.hidden, dtype=self.dtype, device=self.device)
        self._project.run(dict(taps=_contig(taps, self.dtype, self.device)), dict(hidden=out))
        return out

    def forward(self, hidden_in, tokens, positions, slots, mask, cache):
        """One drafter step; returns (logits (B, S, V) fp32, hidden_out (B, S, hidden))."""
        from .ort import check_positions, check_tokens

        cfg, dev = self.config, self.device
        _check_step(tokens, positions, slots, mask, cache.batch, self.max_cache_len)
        check_tokens(tokens, cfg.vocab_size)
        check_positions(positions, cfg.seq_len)
        _check_cache(cache, (cache.batch, cfg.n_head, self.max_cache_len, cfg.head_dim), self.dtype, dev, "drafter")
        B, S = tokens.shape
        inputs = dict(hidden_in=_contig(hidden_in, self.dtype, dev), input_ids=_contig(tokens, torch.int64, dev),
                      position_ids=_contig(positions, torch.int64, dev), cache_slots=_contig(slots, torch.int64, dev),
                      attention_mask=_contig(mask, torch.bool, dev))
        out = dict(logits=torch.empty(B, S, cfg.vocab_size, dtype=torch.float32, device=dev),
                   hidden=torch.empty(B, S, cfg.hidden, dtype=self.dtype, device=dev))
        swaps = self._bind_kv(self._step, cache, 1, inputs, out)
        self._step.run(inputs, out)
        self._apply_swaps(swaps)
        return out["logits"], out["hidden"]

    __call__ = forward


# ----------------------------------------------------------------------------- GASV, VQ

class TrtGASV(GraphGASV, _TrtRunner):
    """The GASV engine (the lisa::gasv plugin graph): GASV v2 per-node gates -> GASVGates."""

    def __init__(self, manifest, **kw):
        super().__init__(manifest, **kw)
        self.config = manifest.gasv_config
        if self.config is None:
            raise InputError(f"{manifest.dir} has no GASV graph; export with --tables")
        from .plugins import trt_plugin as tp

        tp.register()  # JIT plugins need the registration at run time; AOT ones do not mind
        self._run = self._graph(Graph.GASV)
        self.vocab_size = manifest.tables["vocab_size"]


class TrtVQDecoder(GraphVQDecoder, _TrtRunner):
    """The VQ decoder engine: token ids (B, h*w) -> images (B, 3, H, W) in about [-1, 1]."""

    def __init__(self, manifest, **kw):
        super().__init__(manifest, **kw)
        self.config = manifest.vq_config
        self.grid = manifest.target_config.grid_size
        self._run = self._graph(Graph.VQ_DECODE)


class TrtEngines(NamedTuple):
    target: TrtTarget
    drafter: Optional[TrtDrafter]
    gasv: Optional[TrtGASV]
    vq: Optional[TrtVQDecoder]
    manifest: object


def load_trt_engines(engine_dir, *, device=None, kv_binding: str = "inplace", share_memory: bool = True,
                     target_hash: Optional[str] = None, drafter_hash: Optional[str] = None,
                     tables_hash: Optional[str] = None) -> TrtEngines:
    """Open every built engine of an engine directory (after `lisa-trt build`).

    Raises:
        TensorRTUnavailableError / NoCudaDeviceError: what is missing, and the ORT alternative.
        CheckpointError: no engines built; ArtifactMismatchError: plans changed, built for another
        TensorRT / GPU, or for other artifacts than the given hashes.
    """
    from ..export.manifest import read_manifest

    require_tensorrt_gpu()
    man = read_manifest(engine_dir, target_hash=target_hash, drafter_hash=drafter_hash, tables_hash=tables_hash)
    kw = dict(device=device, kv_binding=kv_binding, share_memory=share_memory)
    return TrtEngines(
        target=TrtTarget(man, **kw),
        drafter=TrtDrafter(man, **kw) if man.has(Graph.DRAFTER_STEP) else None,
        gasv=TrtGASV(man, **kw) if man.has(Graph.GASV) else None,
        vq=TrtVQDecoder(man, **kw) if man.has(Graph.VQ_DECODE) else None,
        manifest=man)


__all__ = ["KV_BINDINGS", "TrtDrafter", "TrtEngines", "TrtGASV", "TrtGraph", "TrtRuntimeError", "TrtTarget",
           "TrtVQDecoder", "io_shapes", "load_trt_engines", "select_profile", "seq_capacity",
           "torch_dtype"]
