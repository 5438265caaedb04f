"""A minimal stand-in for TensorRT's compiled core (`tensorrt.so`), under NVIDIA's pure-Python layer.

The `tensorrt-cu12-bindings` wheel ships `tensorrt_bindings/plugin/*.py` (the `tensorrt.plugin`
package: validators, registry glue, ShapeExpr / SymInt semantics, the plugin template classes
and their `get_launch_params`) next to `tensorrt.so`, which needs libnvinfer. `load_vendor_plugin`
runs those vendor modules unchanged over `make_core()`: enums, base classes, the plugin registry,
and the dimension-expression objects they wrap. Every piece cites the header / binding it follows
(NVIDIA/TensorRT `include/NvInferRuntime.h`, `include/NvInferRuntimeBase.h`,
`include/NvInferPluginBase.h`, `python/src/infer/pyPlugin.cpp`, `pyCore.cpp`); nothing here
decides what the vendor code decides.

`import_plugin_node` + `build_plugin_layer` drive a plugin the way TensorRT's ONNX parser and
builder do (onnx-tensorrt `onnxOpCheckers.cpp` / `importerUtils.cpp` / `onnxOpImporters.cpp`;
the IPluginV3 build-phase call order of NvInferRuntime.h), so a wrong plugin version, a missing
field, a bad shape expression or a launch-parameter error fails here as it would in a build.
"""

from __future__ import annotations

import enum
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np

from lisa_trt.engines.parser_checks import node_attrs as _attrs

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "trt-bindings"
# The versions .ci/run downloads: the oldest TensorRT lisa-trt supports and the newest 11.x.
VERSIONS = ("10.14.1.48.post1", "11.4.0.106")


class ParserError(RuntimeError):
    """What TensorRT's ONNX parser reports for a node it cannot import."""


def plugin_dir(version: str) -> Path:
    return CACHE / version / "tensorrt_bindings" / "plugin"


# ----------------------------------------------------------------------------- enums

class DataType(enum.IntEnum):  # NvInferRuntimeBase.h enum class DataType (values as declared)
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    FP8 = 6
    BF16 = 7
    INT64 = 8
    INT4 = 9


_NP = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT8: np.int8, DataType.INT32: np.int32,
       DataType.BOOL: np.bool_, DataType.UINT8: np.uint8, DataType.INT64: np.int64}


class TensorFormat(enum.IntEnum):  # NvInferRuntime.h enum class TensorFormat (kLINEAR = 0 ...)
    LINEAR = 0
    CHW2 = 1
    HWC8 = 2
    CHW4 = 3
    CHW16 = 4
    CHW32 = 5


class PluginFieldType(enum.IntEnum):  # NvInferPluginBase.h enum class PluginFieldType
    FLOAT16 = 0
    FLOAT32 = 1
    FLOAT64 = 2
    INT8 = 3
    INT16 = 4
    INT32 = 5
    CHAR = 6
    DIMS = 7
    UNKNOWN = 8
    BF16 = 9
    INT64 = 10
    FP8 = 11
    INT4 = 12


_FIELD_NP = {PluginFieldType.FLOAT16: np.float16, PluginFieldType.FLOAT32: np.float32,
             PluginFieldType.FLOAT64: np.float64, PluginFieldType.INT8: np.int8, PluginFieldType.INT16: np.int16,
             PluginFieldType.INT32: np.int32, PluginFieldType.INT64: np.int64}


class PluginArgType(enum.IntEnum):  # NvInferRuntime.h enum class PluginArgType (10.9+)
    INT = 0


class PluginArgDataType(enum.IntEnum):  # NvInferRuntime.h enum class PluginArgDataType
    INT8 = 0
    INT16 = 1
    INT32 = 2


class DimensionOperation(enum.IntEnum):  # NvInferRuntime.h enum class DimensionOperation
    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    SUB = 4
    EQUAL = 5
    LESS = 6
    FLOOR_DIV = 7
    CEIL_DIV = 8


class TensorRTPhase(enum.IntEnum):  # NvInferPluginBase.h enum class TensorRTPhase
    BUILD = 0
    RUNTIME = 1


class QuickPluginCreationRequest(enum.IntEnum):  # NvInferRuntime.h (10.9+): its presence enables AOT in _export.py
    UNKNOWN = 0
    PREFER_JIT = 1
    PREFER_AOT = 2
    STRICT_JIT = 3
    STRICT_AOT = 4


