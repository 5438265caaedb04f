"""The static checks TensorRT's ONNX parser runs on every node before it imports any, on CPU.

A transcription (not a copy) of the conditions in onnx/onnx-tensorrt `onnxOpCheckers.cpp`
(`DEFINE_OP_CHECKER(<op>)`; read at commit dd0a3a9f8794ae4f0316ed07ea68cda9b944bb3c, the
10.15-era tree that carries the Attention checker added by the "10.14-GA Release" PR #1043).
The parser collects these errors for the whole graph first and refuses the model when there is
any, so one failed condition fails the build of the graph. Messages are the checker's own.

How the parser picks a node's checker (ModelImporter.cpp `parseNodeStaticCheck`): the op's
registered checker; else, for a local function, the function's nodes; else the plugin fallback
(`FallbackPluginImporter`: a plugin creator named like the op, version / namespace from the node's
attributes, then its domain; "Plugin not found, are the plugin name, version, and namespace
correct?" when there is none). So a standard-domain op is one of:

  - transcribed (`CHECKERS`): ArgMax / ArgMin, Attention, AveragePool / MaxPool / LpPool (with
    the dilation check), BatchNormalization, Cast, Constant, ConstantOfShape, Dropout, Einsum, If,
    LayerNormalization, LpNormalization, Pow, RandomUniform(Like) / RandomNormal(Like), Resize,
    ReverseSequence, RoiAlign, Slice, TopK, Upsample;
  - registered with an empty checker (`EMPTY_CHECKERS`, `DEFINE_OP_EMPTY_CHECKER`): nothing is
    refused before import. Every other op of the v2 bundles is one (MatMul, Softmax, Gather,
    GatherElements, GatherND, Where, Expand, Concat, Reshape, Transpose, Split, Squeeze, Unsqueeze,
    Shape, Trilu, the element-wise and reduce ops, Conv, GroupNormalization, Q/DQ ...); what their
    importers (onnxOpImporters.cpp) refuse at import time (dtypes, ranks) is in deploy/trt_lint.py's
    table;
  - registered, checks not transcribed (`UNTRANSCRIBED`: no lisa-trt graph uses them): GRU / LSTM /
    RNN (bidirectional activations, LSTM input_forget);
  - refused outright (`UNSUPPORTED_OPS`: a checker that is `STATIC_CHECK(false, kUNSUPPORTED_NODE)`:
    the Bitwise ops, the Sequence / Optional / String ops, Unique, QLinearConv, DFT, ...);
  - anything else: the plugin fallback (a standard-domain op has no plugin creator of its name).

TensorRT also parses a copy of a graph when the export carries what the parser refuses but ONNX
Runtime uses: `strip_for_trt` removes Attention's `softmax_precision` (the only such attribute;
TensorRT's IAttention picks its own softmax accumulation).
"""

from __future__ import annotations

SOURCE = ("onnx/onnx-tensorrt onnxOpCheckers.cpp @ dd0a3a9f8794ae4f0316ed07ea68cda9b944bb3c "
          "(Attention checker since the 10.14 GA release, PR #1043)")

# ONNX element types the parser's convertDtype maps to a TensorRT DataType (name for messages)
TRT_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16", 6: "int32", 7: "int64", 3: "int8",
              2: "uint8", 9: "bool", 17: "float8e4m3fn", 22: "int4", 23: "float4e2m1"}
_STANDARD = ("", "ai.onnx")
_RESIZE_CTM = ("align_corners", "tf_half_pixel_for_nn", "pytorch_half_pixel", "half_pixel", "asymmetric")
_EINSUM_OK = set("abcdefghijklmnopqrstuvwxyz->., ")


def node_attrs(node) -> dict:
    """{name: value} of a node's attributes (strings decoded)."""
    import onnx

    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _outputs_beyond(node, n: int) -> list:
    if any(o for o in node.output[n:]):
        return [f"This version of TensorRT doesn't support mode than {n} outputs for {node.op_type} nodes!"]
    return []


