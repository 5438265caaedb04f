"""TensorRT compatibility of the exported graphs, checked on CPU (no TensorRT needed).

For every graph TensorRT would build from an engine directory (the plain ONNX graph, or its
TensorRT variant: gasv.trt.onnx with the `lisa::gasv2` plugin):
  1. every node (including those of local functions and If/Loop/Scan subgraphs) is an ONNX op
     TensorRT's parser imports in the targeted version range, with its documented
     restrictions (ScatterND without reduction, Attention with one output and no past_key ...),
     or a lisa plugin node carrying the attributes the parser needs;
  2. every tensor's element type is one TensorRT supports (no DOUBLE, INT16, UINT32 ...;
     UINT8 only at the network boundary) and each op's data input has a type that op takes;
  3. every node passes the static checks TensorRT's parser runs before it imports anything
     (onnx-tensorrt onnxOpCheckers.cpp, transcribed in engines/parser_checks.py: Attention
     without softmax_precision and with softcap == 0, Cast to a TensorRT type, Resize modes,
     Slice arity ...): each failed check is a violation;
  4. graph inputs/outputs are the io-spec ones (names, order, dtype, static dims, and
     symbolic dynamic axes), and the optimisation profiles fit them (build.profiles_from_io_spec).

`check_trt_compat(engine_dir)` returns a CompatReport and raises TrtCompatError when any graph
has a violation (warnings do not fail). CI runs it on a tiny export (tests/engines).

Sources of the support table (reference, read on 2026-11-30):
  - onnx/onnx-tensorrt docs/operators.md at "ONNX-TensorRT 10.1 GA release" (96e7811, June
    2024): the operator matrix, supported types and restrictions for TensorRT 10.x
    ("TensorRT 10.0 supports operators in the inclusive range of opset 9 to opset 20").
  - onnx/onnx-tensorrt onnxOpImporters.cpp (10.15/10.16 era) for the newer importers and their
    checks: Attention ("TensorRT only supports Attention nodes with one output", past_key /
    past_value unsupported), TensorScatter (4-D cache, axis -2, mode "linear", via
    IKVCacheUpdateLayer), RotaryEmbedding, ScatterND ("ScatterND with reduction is not
    supported"), ScatterElements with a reduction (imported as the standard-plugin
    ScatterElements v2, so it needs libnvinfer_plugin).
  - onnx/onnx-tensorrt onnxOpImporters.cpp, read on 2026-12-04 for the ops of the v2 bundles
    (plain-ops attention over a read-only cache), whose static checkers are all empty
    (engines/parser_checks.py): at commit dd0a3a9f8794ae4f0316ed07ea68cda9b944bb3c, Trilu needs
    rank >= 2, Expand a 1-D shape tensor, Transpose rank <= Dims::MAX_DIMS (8) (`_check_trilu`,
    `_check_expand`, `_check_transpose`, the importer's messages), Where / Trilu refuse UINT8 data;
    at 10.1 GA (96e7811), MatMul refuses INT32 / INT64 inputs and Gather / Expand / Concat UINT8
    data (the `types` below keep all of these out).
  - onnx/onnx-tensorrt onnxOpCheckers.cpp at commit dd0a3a9f8794ae4f0316ed07ea68cda9b944bb3c
    (the 10.15-era tree; its Attention checker came with the 10.14 GA release, PR #1043):
    `DEFINE_OP_CHECKER(Attention)` rejects softcap != 0 ("Setting softcap is not supported in
    TensorRT Attention.") and any softmax_precision ("Setting softmax precision is not supported
    in TensorRT Attention."); the other checkers are listed in engines/parser_checks.py.
  - onnx/onnx-tensorrt PR #1043 "10.14-GA Release: Added support for the Attention operator";
    PR #1046 (maintainer: "RMSNorm support will be available in the 10.15 release").
  - shared/spec/deploy.md (IAttention 10.14, IKVCacheUpdateLayer 10.15, IRotaryEmbedding
    10.15.1; Python plugins: op_type = plugin name, plugin_namespace / plugin_version (always "1" for
    tensorrt.plugin, `_lib.py`) / aot).
TensorRT 11 keeps the 10.x ONNX importers (it removes weak typing, not ops), so the same table
is used for 11.x. Nothing here was run against a real TensorRT parser.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..engines.parser_checks import TRT_DTYPES, node_errors, standard_opset
from ..errors import LisaError

TRT_MIN_VERSION = (10, 14)  # default target: ONNX Attention (IAttention) needs the 10.14 parser
TRT_RANGE = "10.14 .. 11.x"

# ----------------------------------------------------------------------------- dtypes

# ONNX TensorProto element types TensorRT 10/11 represent (docs/operators.md: DOUBLE is only cast
# down, so it is refused here; FLOAT8E4M3FN, INT4 and FLOAT4E2M1 are quantized types): TRT_DTYPES,
# the types the parser's convertDtype maps (engines/parser_checks.py).
BOUNDARY_ONLY = {2}  # UINT8: "only supported as network input or output tensor types"
ONNX_DTYPE_NAMES = {0: "undefined", 1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
                    7: "int64", 8: "string", 9: "bool", 10: "float16", 11: "double", 12: "uint32",
                    13: "uint64", 14: "complex64", 15: "complex128", 16: "bfloat16", 17: "float8e4m3fn",
                    18: "float8e4m3fnuz", 19: "float8e5m2", 20: "float8e5m2fnuz", 21: "uint4", 22: "int4",
                    23: "float4e2m1"}

F = frozenset({1, 10, 16})              # FP32, FP16, BF16
N = F | {6, 7}                          # + INT32, INT64
A = N | {9}                             # + BOOL
B = frozenset({9})                      # BOOL
F32_16 = frozenset({1, 10})


# ----------------------------------------------------------------------------- op table

@dataclass(frozen=True)
class OpSupport:
    """One ONNX operator in TensorRT's parser: first version, data types, restrictions."""

    since: tuple = (10, 0)
    types: Optional[frozenset] = None  # element types of the checked input; None: any TRT type
    type_input: int = 0                # which input carries the "T" type
    check: Optional[Callable] = None   # (node, ctx) -> (violations, warnings)
    note: str = ""


