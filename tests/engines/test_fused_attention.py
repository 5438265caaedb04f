"""Attention in the form TensorRT fuses (issue 51), checked against NVIDIA's documented pattern.

NVIDIA, TensorRT developer guide, "Fused Attention" (inference-library/transformers-fused-attention;
method 2, attention written with IMatrixMultiplyLayer / ISoftMaxLayer): TensorRT fuses
softmax(Q * K^T (mask)) * V, the mask a bool or an add mask, and requires Q or K to be multiplied by
the attention scale before the first batched matmul (BMM1). `attention_ops.fused_attention_report`
encodes it; every attention of an exported bundle must pass, the forms exported before (scale after
BMM1, scores concatenated and probabilities sliced) must not. `choose_attention` is then given a
refused and an accepted probe (both for ONNX Attention nodes and for the pattern a bundle holds)."""

import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from test_trt_compat import tiny_bundle  # noqa: E402

from lisa_trt.deploy import attention_probe as AP  # noqa: E402
from lisa_trt.deploy.build import profiles_from_io_spec  # noqa: E402
from lisa_trt.engines import attention_ops as A  # noqa: E402
from lisa_trt.engines.trt_plans import EngineBuildError  # noqa: E402
from lisa_trt.export.manifest import read_manifest  # noqa: E402
from lisa_trt.models.io_spec import Graph  # noqa: E402


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return tiny_bundle(tmp_path_factory)


def _reports(d):
    man = read_manifest(d)
    out = {}
    for g in man.graphs:
        out[g] = A.fused_attention_report(onnx.load(str(man.graph_path(Graph(g))), load_external_data=False))
    return man, out


def test_every_attention_of_the_bundle_is_the_fused_pattern(bundle):
    man, reports = _reports(bundle)
    n_layer = man.target_config.n_layer
    assert len(reports["target_verify"]) == n_layer and len(reports["drafter_step"]) == 1
    assert reports["vq_decode"] and not reports["gasv"]          # the VQ decoder's attention is checked too
    for g, rs in reports.items():
        for r in rs:
            assert r["violations"] == [], (g, r)
            assert r["scale"] == "q" and r["bmm1"] and r["bmm2"]
        if g in ("target_verify", "target_prefill", "drafter_step"):
            assert all(r["mask"] == "Where" for r in rs), g     # bool mask: select, as documented