# ----------------------------------------------------------------------------- dimension expressions

_OPS = {DimensionOperation.SUM: lambda a, b: a + b, DimensionOperation.PROD: lambda a, b: a * b,
        DimensionOperation.MAX: max, DimensionOperation.MIN: min, DimensionOperation.SUB: lambda a, b: a - b,
        DimensionOperation.EQUAL: lambda a, b: int(a == b), DimensionOperation.LESS: lambda a, b: int(a < b),
        DimensionOperation.FLOOR_DIV: lambda a, b: a // b, DimensionOperation.CEIL_DIV: lambda a, b: -(-a // b)}


class IDimensionExpr:
    """NvInferRuntime.h IDimensionExpr: isConstant(), getConstantValue() (a constant's value; the
    value is undefined otherwise, so it raises here), isSizeTensor(). Expressions are built only
    by IExprBuilder; `evaluate(env)` gives the value for concrete input dims (test side)."""

    def __init__(self, value=None, symbol=None, op=None, args=()):
        self._value, self._symbol, self._op, self._args = value, symbol, op, tuple(args)

    def is_constant(self) -> bool:
        return self._value is not None

    def get_constant_value(self) -> int:
        if self._value is None:
            raise RuntimeError("getConstantValue() of a non-constant IDimensionExpr (NvInferRuntime.h: undefined)")
        return self._value

    def is_size_tensor(self) -> bool:
        return False

    def evaluate(self, env: dict) -> int:
        if self._value is not None:
            return self._value
        if self._symbol is not None:
            return env[self._symbol]
        return _OPS[self._op](*(a.evaluate(env) for a in self._args))

    def __repr__(self):
        return f"Dim({self._value if self._value is not None else self._symbol or self._op.name})"


class IExprBuilder:
    """NvInferRuntime.h IExprBuilder: constant(value), operation(op, first, second) (constant
    operands fold to a constant, as TensorRT does), declareSizeTensor."""

    def constant(self, value: int) -> IDimensionExpr:
        if not isinstance(value, (int, np.integer)):
            raise TypeError(f"IExprBuilder.constant takes an int, got {type(value).__name__}")
        return IDimensionExpr(value=int(value))

    def operation(self, op, first, second) -> IDimensionExpr:
        if not (isinstance(first, IDimensionExpr) and isinstance(second, IDimensionExpr)):
            raise TypeError(f"IExprBuilder.operation takes two IDimensionExpr, got {type(first).__name__}, "
                            f"{type(second).__name__}")
        op = DimensionOperation(op)
        if first.is_constant() and second.is_constant():
            return IDimensionExpr(value=_OPS[op](first.get_constant_value(), second.get_constant_value()))
        return IDimensionExpr(op=op, args=(first, second))

    def declare_size_tensor(self, output_index, opt, upper):
        raise NotImplementedError("size tensors are not used by lisa plugins")


class DimsExprs(list):
    """NvInferRuntime.h DimsExprs (nbDims expressions); pyPlugin.cpp makes it indexable."""

    def __init__(self, n=0):
        super().__init__([None] * int(n))


class Dims(list):
    """NvInferRuntimeBase.h Dims; MAX_DIMS = 8 (kMAX_DIMS). Built from a shape (or a rank)."""

    MAX_DIMS = 8

    def __init__(self, shape=()):
        super().__init__([0] * shape if isinstance(shape, int) else [int(d) for d in shape])
        if len(self) > self.MAX_DIMS:
            raise ValueError(f"Dims holds at most {self.MAX_DIMS} dimensions")


# ----------------------------------------------------------------------------- descriptors / fields

class PluginTensorDesc:  # NvInferRuntimePlugin.h PluginTensorDesc {dims, type, format, scale}
    def __init__(self, dims=(), type=DataType.FLOAT, format=TensorFormat.LINEAR, scale=1.0):
        self.dims, self.type, self.format, self.scale = Dims(dims), type, format, scale


class DynamicPluginTensorDesc:  # NvInferRuntime.h DynamicPluginTensorDesc {desc, min, max, opt}
    def __init__(self, desc=None, min=(), opt=(), max=()):
        self.desc = desc or PluginTensorDesc()
        self.min, self.opt, self.max = Dims(min), Dims(opt), Dims(max)


class PluginField:
    """NvInferPluginBase.h PluginField {name, data, type, length}; pyPlugin.cpp exposes `data` as a
    numpy array (bytes / str data as uint8)."""

    def __init__(self, name="", data=None, type=PluginFieldType.UNKNOWN):
        self.name, self.type = name, PluginFieldType(type)
        if data is None:
            data = np.array([])
        if isinstance(data, (bytes, bytearray)):
            data = np.frombuffer(bytes(data), dtype=np.uint8)
        self.data = np.asarray(data)
        self.size = int(self.data.size)


class PluginFieldCollection(list):  # NvInferPluginBase.h PluginFieldCollection; pyPlugin.cpp: a list
    pass


class ITensor:  # INetworkDefinition tensors; only used by PluginDef.__call__ (not here)
    pass


class ISymExpr:  # NvInferRuntime.h ISymExpr (10.9+): a launch-parameter expression; SymExprImpl subclasses it
    def __init__(self):
        pass


class _Base:  # the trampolines of pyPlugin.cpp: Python subclasses call Base.__init__(self)
    def __init__(self):
        pass


class KernelLaunchParamsOut:
    """NvInferRuntime.h IKernelLaunchParams (gridX..blockZ, sharedMem), what get_launch_params fills;
    every value must be an ISymExpr (pyPlugin.cpp casts it)."""

    FIELDS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "shared_mem")

    def __setattr__(self, name, value):
        if name not in self.FIELDS:
            raise AttributeError(f"IKernelLaunchParams has no attribute {name!r}")
        if not isinstance(value, ISymExpr):
            raise TypeError(f"IKernelLaunchParams.{name} takes an ISymExpr, got {type(value).__name__}")
        super().__setattr__(name, value)


