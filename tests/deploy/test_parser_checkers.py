"""The parser's static checker of every op the v2 bundles hold (engines/parser_checks.py, from
onnx-tensorrt onnxOpCheckers.cpp / ModelImporter.cpp) and the import-time restrictions of those ops
(deploy/trt_lint.py, from onnxOpImporters.cpp): each op of the recorded operator audit has a
registered checker, an unregistered or always-refused op is refused with the parser's message,
the importers' rank rules are enforced, and the audit itself runs the static checks."""

import json
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from lisa_trt.deploy import op_audit as oa
from lisa_trt.deploy import trt_lint as tc
from lisa_trt.engines import parser_checks as pc
from lisa_trt.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "bench" / "trt_op_audit.json"
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def one_node(node, inputs, outputs, opset=23, inits=()):
    g = helper.make_graph([node], "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def test_every_recorded_v2_op_has_a_registered_parser_checker():
    rows = json.loads(RECORD.read_text())["rows"]
    ops = {r["op"] for r in rows if r["domain"] == ""}
    assert {"MatMul", "Softmax", "Gather", "Where", "Expand", "Cast"} <= ops, ops
    kinds = {op: pc.checker_kind(op) for op in ops}
    assert all(k in ("checked", "empty") for k in kinds.values()), kinds  # none falls to the plugin fallback
    assert {op for op, k in kinds.items() if k == "checked"} == {"Cast", "Resize", "Slice"}, kinds
    # every op of the lint's support table is one the parser registers (the two tables agree)
    bad = {op: pc.checker_kind(op) for op in tc.SUPPORTED_OPS if pc.checker_kind(op) in ("plugin", "unsupported")}
    assert not bad, bad


@pytest.mark.parametrize("op, message", [
    ("NoSuchOp", pc.PLUGIN_NOT_FOUND),                   # no checker: the parser tries it as a plugin
    ("Unique", "UNSUPPORTED_NODE: Unique"),              # a checker that always fails
    ("BitwiseAnd", "UNSUPPORTED_NODE: BitwiseAnd"),
])
def test_an_op_without_a_checker_or_refused_by_it_fails(op, message):
    node = helper.make_node(op, ["x"], ["y"], name="n")
    assert any(message in m for m in pc.node_errors(node, 23)), pc.node_errors(node, 23)
    model = one_node(node, [vi("x", F32, [4])], [vi("y", F32, [4])])
    assert any(message in v for v in tc.check_model(model).violations)
    rows = oa.audit_model(model, bundle="b", graph="g")
    assert not rows[0].supported and message in rows[0].reason, rows
    with pytest.raises(oa.OpAuditError, match=op):
        oa.check_rows(rows)
    # another domain is a plugin the lint checks where it knows it: no static-check message here
    assert pc.node_errors(helper.make_node(op, ["x"], ["y"], domain="lisa"), 23) == []


def test_empty_checkers_refuse_no_attribute():
    for node in (helper.make_node("Softmax", ["x"], ["y"], axis=-1), helper.make_node("Gather", ["x", "i"], ["y"], axis=3),
                 helper.make_node("MatMul", ["a", "b"], ["y"]), helper.make_node("Trilu", ["x"], ["y"], upper=1),
                 helper.make_node("Where", ["c", "a", "b"], ["y"]), helper.make_node("Expand", ["x", "s"], ["y"])):
        assert pc.checker_kind(node.op_type) == "empty" and pc.node_errors(node, 23) == [], node.op_type


def test_the_importers_rank_rules_of_trilu_expand_and_transpose():
    bad = tc.check_model(one_node(helper.make_node("Trilu", ["x"], ["y"]), [vi("x", F32, [4])], [vi("y", F32, [4])]))
    assert any("Trilu input must have at least 2 dimensions! Current number of dimensions = 1." in v
               for v in bad.violations), bad.violations
    ok = tc.check_model(one_node(helper.make_node("Trilu", ["x"], ["y"]), [vi("x", F32, [4, 4])], [vi("y", F32, [4, 4])]))
    assert ok.ok, ok.violations
    shape2d = helper.make_tensor("s", I64, [1, 2], [2, 4])
    bad = tc.check_model(one_node(helper.make_node("Expand", ["x", "s"], ["y"]), [vi("x", F32, [1, 4])],
                                  [vi("y", F32, None)], inits=[shape2d]))
    assert any("The shape tensor is required to be 1D." in v for v in bad.violations), bad.violations
    shape1d = helper.make_tensor("s", I64, [2], [2, 4])
    ok = tc.check_model(one_node(helper.make_node("Expand", ["x", "s"], ["y"]), [vi("x", F32, [1, 4])],
                                 [vi("y", F32, [2, 4])], inits=[shape1d]))
    assert ok.ok, ok.violations
    nine = [1] * 9
    bad = tc.check_model(one_node(helper.make_node("Transpose", ["x"], ["y"]), [vi("x", F32, nine)],
                                  [vi("y", F32, nine)]))
    assert any("max supported rank = 8" in v for v in bad.violations), bad.violations


def test_the_audit_runs_the_parsers_static_checks():
    cast = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.DOUBLE)
    rows = oa.audit_model(one_node(cast, [vi("x", F32, [4])], [vi("y", TensorProto.DOUBLE, [4])]),
                          bundle="b", graph="g")
    assert not rows[0].supported and "Unsupported data type for the Cast operator!" in rows[0].reason, rows
    q = [vi(n, TensorProto.FLOAT16, [1, 2, 4, 8]) for n in "qkv"]
    att = helper.make_node("Attention", ["q", "k", "v"], ["y"], softmax_precision=F32)
    rows = oa.audit_model(one_node(att, q, [vi("y", TensorProto.FLOAT16, [1, 2, 4, 8])]), bundle="b", graph="g")
    assert not rows[0].supported and "Setting softmax precision is not supported" in rows[0].reason, rows