def _old_form(scale_after: bool, split: bool):
    """The attention lisa-trt exported before (models/layers.py before issue 51): BMM1 against the
    cache and against the new rows, Concat of the scores, Mul(scale) after BMM1, Where, Softmax,
    two Slices, two BMM2 and an Add; or only the scale moved after BMM1."""
    f = TP.FLOAT
    ins = [helper.make_tensor_value_info(n, f, s) for n, s in
           (("q", [1, 2, 3, 4]), ("kt", [1, 2, 4, 5]), ("knt", [1, 2, 4, 3]), ("v", [1, 2, 5, 4]),
            ("vn", [1, 2, 3, 4]))] + [helper.make_tensor_value_info("m", TP.BOOL, [1, 1, 3, 8 if split else 5])]
    inits = [helper.make_tensor("s", f, [], [0.5]), helper.make_tensor("ninf", f, [], [-np.inf]),
             helper.make_tensor("st", TP.INT64, [1], [0]), helper.make_tensor("mid", TP.INT64, [1], [5]),
             helper.make_tensor("end", TP.INT64, [1], [8]), helper.make_tensor("ax", TP.INT64, [1], [3])]
    if split:
        nodes = [helper.make_node("MatMul", ["q", "kt"], ["s1"]), helper.make_node("MatMul", ["q", "knt"], ["s2"]),
                 helper.make_node("Concat", ["s1", "s2"], ["sc"], axis=-1)]
    else:
        nodes = [helper.make_node("MatMul", ["q", "kt"], ["sc"])]
    nodes += [helper.make_node("Mul", ["sc", "s"], ["ss"]) if scale_after else
              helper.make_node("Identity", ["sc"], ["ss"]),
              helper.make_node("Where", ["m", "ss", "ninf"], ["w"]), helper.make_node("Softmax", ["w"], ["p"], axis=-1)]
    if split:
        nodes += [helper.make_node("Slice", ["p", "st", "mid", "ax"], ["p1"]),
                  helper.make_node("Slice", ["p", "mid", "end", "ax"], ["p2"]),
                  helper.make_node("MatMul", ["p1", "v"], ["y1"]), helper.make_node("MatMul", ["p2", "vn"], ["y2"]),
                  helper.make_node("Add", ["y1", "y2"], ["y"])]
    else:
        nodes += [helper.make_node("MatMul", ["p", "v"], ["y"])]
    g = helper.make_graph(nodes, "old", ins, [helper.make_tensor_value_info("y", f, [1, 2, 3, 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])


def test_the_forms_tensorrt_does_not_fuse_are_refused():
    (r,) = A.fused_attention_report(_old_form(scale_after=True, split=True))
    assert any("not one BMM2" in v for v in r["violations"])                 # the Slice split of P
    assert any("between BMM1 and Softmax" in v for v in r["violations"])      # Mul(scale) / Concat there
    (r,) = A.fused_attention_report(_old_form(scale_after=True, split=False))
    assert r["violations"] and any("Mul between BMM1" in v for v in r["violations"])
    assert r["scale"] is None                                                 # nothing scaled Q or K first


# ----------------------------------------------------------------------------- choose_attention

def _attention_node_manifest(tmp_path):
    """A stand-in manifest whose target_verify graph is one ONNX Attention node (3 x 5 keys)."""
    spec = {"node": "att", "inputs": [(TP.FLOAT, [2, 4, 3, 8]), (TP.FLOAT, [2, 4, 5, 8]), (TP.FLOAT, [2, 4, 5, 8]),
                                      (TP.BOOL, [2, 1, 3, 5])], "output": (TP.FLOAT, [2, 4, 3, 8]), "attrs": {}}
    path = tmp_path / "target_verify.onnx"
    onnx.save(A.probe_model(spec, 23), str(path))
    man = types.SimpleNamespace(graph_path=lambda g: path)
    return man, {"target_verify": [{}]}


def _builder(refuse: bool, calls: list):
    def build(path, profiles, plan):
        calls.append([n.op_type for n in onnx.load(str(path)).graph.node])
        if refuse:
            raise EngineBuildError("Could not find any implementation for node att (test)")
    return build


def test_choose_attention_given_a_refused_and_an_accepted_probe(tmp_path):
    man, profiles = _attention_node_manifest(tmp_path)
    calls, warned = [], []
    modes, probes = AP.choose_attention(man, ["target_verify"], profiles, "auto", build=_builder(False, calls),
                                        warn=warned.append)
    assert modes == {"target_verify": "op"} and warned == [] and len(calls) == 1   # accepted: IAttention
    assert probes["target_verify"][0]["ok"]
    modes, probes = AP.choose_attention(man, ["target_verify"], profiles, "auto", build=_builder(True, calls),
                                        warn=warned.append)
    assert modes == {"target_verify": "plain"} and len(warned) == 1 and "plain ops" in warned[0]  # refused
    assert not probes["target_verify"][0]["ok"] and "att" in probes["target_verify"][0]["error"]
    with pytest.raises(AP.AttentionRefusedError, match="--attention plain"):
        AP.choose_attention(man, ["target_verify"], profiles, "op", build=_builder(True, calls))


def test_auto_probes_the_pattern_the_bundle_holds(bundle):
    """The bundle has no Attention node: `auto` cuts each distinct attention out of the graph (the
    scale Mul to BMM2), checks it against the pattern and builds it; refused -> "unfused" and a
    warning (auto) or the error (op); accepted -> "fused"."""
    man = read_manifest(bundle)
    profiles = profiles_from_io_spec(man, seq_split=4)
    names = ["target_verify", "drafter_step"]
    calls = []
    modes, probes = AP.choose_attention(man, names, profiles, "auto", build=_builder(False, calls))
    assert modes == {"target_verify": "fused", "drafter_step": "fused"} and calls
    for ops in calls:  # each probe: the scale Mul into BMM1, the mask, Softmax, BMM2
        assert [o for o in ops if o in ("Mul", "MatMul", "Where", "Softmax")] == ["Mul", "MatMul", "Where",
                                                                                  "Softmax", "MatMul"], ops
    assert all(r["kind"] == "pattern" and r["ok"] for rs in probes.values() for r in rs)
    assert len(probes["target_verify"]) == man.target_config.n_layer
    warned = []
    modes, _ = AP.choose_attention(man, names, profiles, "auto", build=_builder(True, []), warn=warned.append)
    assert modes == {"target_verify": "unfused", "drafter_step": "unfused"} and len(warned) == 2
    with pytest.raises(AP.AttentionRefusedError):
        AP.choose_attention(man, names, profiles, "op", build=_builder(True, []))


def test_a_probe_of_an_unfusable_pattern_is_refused_without_tensorrt(tmp_path):
    """In a dry run the pattern check answers: the old form's probe is refused, naming why."""
    model = _old_form(scale_after=True, split=False)
    (r,) = A.fused_attention_report(model)
    err = AP._static_errors(model, [{}])
    assert err and "fused-attention pattern" in err[0]


def test_fp16_attention_keeps_scores_and_softmax_in_fp32(tmp_path):
    """rows_attention exported in fp16 (dynamo, opset 23): BMM1's scores are cast to fp32 before the
    mask and the Softmax, and only the probabilities go back to fp16 for BMM2 (issue 53: computing
    them in fp16 passed every test). Independent of how a bundle's export upcasts: the function itself."""
    import torch
    from test_kv_rows import _case, _Layer

    q, k, v, kc, vc, slots, mask = _case(4, 2)
    args = tuple(a.half() if a.is_floating_point() else a for a in (q, k, v, mask, slots, kc, vc))
    path = tmp_path / "rows16.onnx"
    torch.onnx.export(_Layer(), args, str(path), dynamo=True, opset_version=23, verbose=False)
    (r,) = A.fused_attention_report(onnx.load(str(path)))
    assert r["violations"] == [] and r["scale"] == "q"
    assert r["softmax_dtype"] == TP.FLOAT and r["casts"] == [TP.FLOAT, TP.FLOAT16], r
