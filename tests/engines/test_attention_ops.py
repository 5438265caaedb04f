"""Attention for TensorRT (engines/attention_ops.py, deploy/attention_probe.py).

- the plain-ops rewrite computes what ONNX Runtime's Attention computes: single nodes (fp32 /
  fp16, bool / float / no mask, causal, GQA, 3-D inputs) and whole exported graphs (the tiny c2i
  bundle fp32 and fp16, a Chameleon token-prompt bundle) run through ORT before and after;
- the probe graphs and the rewritten graphs pass the parser's static checks (parser_checks) and
  the TensorRT op table (trt_lint);
- `lisa-trt build --attention auto|op|plain` over the fake TensorRT core (tests/contract), made to
  refuse Attention as NVIDIA/TensorRT#4705 does on sm_89: auto builds the plain graph (warning,
  recorded per engine in the manifest) and the runner decodes with it; op stops after the probe,
  before any engine build, naming the node and `--attention plain`.
"""

import copy
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "export"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "contract"))

from test_trt_compat import tiny_bundle  # noqa: E402

from lisa_trt.deploy import build as B  # noqa: E402
from lisa_trt.deploy.trt_lint import check_model  # noqa: E402
from lisa_trt.engines import attention_ops as A  # noqa: E402
from lisa_trt.engines.parser_checks import model_errors  # noqa: E402
from lisa_trt.engines.profiles import trt_copy  # noqa: E402
from lisa_trt.export.manifest import read_manifest  # noqa: E402
from lisa_trt.models.io_spec import Graph  # noqa: E402

ort = pytest.importorskip("onnxruntime")
TOL = {1: 1e-5, 10: 4e-3}  # fp16: a few ulps of outputs ~1


def _session(model_or_path):
    src = str(model_or_path) if isinstance(model_or_path, Path) else model_or_path.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"])


def _node_case(dt, hq, hkv, mask, causal, rank, softcap=0.0):
    """A one-node Attention model (probe_model) and random feeds for it."""
    rng = np.random.default_rng(hq * 7 + hkv + causal)
    npdt = np.float16 if dt == 10 else np.float32
    B_, S, T, D = 2, 3, 5, 8
    if rank == 4:
        shapes = [[B_, hq, S, D], [B_, hkv, T, D], [B_, hkv, T, D]]
        attrs = {}
    else:
        shapes = [[B_, S, hq * D], [B_, T, hkv * D], [B_, T, hkv * D]]
        attrs = {"q_num_heads": hq, "kv_num_heads": hkv}
    attrs.update(is_causal=causal, softcap=softcap)
    if dt == 10:
        attrs["softmax_precision"] = 1  # what the fp16 export sets (ORT honours it; the rewrite always does)
    ins = [(dt, s) for s in shapes] + [None if mask is None else (9 if mask == "bool" else dt, [B_, 1, S, T])]
    model = A.probe_model({"node": "att", "inputs": ins, "output": (dt, shapes[0]), "attrs": attrs}, 23)
    feeds = {n: rng.standard_normal(s).astype(npdt) for n, s in zip("qkv", shapes)}
    if mask == "bool":
        m = rng.random((B_, 1, S, T)) < 0.6
        m[..., 0] = True
        feeds["mask"] = m
    elif mask == "float":
        feeds["mask"] = rng.standard_normal((B_, 1, S, T)).astype(npdt)
    return model, feeds


