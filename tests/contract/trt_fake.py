"""A fake TensorRT native core for running Polygraphy's REAL loaders and lisa-trt's runners on CPU.

`make_fake_trt(version)` extends trt_core.make_core (the plugin-layer stand-in) with the builder,
ONNX parser and runtime surface that Polygraphy's `NetworkFromOnnxPath` / `CreateConfig` /
`EngineFromNetwork` / `SaveEngine` and `lisa_trt.engines.trt.TrtRunner` call. It enforces what
TensorRT enforces, each behaviour citing its source:

- parser: every node, standard ONNX domain included, first passes the parser's static checks
  (onnx-tensorrt onnxOpCheckers.cpp, transcribed in lisa_trt/engines/parser_checks.py: e.g.
  "Setting softmax precision is not supported in TensorRT Attention."); a failed check is a
  parser error and parse_from_file returns False. A node outside the standard ONNX domain is a
  plugin, found by EXACT (name, version, namespace) from its attributes (onnx-tensorrt FallbackPluginImporter; trt_core.import_plugin_node);
  "Plugin not found" otherwise. With NVIDIA's tensorrt.plugin loaded over the core (trt_core),
  the creator is the vendor's and the build runs its build-phase methods (build_plugin_layer).
- builder: every dynamic network input needs min <= opt <= max shapes of its rank in EVERY
  optimisation profile, static dims equal (NvInferRuntime.h IOptimizationProfile::setDimensions;
  builder error "optimization profile is missing values for input"); failure -> None from
  build_serialized_network (NvInfer.h buildSerializedNetwork: "nullptr on failure").
- engine: tensor names, modes, dtypes from the network (ICudaEngine::getTensorDataType);
  `get_aliased_input_tensor` only from 10.15 (NvInferRuntime.h ICudaEngine::getAliasedInputTensor),
  aliases only where the plan records them (IKVCacheUpdateLayer; never for ScatterElements).
- context: `set_input_shape` returns False outside the selected profile's [min, max] or with
  another rank (IExecutionContext::setInputShape: "false if ... out of bounds for the current
  optimization profile"); `set_tensor_address` False for an unknown name; `execute_async_v3`
  False when an input shape or address is unset (enqueueV3 preconditions). Outputs are TensorRT's
  memory during the enqueue and inputs may be read until it completes (IExecutionContext::
  setInputConsumedEvent: inputs may be reused only after that event): this fake first writes
  scratch into every output buffer the engine does NOT report as aliased, then reads the
  inputs, then writes the results. An input bound to the same memory as such an output is
  therefore corrupted, as it may be on a GPU. Each call is recorded in `Engine.calls` with the
  bytes it wrote to every output (`written`: the whole output tensor, or for an aliased output
  the elements the update changed), so a test can show which steps write a full KV cache.
"""

from __future__ import annotations

import collections
import ctypes
import sys
import enum
import importlib.machinery
import json
import types

import numpy as np

import trt_core
from trt_core import DataType

from lisa_trt.engines import parser_checks

ONNX_TO_TRT = {1: DataType.FLOAT, 10: DataType.HALF, 16: DataType.BF16, 6: DataType.INT32, 7: DataType.INT64,
               9: DataType.BOOL, 3: DataType.INT8, 2: DataType.UINT8}
NP = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT32: np.int32, DataType.INT64: np.int64,
      DataType.BOOL: np.bool_, DataType.INT8: np.int8, DataType.UINT8: np.uint8}
SCRATCH = {np.float32: np.nan, np.float16: np.nan, np.int64: -7, np.int32: -7, np.bool_: True}


class NetworkDefinitionCreationFlag(enum.IntEnum):  # NvInfer.h (10.x: kEXPLICIT_BATCH deprecated, kSTRONGLY_TYPED)
    EXPLICIT_BATCH = 0
    STRONGLY_TYPED = 1
    PREFER_JIT_PYTHON_PLUGINS = 2  # kPREFER_JIT_PYTHON_PLUGINS = 2
    PREFER_AOT_PYTHON_PLUGINS = 3  # kPREFER_AOT_PYTHON_PLUGINS = 3


