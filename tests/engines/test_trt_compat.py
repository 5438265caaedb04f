"""The CPU TensorRT-compatibility check: passes on a real export, fails loudly on what TensorRT
cannot build (unsupported ops, dtypes, op restrictions, plugin attributes, shapes vs profiles)."""

import json
import shutil
import sys
from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))

from lisa_trt.deploy import trt_lint as tc  # noqa: E402

F32, F64, I64, BOOL = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.BOOL


def tiny_bundle(tmp_path_factory) -> Path:
    """One fp32 export of the tiny c2i model per test session (shared by tests/engines/test_*)."""
    out = tmp_path_factory.getbasetemp() / "trt_tiny_bundle"
    if not (out / "manifest.json").is_file():
        from export_artifacts import make_artifacts

        from lisa_trt.export import export_bundle

        a = make_artifacts()
        export_bundle(a["target"], a["drafter"], a["tables"], a["vq"], out, max_tree=16, validate=False,
                      lint=False, progress=False)
    return out


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return tiny_bundle(tmp_path_factory)


def model(nodes, inputs, outputs, inits=(), opset=23, functions=(), extra_opsets=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)] + list(extra_opsets),
                             functions=list(functions))


def vi(name, t=F32, shape=(2, 3)):
    return helper.make_tensor_value_info(name, t, list(shape))


# ----------------------------------------------------------------------------- real export

def test_passes_on_the_tiny_export(bundle):
    r = tc.check_trt_compat(bundle)
    assert r.ok, r.summary()
    assert set(r.graphs) == {"target_prefill", "target_verify", "drafter_project", "drafter_step", "drafter_fused",
                             "gasv", "vq_decode"}
    assert r.graphs["gasv"].file == "gasv.trt.onnx" and r.graphs["gasv"].plugins == ["lisa_gasv"]
    verify = r.graphs["target_verify"].ops
    assert verify["Softmax"] == 4 and "Attention" not in verify     # one per layer, over the cache + new rows
    assert not any(op in g.ops for g in r.graphs.values() for op in ("ScatterElements", "ScatterND", "TensorScatter"))
    assert r.min_trt_version == (10, 14)                             # the export opset (23), not a KV op
    assert all(g.profiles for g in r.graphs.values())
    json.dumps(r.to_dict())  # serialisable (recorded next to benchmarks / in CI logs)


def test_an_older_tensorrt_target_fails(bundle):
    with pytest.raises(tc.TrtCompatError, match=r"opset 23 > 20 needs a newer TensorRT parser than 10\.8"):
        tc.check_trt_compat(bundle, trt_version=(10, 8))