def _names(s: str) -> list:
    return s.split()


def _const_input(node, i: int, ctx) -> bool:
    """Input i is absent, an initializer or a Constant node output (a build-time constant)."""
    return len(node.input) <= i or node.input[i] == "" or node.input[i] in ctx.constants


def _axes_const(what: str, index: int = 1):
    def check(node, ctx):
        if not _const_input(node, index, ctx):
            return [f"{what}: `axes` must be an initializer (onnx-tensorrt restriction)"], []
        return [], []
    return check


def _attr(node, name, default=None):
    import onnx

    for a in node.attribute:
        if a.name == name:
            v = onnx.helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return default


def _check_scatter_nd(node, ctx):
    if _attr(node, "reduction", "none") != "none":
        return [f"ScatterND reduction={_attr(node, 'reduction')!r}: TensorRT imports ScatterND only without a "
                "reduction (\"ScatterND with reduction is not supported\")"], []
    return [], []


def _check_scatter_elements(node, ctx):
    if _attr(node, "reduction", "none") != "none":
        return [], [f"ScatterElements reduction={_attr(node, 'reduction')!r} is imported as the standard "
                    "ScatterElements v2 plugin: libnvinfer_plugin must be loaded; not allowed in "
                    "version-compatible / lean-runtime engines"]
    return [], []


def _check_attention(node, ctx):
    bad = []
    if len([o for o in node.output if o]) != 1:
        bad.append("Attention: TensorRT only supports Attention nodes with one output (no present_key / "
                   "present_value / qk_matmul_output)")
    if len(node.input) > 4 and any(node.input[4:6]):
        bad.append("Attention: past_key / past_value inputs are not supported by TensorRT (scatter into a "
                   "static cache and pass it as key/value instead)")
    return bad, []


def _check_tensor_scatter(node, ctx):
    bad = []
    axis = _attr(node, "axis", -2)
    rank = ctx.rank(node.input[0]) if node.input else None
    if rank is not None and rank != 4:
        bad.append(f"TensorScatter: the cache must be 4-D (batch, heads, seq, head_dim), got rank {rank}")
    if axis not in (-2, 2):
        bad.append(f"TensorScatter: sequence axis must be -2, got {axis}")
    if _attr(node, "mode", "linear") != "linear":
        bad.append(f"TensorScatter: only mode 'linear' is supported, got {_attr(node, 'mode')!r}")
    return bad, []