def _attention(node, a, opset):
    bad = []
    if float(a.get("softcap", 0.0)) != 0.0:
        bad.append("Setting softcap is not supported in TensorRT Attention.")
    if "softmax_precision" in a:
        bad.append("Setting softmax precision is not supported in TensorRT Attention.")
    return bad


def _arg_min_max(node, a, opset):
    if int(a.get("select_last_index", 0)) and opset < 12:
        return ["Per-opset 12 ONNX does not support the select_last_index attribute."]
    return []


def _pooling(node, a, opset):
    """poolingCheckHelper: from opset 10, every dilation must be 1 (one error per other value)."""
    if opset < 10:
        return []
    return ["This version of TensorRT does not support dilations other than 1."
            for d in a.get("dilations", [1, 1]) if int(d) != 1]


def _random(kind: str):
    def check(node, a, opset):
        if "dtype" in a and int(a["dtype"]) not in (1, 10):  # FLOAT, FLOAT16
            return [f"Unsupported data type in {kind}"]
        return []
    return check


def _roi_align(node, a, opset):
    bad = [] if a.get("mode", "avg") in ("avg", "max") else ["Mode must be avg or max!"]
    if int(a.get("sampling_ratio", 0)) < 0:
        bad.append("Sampling ratio cannot be negative!")
    if opset >= 16 and a.get("coordinate_transformation_mode", "half_pixel") not in ("half_pixel", "output_half_pixel"):
        bad.append("Coordinate transformation mode must be half_pixel or output_half_pixel!")
    return bad


def _batch_norm(node, a, opset):
    bad = ["This version of TensorRT does not support training_mode == 1 in BatchNormalization."] \
        if int(a.get("training_mode", 0)) else []
    return bad + _outputs_beyond(node, 1)


def _cast(node, a, opset):
    to = int(a.get("to", 1))
    return [] if to in TRT_DTYPES else [f"Unsupported data type for the Cast operator! (to = ONNX type {to})"]


def _constant(node, a, opset):
    if a.get("trt_outputs_range_min") or not {"sparse_value", "value_string", "value_strings"} & set(a):
        return []
    return ["This version of TensorRT does not support the sparse_value, value_string and value_strings "
            "attributes."]


def _constant_of_shape(node, a, opset):
    value = a.get("value")
    return ["Invalid input type for ConstantOfShape"] if value is not None and value.data_type == 2 else []


def _dropout(node, a, opset):
    if opset <= 6 and not int(a.get("is_test", 1)):
        return ["TensorRT does not support the Droupout operator with training mode."]
    return []


def _einsum(node, a, opset):
    bad = sorted(set(str(a.get("equation", ""))) - _EINSUM_OK)
    return [f"Invalid character(s) in Einsum equation: {','.join(bad)}"] if bad else []


def _if(node, a, opset):
    then, other = a.get("then_branch"), a.get("else_branch")
    if then is not None and other is not None and len(then.output) != len(other.output):
        return ["then/else subgraphs should have the same number of outputs."]
    return []


def _lp(node, a, opset):
    return [] if int(a.get("p", 2)) in (1, 2) else ["Only L1 and L2 normalization are supported."]


def _lp_pool(node, a, opset):
    return _lp(node, a, opset) + _pooling(node, a, opset)


def _pow(node, a, opset):
    return [] if len(node.input) == 2 else ["POW operator expects two inputs!"]


def _resize(node, a, opset):
    bad = []
    if a.get("mode", "nearest") not in ("cubic", "linear", "nearest"):
        bad.append("Invalid Resize mode")
    if opset >= 11:
        ctm = a.get("coordinate_transformation_mode", "half_pixel")
        if ctm == "tf_half_pixel_for_nn" and a.get("nearest_mode", "round_prefer_floor") != "round_prefer_floor":
            bad.append("This version of TensorRT only support round_prefer_floor nearest mode in "
                       "tf_half_pixel_for_nn!")
        if ctm not in _RESIZE_CTM:
            bad.append("TensorRT only supports half_pixel, pytorch_half_pixel, tf_half_pixel_for_nn, asymmetric "
                       "and align_corners transformation modes!")
    if int(a.get("antialias", 0)):
        bad.append("Antialiasing is not supported currently.")
    if a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        bad.append("Only `stretch` is supported currently as `keep_aspect_ratio_policy`.")
    axes = list(a.get("axes", []))
    if len(set(axes)) != len(axes):
        bad.append("The input axes must have unique elements.")
    return bad