def test_the_docs_table_is_written_between_its_markers(tmp_path):
    rows = [oa.OpRow(**r) for r in json.loads(RECORD.read_text())["rows"]]
    text = f"intro\n{oa.DOCS_BEGIN}\nold table\n{oa.DOCS_END}\nafter\n"
    out = oa.with_docs_table(text, rows)
    assert out.startswith("intro\n") and out.endswith(f"{oa.DOCS_END}\nafter\n") and "old table" not in out
    assert oa.markdown(rows) in out and oa.with_docs_table(out, rows) == out
    with pytest.raises(InputError, match="op-audit:begin .* put the two markers"):
        oa.with_docs_table("no markers here", rows)


@pytest.mark.parametrize("node, opset, message", [
    (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[2, 1]), 17,
     "This version of TensorRT does not support dilations other than 1."),
    (helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[1, 3]), 19,
     "This version of TensorRT does not support dilations other than 1."),
    (helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[2, 2], p=2), 18,
     "This version of TensorRT does not support dilations other than 1."),
    (helper.make_node("ArgMax", ["x"], ["y"], select_last_index=1), 11,
     "Per-opset 12 ONNX does not support the select_last_index attribute."),
    (helper.make_node("RandomNormal", [], ["y"], dtype=TensorProto.DOUBLE, shape=[2]), 17,
     "Unsupported data type in randomNormal"),
    (helper.make_node("RoiAlign", ["x", "r", "b"], ["y"], coordinate_transformation_mode="nearest"), 16,
     "Coordinate transformation mode must be half_pixel or output_half_pixel!"),
])
def test_the_other_transcribed_checkers_refuse_what_the_parser_refuses(node, opset, message):
    assert message in pc.node_errors(node, opset), pc.node_errors(node, opset)
    ok = {"MaxPool": dict(dilations=[1, 1]), "AveragePool": dict(dilations=[1, 1]), "LpPool": dict(dilations=[1, 1]),
          "ArgMax": {}, "RandomNormal": dict(dtype=TensorProto.FLOAT16), "RoiAlign": {}}[node.op_type]
    attrs = {**pc.node_attrs(node), **ok}
    if node.op_type == "ArgMax":
        opset = 12  # the attribute exists from opset 12
    if node.op_type == "RoiAlign":
        attrs.pop("coordinate_transformation_mode")
    fixed = helper.make_node(node.op_type, list(node.input), list(node.output), **attrs)
    assert pc.node_errors(fixed, opset) == [], pc.node_errors(fixed, opset)