class SymExprSetter:
    """NvInferRuntime.h ISymExprs: nbSymExprs, then one ISymExpr per index (< nbSymExprs)."""

    def __init__(self):
        self.nbSymExprs, self.exprs = 0, {}

    def __setitem__(self, i, value):
        if not 0 <= i < self.nbSymExprs:
            raise IndexError(f"ISymExprs index {i} outside nbSymExprs={self.nbSymExprs}")
        if not isinstance(value, ISymExpr):
            raise TypeError(f"ISymExprs takes ISymExpr, got {type(value).__name__}")
        self.exprs[i] = value


# ----------------------------------------------------------------------------- registry

class PluginRegistry:
    """NvInferRuntime.h IPluginRegistry: registerCreator(creator, pluginNamespace) -> bool (False for
    a duplicate name/version/namespace); getCreator(name, version, namespace) -> the creator with
    EXACTLY that triple, else nullptr (None in Python, pyCore.cpp)."""

    def __init__(self):
        self.creators = {}

    def register_creator(self, creator, plugin_namespace: str = "") -> bool:
        key = (creator.name, creator.plugin_version, plugin_namespace)
        if key in self.creators:
            return False
        self.creators[key] = creator
        return True

    def get_creator(self, name: str, version: str, plugin_namespace: str = ""):
        return self.creators.get((name, version, plugin_namespace))

    @property
    def all_creators(self):
        return list(self.creators.values())


class Logger:  # NvInferRuntimeBase.h ILogger::Severity; pyCore.cpp Logger(min_severity)
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

    def __init__(self, min_severity=WARNING):
        self.min_severity, self.messages = min_severity, []

    def log(self, severity, msg):
        self.messages.append((severity, msg))


def make_core(version: str) -> types.ModuleType:
    """A fresh `tensorrt` module: what the vendor's plugin layer reads from `tensorrt.so`."""
    m = types.ModuleType("tensorrt")
    m.__version__ = version
    m.__path__ = []  # a package, so `tensorrt.plugin` can be imported under it
    for e in (DataType, TensorFormat, PluginFieldType, PluginArgType, PluginArgDataType, DimensionOperation,
              TensorRTPhase, QuickPluginCreationRequest):
        setattr(m, e.__name__, e)
    m.float32, m.float16, m.int8, m.int32, m.bool, m.uint8, m.int64, m.bfloat16 = (
        DataType.FLOAT, DataType.HALF, DataType.INT8, DataType.INT32, DataType.BOOL, DataType.UINT8, DataType.INT64,
        DataType.BF16)
    m.nptype = lambda t: _NP[DataType(t)]
    for cls in (IDimensionExpr, IExprBuilder, DimsExprs, Dims, PluginTensorDesc, DynamicPluginTensorDesc, PluginField,
                PluginFieldCollection, ITensor, ISymExpr, Logger):
        setattr(m, cls.__name__, cls)
    for name in ("IPluginV3", "IPluginV3QuickCore", "IPluginV3QuickBuild", "IPluginV3QuickRuntime",
                 "IPluginV3QuickAOTBuild", "IPluginCreatorV3Quick"):
        setattr(m, name, type(name, (_Base,), {}))
    registry = PluginRegistry()
    m.get_plugin_registry = lambda: registry
    return m


