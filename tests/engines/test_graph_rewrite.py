"""The onnx-graphsurgeon rewrite of the GASV graph into its TensorRT variant (lisa::gasv plugin).

The plain graph is the exporter's own GASVGraph (export/onnx.py) on a tiny table. The TensorRT
variant cannot run without TensorRT, so its wiring is checked by `emulate_trt_variant`: ONNX
Runtime up to the plugin node, then the PyTorch reference on the plugin's actual inputs; it
must reproduce the plain graph (which ONNX Runtime runs) exactly.
"""

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx_graphsurgeon")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from export_artifacts import make_tables  # noqa: E402

from lisa_trt.engines.plugins import graph_rewrite as gr  # noqa: E402
from lisa_trt.engines.plugins import trt_plugin as tp  # noqa: E402
from lisa_trt.models.io_spec import GASV_K  # noqa: E402
from lisa_trt.speculative.gasv import GASVConfig  # noqa: E402
from lisa_trt.testing import make_target  # noqa: E402

C = 5


@pytest.fixture(scope="module")
def tables():
    return make_tables(make_target(), C=C)


@pytest.fixture(scope="module")
def plain(tables, tmp_path_factory):
    """gasv.onnx exported by the exporter's own GASVGraph (plain ONNX ops, ORT-runnable)."""
    from lisa_trt.models.io_spec import Graph, export_dims
    from lisa_trt.export.onnx import GASVGraph, onnx_from_torch
    from lisa_trt.export.validate import sample_inputs

    target = make_target()
    module = GASVGraph(tables)
    dims = export_dims(target.config, max_cache_len=40)
    example = sample_inputs(Graph.GASV, module.spec, dims, dict(target=target, tables=tables), nodes=4)
    path = tmp_path_factory.mktemp("gasv") / "gasv.onnx"
    onnx_from_torch(module, example, path)
    return path


def _inputs(V, rows=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, V, generator=g) * 3
    x[1, V // 3:] = float("-inf")                   # a filtered row
    kth = torch.topk(x[2], 7).values[-1]
    x[2] = x[2].masked_fill(x[2] < kth, float("-inf"))  # 7 finite logits
    tokens = x.argsort(-1, descending=True)[:, 1]   # near the top: gates open
    tokens[3] = 0
    parents = torch.tensor([-1, 0, 0, 1, 2][:rows])
    return x.numpy(), tokens.numpy(), parents.numpy()


def _run_plain(path, logits, tokens, parents, params):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"guided_logits": logits, "node_tokens": tokens, "node_parents": parents, "gasv_params": params}
    return dict(zip(gr.GRAPH_OUTPUTS, s.run(list(gr.GRAPH_OUTPUTS), feeds)))


def _vocab(path):
    return onnx.load(str(path)).graph.output[0].type.tensor_type.shape.dim[1].dim_value


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def test_the_plain_graph_is_not_tensorrt_compatible(plain):
    # why the rewrite exists: the cluster masses are a ScatterND with reduction="add"
    from lisa_trt.deploy.trt_lint import check_model

    gc = check_model(onnx.load(str(plain)), graph="gasv")
    assert not gc.ok and any("ScatterND" in v for v in gc.violations)


def test_rewrite_is_valid_onnx_with_one_plugin_node(plain, tables):
    before = hashlib.sha256(plain.read_bytes()).hexdigest()
    m = gr.rewrite_gasv(plain)
    onnx.checker.check_model(m)
    assert hashlib.sha256(plain.read_bytes()).hexdigest() == before  # the ORT graph is untouched
    assert [i.name for i in m.graph.input] == list(gr.GRAPH_INPUTS)
    assert [o.name for o in m.graph.output] == ["p", "delta_eff", "cand", "gate"]
    assert {(o.domain, o.version) for o in m.opset_import} >= {("", 23), ("lisa", 1)}
    ops = [n.op_type for n in m.graph.node]
    assert "ScatterND" not in ops and "MatMul" not in ops and "Softmax" not in ops  # the plain body is gone
    (node,) = gr.plugin_nodes(m)
    assert (node.op_type, node.domain) == ("gasv2", "lisa")
    a = _attrs(node)
    assert a["plugin_namespace"] == b"lisa" and a["plugin_version"] == b"1" and a["aot"] == 1
    assert a["num_warps"] == 4
    assert len(node.input) == tp.N_INPUTS and list(node.output) == ["p", "delta_eff", "gate"]
    assert node.input[0] == "guided_logits" and node.input[-1] == "gasv_params"
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    V, H = tables.w_tilde.shape
    nb, w, n2, cl, beta = (inits[n] for n in node.input[3:8])
    assert nb.shape == (V, GASV_K) and nb.dtype == np.int32
    assert w.shape == (V, H) and w.dtype == np.float32
    assert n2.shape == (V,) and cl.shape == (V,) and cl.dtype == np.int32 and beta.shape == (C,)
    np.testing.assert_allclose(w, tables.w_tilde.numpy(), rtol=0, atol=0)
    np.testing.assert_array_equal(cl, tables.cluster.numpy())
    np.testing.assert_array_equal(nb[:, :20], tables.lantern_neighbors.numpy())
    assert (nb[:, 20:] == -1).all()
    np.testing.assert_allclose(beta, tables.beta.numpy(), rtol=0, atol=0)