def test_a_broken_graph_in_the_directory_fails_the_check(bundle, tmp_path):
    d = tmp_path / "broken"
    shutil.copytree(bundle, d)
    path = d / "drafter_project.onnx"
    m = onnx.load(str(path))
    old = m.graph.output[0].name
    m.graph.node[-1].output[0] = "pre"
    m.graph.node.append(helper.make_node("Cast", ["pre"], ["pre64"], to=F64))   # DOUBLE inside the network
    m.graph.node.append(helper.make_node("Cast", ["pre64"], [old], to=F32))
    onnx.save(m, str(path))
    man = json.loads((d / "manifest.json").read_text())
    import hashlib

    man["graphs"]["drafter_project"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (d / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(tc.TrtCompatError, match="drafter_project.*FAILED") as e:
        tc.check_trt_compat(d)
    assert "Unsupported data type for the Cast operator! (to = ONNX type 11)" in str(e.value)
    assert "does not take double inputs" in str(e.value)
    r = tc.check_trt_compat(d, raise_on_error=False)
    assert not r.ok and r.graphs["target_verify"].ok


def test_profiles_that_do_not_fit_fail(bundle):
    from lisa_trt.deploy.build import ProfileSpec, profiles_from_io_spec
    from lisa_trt.export.manifest import read_manifest

    profiles = profiles_from_io_spec(read_manifest(bundle))
    p = profiles["target_verify"][0]
    bad = dict(p.shapes)
    mn, opt, mx = bad["attention_mask"]
    bad["attention_mask"] = (mn, opt, mx[:2] + (mx[2] + 8,))   # cache length is static
    profiles["target_verify"] = [ProfileSpec("bad", bad)]
    del profiles["vq_decode"]
    r = tc.check_trt_compat(bundle, profiles=profiles, raise_on_error=False)
    v = r.graphs["target_verify"].violations
    assert any("attention_mask axis 2 is static" in x for x in v), v
    assert r.graphs["vq_decode"].violations == ["no optimisation profile for vq_decode"]


# ----------------------------------------------------------------------------- hand-made graphs

def test_supported_graph_passes():
    m = model([helper.make_node("Add", ["x", "y"], ["z"]), helper.make_node("Relu", ["z"], ["out"])],
              [vi("x"), vi("y")], [vi("out")])
    gc = tc.check_model(m)
    assert gc.ok and gc.ops == {"Add": 1, "Relu": 1}


@pytest.mark.parametrize("node,msg", [
    (helper.make_node("Unique", ["x"], ["out"]), "Unique is not in TensorRT"),
    (helper.make_node("GroupQueryAttention", ["x"], ["out"], domain="com.microsoft"),
     "com.microsoft::GroupQueryAttention"),
    (helper.make_node("Det", ["x"], ["out"]), "Det is not in TensorRT"),
])
def test_unsupported_ops_fail(node, msg):
    extra = [helper.make_opsetid("com.microsoft", 1)] if node.domain else []
    gc = tc.check_model(model([node], [vi("x")], [vi("out")], extra_opsets=extra))
    assert not gc.ok and any(msg in v for v in gc.violations), gc.violations


def test_bad_dtypes_fail():
    m = model([helper.make_node("Add", ["x", "x"], ["out"])], [vi("x", F64)], [vi("out", F64)])
    gc = tc.check_model(m)
    assert any("element type double" in v for v in gc.violations), gc.violations
    m = model([helper.make_node("Cast", ["x"], ["u"], to=TensorProto.UINT8),
               helper.make_node("Cast", ["u"], ["out"], to=F32)], [vi("x")], [vi("out")])
    assert any("uint8 inside the network" in v for v in tc.check_model(m).violations)
    m = model([helper.make_node("Sqrt", ["x"], ["out"])], [vi("x", I64)], [vi("out", I64)])
    assert any("Sqrt does not take int64" in v for v in tc.check_model(m).violations)


def test_op_restrictions():
    idx = helper.make_tensor("idx", I64, [1, 1], [0])
    upd = helper.make_tensor("upd", F32, [1, 3], [1, 2, 3])
    m = model([helper.make_node("ScatterND", ["x", "idx", "upd"], ["out"], reduction="add")],
              [vi("x")], [vi("out")], inits=[idx, upd])
    assert any("ScatterND reduction='add'" in v for v in tc.check_model(m).violations)
    # ScatterElements with a reduction: imported through the standard plugin -> warning only
    m = model([helper.make_node("ScatterElements", ["x", "i2", "u2"], ["out"], axis=1, reduction="add")],
              [vi("x")], [vi("out")], inits=[helper.make_tensor("i2", I64, [1, 1], [0]),
                                             helper.make_tensor("u2", F32, [1, 1], [1.0])])
    gc = tc.check_model(m)
    assert gc.ok and any("ScatterElements v2 plugin" in w for w in gc.warnings)
    k = helper.make_tensor("k", I64, [1], [4000])
    m = model([helper.make_node("TopK", ["x", "k"], ["v", "i"])], [vi("x", shape=(2, 5000))],
              [vi("v", shape=(2, 4000)), vi("i", I64, (2, 4000))], inits=[k])
    assert any("must be less than 3840" in v for v in tc.check_model(m).violations)
    axes = helper.make_node("Shape", ["x"], ["ax"], start=0, end=1)
    m = model([axes, helper.make_node("ReduceSum", ["x", "ax"], ["out"])], [vi("x")], [vi("out", shape=(3,))])
    assert any("`axes` must be an initializer" in v for v in tc.check_model(m).violations)


def test_attention_restrictions():
    q = [vi(n, F32, (1, 2, 4, 8)) for n in ("q", "k", "v")]
    ok = model([helper.make_node("Attention", ["q", "k", "v"], ["y"])], q, [vi("y", F32, (1, 2, 4, 8))])
    gc = tc.check_model(ok)
    assert gc.ok and gc.min_trt_version == (10, 14)
    assert any("needs TensorRT >= 10.14" in v for v in tc.check_model(ok, trt_version=(10, 9)).violations)
    past = [vi(n, F32, (1, 2, 3, 8)) for n in ("pk", "pv")]
    bad = model([helper.make_node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y", "prk", "prv"])], q + past,
                [vi("y", F32, (1, 2, 4, 8)), vi("prk", F32, (1, 2, 7, 8)), vi("prv", F32, (1, 2, 7, 8))])
    v = tc.check_model(bad).violations
    assert any("one output" in x for x in v) and any("past_key / past_value" in x for x in v), v


def test_functions_and_subgraphs_are_walked():
    f = helper.make_function("custom", "Fn", ["a"], ["b"], [helper.make_node("Unique", ["a"], ["b"])],
                             [helper.make_opsetid("", 23)])
    m = model([helper.make_node("Fn", ["x"], ["out"], domain="custom")], [vi("x")], [vi("out")], functions=[f],
              extra_opsets=[helper.make_opsetid("custom", 1)])
    gc = tc.check_model(m)
    assert any("Fn/" in v and "Unique" in v for v in gc.violations), gc.violations
    then = helper.make_graph([helper.make_node("Det", ["x"], ["t"])], "then", [], [vi("t", F32, ())])
    other = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["e"], keepdims=0)], "else", [],
                              [vi("e", F32, ())])
    m = model([helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other)],
              [vi("c", BOOL, ()), vi("x", F32, (2, 2))], [vi("out", F32, ())])
    assert any("then_branch/" in v and "Det" in v for v in tc.check_model(m).violations)