def load_vendor_plugin(version: str, monkeypatch):
    """(core, tensorrt.plugin) for `version`: the wheel's plugin modules imported over a fresh core.

    sys.modules entries are set through `monkeypatch`, so they are undone after the test.
    """
    d = plugin_dir(version)
    core = make_core(version)
    for k in [k for k in sys.modules if k == "tensorrt" or k.startswith("tensorrt.")]:
        monkeypatch.delitem(sys.modules, k)
    monkeypatch.setitem(sys.modules, "tensorrt", core)
    spec = importlib.util.spec_from_file_location("tensorrt.plugin", d / "__init__.py",
                                                  submodule_search_locations=[str(d)])
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tensorrt.plugin", mod)
    core.plugin = mod
    spec.loader.exec_module(mod)  # runs __discover_modules: every vendor submodule is imported
    for k in list(sys.modules):
        if k.startswith("tensorrt.plugin."):
            monkeypatch.setitem(sys.modules, k, sys.modules[k])  # removed again at teardown
    return core, mod


# ----------------------------------------------------------------------------- parser / builder

def import_plugin_node(core, node):
    """TensorRT's ONNX parser on a node that is no ONNX op (onnx-tensorrt FallbackPluginImporter).

    - creator lookup: name = op_type, version = attribute plugin_version (default "1"),
      namespace = attribute plugin_namespace (default ""), then the node's domain
      (onnxOpCheckers.cpp); not found -> "Plugin not found, are the plugin name, version, and
      namespace correct?";
    - fields: for each of the creator's field names, the node attribute of that name, converted to
      the field's type; attributes that are not fields are not passed (onnxOpImporters.cpp
      loadFields: "Attribute ... not found in plugin node!" is only a warning);
    - creation: V3 quick creators get createPlugin(op_type, namespace, fields, kBUILD, request) with
      request kSTRICT_AOT / kSTRICT_JIT from an `aot` attribute, else kUNKNOWN (importerUtils.cpp).
    """
    a = _attrs(node)
    reg = core.get_plugin_registry()
    name, version = node.op_type, a.get("plugin_version", "1")
    ns = a.get("plugin_namespace", "")
    creator = reg.get_creator(name, version, ns) or reg.get_creator(name, version, node.domain)
    if creator is None:
        raise ParserError(f"In node {node.name} (importFallbackPluginImporter): UNSUPPORTED_NODE: Assertion failed: "
                          f"creator && \"Plugin not found, are the plugin name, version, and namespace correct?\" "
                          f"(name {name!r}, version {version!r}, namespace {ns!r}; registered: "
                          f"{sorted(reg.creators)})")
    if reg.get_creator(name, version, ns) is None:
        ns = node.domain
    fields = []
    for f in creator.field_names:
        if f.name not in a:
            continue
        v = a[f.name]
        if f.type == PluginFieldType.CHAR:
            fields.append(PluginField(f.name, str(v).encode(), PluginFieldType.CHAR))
        elif f.type in _FIELD_NP:
            fields.append(PluginField(f.name, np.array(v if isinstance(v, list) else [v], _FIELD_NP[f.type]), f.type))
        else:
            fields.append(PluginField(f.name, bytes(v) if isinstance(v, (bytes, str)) else v, f.type))
    if "aot" in a:
        request = QuickPluginCreationRequest.STRICT_AOT if a["aot"] else QuickPluginCreationRequest.STRICT_JIT
    else:
        request = QuickPluginCreationRequest.UNKNOWN
    return creator.create_plugin(name, ns, PluginFieldCollection(fields), TensorRTPhase.BUILD, request)