def _check_topk(node, ctx):
    bad, warn = [], []
    if int(_attr(node, "sorted", 1)) != 1:
        bad.append("TopK: `sorted` must be 1")
    k = ctx.constant_value(node.input[1]) if len(node.input) > 1 else None
    if k is None:
        warn.append("TopK: K is not a build-time constant (must stay < 3840 at run time)")
    elif int(k.reshape(-1)[0]) >= 3840:
        bad.append(f"TopK: K = {int(k.reshape(-1)[0])} must be less than 3840")
    return bad, warn


# Import-time restrictions of ops the v2 bundles use whose static checker is empty (parser_checks):
# onnx-tensorrt onnxOpImporters.cpp @ dd0a3a9f8794ae4f0316ed07ea68cda9b944bb3c, messages the importer's.
TRT_MAX_DIMS = 8  # nvinfer1::Dims::MAX_DIMS


def _check_trilu(node, ctx):
    rank = ctx.rank(node.input[0]) if node.input else None
    if rank is not None and rank < 2:
        return [f"Trilu input must have at least 2 dimensions! Current number of dimensions = {rank}."], []
    return [], []


def _check_expand(node, ctx):
    rank = ctx.rank(node.input[1]) if len(node.input) > 1 else None
    if rank is not None and rank != 1:
        return ["Expand: The shape tensor is required to be 1D."], []
    return [], []


def _check_transpose(node, ctx):
    rank = ctx.rank(node.input[0]) if node.input else None
    if rank is not None and rank > TRT_MAX_DIMS:
        return [f"Transpose: The rank of the input tensor exceeds the maximum supported by this version of "
                f"TensorRT. Current rank of inputs = {rank}, max supported rank = {TRT_MAX_DIMS}."], []
    return [], []


def _check_dropout(node, ctx):
    if len(node.input) > 2 and node.input[2] and not _const_input(node, 2, ctx):
        return ["Dropout: `training_mode` must be an initializer evaluating to False"], []
    return [], []


def _table() -> dict:
    t = {}
    for op in _names("Acos Acosh Asin Asinh Atan Atanh AveragePool BatchNormalization Ceil Celu Clip Conv "
                     "ConvTranspose Cos Cosh Einsum Elu Erf Exp Floor Gemm GlobalAveragePool GlobalLpPool "
                     "GlobalMaxPool GroupNormalization GRU HardSigmoid HardSwish Hardmax ImageScaler "
                     "InstanceNormalization IsInf LeakyRelu Log LogSoftmax LRN LSTM LpNormalization LpPool "
                     "MatMul MaxPool MeanVarianceNormalization ParametricSoftplus Pow PRelu QuantizeLinear "
                     "RandomNormal RandomNormalLike RandomUniform RandomUniformLike Reciprocal RNN Round "
                     "ScaledTanh Scan Selu Sigmoid Sin Sinh Softmax Softplus Softsign Sqrt Tan Tanh "
                     "ThresholdedRelu Upsample"):
        t[op] = OpSupport(types=F)
    for op in _names("Abs Add ArgMax ArgMin DepthToSpace Div Equal Gelu Greater GreaterOrEqual IsNaN Less "
                     "LessOrEqual Max Mean Min Mod Mul Neg Range Relu Scatter ScatterElements Shrink Sign "
                     "SpaceToDepth Sub Sum"):
        t[op] = OpSupport(types=N)
    for op in _names("Concat Constant ConstantOfShape Expand EyeLike Flatten Gather GatherElements GatherND "
                     "Identity If Loop OneHot Reshape ReverseSequence Shape Size Split Tile Transpose Trilu"):
        t[op] = OpSupport(types=A)
    for op in _names("And Or Xor Not"):
        t[op] = OpSupport(types=B)
    for op in _names("DeformConv GridSample Mish NonMaxSuppression NonZero RoiAlign"):
        t[op] = OpSupport(types=F32_16)
    for op in _names("ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd "
                     "ReduceSum ReduceSumSquare"):
        t[op] = OpSupport(types=N, check=_axes_const(op))
    for op in ("Slice",):
        t[op] = OpSupport(types=A, check=_axes_const(op, 3))
    for op in ("Squeeze", "Unsqueeze"):
        t[op] = OpSupport(types=A, check=_axes_const(op))
    t["Pad"] = OpSupport(types=N, check=_axes_const("Pad", 3))
    t["CumSum"] = OpSupport(types=F, check=_axes_const("CumSum (axis)"))
    t["Cast"] = OpSupport(types=frozenset(TRT_DTYPES))
    t["CastLike"] = OpSupport(types=frozenset(TRT_DTYPES))
    t["DequantizeLinear"] = OpSupport(types=frozenset({3, 17, 22}), note="x_zero_point must be zero")
    t["Dropout"] = OpSupport(types=F, check=_check_dropout)
    t["Where"] = OpSupport(types=A, type_input=1)
    t["Trilu"] = OpSupport(types=A, check=_check_trilu)
    t["Expand"] = OpSupport(types=A, check=_check_expand)
    t["Transpose"] = OpSupport(types=A, check=_check_transpose)
    t["ScatterND"] = OpSupport(types=N, check=_check_scatter_nd)
    t["ScatterElements"] = OpSupport(types=N, check=_check_scatter_elements)
    t["TopK"] = OpSupport(types=N, check=_check_topk)
    t["Resize"] = OpSupport(types=F)
    t["LayerNormalization"] = OpSupport(types=F)
    # newer importers (onnxOpImporters.cpp; release notes)
    t["Attention"] = OpSupport(since=(10, 14), types=F, check=_check_attention, note="IAttention")
    t["RMSNormalization"] = OpSupport(since=(10, 15), types=F)
    t["RotaryEmbedding"] = OpSupport(since=(10, 15), types=F, note="IRotaryEmbeddingLayer")
    t["TensorScatter"] = OpSupport(since=(10, 15), types=F, check=_check_tensor_scatter,
                                   note="IKVCacheUpdateLayer; the output aliases the cache input")
    return t