def _reverse_sequence(node, a, opset):
    same = int(a.get("batch_axis", 1)) == int(a.get("time_axis", 0))
    return ["batch_axis and time_axis cannot be the same"] if same else []


def _slice(node, a, opset):
    if opset >= 10 and not 3 <= len(node.input) <= 5:
        return ["Post-opset 10 Slice operator requires 3 - 5 inputs."]
    return []


def _topk(node, a, opset):
    return ["Attribute k is missing."] if opset < 10 and "k" not in a else []


def _upsample(node, a, opset):
    if a.get("mode", "nearest") not in ("nearest", "linear", "bilinear"):
        return ["The attribute mode can only be nearest, linear, or bilinear."]
    return []


CHECKERS = {
    "ArgMax": _arg_min_max, "ArgMin": _arg_min_max, "Attention": _attention, "AveragePool": _pooling,
    "BatchNormalization": _batch_norm, "Cast": _cast, "Constant": _constant,
    "ConstantOfShape": _constant_of_shape, "Dropout": _dropout, "Einsum": _einsum, "If": _if,
    "LayerNormalization": lambda n, a, o: _outputs_beyond(n, 1), "LpNormalization": _lp, "LpPool": _lp_pool,
    "MaxPool": lambda n, a, o: _outputs_beyond(n, 1) + _pooling(n, a, o), "Pow": _pow,
    "RandomNormal": _random("randomNormal"), "RandomNormalLike": _random("randomNormal"),
    "RandomUniform": _random("randomUniform"), "RandomUniformLike": _random("randomUniform"),
    "Resize": _resize, "ReverseSequence": _reverse_sequence, "RoiAlign": _roi_align, "Slice": _slice,
    "TopK": _topk, "Upsample": _upsample,
}


# Standard ops registered with DEFINE_OP_EMPTY_CHECKER at SOURCE (the TRT_* ops are left out).
EMPTY_CHECKERS = frozenset("""
    Abs Acos Acosh Add And Asin Asinh Atan Atanh BlackmanWindow CastLike Ceil Celu Clip Concat Conv
    ConvTranspose Cos Cosh CumSum DeformConv DepthToSpace DequantizeLinear Div Elu Equal Erf Exp Expand
    EyeLike Flatten Floor Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool
    GlobalMaxPool Greater GreaterOrEqual GridSample GroupNormalization HammingWindow HannWindow Hardmax
    HardSigmoid HardSwish Identity ImageScaler InstanceNormalization IsInf IsNaN LRN LeakyRelu Less
    LessOrEqual Log LogSoftmax Loop MatMul Max Mean MeanVarianceNormalization Min Mish Mod Mul Neg
    NonMaxSuppression NonZero Not OneHot Or PRelu Pad ParametricSoftplus QuantizeLinear RMSNormalization
    Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin
    ReduceProd ReduceSum ReduceSumSquare Relu Reshape RotaryEmbedding Round STFT ScaledTanh Scan Scatter
    ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Softmax Softplus Softsign
    SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh TensorScatter ThresholdedRelu Tile Transpose Trilu
    Unsqueeze Where Xor
""".split())
# Registered with real checks that are not transcribed here (see the module docstring).
UNTRANSCRIBED = frozenset("GRU LSTM RNN".split())
# Checker `STATIC_CHECK(false, ErrorCode::kUNSUPPORTED_NODE, ...)`: the parser refuses the node.
UNSUPPORTED_OPS = frozenset("""
    AffineGrid Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor CenterCropPad Col2Im Compress
    ConcatFromSequence ConvInteger DFT Det DynamicQuantizeLinear ImageDecoder MatMulInteger MaxRoiPool
    MaxUnpool MelWeightMatrix Multinomial NegativeLogLikelihoodLoss Optional OptionalGetElement
    OptionalHasElement QLinearConv QLinearMatMul RegexFullMatch SequenceAt SequenceConstruct SequenceEmpty
    SequenceErase SequenceInsert SequenceLength SequenceMap SoftmaxCrossEntropyLoss SplitToSequence
    StringConcat StringNormalizer StringSplit TfIdfVectorizer Unique
""".split())
PLUGIN_NOT_FOUND = "Plugin not found, are the plugin name, version, and namespace correct?"