def build_plugin_layer(plugin, inputs: list, profile: str = "opt", tactic_env: dict = None) -> dict:
    """The IPluginV3 build-phase calls, in TensorRT's order (NvInferRuntime.h IPluginV3OneBuild /
    IPluginV3QuickAOTBuild), for one plugin layer.

    Args:
        inputs: [(DataType, dims with symbols for dynamic axes, e.g. ("N", 256)), ...]; a symbol's
            (min, opt, max) comes from `tactic_env` = {symbol: (min, opt, max)}.
    Returns:
        {"output_types", "output_shapes" (evaluated at `profile`), "combination", "tactic",
         "launch" {grid_x..shared_mem: int}, "extra_args" [int], "kernel" (name, ptx)} (AOT only for
         the last three).
    Raises what TensorRT would: no supported type/format combination for the network's types,
    a launch parameter / extra argument that is not a SymInt32 expression.
    """
    env_all = tactic_env or {}
    idx = {"min": 0, "opt": 1, "max": 2}[profile]
    env = {k: v[idx] for k, v in env_all.items()}
    types_in = [t for t, _ in inputs]
    ranks = [len(d) for _, d in inputs]
    out_types = list(plugin.get_output_data_types(types_in, ranks))      # 1. getOutputDataTypes
    eb = IExprBuilder()
    in_exprs = []
    for i, (_, dims) in enumerate(inputs):
        e = DimsExprs(len(dims))
        for j, d in enumerate(dims):
            e[j] = eb.constant(d) if isinstance(d, int) else IDimensionExpr(symbol=d)
        in_exprs.append(e)
    out_exprs = plugin.get_output_shapes(in_exprs, [], eb)                # 2. getOutputShapes
    n_in, n_out = len(inputs), len(out_types)

    def dyn(exprs, t, k):
        dims = [x.evaluate({s: v[k] for s, v in env_all.items()}) for x in exprs]
        return dims

    in_out = []
    for i, (t, dims) in enumerate(inputs):
        desc = PluginTensorDesc([-1 if not isinstance(d, int) else d for d in dims], t)
        in_out.append(DynamicPluginTensorDesc(desc, dyn(in_exprs[i], t, 0), dyn(in_exprs[i], t, 1),
                                              dyn(in_exprs[i], t, 2)))
    for i, t in enumerate(out_types):
        ex = out_exprs[i]
        desc = PluginTensorDesc([x.get_constant_value() if x.is_constant() else -1 for x in ex], t)
        in_out.append(DynamicPluginTensorDesc(desc, dyn(ex, t, 0), dyn(ex, t, 1), dyn(ex, t, 2)))
    combos = plugin.get_supported_format_combinations(in_out, n_in)     # 3. format combinations
    n_io = n_in + n_out
    want = types_in + out_types
    chosen = None
    for c in range(0, len(combos), n_io):
        comb = combos[c:c + n_io]
        if [d.type for d in comb] == want and all(d.format == TensorFormat.LINEAR for d in comb):
            chosen = comb
            break
    if chosen is None:
        got = [[DataType(d.type).name for d in combos[c:c + n_io]] for c in range(0, len(combos), n_io)]
        raise RuntimeError(f"no supported format combination for the network's types "
                           f"{[DataType(t).name for t in want]} (plugin offers {got})")
    for d, c in zip(in_out, chosen):
        d.desc.type, d.desc.format = c.type, c.format
    plugin.configure_plugin(in_out[:n_in], in_out[n_in:])                # 4. configurePlugin
    tactics = list(plugin.get_valid_tactics())                            # 5. getValidTactics (empty: 0)
    tactic = tactics[0] if tactics else 0
    plugin.set_tactic(tactic)
    out = {"output_types": out_types, "combination": [DataType(c.type).name for c in chosen], "tactic": tactic,
           "output_shapes": [[x.evaluate(env) for x in ex] for ex in out_exprs]}
    if hasattr(plugin, "get_launch_params"):                              # 6. AOT: kernel + launch params
        lp, setter = KernelLaunchParamsOut(), SymExprSetter()
        plugin.get_launch_params(in_exprs, in_out, n_in, lp, setter, eb)
        out["launch"] = {f: getattr(lp, f).expr.evaluate(env) for f in KernelLaunchParamsOut.FIELDS}
        out["extra_args"] = [setter.exprs[i].expr.evaluate(env) for i in range(setter.nbSymExprs)]
        out["extra_arg_types"] = [PluginArgDataType(setter.exprs[i].dtype).name for i in range(setter.nbSymExprs)]
        descs = [PluginTensorDesc(d.opt, d.desc.type, d.desc.format) for d in in_out]
        out["kernel"] = plugin.get_kernel(descs[:n_in], descs[n_in:])
    return out
