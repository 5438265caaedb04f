"""The exporter pitfall a VQ decoder hit: torch.chunk over a [x; y] batch concatenation makes the
dynamo exporter fix the batch axis (ONNX Runtime then fails validation with INVALID_ARGUMENT).
The export refuses such a graph and the TensorRT lint reports it, both naming the pitfall."""

import onnx
import pytest
import torch
from onnx import TensorProto, helper

from lisa_trt.deploy import trt_lint as tc
from lisa_trt.export.onnx import ExportError, _NamedGraph, onnx_from_torch
from lisa_trt.models.io_spec import Graph, GraphSpec, TensorSpec

SPEC = GraphSpec(Graph.VQ_DECODE, (TensorSpec("image_tokens", "int64", ("batch", "h_lat", "w_lat"), "codes"),),
                 (TensorSpec("images", "float32", ("batch", "channels", "height", "width"), "pixels"),), doc="test")


class Chunked(_NamedGraph):
    def __init__(self, chunk: bool):
        super().__init__(SPEC)
        self.emb, self.chunk = torch.nn.Embedding(16, 3), chunk

    def compute(self, x):
        q = self.emb(x["image_tokens"]).permute(0, 3, 1, 2)
        if self.chunk:  # the pitfall: both halves through one op, then chunked apart
            a, b = torch.chunk(torch.cat([q, 2 * q]) * 0.5, 2, dim=0)
        else:
            a, b = q * 0.5, 2 * q * 0.5
        return dict(images=a + b)


def test_export_refuses_a_batch_fixed_by_chunk_and_names_the_pitfall(tmp_path):
    x = dict(image_tokens=torch.randint(0, 16, (2, 3, 4)))
    onnx_from_torch(Chunked(False), x, tmp_path / "ok.onnx")  # the same math without chunk keeps the batch
    m = onnx.load(str(tmp_path / "ok.onnx"))
    assert not m.graph.input[0].type.tensor_type.shape.dim[0].HasField("dim_value")
    with pytest.raises(ExportError, match="torch.chunk"):
        onnx_from_torch(Chunked(True), x, tmp_path / "bad.onnx")
    assert not (tmp_path / "bad.onnx").exists()


def test_lint_names_the_pitfall_on_a_graph_with_a_fixed_batch_and_a_batch_split():
    split = helper.make_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2)
    add = helper.make_node("Add", ["a", "b"], ["images"])
    g = helper.make_graph([split, add], "g", [helper.make_tensor_value_info("image_tokens", TensorProto.INT64,
                                                                             [2, 3, 4])],
                          [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, 6, 8])])
    g.node.insert(0, helper.make_node("Cast", ["image_tokens"], ["x"], to=TensorProto.FLOAT))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    v = tc.check_model(m, spec=SPEC, dims={}).violations
    assert any("torch.chunk" in s and "image_tokens axis 'batch' = 2" in s for s in v), v
    m.graph.node.remove(m.graph.node[1])  # no batch split: the fixed axis is still reported, without the pitfall's name
    v = tc.check_model(m, spec=SPEC, dims={}).violations
    assert any("fixed dynamic axes" in s for s in v) and not any("torch.chunk" in s for s in v), v