class BuilderFlag(enum.IntEnum):  # NvInfer.h BuilderFlag (subset, 10.x values); TF32 is ON by default
    FP16 = 0
    INT8 = 1
    DEBUG = 2
    GPU_FALLBACK = 3
    REFIT = 4
    DISABLE_TIMING_CACHE = 5
    TF32 = 6
    SPARSE_WEIGHTS = 7
    OBEY_PRECISION_CONSTRAINTS = 9
    PREFER_PRECISION_CONSTRAINTS = 10
    DIRECT_IO = 11
    FP8 = 15
    BF16 = 17
    STRIP_PLAN = 19
    REFIT_IDENTICAL = 20
    WEIGHT_STREAMING = 21


class MemoryPoolType(enum.IntEnum):  # NvInfer.h MemoryPoolType
    WORKSPACE = 0
    DLA_MANAGED_SRAM = 1
    DLA_LOCAL_DRAM = 2
    DLA_GLOBAL_DRAM = 3
    TACTIC_DRAM = 4
    TACTIC_SHARED_MEMORY = 5


class TensorIOMode(enum.IntEnum):  # NvInferRuntime.h TensorIOMode
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class OnnxParserFlag(enum.IntEnum):  # NvOnnxParser.h OnnxParserFlag
    NATIVE_INSTANCENORM = 0


class ProfilingVerbosity(enum.IntEnum):
    LAYER_NAMES_ONLY = 0
    NONE = 1
    DETAILED = 2


class _Tensor:
    """INetworkDefinition ITensor: name, shape (-1 for dynamic), dtype, is_shape_tensor."""

    def __init__(self, name, dtype, shape, symbols):
        self.name, self.dtype, self.shape, self.symbols = name, dtype, trt_core.Dims(shape), symbols
        self.is_shape_tensor, self.is_execution_tensor, self.location = False, True, 0

    def __repr__(self):
        return f"ITensor({self.name}, {self.dtype.name}, {list(self.shape)})"


class Network:
    """INetworkDefinition after parsing: inputs/outputs and the plugin layers (parser side)."""

    def __init__(self, flags: int):
        self.flags, self.inputs, self.outputs, self.plugins, self.onnx = flags, [], [], [], None
        self.name, self.num_layers = "network", 0
        self.has_implicit_batch_dimension = False

    def get_flag(self, flag) -> bool:
        return bool(self.flags & (1 << int(flag)))

    @property
    def num_inputs(self):
        return len(self.inputs)

    @property
    def num_outputs(self):
        return len(self.outputs)

    def get_input(self, i):
        return self.inputs[i]

    def get_output(self, i):
        return self.outputs[i]

    def __iter__(self):
        return iter([])

    def __len__(self):
        return 0


class OnnxParser:
    """NvOnnxParser.h IParser: parse_from_file(path) -> bool; errors through num_errors / get_error."""

    def __init__(self, network, logger):
        self.network, self.logger, self.errors, self.flags = network, logger, [], 0

    def clear_flag(self, flag):
        self.flags &= ~(1 << int(flag))

    @property
    def num_errors(self):
        return len(self.errors)

    def get_error(self, i):
        return _ParserError(self.errors[i])

    def clear_errors(self):
        self.errors = []

    def parse_from_file(self, path) -> bool:
        import onnx

        model = onnx.load(str(path))  # external data next to the file, as the parser resolves it
        g = model.graph
        inits = {t.name for t in g.initializer}
        net = self.network
        net.onnx = str(path)
        for vi, dest in [(v, net.inputs) for v in g.input if v.name not in inits] + [(v, net.outputs) for v in g.output]:
            tt = vi.type.tensor_type
            if tt.elem_type not in ONNX_TO_TRT:
                self.errors.append(f"{vi.name}: ONNX element type {tt.elem_type} has no TensorRT type")
                continue
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            syms = [d.dim_param if not d.HasField("dim_value") else None for d in tt.shape.dim]
            dest.append(_Tensor(vi.name, ONNX_TO_TRT[tt.elem_type], dims, syms))
        self.errors += parser_checks.model_errors(model)  # every node, standard domain included
        core = self.core
        for node in g.node:
            if node.domain in ("", "ai.onnx"):
                continue
            try:
                plugin = trt_core.import_plugin_node(core, node)
            except Exception as e:  # noqa: BLE001 - the parser reports any import failure as an error
                self.errors.append(str(e))
                continue
            net.plugins.append((node, plugin))
        return not self.errors