SUPPORTED_OPS = _table()


# ----------------------------------------------------------------------------- report

class TrtCompatError(LisaError):
    """An exported graph uses an op, dtype or shape TensorRT cannot build."""


@dataclass
class GraphCompat:
    """Compatibility of one graph file."""

    graph: str
    file: str
    ops: dict = field(default_factory=dict)          # op -> count
    min_trt_version: tuple = (10, 0)
    plugins: list = field(default_factory=list)      # lisa plugin node names
    profiles: list = field(default_factory=list)     # [{input: [min, opt, max]}]
    violations: list = field(default_factory=list)
    warnings: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass
class CompatReport:
    """check_trt_compat's result: one GraphCompat per graph TensorRT would build."""

    engine_dir: str
    trt_version: tuple
    graphs: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(g.ok for g in self.graphs.values())

    @property
    def min_trt_version(self) -> tuple:
        return max((g.min_trt_version for g in self.graphs.values()), default=(10, 0))

    def summary(self) -> str:
        lines = [f"TensorRT compatibility of {self.engine_dir} (target TensorRT >= "
                 f"{'.'.join(map(str, self.trt_version))}; graphs need >= {'.'.join(map(str, self.min_trt_version))}):"]
        for g in self.graphs.values():
            lines.append(f"  {g.graph} ({g.file}): {'ok' if g.ok else 'FAILED'}, {sum(g.ops.values())} nodes, "
                         f"{len(g.ops)} op types" + (f", plugins {g.plugins}" if g.plugins else ""))
            lines += [f"    ERROR {v}" for v in g.violations] + [f"    warn  {w}" for w in g.warnings]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"engine_dir": self.engine_dir, "trt_version": list(self.trt_version), "ok": self.ok,
                "min_trt_version": list(self.min_trt_version),
                "graphs": {k: dataclasses.asdict(v) for k, v in self.graphs.items()}}


# ----------------------------------------------------------------------------- graph walk