@pytest.mark.parametrize("dt", [1, 10], ids=["fp32", "fp16"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("mask,causal", [("bool", 0), ("float", 0), (None, 1), ("bool", 1)])
@pytest.mark.parametrize("rank", [4, 3])
def test_plain_attention_matches_ort_on_one_node(dt, heads, mask, causal, rank):
    model, feeds = _node_case(dt, *heads, mask, causal, rank)
    want = _session(model).run(None, feeds)[0]
    plain = copy.deepcopy(model)
    assert A.plain_attention(plain) == 1 and not A.attention_nodes(plain)
    onnx.checker.check_model(plain, full_check=True)
    got = _session(plain).run(None, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    err = float(np.abs(got.astype(np.float32) - want.astype(np.float32)).max())
    assert err < TOL[dt], err
    # the rewrite passes what TensorRT's parser checks, and only uses ops of its table
    assert model_errors(plain) == []
    assert check_model(plain).violations == []


@pytest.mark.parametrize("dt", [1, 10], ids=["fp32", "fp16"])
def test_plain_attention_applies_softcap_like_ort(dt):
    """softcap (which TensorRT's Attention refuses) is applied before the mask, as ONNX specifies."""
    model, feeds = _node_case(dt, 4, 2, "bool", 0, 4, softcap=2.0)
    want = _session(model).run(None, feeds)[0].astype(np.float32)
    uncapped, _ = _node_case(dt, 4, 2, "bool", 0, 4)
    assert np.abs(_session(uncapped).run(None, feeds)[0].astype(np.float32) - want).max() > 0.05
    assert any("softcap" in e for e in model_errors(model))  # the parser refuses the op with it
    A.plain_attention(model)
    assert np.abs(_session(model).run(None, feeds)[0].astype(np.float32) - want).max() < TOL[dt]
    assert model_errors(model) == []


def test_the_mask_and_the_grouping_matter():
    """The single-node comparison can fail: dropping the mask or the GQA head order changes Y."""
    model, feeds = _node_case(1, 4, 2, "bool", 0, 4)
    want = _session(model).run(None, feeds)[0]
    no_mask = dict(feeds, mask=np.ones_like(feeds["mask"]))
    assert np.abs(_session(model).run(None, no_mask)[0] - want).max() > 1e-3
    plain = copy.deepcopy(model)
    A.plain_attention(plain)
    swapped = dict(feeds, k=feeds["k"][:, ::-1].copy(), v=feeds["v"][:, ::-1].copy())
    assert np.abs(_session(plain).run(None, swapped)[0] - want).max() > 1e-3


def test_refused_forms_say_why():
    model, _ = _node_case(1, 4, 4, "bool", 0, 4)
    node = model.graph.node[0]
    node.input.extend(["past_k", "past_v"])
    with pytest.raises(A.AttentionRewriteError, match="past_key"):
        A.plain_attention(model)
    model, _ = _node_case(1, 4, 4, None, 0, 4)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "heads"  # head count not static
    with pytest.raises(A.AttentionRewriteError, match="static"):
        A.plain_attention(model)


# ----------------------------------------------------------------------------- exported graphs

def _no_attention_anywhere(man) -> None:
    """Every exported graph attends with plain ops (the new-rows KV graphs: models/layers.rows_attention),
    so no ONNX Attention node reaches TensorRT and the plain rewrite has nothing to change."""
    for g in man.graphs:
        src = man.graph_path(Graph(g))
        model = onnx.load(str(src), load_external_data=False)
        assert A.attention_nodes(model) == [] and A.probe_specs(model) == [], g
        plain = trt_copy(src, "plain")
        assert [n.op_type for n in plain.graph.node] == [n.op_type for n in trt_copy(src).graph.node], g


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return tiny_bundle(tmp_path_factory)


@pytest.fixture(scope="module")
def bundle16(tmp_path_factory):
    from export_artifacts import make_artifacts

    from lisa_trt.export import export_bundle

    a = make_artifacts()
    out = tmp_path_factory.mktemp("att16") / "eng"
    export_bundle(a["target"], a["drafter"], a["tables"], a["vq"], out, max_tree=16, validate=False, lint=False,
                  progress=False, fp16=True)
    return out


def test_the_tiny_bundle_holds_no_attention_node(bundle):
    _no_attention_anywhere(read_manifest(bundle))


@pytest.mark.slow  # an fp16 export of the tiny bundle
def test_the_fp16_tiny_bundle_holds_no_attention_node(bundle16):
    _no_attention_anywhere(read_manifest(bundle16))


@pytest.mark.slow
def test_a_token_prompt_bundle_holds_no_attention_node(tmp_path_factory):
    pytest.importorskip("transformers")
    from chameleon_bundle import export_cli, export_kwargs, make_chameleon_artifacts

    root = tmp_path_factory.mktemp("att_cham")
    art = make_chameleon_artifacts(root / "art")
    for prec in ("fp32", "fp16"):
        man = export_cli(art["model_dir"], root / prec, **export_kwargs(art, validate=False, fp16=prec == "fp16"))
        _no_attention_anywhere(man)


# ----------------------------------------------------------------------------- probes

@pytest.mark.parametrize("dt", [1, 10], ids=["fp32", "fp16"])
def test_probe_specs_follow_the_graph(dt):
    """A graph with Attention nodes (not one lisa-trt exports: a user's, or a future export) gets one
    probe per distinct node, rebuilt from the node's dtypes, shapes and attributes, and the probe
    passes the parser's static checks."""
    model, _ = _node_case(dt, 4, 2, "bool", 0, 4)
    specs = A.probe_specs(model)
    assert len(specs) == 1 and specs[0]["nodes"] == 1
    q, k, v, mask = specs[0]["inputs"]
    assert mask[0] == 9 and q[0] == k[0] == v[0] == dt
    assert [list(x[1]) for x in (q, k, v, mask)] == [[2, 4, 3, 8], [2, 2, 5, 8], [2, 2, 5, 8], [2, 1, 3, 5]]
    probe = A.probe_model(specs[0], 23)
    assert [n.op_type for n in probe.graph.node] == ["Attention"]
    found = [str(v) for v in check_model(probe).violations]  # fp16: the export's softmax_precision, refused
    if dt == 1:
        assert found == [] and model_errors(probe) == []
    else:
        assert len(found) == 1 and "softmax precision is not supported" in found[0]


def test_dry_run_probe_runs_the_parsers_static_checks(bundle, monkeypatch):
    """Without TensorRT the probe is the parser's static checks on the probe graph. The bundle holds
    no Attention node, so a checker refusing Attention refuses nothing there: every mode probes the
    attention the graphs hold (primitive ops, checked against the fused pattern) and records it
    "fused". A graph that does hold an Attention node gets the refusing checker's answer
    (choose_attention's op / plain decision on refused and accepted probes:
    tests/engines/test_fused_attention.py)."""
    from lisa_trt.engines import parser_checks as pc

    monkeypatch.setitem(pc.CHECKERS, "Attention", lambda n, a, o: ["Attention is not supported (test)."])
    for mode in ("op", "auto"):
        warned = []
        rec = B.build_engines(bundle, dry_run=True, progress=False, attention=mode, warn=warned.append)
        with_att = {g: r for g, r in rec["graphs"].items() if r.get("attention_probes")}
        assert warned == [] and {"target_verify", "drafter_fused"} <= set(with_att), mode
        assert all(r["attention"] == "fused" and all(p["ok"] and p["kind"] == "pattern" for p in r["attention_probes"])
                   for r in with_att.values()), mode
    probe, _ = _node_case(1, 4, 4, None, 1, 4)  # a graph that does hold one: the refusing checker answers
    assert any("not supported (test)" in str(v) for v in check_model(probe).violations)


def test_unknown_attention_mode_is_refused(bundle):
    from click.testing import CliRunner

    from lisa_trt.cli import main

    with pytest.raises(B.InputError, match="auto, op, plain"):
        B.build_engines(bundle, dry_run=True, attention="fast")
    res = CliRunner().invoke(main, ["build", str(bundle), "--dry-run", "--attention", "fast"])
    assert res.exit_code == 2 and "--attention" in res.output


# ----------------------------------------------------------------------------- fake TensorRT

def _refusing_builder(trt_fake, monkeypatch):
    """The fake builder fails any network holding an ONNX Attention node, as TensorRT 10.14 does
    for a strongly typed opset-23 Attention on an RTX 4080 (NVIDIA/TensorRT#4705): the parse
    succeeds, build_serialized_network returns None (NvInfer.h: "nullptr on failure")."""
    real = trt_fake.Builder.build_serialized_network

    def build(self, network, config):
        model = onnx.load(network.onnx, load_external_data=False)
        if A.attention_nodes(model):
            self.logger.log(trt_fake.trt_core.Logger.ERROR, "Could not find any implementation for node "
                            f"{A.attention_nodes(model)[0].name} [Attention] (test: NVIDIA/TensorRT#4705)")
            return None
        return real(self, network, config)

    monkeypatch.setattr(trt_fake.Builder, "build_serialized_network", build)


@pytest.fixture
def refusing(bundle, tmp_path, monkeypatch, request):
    import test_build as TB
    import trt_fake

    fake = TB.FakeTRT()
    TB._install(fake, monkeypatch, request)
    _refusing_builder(trt_fake, monkeypatch)
    d = tmp_path / "engines"
    shutil.copytree(bundle, d)
    return fake, d


def test_a_builder_that_refuses_attention_builds_the_bundle_in_every_mode(refusing):
    """The builder refuses any network with an ONNX Attention node (NVIDIA/TensorRT#4705's failure);
    the bundle's graphs hold none, so every mode builds every engine with no probe, and the runner's
    prefill logits equal torch's. An export that put the Attention op back fails here."""
    import torch
    from export_artifacts import make_artifacts

    from lisa_trt.engines import trt as T

    fake, d = refusing
    profiles = B.profiles_from_io_spec(read_manifest(d), seq_split=4)
    for mode in ("op", "auto", "plain"):
        n0, warned = len(fake.builds), []
        rec = B.build_engines(d, profiles=profiles, progress=False, attention=mode, warn=warned.append)
        probes = [p for g in rec["graphs"].values() for p in g.get("attention_probes") or []]
        assert warned == [] and all(p["ok"] and p["kind"] == "pattern" for p in probes), mode  # no Attention op
        assert len(fake.builds) - n0 >= len(rec["graphs"]), mode  # every engine (and the pattern probes) built
    eng = T.load_trt_engines(d, device="cpu")  # the fake runs each engine's ONNX with ORT
    target = make_artifacts()["target"]
    cond = torch.tensor([1, 10])
    want = target.prefill(cond, target.new_cache(2, extra=16)).logits
    got = eng.target.prefill(cond, eng.target.new_cache(2, extra=16)).logits.cpu()
    assert (got - want).abs().max() < 1e-3
    eng.close()


# ----------------------------------------------------------------------------- bench/gpu_check.py

@pytest.mark.slow  # the fp16 export of the tiny bundle
def test_gpu_check_tensorrt_section_builds_fp32_and_fp16(bundle, bundle16, tmp_path, monkeypatch, request):
    """bench/gpu_check.py's tensorrt section over the fake core, the tiny bundles standing in for the
    demo exports: both precisions are built (`--attention auto`; the core refuses Attention, which the
    graphs do not hold: they build as they are) and checked against their torch graphs; fp32 results stay at the top."""
    import importlib.util
    import types

    import test_build as TB
    import trt_fake

    spec = importlib.util.spec_from_file_location("gpu_check_under_test", ROOT / "bench" / "gpu_check.py")
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    fake = TB.FakeTRT()
    TB._install(fake, monkeypatch, request)
    _refusing_builder(trt_fake, monkeypatch)
    copies = {}
    for fp16, src in ((False, bundle), (True, bundle16)):
        copies[fp16] = tmp_path / ("b16" if fp16 else "b32") / "eng"
        shutil.copytree(src, copies[fp16])
    exported = []
    monkeypatch.setattr(gc, "_demo_bundle", lambda ctx, fp16=False: exported.append(fp16) or copies[fp16])
    args = types.SimpleNamespace(cpu_smoke=True, budget=600.0, section_budget={})
    ctx = gc.Ctx(args)
    ctx.start_section("tensorrt")
    out = gc.section_tensorrt(ctx)
    assert exported == [False, True] and "error" not in out and "error" not in out["fp16"], out
    for res in (out, out["fp16"]):
        # no ONNX Attention node: the probes build the primitive-op chain the bundle holds, accepted here
        assert res["engines"]["target_verify"]["attention"] == "fused"
        probes = res["engines"]["target_verify"]["attention_probes"]
        assert probes and all(p["ok"] and p.get("kind") == "pattern" for p in probes), probes
        assert res["parity"]["target_greedy"]["steps"] == 8
    assert out["parity"]["target_greedy"]["tokens_identical"]  # fp32 plain-ops engines decode like torch
    assert out["fp16"]["parity"]["target_greedy"]["token_agreement"] >= 0.5
    assert read_manifest(copies[True]).precision == "fp16"