class _ParserError:
    def __init__(self, msg):
        self.msg = msg

    def desc(self):
        return self.msg

    def code(self):
        return 8  # ErrorCode.kUNSUPPORTED_NODE

    def node(self):
        return -1

    def node_name(self):
        return ""

    def node_operator(self):
        return ""

    def file(self):
        return "fake"

    def line(self):
        return 0

    def func(self):
        return "parse"

    def local_function_stack(self):
        return []

    def local_function_stack_size(self):
        return 0

    def __str__(self):
        return self.msg


class OptimizationProfile:
    """IOptimizationProfile::setDimensions: false (Python: RuntimeError) unless min <= opt <= max elementwise."""

    def __init__(self):
        self.shapes = {}

    def set_shape(self, name, min, opt, max):
        mn, op, mx = (tuple(int(v) for v in s) for s in (min, opt, max))
        if not (len(mn) == len(op) == len(mx)) or any(not a <= b <= c for a, b, c in zip(mn, op, mx)):
            # pyFoundationalTypes / pyCore.cpp: a failed setDimensions is a RuntimeError in Python
            raise RuntimeError(f"IOptimizationProfile.set_shape({name}): needs min <= opt <= max of one rank, "
                             f"got {mn} {op} {mx}")
        self.shapes[name] = (mn, op, mx)

    def get_shape(self, name):
        return [trt_core.Dims(s) for s in self.shapes[name]]

    def __bool__(self):
        return True


class BuilderConfig:
    """IBuilderConfig: flags (TF32 set by default, NvInfer.h), profiles, pool limits, timing cache."""

    def __init__(self):
        self.flags = 1 << int(BuilderFlag.TF32)
        self.profiles, self.pool_limits, self.timing_cache = [], {}, None
        self.profiling_verbosity = ProfilingVerbosity.LAYER_NAMES_ONLY
        self.builder_optimization_level, self.avg_timing_iterations = 3, 1
        self.default_device_type, self.DLA_core, self.engine_capability = 0, -1, 0
        self.max_aux_streams, self.hardware_compatibility_level, self.runtime_platform = -1, 0, 0
        self.tiling_optimization_level, self.l2_limit_for_tiling, self.num_optimization_profiles = 0, -1, 0
        self.progress_monitor, self.algorithm_selector, self.int8_calibrator = None, None, None
        self.plugins_to_serialize = []

    def set_flag(self, f):
        self.flags |= 1 << int(f)

    def clear_flag(self, f):
        self.flags &= ~(1 << int(f))

    def get_flag(self, f) -> bool:
        return bool(self.flags & (1 << int(f)))

    def add_optimization_profile(self, p) -> int:
        self.profiles.append(p)
        self.num_optimization_profiles = len(self.profiles)
        return len(self.profiles) - 1

    def set_memory_pool_limit(self, pool, size):
        self.pool_limits[MemoryPoolType(pool)] = int(size)

    def get_memory_pool_limit(self, pool):
        return self.pool_limits.get(MemoryPoolType(pool), 1 << 40)

    def create_timing_cache(self, data=b""):
        return _TimingCache(bytes(data))

    def set_timing_cache(self, cache, ignore_mismatch=False) -> bool:
        self.timing_cache = cache
        return True

    def get_timing_cache(self):
        return self.timing_cache

    def get_preview_feature(self, f):
        return False

    def set_preview_feature(self, f, v):
        pass

    def get_tactic_sources(self):
        return 0

    def set_tactic_sources(self, s):
        return True


class _TimingCache:
    def __init__(self, data):
        self.data = data or b"fake-timing-cache"

    def serialize(self):
        return HostMemory(self.data)

    def combine(self, other, ignore_mismatch):
        return True