class _Ctx:
    """Types, ranks and constants of one model (after ONNX shape inference)."""

    def __init__(self, model):
        import onnx
        from onnx import numpy_helper

        try:
            model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:  # inference is best effort: unknown types are simply not checked
            pass
        self.model = model
        self.opset = standard_opset(model)
        g = model.graph
        self.types, self.shapes = {}, {}
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            tt = vi.type.tensor_type
            if tt.elem_type:
                self.types[vi.name] = tt.elem_type
            if tt.HasField("shape"):
                self.shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                        for d in tt.shape.dim]
        self.values = {}
        for t in g.initializer:
            self.types[t.name] = t.data_type
            self.shapes[t.name] = list(t.dims)
            if t.data_location != onnx.TensorProto.EXTERNAL and _nbytes(t) <= 1 << 16:
                self.values[t.name] = numpy_helper.to_array(t)
        self.constants = {t.name for t in g.initializer}
        for n in g.node:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
                self.constants.update(o for o in n.output if o)
                for a in n.attribute:
                    if a.name == "value":
                        self.values[n.output[0]] = numpy_helper.to_array(a.t)
        self.boundary = {v.name for v in list(g.input) + list(g.output)}
        self.functions = {(f.domain, f.name): f for f in model.functions}

    def rank(self, name):
        s = self.shapes.get(name)
        return None if s is None else len(s)

    def constant_value(self, name):
        return self.values.get(name)


def _nbytes(t) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n * 8


def _walk(nodes, ctx: _Ctx, gc: GraphCompat, trt_version: tuple, where: str = "") -> None:
    import onnx

    from ..engines.plugins import trt_plugin as tp

    for node in nodes:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        gc.ops[key] = gc.ops.get(key, 0) + 1
        label = f"{where}{node.name or node.op_type}"
        if (node.domain, node.op_type) in ctx.functions:  # local function: its body is what gets parsed
            _walk(ctx.functions[(node.domain, node.op_type)].node, ctx, gc, trt_version, f"{label}/")
            continue
        if node.domain == tp.NAMESPACE or (node.op_type in tp.PLUGINS and node.domain not in ("", "ai.onnx")):
            gc.plugins.append(node.name or node.op_type)
            bad, warn = _check_plugin(node, ctx)
            gc.violations += [f"{label}: {m}" for m in bad]
            gc.warnings += [f"{label}: {m}" for m in warn]
            gc.min_trt_version = max(gc.min_trt_version, (10, 9) if _attr(node, "aot", 0) else (10, 6))
            continue
        if node.domain not in ("", "ai.onnx"):
            gc.violations.append(f"{label}: op {node.domain}::{node.op_type} is neither an ONNX op nor a lisa "
                                 "plugin; TensorRT cannot import it")
            continue
        sup = SUPPORTED_OPS.get(node.op_type)
        if sup is None:
            gc.violations.append(f"{label}: ONNX op {node.op_type} is not in TensorRT's ONNX operator support "
                                 f"matrix ({TRT_RANGE})")
            gc.violations += [f"{label}: {m} (onnxOpCheckers.cpp)" for m in node_errors(node, ctx.opset)]
            continue
        gc.min_trt_version = max(gc.min_trt_version, sup.since)
        if sup.since > trt_version:
            gc.violations.append(f"{label}: {node.op_type} needs TensorRT >= {'.'.join(map(str, sup.since))} "
                                 f"(target {'.'.join(map(str, trt_version))})")
        if sup.types is not None and len(node.input) > sup.type_input:
            dt = ctx.types.get(node.input[sup.type_input])
            if dt is not None and dt not in sup.types:
                gc.violations.append(f"{label}: {node.op_type} does not take {ONNX_DTYPE_NAMES.get(dt, dt)} "
                                     f"inputs in TensorRT (takes {sorted(ONNX_DTYPE_NAMES[t] for t in sup.types)})")
        if sup.check is not None:
            bad, warn = sup.check(node, ctx)
            gc.violations += [f"{label}: {m}" for m in bad]
            gc.warnings += [f"{label}: {m}" for m in warn]
        gc.violations += [f"{label}: {m} (onnxOpCheckers.cpp)" for m in node_errors(node, ctx.opset)]
        for a in node.attribute:  # If / Loop / Scan bodies
            if a.type == onnx.AttributeProto.GRAPH:
                _walk(a.g.node, ctx, gc, trt_version, f"{label}/{a.name}/")
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    _walk(sub.node, ctx, gc, trt_version, f"{label}/{a.name}/")