def _plugin_model(op_type=None, **attr_overrides):
    from lisa_trt.engines.plugins import trt_plugin as tp

    ins = ["logits", "tok", "par", "nb", "w", "n2", "cl", "beta", "params"]
    node = tp.onnx_plugin_node(ins, ["p", "delta_eff", "gate"])
    if op_type:
        node.op_type = op_type
    keep = [a for a in node.attribute if a.name not in attr_overrides]
    del node.attribute[:]
    node.attribute.extend(keep + [helper.make_attribute(k, v) for k, v in attr_overrides.items() if v is not None])
    I32 = TensorProto.INT32
    inits = [helper.make_tensor("nb", I32, [4, 2], [1, 2, 0, 2, 3, 1, 2, 0]),
             helper.make_tensor("w", F32, [4, 2], [0.0] * 8), helper.make_tensor("n2", F32, [4], [0.0] * 4),
             helper.make_tensor("cl", I32, [4], [0, 1, 0, 1]),
             helper.make_tensor("beta", F32, [2], [1.0, 1.0]), helper.make_tensor("params", F32, [10], [0.0] * 10)]
    return model([node], [vi("logits", F32, ("N", 4)), vi("tok", I32, ("N",)), vi("par", I32, ("N",))],
                 [vi("p", F32, ("N", 4)), vi("delta_eff", F32, ("N",)), vi("gate", F32, ("N", 2))],
                 inits=inits, opset=17, extra_opsets=[helper.make_opsetid("lisa", 1)])