class HostMemory(bytes):  # IHostMemory: a buffer; tensorrt/__init__.py gives it __enter__ / __exit__
    @property
    def nbytes(self):
        return len(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


class Builder:
    """IBuilder: create_network(flags), create_builder_config(), create_optimization_profile(),
    build_serialized_network(network, config) -> IHostMemory or None (errors to the logger)."""

    def __init__(self, logger):
        self.logger = logger
        self.platform_has_fast_fp16 = self.platform_has_fast_int8 = True
        self.num_DLA_cores, self.max_DLA_batch_size = 0, 1

    def create_network(self, flags=0):
        return Network(int(flags))

    def create_builder_config(self):
        return BuilderConfig()

    def create_optimization_profile(self):
        return OptimizationProfile()

    def is_network_supported(self, network, config):
        return True

    def build_serialized_network(self, network, config):
        errors = self._check(network, config)
        if errors:
            for e in errors:
                self.logger.log(trt_core.Logger.ERROR, e)
            self.core.build_errors.extend(errors)
            return None
        core = self.core
        plugins = []
        for node, plugin in network.plugins:
            info = {"op": node.op_type, "domain": node.domain}
            if hasattr(plugin, "get_output_data_types"):  # the vendor's plugin: its build phase
                try:
                    info.update(_build_plugin(node, plugin, network, config))
                except Exception as e:  # noqa: BLE001 - the builder reports a plugin failure and returns None
                    core.build_errors.append(f"plugin {node.op_type}: {type(e).__name__}: {e}")
                    self.logger.log(trt_core.Logger.ERROR, core.build_errors[-1])
                    return None
            plugins.append(info)
        plan = {"fake_tensorrt": core.__version__, "onnx": network.onnx,
                "inputs": [[t.name, int(t.dtype), list(t.shape)] for t in network.inputs],
                "outputs": [[t.name, int(t.dtype), list(t.shape)] for t in network.outputs],
                "profiles": [{n: [list(s) for s in v] for n, v in p.shapes.items()} for p in config.profiles],
                "tf32": config.get_flag(BuilderFlag.TF32), "refit": config.get_flag(BuilderFlag.REFIT),
                # 11.x: strongly typed whatever the (kept, ignored) flag says
                "strongly_typed": core.version_tuple >= (11, 0)
                or network.get_flag(NetworkDefinitionCreationFlag.STRONGLY_TYPED),
                "strongly_typed_flag": network.get_flag(NetworkDefinitionCreationFlag.STRONGLY_TYPED),  # as set
                "workspace": config.pool_limits.get(MemoryPoolType.WORKSPACE), "plugins": plugins,
                "aliases": core.plan_aliases(network)}
        core.builds.append(plan)
        return HostMemory(json.dumps(plan).encode())

    def _check(self, network, config) -> list:
        errors = []
        dynamic = [t for t in network.inputs if -1 in t.shape]
        if dynamic and not config.profiles:
            return ["Network has dynamic or shape inputs, but no optimization profile has been defined."]
        for k, p in enumerate(config.profiles):
            for t in network.inputs:
                if t.name not in p.shapes:
                    if -1 in t.shape:
                        errors.append(f"optimization profile {k} is missing values for input {t.name}")
                    continue
                for s in p.shapes[t.name]:
                    if len(s) != len(t.shape) or any(d != -1 and d != v for d, v in zip(t.shape, s)):
                        errors.append(f"profile {k}: {t.name} shape {s} does not match the network's "
                                      f"{list(t.shape)}")
                        break
        return errors


def _build_plugin(node, plugin, network, config) -> dict:
    """Run the vendor plugin's build phase with the plugin inputs' types / dims from the ONNX graph."""
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(network.onnx), strict_mode=False)
    g = model.graph
    info = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        info[vi.name] = (tt.elem_type, [d.dim_value if d.HasField("dim_value") else d.dim_param
                                        for d in tt.shape.dim])
    for t in g.initializer:
        info[t.name] = (t.data_type, list(t.dims))
    env = {}
    prof = config.profiles[0].shapes
    for t in network.inputs:
        for j, sym in enumerate(t.symbols):
            if sym and t.name in prof:
                env[sym] = tuple(prof[t.name][k][j] for k in range(3))
    inputs = [(ONNX_TO_TRT[info[n][0]], tuple(info[n][1])) for n in node.input]
    r = trt_core.build_plugin_layer(plugin, inputs, "opt", env)
    return {"launch": r.get("launch"), "extra_args": r.get("extra_args"),
            "kernel": r["kernel"][0].decode() if "kernel" in r else None}