def _check_plugin(node, ctx) -> tuple:
    """The attributes, arity and input dtypes TensorRT's parser and the plugin expect.

    Returns (violations, warnings). Attributes: plugin_namespace and domain "lisa",
    plugin_version "1" (the only version `tensorrt.plugin` registers: `_lib.py`
    `_TemplatePluginCreator`, `self.plugin_version = "1"`; the parser's creator lookup is by exact
    name, version and namespace, onnx-tensorrt FallbackPluginImporter), num_warps (declared by
    register()), aot 0/1 (required: lisa::gasv2 defines both a JIT and an AOT implementation, and
    without the attribute the parser leaves the choice to a PREFER_{AOT,JIT}_PYTHON_PLUGINS network
    flag, else `tensorrt.plugin` refuses to create it: `_lib.py` "has both AOT and JIT
    implementations"; aot=0 (JIT, Python at run time) is a warning). GASV generations differ by op name (gasv2), so the
    retired v1 op names are refused.
    """
    from ..engines.plugins import graph_rewrite as gr
    from ..engines.plugins import trt_plugin as tp

    bad, warn = [], []
    if node.op_type in tp.RETIRED_PLUGINS:
        return [f"{tp.NAMESPACE}::{node.op_type} is the retired GASV v1 plugin; the current plugin is "
                f"{tp.PLUGIN_ID} (re-run the rewrite: lisa-trt build, or graph_rewrite.write_trt_variant)"], warn
    if node.op_type not in tp.PLUGINS:
        return [f"unknown lisa plugin {node.op_type!r} (known: {sorted(tp.PLUGINS)})"], warn
    ns = _attr(node, "plugin_namespace")
    if ns != tp.NAMESPACE:
        bad.append(f"plugin node needs string attribute plugin_namespace={tp.NAMESPACE!r}, has {ns!r}")
    if node.domain != tp.NAMESPACE:
        bad.append(f"plugin node domain must be {tp.NAMESPACE!r} (TensorRT >= 10.10 reads the namespace from it)")
    ver = _attr(node, "plugin_version", tp.PLUGIN_VERSION)  # the parser's default is "1" too
    if ver != tp.PLUGIN_VERSION:
        bad.append(f"plugin node has plugin_version={ver!r}, but tensorrt.plugin registers every plugin as version "
                   f"{tp.PLUGIN_VERSION!r} and the parser looks it up by exact version (\"Plugin not found\"); "
                   f"set plugin_version={tp.PLUGIN_VERSION!r} (plugin generations differ by name)")
    aot = _attr(node, "aot")
    if aot is None:
        bad.append(f"plugin node has no aot attribute; {tp.PLUGIN_ID} has both JIT and AOT implementations, so "
                   "tensorrt.plugin refuses to create it unless the network sets PREFER_AOT/PREFER_JIT_PYTHON_PLUGINS; "
                   "set aot=1 (AOT, no Python at run time) or aot=0 (JIT)")
    elif aot == 0:
        warn.append("plugin node has aot=0: TensorRT uses the JIT implementation (Python and the registration at "
                    "run time)")
    elif aot not in (0, 1):
        bad.append(f"plugin attribute aot must be 0 (JIT) or 1 (AOT), has {aot!r}")
    if _attr(node, "num_warps") is None:
        bad.append("plugin node lacks its num_warps attribute (declared by the plugin's register())")
    if len(node.input) != tp.N_INPUTS or len(node.output) != tp.N_OUTPUTS:
        bad.append(f"{tp.NAMESPACE}::{node.op_type} takes {tp.N_INPUTS} inputs and {tp.N_OUTPUTS} "
                   f"outputs, the node has {len(node.input)} / {len(node.output)}")
        return bad, warn
    want = gr.plugin_input_dtypes()
    for name, w in zip(node.input, want):
        dt = ctx.types.get(name)
        if dt is not None and ONNX_DTYPE_NAMES.get(dt) != w:
            bad.append(f"plugin input {name} is {ONNX_DTYPE_NAMES.get(dt, dt)}, the kernel takes {w}")
    return bad, warn


