"""deploy/trt_lint runs onnx-tensorrt's static node checks (engines/parser_checks.py) as violations."""

import pytest
from onnx import TensorProto, helper

from lisa_trt.deploy import trt_lint as tc


def attention_model(**attrs):
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [1, 2, 4, 8]) for n in "qkv"]
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], name="att", **attrs)
    g = helper.make_graph([node], "g", vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 2, 4, 8])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


@pytest.mark.parametrize("attrs, message", [
    ({"softmax_precision": TensorProto.FLOAT}, "Setting softmax precision is not supported in TensorRT Attention."),
    ({"softcap": 30.0}, "Setting softcap is not supported in TensorRT Attention."),
])
def test_the_lint_refuses_what_the_attention_checker_refuses(attrs, message):
    g = tc.check_model(attention_model(**attrs))
    assert any(message in v for v in g.violations), (g.violations, g.warnings)


def test_a_plain_attention_passes_the_lint():
    g = tc.check_model(attention_model())
    assert g.ok, g.violations


def test_the_checker_conditions_on_other_ops():
    from lisa_trt.engines.parser_checks import node_errors

    resize = helper.make_node("Resize", ["x", "", "s"], ["y"], mode="cubic", antialias=1)
    assert node_errors(resize, 19) == ["Antialiasing is not supported currently."]
    assert node_errors(helper.make_node("Slice", ["x", "a"], ["y"]), 13) == [
        "Post-opset 10 Slice operator requires 3 - 5 inputs."]
    assert node_errors(helper.make_node("Cast", ["x"], ["y"], to=TensorProto.DOUBLE), 13) == [
        "Unsupported data type for the Cast operator! (to = ONNX type 11)"]
    assert node_errors(helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16), 13) == []


def test_strip_for_trt_keeps_everything_but_softmax_precision():
    from lisa_trt.engines.parser_checks import needs_trt_copy, strip_for_trt

    m = attention_model(softmax_precision=TensorProto.FLOAT, scale=0.5)
    assert needs_trt_copy(m) and strip_for_trt(m) == 1 and not needs_trt_copy(m)
    assert [a.name for a in m.graph.node[0].attribute] == ["scale"]
    assert tc.check_model(m).ok