# ----------------------------------------------------------------------------- runtime

def _view(ptr: int, shape, dtype) -> np.ndarray:
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer((ctypes.c_char * n).from_address(ptr), dtype=dtype).reshape(shape)


def _bytes_written(dst: np.ndarray, result: np.ndarray, aliased: bool) -> int:
    """Bytes one execution writes to an output buffer. A layer's output tensor is written whole
    (every TensorRT layer but the in-place cache update owns its output); an output the engine
    aliases to its input (IKVCacheUpdateLayer, NvInfer.h of TensorRT 10.15+; reported by
    ICudaEngine::getAliasedInputTensor) is written only where the update lands, counted here as
    the elements that change (a lower bound of the update's rows: a row rewritten with its old
    value is not seen)."""
    if not aliased:
        return int(result.nbytes)
    changed = np.asarray(dst != result)
    if np.issubdtype(result.dtype, np.floating):
        changed &= ~(np.isnan(dst) & np.isnan(result))
    return int(changed.sum()) * result.dtype.itemsize


class Engine:
    """ICudaEngine over a fake plan: runs the plan's ONNX graph in ONNX Runtime (the GASV plugin
    graph through graph_rewrite.emulate_trt_variant)."""

    def __init__(self, core, plan: bytes):
        d = json.loads(bytes(plan))
        self.core, self.plan = core, d
        self.inputs = [n for n, _, _ in d["inputs"]]
        self.outputs = [n for n, _, _ in d["outputs"]]
        self.dtypes = {n: DataType(t) for n, t, _ in d["inputs"] + d["outputs"]}
        self.static = {n: s for n, _, s in d["inputs"]}
        self.profiles = d["profiles"]
        self.num_optimization_profiles = len(self.profiles)
        self.aliases = dict(d.get("aliases") or {})
        self._runner = None  # ONNX Runtime session made on first execute (EngineFromNetwork deserializes too)
        self.calls = []
        core.engines.append(self)
        if core.version_tuple >= (10, 15):  # ICudaEngine::getAliasedInputTensor (TensorRT 10.15+)
            self.get_aliased_input_tensor = lambda name: self.aliases.get(name)

    def _run(self, feeds):
        if self._runner is None:
            import onnx
            import onnxruntime as ort

            from lisa_trt.engines.plugins import graph_rewrite as gr

            path = self.plan["onnx"]
            model = onnx.load(path)
            if gr.plugin_nodes(model):
                self._runner = lambda f: gr.emulate_trt_variant(model, *(f[n] for n in gr.GRAPH_INPUTS))
            else:
                sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
                self._runner = lambda f: dict(zip(self.outputs, sess.run(self.outputs, f)))
        return self._runner(feeds)

    @property
    def num_io_tensors(self):
        return len(self.inputs) + len(self.outputs)

    def get_tensor_name(self, i):
        return (self.inputs + self.outputs)[i]

    def get_tensor_mode(self, name):
        return TensorIOMode.INPUT if name in self.inputs else TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name):
        return self.dtypes[name]

    def get_tensor_profile_shape(self, name, k):
        return [trt_core.Dims(s) for s in self.profiles[k][name]]

    def get_device_memory_size_for_profile_v2(self, i):
        """ICudaEngine::getDeviceMemorySizeForProfileV2: the context memory a profile needs; here 4 bytes
        per element of every input at the profile's max shape, in 256-byte units (a stand-in that
        grows with the profile, so a runner sizing its buffer from another profile is caught)."""
        n = sum(int(np.prod(mx)) for _, _, mx in self.profiles[i].values()) * 4
        return -(-n // 256) * 256

    @property
    def device_memory_size_v2(self):  # ICudaEngine::getDeviceMemorySizeV2: the maximum over profiles
        return max(self.get_device_memory_size_for_profile_v2(i) for i in range(self.num_optimization_profiles))

    def create_execution_context(self, strategy=None):
        self.core.counters["create_execution_context"] += 1
        return Context(self, strategy)

    def serialize(self):
        return HostMemory(json.dumps(self.plan).encode())


class Context:
    """IExecutionContext (see the module docstring for what it enforces)."""

    def __init__(self, engine, strategy):
        self.engine, self.strategy, self.profile, self.memory = engine, strategy, 0, None
        self.shapes, self.addr = {}, {}

    def set_device_memory(self, ptr, size):
        """IExecutionContext::setDeviceMemoryV2(memory, size): the size must cover the engine's need
        (checked at enqueue for the active profile, as TensorRT validates it there)."""
        self.engine.core.counters["set_device_memory"] += 1
        self.memory = (int(ptr), int(size))

    def set_optimization_profile_async(self, i, stream) -> bool:
        if not 0 <= i < self.engine.num_optimization_profiles:
            return False
        self.profile, self.shapes = i, {}
        return True

    def set_input_shape(self, name, shape) -> bool:
        e = self.engine
        e.core.counters["set_input_shape"] += 1
        e.core.binds.append(("shape", name))
        if name not in e.inputs:
            return False
        shape = tuple(int(v) for v in shape)
        static = e.static[name]
        if len(shape) != len(static) or any(s != -1 and s != v for s, v in zip(static, shape)):
            return False
        if name in e.profiles[self.profile]:
            mn, _, mx = e.profiles[self.profile][name]
            if any(not a <= v <= b for a, v, b in zip(mn, shape, mx)):
                return False
        self.shapes[name] = shape
        return True

    def set_tensor_address(self, name, ptr) -> bool:
        self.engine.core.counters["set_tensor_address"] += 1
        self.engine.core.binds.append(("address", name))
        if name not in self.engine.inputs + self.engine.outputs:
            return False
        self.addr[name] = int(ptr)
        return True

    def execute_async_v3(self, stream) -> bool:
        e = self.engine
        if any(n not in self.shapes or n not in self.addr for n in e.inputs) or \
                any(n not in self.addr for n in e.outputs):
            return False
        if self.strategy == e.core.ExecutionContextAllocationStrategy.USER_MANAGED and (
                self.memory is None or self.memory[1] < e.get_device_memory_size_for_profile_v2(self.profile)):
            return False  # USER_MANAGED: no (or too small) device memory for the active profile
        feeds_shapes = dict(self.shapes)
        out_shapes = {}
        # outputs are TensorRT's memory during the enqueue: scratch goes there before the inputs are read
        probe = e._run({n: _view(self.addr[n], feeds_shapes[n], NP[e.dtypes[n]]).copy() for n in e.inputs}) \
            if e.core.poison_outputs else None
        if probe is not None:
            for n in e.outputs:
                if n in e.aliases:
                    continue
                out_shapes[n] = np.asarray(probe[n]).shape
                dt = NP[e.dtypes[n]]
                _view(self.addr[n], out_shapes[n], dt)[...] = SCRATCH.get(dt, 0)
        feeds = {n: _view(self.addr[n], feeds_shapes[n], NP[e.dtypes[n]]).copy() for n in e.inputs}
        outs = e._run(feeds)
        written = {}
        for n in e.outputs:
            arr = np.asarray(outs[n])
            dst = _view(self.addr[n], arr.shape, NP[e.dtypes[n]])
            written[n] = _bytes_written(dst, arr, n in e.aliases)
            dst[...] = arr
        e.core.counters["execute_async_v3"] += 1
        e.calls.append({"profile": self.profile, "shapes": dict(self.shapes), "addr": dict(self.addr),
                        "written": written})
        return True


class Runtime:
    def __init__(self, logger):
        self.logger = logger

    def deserialize_cuda_engine(self, plan):
        core = self.core
        if not core.plugins_initialised:
            raise AssertionError("deserialize_cuda_engine before init_libnvinfer_plugins")
        return Engine(core, plan)


def make_fake_trt(version: str = "10.14.1.48.post1", *, poison_outputs: bool = True) -> types.ModuleType:
    """A fake `tensorrt` module: trt_core's plugin-layer stand-in plus builder / parser / runtime."""
    core = trt_core.make_core(version)
    core.__spec__ = importlib.machinery.ModuleSpec("tensorrt", loader=None)  # Polygraphy's is_installed()
    core.version_tuple = tuple(int(x) for x in version.split(".")[:2])
    core.engines, core.builds, core.build_errors = [], [], []
    # binding calls the runtime makes (set_tensor_address, set_input_shape, set_device_memory, ...) and
    # each binding's (kind, tensor name) in order: what a test counts per step
    core.counters, core.binds = collections.Counter(), []
    core.poison_outputs, core.plugins_initialised = poison_outputs, False
    core.plan_aliases = lambda network: {}  # no output of the new-rows graphs aliases an input
    flags = NetworkDefinitionCreationFlag
    if core.version_tuple >= (11, 0):
        # TensorRT 11: strongly typed only; kSTRONGLY_TYPED is kept for API compatibility, deprecated and
        # ignored (TensorRT 11 Python API Builder page / NvInfer.h), kEXPLICIT_BATCH is gone. Values kept
        # at 10.x's (Polygraphy and lisa-trt read the flags by name).
        flags = enum.IntEnum("NetworkDefinitionCreationFlag", {"STRONGLY_TYPED": 1, "PREFER_JIT_PYTHON_PLUGINS": 2,
                                                               "PREFER_AOT_PYTHON_PLUGINS": 3})
    core.NetworkDefinitionCreationFlag = flags
    for cls in (BuilderFlag, MemoryPoolType, TensorIOMode, OnnxParserFlag, ProfilingVerbosity):
        setattr(core, cls.__name__, cls)
    core.ExecutionContextAllocationStrategy = types.SimpleNamespace(STATIC=0, ON_PROFILE_CHANGE=1, USER_MANAGED=2)
    core.DeviceType = types.SimpleNamespace(GPU=0, DLA=1)
    core.LayerType = types.SimpleNamespace(QUANTIZE=1, DEQUANTIZE=2, PLUGIN_V3=3)
    core.fp8 = None
    base_logger = trt_core.Logger

    class Logger(base_logger):
        Severity = types.SimpleNamespace(INTERNAL_ERROR=0, ERROR=1, WARNING=2, INFO=3, VERBOSE=4)

        def __init__(self, min_severity=base_logger.WARNING):
            super().__init__(min_severity)
            self.core = core

    core.Logger = core.ILogger = Logger

    def init_libnvinfer_plugins(logger, namespace):  # pyCore.cpp: registers the standard plugins -> bool
        core.plugins_initialised = True
        return True

    core.init_libnvinfer_plugins = init_libnvinfer_plugins
    # bound to this core (Polygraphy caches its logger across modules, so the core is not found through it)
    core.Builder = type("Builder", (Builder,), {"core": core})
    core.OnnxParser = type("OnnxParser", (OnnxParser,), {"core": core})
    core.Runtime = type("Runtime", (Runtime,), {"core": core})
    core.IBuilderConfig, core.INetworkDefinition, core.ICudaEngine, core.IHostMemory = (
        BuilderConfig, Network, Engine, HostMemory)
    core.IOptimizationProfile, core.IExecutionContext = OptimizationProfile, Context
    return core


def reset_polygraphy_trt() -> int:
    """Make Polygraphy import `tensorrt` again on next use.

    Polygraphy's lazy modules (polygraphy.mod.importer LazyModule) keep the module they imported
    first; a test that installs a new fake core must drop that reference (also after the test,
    so no later test sees a stale fake). Returns how many references were dropped."""
    n = 0
    for name, m in list(sys.modules.items()):
        if not name.startswith("polygraphy") or m is None:
            continue
        for v in list(vars(m).values()):
            if type(v).__name__ == "LazyModule":
                held = object.__getattribute__(v, "__dict__").get("module")
                if held is not None and getattr(held, "__name__", "") == "tensorrt":
                    object.__setattr__(v, "module", None)
                    n += 1
    util = sys.modules.get("polygraphy.backend.trt.util")
    if util is not None and hasattr(util, "TRT_LOGGER"):
        util.TRT_LOGGER = None
    return n
