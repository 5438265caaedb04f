"""Operator audit (deploy/op_audit.py): every op of every graph TensorRT would parse, checked
against the TensorRT ONNX parser's support table for the pinned version; the recorded audit of the
demo / fp16 / quantized / Medusa bundles (bench/trt_op_audit.json) is the table in docs/tensorrt.md."""

import json
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from lisa_trt.deploy import op_audit as oa
from lisa_trt.deploy import trt_lint as tc

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "bench" / "trt_op_audit.json"


def test_tiny_bundle_ops_are_all_supported(bundle):
    rows = oa.audit_bundle(bundle, name="tiny")
    assert rows and all(r.supported for r in rows), [r for r in rows if not r.supported]
    ops = {r.op for r in rows}
    assert {"Softmax", "MatMul", "gasv2"} <= ops and "ScatterND" not in ops  # gasv: TensorRT variant
    assert not ops & {"ScatterElements", "TensorScatter", "Attention"}  # graphs return new K/V rows, write no cache
    assert all(r.opset >= 23 for r in rows if r.op == "Softmax")
    oa.check_rows(rows)


def _model(node, inputs, outputs, opset=17, extra=()):
    g = helper.make_graph([node], "g", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), *extra])


def test_an_op_outside_the_table_fails():
    f32 = TensorProto.FLOAT
    x, y = helper.make_tensor_value_info("x", f32, [4]), helper.make_tensor_value_info("y", f32, [4])
    rows = oa.audit_model(_model(helper.make_node("Unique", ["x"], ["y"]), [x], [y]), bundle="b", graph="g")
    with pytest.raises(oa.OpAuditError, match="Unique .*support matrix"):
        oa.check_rows(rows)
    ort_op = helper.make_node("MatMulNBits", ["x"], ["y"], domain="com.microsoft")  # an ORT-quantized bundle
    rows = oa.audit_model(_model(ort_op, [x], [y], extra=[helper.make_opsetid("com.microsoft", 1)]),
                          bundle="b", graph="g")
    with pytest.raises(oa.OpAuditError, match="com.microsoft::MatMulNBits"):
        oa.check_rows(rows)
    nd = helper.make_node("ScatterND", ["x", "i", "x"], ["y"], reduction="add")    # the restriction is checked
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [4, 1])
    rows = oa.audit_model(_model(nd, [x, i], [y], opset=18), bundle="b", graph="g")
    assert not rows[0].supported and "reduction" in rows[0].reason


def test_recorded_audit_is_supported_and_is_the_docs_table():
    rec = json.loads(RECORD.read_text())
    assert tuple(rec["trt_version"]) == tc.TRT_MIN_VERSION
    rows = [oa.OpRow(**r) for r in rec["rows"]]
    bundles = {r.bundle for r in rows}
    assert {"demo", "demo-fp16", "demo-medusa", "demo-trt-int8", "demo-trt-int4"} <= bundles, bundles
    ops = {r.op for r in rows}  # recorded from io spec v2 bundles (docs/tensorrt.md says which ops are absent)
    assert not ops & {"Attention", "ScatterElements", "ScatterND", "TensorScatter", "Trilu"}, ops
    assert {"QuantizeLinear", "DequantizeLinear"} <= {r.op for r in rows if r.bundle == "demo-trt-int8"}
    for r in rows:  # every recorded op is in the table as the code has it now
        assert r.domain == "lisa" or r.op in tc.SUPPORTED_OPS, r
    oa.check_rows(rows)                                            # fails on an op outside the table
    docs = (ROOT / "docs" / "tensorrt.md").read_text()
    assert oa.markdown(rows) in docs, "docs/tensorrt.md: re-run scripts/trt_op_audit.py and paste its table"