def _check_dtypes(ctx: _Ctx, gc: GraphCompat) -> None:
    for name, dt in sorted(ctx.types.items()):
        if dt not in TRT_DTYPES:
            gc.violations.append(f"tensor {name} has element type {ONNX_DTYPE_NAMES.get(dt, dt)}, which TensorRT "
                                 "does not support (use float32/float16/bfloat16/int32/int64/bool)")
        elif dt in BOUNDARY_ONLY and name not in ctx.boundary:
            gc.violations.append(f"tensor {name} is uint8 inside the network (TensorRT: uint8 only at inputs/outputs)")


# ----------------------------------------------------------------------------- io spec

_IO_DTYPES = {"int64": 7, "bool": 9, "float32": 1}


def _check_io(model, spec, dims: dict, precision: str, gc: GraphCompat) -> None:
    """Graph inputs/outputs against the io spec: names and order, dtypes, static and dynamic axes."""
    from ..models.io_spec import DYNAMIC_AXES

    from ..export.onnx import fixed_axes_message, fixed_dynamic_axes

    fixed = fixed_dynamic_axes(model, spec)
    if fixed:
        gc.violations.append(fixed_axes_message(model, fixed))
    act = 10 if precision == "fp16" else 1
    for role, have, want in (("input", model.graph.input, spec.inputs), ("output", model.graph.output, spec.outputs)):
        have = list(have)
        if [h.name for h in have] != [t.name for t in want]:
            gc.violations.append(f"graph {role}s {[h.name for h in have]} are not the io-spec {role}s "
                                 f"{[t.name for t in want]}")
            continue
        for h, t in zip(have, want):
            tt = h.type.tensor_type
            exp = act if t.dtype == "act" else _IO_DTYPES[t.dtype]
            if tt.elem_type != exp:
                gc.violations.append(f"{role} {t.name} is {ONNX_DTYPE_NAMES.get(tt.elem_type)}, io spec says "
                                     f"{ONNX_DTYPE_NAMES[exp]}")
            got = list(tt.shape.dim)
            if len(got) != len(t.axes):
                gc.violations.append(f"{role} {t.name} has rank {len(got)}, io spec axes {t.axes}")
                continue
            for d, a in zip(got, t.axes):
                if a in DYNAMIC_AXES:
                    if d.HasField("dim_value") and role == "output":  # inputs: fixed_dynamic_axes above
                        gc.violations.append(f"{role} {t.name}: dynamic axis {a!r} was specialised to {d.dim_value} "
                                             "at export; profiles cannot vary it (re-export with a dynamic axis)")
                elif a in dims and d.HasField("dim_value") and d.dim_value != dims[a]:
                    gc.violations.append(f"{role} {t.name}: axis {a!r} is {d.dim_value}, the export's dims say "
                                         f"{dims[a]}")


def check_profiles(model, profiles: list, gc: GraphCompat, *, limits: Optional[dict] = None) -> None:
    """Every profile names every graph input with min <= opt <= max shapes of its rank that
    agree with the graph's static dims; dynamic dims >= 1 (>= 0 on io_spec.EMPTY_AXES) and within `limits` ({axis-less:
    input name -> max shape} optional)."""
    from ..models.io_spec import EMPTY_AXES

    inputs = {i.name: list(i.type.tensor_type.shape.dim) for i in model.graph.input}
    for k, prof in enumerate(profiles):
        shapes = prof.shapes if hasattr(prof, "shapes") else prof
        if set(shapes) != set(inputs):
            gc.violations.append(f"profile {k}: names {sorted(shapes)} != graph inputs {sorted(inputs)}")
            continue
        for name, (mn, opt, mx) in shapes.items():
            dims = inputs[name]
            if not len(mn) == len(opt) == len(mx) == len(dims):
                gc.violations.append(f"profile {k}: {name} shapes {mn}/{opt}/{mx} do not have rank {len(dims)}")
                continue
            for j, d in enumerate(dims):
                lo = 0 if d.dim_param in EMPTY_AXES else 1  # TensorRT takes empty tensors (a non-null address)
                if not lo <= mn[j] <= opt[j] <= mx[j]:
                    gc.violations.append(f"profile {k}: {name} axis {j} needs {lo} <= min <= opt <= max, "
                                         f"got {mn[j]}/{opt[j]}/{mx[j]}")
                if d.HasField("dim_value") and not mn[j] == opt[j] == mx[j] == d.dim_value:
                    gc.violations.append(f"profile {k}: {name} axis {j} is static {d.dim_value} in the graph, "
                                         f"profile gives {mn[j]}/{opt[j]}/{mx[j]}")
            if limits and name in limits:
                lim = limits[name]
                if any(a > b for a, b in zip(mx, lim)):
                    gc.violations.append(f"profile {k}: {name} max {mx} exceeds what the export allows {lim}")
        gc.profiles.append({n: [list(s) for s in v] for n, v in shapes.items()})