def checker_kind(op_type: str) -> str:
    """How the parser statically checks a standard-domain op: "checked" (transcribed), "empty",
    "untranscribed", "unsupported" (always refused) or "plugin" (no checker: the plugin fallback)."""
    if op_type in CHECKERS:
        return "checked"
    for kind, ops in (("empty", EMPTY_CHECKERS), ("untranscribed", UNTRANSCRIBED), ("unsupported", UNSUPPORTED_OPS)):
        if op_type in ops:
            return kind
    return "plugin"


def node_errors(node, opset: int) -> list:
    """The parser's static-check messages for one standard-domain node ([] when it passes; other
    domains: [], their plugin lookup is checked where the plugin is known, deploy/trt_lint.py)."""
    if node.domain not in _STANDARD:
        return []
    kind = checker_kind(node.op_type)
    if kind == "checked":
        return CHECKERS[node.op_type](node, node_attrs(node), opset)
    if kind == "unsupported":
        return [f"UNSUPPORTED_NODE: {node.op_type} (its static checker always fails: STATIC_CHECK(false))"]
    if kind == "plugin":
        return [f"{PLUGIN_NOT_FOUND} (no static checker for {node.op_type}: checked as a plugin)"]
    return []


def standard_opset(model) -> int:
    """The model's opset of the standard ONNX domain."""
    return max((o.version for o in model.opset_import if o.domain in _STANDARD), default=1)


def _all_nodes(model):
    """Every node the parser checks: the graph's, local functions' and If / Loop / Scan bodies'."""
    import onnx

    stack = [list(model.graph.node)] + [list(f.node) for f in model.functions]
    while stack:
        for node in stack.pop():
            yield node
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    stack.append(list(a.g.node))
                elif a.type == onnx.AttributeProto.GRAPHS:
                    stack += [list(g.node) for g in a.graphs]


def model_errors(model) -> list:
    """`In node <name> (<op>): <message>` for every failed check of the model's nodes."""
    opset = standard_opset(model)
    return [f"In node {n.name or '?'} ({n.op_type}): {m}" for n in _all_nodes(model) for m in node_errors(n, opset)]


def _strippable(node) -> bool:
    return node.op_type == "Attention" and node.domain in _STANDARD and any(
        a.name == "softmax_precision" for a in node.attribute)


def needs_trt_copy(model) -> bool:
    """The model carries an attribute the parser refuses but ONNX Runtime uses (softmax_precision)."""
    return any(_strippable(n) for n in _all_nodes(model))


def strip_for_trt(model) -> int:
    """Remove `softmax_precision` from every Attention node (in place); returns how many."""
    n = 0
    for node in _all_nodes(model):
        if _strippable(node):
            kept = [a for a in node.attribute if a.name != "softmax_precision"]
            del node.attribute[:]
            node.attribute.extend(kept)
            n += 1
    return n


__all__ = ["CHECKERS", "EMPTY_CHECKERS", "PLUGIN_NOT_FOUND", "SOURCE", "TRT_DTYPES", "UNSUPPORTED_OPS",
           "UNTRANSCRIBED", "checker_kind", "model_errors", "needs_trt_copy", "node_attrs", "node_errors",
           "standard_opset", "strip_for_trt"]