def test_plugin_node_attributes():
    gc = tc.check_model(_plugin_model())
    assert gc.ok and gc.plugins == ["lisa_gasv"] and gc.min_trt_version == (10, 9)
    v = tc.check_model(_plugin_model(plugin_namespace=None)).violations
    assert any("plugin_namespace='lisa'" in x for x in v), v
    # tensorrt.plugin registers every plugin as version "1" (_lib.py); "2" would be "Plugin not found"
    v = tc.check_model(_plugin_model(plugin_version="2")).violations
    assert any("plugin_version='2'" in x and "set plugin_version='1'" in x for x in v), v
    v = tc.check_model(_plugin_model(op_type="gasv")).violations           # the retired GASV v1 plugin name
    assert any("retired GASV v1" in x and "lisa::gasv2" in x for x in v), v
    # no aot attribute: both impls are registered, so tensorrt.plugin (_lib.py) refuses to pick one
    v = tc.check_model(_plugin_model(aot=None)).violations
    assert any("no aot attribute" in x for x in v), v
    gc = tc.check_model(_plugin_model(aot=0))
    assert gc.ok and any("JIT" in w for w in gc.warnings)


def test_plugin_input_dtype_is_checked():
    m = _plugin_model()
    for t in m.graph.initializer:
        if t.name == "cl":
            t.CopyFrom(helper.make_tensor("cl", I64, [4], [0, 1, 0, 1]))
    assert any("plugin input cl is int64, the kernel takes int32" in x for x in tc.check_model(m).violations)


def test_io_spec_dynamic_axes_must_stay_symbolic():
    from lisa_trt.models.io_spec import Graph, graph_spec

    spec = graph_spec(Graph.DRAFTER_PROJECT)
    good = model([helper.make_node("Identity", ["taps"], ["hidden"])], [vi("taps", F32, ("batch", "seq", 6))],
                 [vi("hidden", F32, ("batch", "seq", 6))])
    assert tc.check_model(good, spec=spec, dims={"tap_dim": 6, "draft_hidden": 6}).ok
    fixed = model([helper.make_node("Identity", ["taps"], ["hidden"])], [vi("taps", F32, (2, "seq", 6))],
                  [vi("hidden", F32, (2, "seq", 6))])
    v = tc.check_model(fixed, spec=spec, dims={"tap_dim": 6, "draft_hidden": 6}).violations
    assert any("dynamic axis 'batch' was specialised to 2" in x for x in v), v
    v = tc.check_model(good, spec=spec, dims={"tap_dim": 6, "draft_hidden": 6}, precision="fp16").violations
    assert any("io spec says float16" in x for x in v), v


@pytest.mark.slow
def test_passes_on_an_fp16_export(tmp_path):
    # fp16 graphs add Cast nodes and Attention softmax_precision; TensorRT builds them strongly typed
    from export_artifacts import make_artifacts

    from lisa_trt.export import export_bundle

    a = make_artifacts()
    out = tmp_path / "fp16"
    export_bundle(a["target"], a["drafter"], a["tables"], None, out, max_tree=8, fp16=True, validate=False,
                  lint=False, progress=False)
    r = tc.check_trt_compat(out)
    assert r.ok and r.graphs["target_verify"].ops.get("Cast", 0) > 0


def test_verify_prefill_profile_only_when_the_tree_profiles_do_not_cover_the_prompt():
    """One target engine: target_verify also runs the prefill. A prompt no longer than the tree
    profile needs nothing more; a longer one adds a "prefill" profile 1 .. prompt (opt half)."""
    from lisa_trt.engines.profiles import _axis_ranges
    from lisa_trt.models.io_spec import Graph

    kw = dict(max_batch=2, max_tree=16, cfg=True, seq_split=8)
    short = _axis_ranges(Graph.TARGET_VERIFY, verify_prefill=16, **kw)
    assert [n for n, _ in short] == ["step", "tree"]
    long = _axis_ranges(Graph.TARGET_VERIFY, verify_prefill=120, **kw)
    assert [n for n, _ in long] == ["step", "tree", "prefill"]
    assert long[-1][1] == {"batch": (1, 2, 4), "seq": (1, 60, 120)}
    # the drafter's step graph never gets it
    assert [n for n, _ in _axis_ranges(Graph.DRAFTER_STEP, verify_prefill=120, **kw)] == ["step", "tree"]