def test_tables_recovered_from_the_graph_are_the_exported_ones(plain, tables):
    t = gr.gasv_tables_from_onnx(onnx.load(str(plain)))
    for k in ("w_tilde", "w_tilde_norm2", "beta"):
        np.testing.assert_allclose(t[k], getattr(tables, k).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(t["cluster"], tables.cluster.numpy())
    np.testing.assert_array_equal(t["nb"][:, :20], tables.lantern_neighbors.numpy())


def _bundle_with_w_tilde_copies(plain, tables, folder, copies):
    """An engine directory (a manifest stand-in) whose gasv.onnx holds W~ under optimizer names,
    once per entry of `copies` (each a function of W~), as the exporter's optimizer may leave it."""
    import dataclasses
    import types

    from onnx import numpy_helper

    from lisa_trt.calibration.tables import save_tables
    from lisa_trt.models.io_spec import Graph

    m = onnx.load(str(plain))
    (w,) = [t for t in m.graph.initializer if t.name == "w_tilde"]
    arr = numpy_helper.to_array(w)
    m.graph.initializer.remove(w)
    for i, f in enumerate(copies):
        name = f"val_{100 + i}"
        m.graph.initializer.append(numpy_helper.from_array(f(arr), name))
        for node in m.graph.node:  # the first copy feeds the uses (the others: as the optimizer leaves them)
            node.input[:] = [name if (x == "w_tilde" and i == 0) else x for x in node.input]
    folder.mkdir()
    onnx.save(m, str(folder / "gasv.onnx"))
    save_tables(dataclasses.replace(tables, w_tilde=None), folder / "tables.safetensors")
    return types.SimpleNamespace(dir=folder, files={"tables": "tables.safetensors"}, target_hash=tables.target_hash,
                                 has=lambda g: g is Graph.GASV, graph_path=lambda g: folder / "gasv.onnx")


def test_bundle_tables_recover_a_renamed_w_tilde_copied_per_use(plain, tables, tmp_path):
    """The optimizer may rename a small W~ and copy it once per Gather that reads it (a Janus-Pro
    bundle's gasv.onnx did): identical copies are one W~; two different candidates are refused."""
    same = _bundle_with_w_tilde_copies(plain, tables, tmp_path / "same", [lambda a: a, lambda a: a.copy()])
    got = gr.tables_from_bundle(same)
    np.testing.assert_allclose(got["w_tilde"], tables.w_tilde.numpy(), rtol=1e-6, atol=1e-6)
    flipped = _bundle_with_w_tilde_copies(plain, tables, tmp_path / "two", [lambda a: a, lambda a: -a])
    with pytest.raises(gr.GraphRewriteError, match="w_tilde"):
        gr.tables_from_bundle(flipped)


def test_verify_tables_refuses_wrong_tables(plain, tables):
    t = gr.gasv_tables_from_onnx(onnx.load(str(plain)))
    t["beta"] = t["beta"][::-1].copy() * 3
    with pytest.raises(gr.GraphRewriteError, match="do not reproduce"):
        gr.verify_tables(onnx.load(str(plain)), t)


@pytest.mark.parametrize("cfg", [GASVConfig(theta_geo=3.0, neighbours=12, kappa=1.5, lam=0.3),
                                 GASVConfig(kappa=1.3, lam=0.25, delta=0.2, neighbours=5, gamma_kappa=0.4,
                                            gamma_lambda=2.0, gamma_delta=1.0, theta_clu=5.0, theta_geo=1.7,
                                            eps=1e-5)])
def test_trt_variant_computes_the_plain_graph(plain, cfg):
    # the plugin reference path (ORT up to the plugin + gasv_gates on its inputs) == the plain graph
    m = gr.rewrite_gasv(plain)
    logits, tokens, parents = _inputs(_vocab(plain))
    params = cfg.params().numpy()
    want = _run_plain(plain, logits, tokens, parents, params)
    got = gr.emulate_trt_variant(m, logits, tokens, parents, params)
    np.testing.assert_array_equal(got["cand"], want["cand"])
    for k in ("p", "delta_eff", "gate"):
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=2e-6)
    np.testing.assert_array_equal(got["params"], params)
    assert (want["gate"] > 0).any() and (want["gate"][1:, : cfg.neighbours] == 0).any()   # teeth


def test_explicit_tables_give_the_same_graph(plain, tables):
    a = gr.rewrite_gasv(plain)
    b = gr.rewrite_gasv(plain, tables=tables)
    ia = {t.name: onnx.numpy_helper.to_array(t) for t in a.graph.initializer}
    ib = {t.name: onnx.numpy_helper.to_array(t) for t in b.graph.initializer}
    assert ia.keys() == ib.keys()
    for k in ia:
        np.testing.assert_allclose(ia[k], ib[k], rtol=1e-6, atol=1e-6)


def test_write_trt_variant_next_to_the_source(plain, tmp_path):
    src = tmp_path / "gasv.onnx"
    src.write_bytes(plain.read_bytes())
    out = gr.write_trt_variant(src, aot=False)
    assert out == tmp_path / "gasv.trt.onnx" and out.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gasv.onnx", "gasv.trt.onnx"]  # no temp files left
    (node,) = gr.plugin_nodes(onnx.load(str(out)))
    assert _attrs(node)["aot"] == 0  # JIT variant, explicit (both impls are registered: kSTRICT_JIT)


def test_rewrite_refuses_other_graphs(plain, tmp_path):
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(gr.GraphRewriteError, match="not a lisa-trt GASV v2 graph"):
        gr.rewrite_gasv(helper.make_model(g))