# ----------------------------------------------------------------------------- entry points

def check_model(model, *, graph: str = "graph", file: str = "", trt_version: tuple = TRT_MIN_VERSION,
                spec=None, dims: Optional[dict] = None, precision: str = "fp32",
                profiles: Optional[list] = None) -> GraphCompat:
    """Check one ONNX model (a ModelProto, external weights need not be loaded).

    Args:
        spec / dims / precision: the graph's io spec and static dims to check I/O against.
        profiles: ProfileSpec list (or {name: (min, opt, max)} dicts) to check against the inputs.
    """
    gc = GraphCompat(graph=graph, file=file)
    ctx = _Ctx(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is not None and opset > 20:
        gc.min_trt_version = max(gc.min_trt_version, (10, 14))  # 10.0-10.13 parse opsets 9..20 (docs)
        if trt_version < (10, 14):
            gc.violations.append(f"opset {opset} > 20 needs a newer TensorRT parser than "
                                 f"{'.'.join(map(str, trt_version))}")
    _walk(ctx.model.graph.node, ctx, gc, trt_version)
    _check_dtypes(ctx, gc)
    if spec is not None:
        _check_io(model, spec, dims or {}, precision, gc)
    if profiles is not None:
        check_profiles(model, profiles, gc)
    return gc


def check_trt_compat(engine_dir, *, trt_version: tuple = TRT_MIN_VERSION, profiles: Optional[dict] = None,
                     max_batch: int = 1, graphs: Optional[list] = None, tables=None,
                     attention: Optional[dict] = None, raise_on_error: bool = True) -> CompatReport:
    """TensorRT compatibility of every graph of an engine directory (CPU only).

    The GASV graph is checked in its TensorRT variant (the plugin rewrite, built in memory when
    gasv.trt.onnx is not there yet); its plain form is ORT-only by design.

    Args:
        engine_dir: directory written by `lisa-trt export` (manifest.json + graphs).
        trt_version: oldest TensorRT version to support, e.g. (10, 14).
        profiles: {graph name: [ProfileSpec]}; default build.profiles_from_io_spec(manifest, max_batch).
        max_batch: prompts per call the default profiles cover (CFG doubles the graph batch).
        graphs: graph names to check (default: every graph of the manifest).
        tables: GASV tables for the in-memory plugin rewrite (default: recovered from gasv.onnx).
        attention: {graph: "op" | "plain"}: check that graph as `lisa-trt build --attention` makes
            it (default: the written TensorRT file, else the export's Attention op).
        raise_on_error: raise TrtCompatError listing every violation (default).
    Returns:
        CompatReport.
    """
    from ..models.io_spec import Graph
    from ..export.manifest import read_manifest
    from ..engines.profiles import profiles_from_io_spec, trt_graph_model

    man = read_manifest(engine_dir)
    dims = man.dims  # the family's static axes and io specs (export/families.py)
    names = sorted(graphs) if graphs else sorted(man.graphs)
    profiles = profiles if profiles is not None else profiles_from_io_spec(man, max_batch=max_batch, graphs=names)
    report = CompatReport(engine_dir=str(engine_dir), trt_version=tuple(trt_version))
    for name in names:
        entry, graph = man.graphs[name], Graph(name)
        model, path = trt_graph_model(man, graph, tables=tables, attention=(attention or {}).get(name))
        spec = man.spec(graph)
        gc = check_model(model, graph=name, file=Path(path).name, trt_version=tuple(trt_version), spec=spec,
                         dims=dims, precision=entry.precision, profiles=profiles.get(name))
        if name not in profiles:
            gc.violations.append(f"no optimisation profile for {name}")
        report.graphs[name] = gc
    if raise_on_error and not report.ok:
        raise TrtCompatError(report.summary())
    return report
