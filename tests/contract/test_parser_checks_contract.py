"""The fake parser runs onnx-tensorrt's static node checks (lisa_trt/engines/parser_checks.py,
transcribed from onnxOpCheckers.cpp) over every node, standard ONNX domain included, so a graph
carrying an attribute TensorRT's parser refuses fails here, before anyone owns a GPU."""

import sys
from pathlib import Path

import pytest
from onnx import TensorProto, helper

import trt_fake

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "export"))

pytestmark = pytest.mark.contract


def attention_model(**attrs):
    """A one-node opset-23 fp16 Attention graph with the given attributes."""
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [1, 2, 4, 8]) for n in "qkv"]
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], name="att", **attrs)
    g = helper.make_graph([node], "g", vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 2, 4, 8])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


def parse(path, version="10.14.1.48.post1"):
    """(ok, error descriptions) of the fake parser on one file."""
    trt = trt_fake.make_fake_trt(version)
    net = trt.Builder(trt.Logger()).create_network(0)
    parser = trt.OnnxParser(net, trt.Logger())
    ok = parser.parse_from_file(str(path))
    return ok, [parser.get_error(i).desc() for i in range(parser.num_errors)]


@pytest.mark.parametrize("attrs, message", [
    ({"softmax_precision": TensorProto.FLOAT}, "Setting softmax precision is not supported in TensorRT Attention."),
    ({"softcap": 30.0}, "Setting softcap is not supported in TensorRT Attention."),
])
def test_the_fake_parser_refuses_what_the_attention_checker_refuses(tmp_path, attrs, message):
    import onnx

    onnx.save(attention_model(**attrs), str(tmp_path / "a.onnx"))
    ok, errors = parse(tmp_path / "a.onnx")
    assert not ok and any(message in e for e in errors), errors


def test_a_plain_attention_passes_the_fake_parser(tmp_path):
    import onnx

    onnx.save(attention_model(), str(tmp_path / "a.onnx"))
    assert parse(tmp_path / "a.onnx") == (True, [])


@pytest.mark.parametrize("op, message", [
    ("Unique", "UNSUPPORTED_NODE: Unique"),             # registered, its checker always fails
    ("NoSuchOp", "Plugin not found, are the plugin name, version, and namespace correct?"),  # no checker
])
def test_the_fake_parser_refuses_an_unsupported_or_unknown_standard_op(tmp_path, op, message):
    import onnx

    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in "xy")
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="n")], "g", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)], ir_version=10), str(tmp_path / "a.onnx"))
    ok, errors = parse(tmp_path / "a.onnx")
    assert not ok and any(message in e for e in errors), errors


@pytest.fixture(scope="module")
def fp16_bundle(tmp_path_factory):
    from export_artifacts import make_artifacts

    from lisa_trt.export import export_bundle

    a = make_artifacts()
    out = tmp_path_factory.mktemp("fp16") / "eng"
    export_bundle(a["target"], a["drafter"], a["tables"], None, out, max_tree=8, fp16=True, validate=False,
                  lint=False, progress=False)
    return out


@pytest.mark.slow
def test_every_graph_tensorrt_parses_of_an_fp16_bundle_passes_the_fake_parser(fp16_bundle, tmp_path):
    """What build_engines hands the parser passes; fp16 graphs need no TensorRT copy (no Attention
    node, so no softmax_precision to strip: they attend with MatMul / Softmax)."""
    import onnx

    from lisa_trt.engines.profiles import trt_graph_model, write_trt_copies
    from lisa_trt.export.manifest import read_manifest
    from lisa_trt.models.io_spec import Graph

    man = read_manifest(fp16_bundle)
    written = write_trt_copies(man, [g for g in man.graphs if g != Graph.GASV.value])
    assert written == [], "fp16 graphs attend with plain ops: no Attention softmax_precision to strip for TensorRT"
    for name in man.graphs:
        if name == Graph.GASV.value:
            continue
        _, path = trt_graph_model(man, Graph(name))
        ok, errors = parse(path)
        assert ok, (name, errors)
    ort = onnx.load(str(man.graph_path(Graph.TARGET_VERIFY)), load_external_data=False)
    assert not any(n.op_type == "Attention" for n in ort.graph.node)
    assert "Softmax" in {n.op_type for n in ort.graph.node}
