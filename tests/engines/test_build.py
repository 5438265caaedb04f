"""`lisa-trt build` and the TensorRT runners without TensorRT.

- profiles are derived from the io spec (pure, checked here);
- without TensorRT / a GPU, building and running stop with an error naming what is missing and
  the ONNX Runtime alternative;
- plans are never deserialized unless their manifest record matches (hash, TensorRT, GPU);
- engines are built by the REAL `build_plan` (Polygraphy's NetworkFromOnnxPath / CreateConfig /
  EngineFromNetwork / SaveEngine) over the fake native core of tests/contract/trt_fake.py, and
  the runners' binding logic (names, shapes, dtypes, profile choice, KV bindings) runs end to end
  on its engines, which execute the ONNX graphs with ONNX Runtime through the bound raw
  addresses; the fake context rejects out-of-profile shapes and writes scratch into outputs
  before reading inputs, so in-place binding of a non-aliased engine shows its hazard. The real
  TensorRT parser/builder is not exercised (tests marked trt do, where TensorRT is installed);
- bench/gpu_check.py runs in CPU smoke mode in seconds.
"""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "export"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_trt_compat import tiny_bundle  # noqa: E402

from lisa_trt.deploy import build as B  # noqa: E402
from lisa_trt.engines import trt as T  # noqa: E402
from lisa_trt.engines import trt_plans as P  # noqa: E402
from lisa_trt.engines.plugins.trt_plugin import TensorRTUnavailableError, tensorrt_available  # noqa: E402
from lisa_trt.errors import ArtifactMismatchError, CheckpointError, InputError  # noqa: E402
from lisa_trt.models.io_spec import Graph, graph_spec  # noqa: E402
from lisa_trt.export.manifest import read_manifest  # noqa: E402
from lisa_trt.speculative.methods import resolve_method

HAS_TRT = tensorrt_available()
HAS_CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return tiny_bundle(tmp_path_factory)


@pytest.fixture(scope="module")
def man(bundle):
    return read_manifest(bundle)


# ----------------------------------------------------------------------------- profiles

def test_profiles_cover_every_input_with_io_spec_shapes(man):
    profs = B.profiles_from_io_spec(man, max_batch=3)
    assert set(profs) == set(man.graphs)
    cfg = man.target_config
    for name, plist in profs.items():
        spec = graph_spec(Graph(name), n_layer=cfg.n_layer, model_type=cfg.model_type)
        for p in plist:
            assert list(p.shapes) == spec.input_names
    (pre,) = profs["target_prefill"]
    assert pre.shapes["class_ids"] == ((1,), (2,), (6,))                          # CFG: 2 x max_batch
    kv = (cfg.kv_heads, man.max_cache_len, cfg.head_dim)
    assert pre.shapes["past_key_values.0.key"] == ((1,) + kv, (2,) + kv, (6,) + kv)
    (tree,) = profs["target_verify"]                                              # max_tree 16 <= split
    assert tree.shapes["input_ids"] == ((1, 1), (2, 16), (6, 16))
    assert tree.shapes["attention_mask"][2] == (6, 16, man.max_cache_len)
    (nodes,) = profs["gasv"]
    assert nodes.shapes["guided_logits"] == ((1, 256), (16, 256), (48, 256)) and nodes.shapes["gasv_params"][0] == (10,)
    assert nodes.shapes["node_tokens"] == ((1,), (16,), (48,)) and nodes.shapes["node_parents"][2] == (48,)
    (vq,) = profs["vq_decode"]
    assert vq.shapes["image_tokens"] == ((1, 16), (1, 16), (3, 16))              # images: no CFG


def test_step_and_tree_profiles(man):
    profs = B.profiles_from_io_spec(man, seq_split=4, max_tree=12, cfg=False)
    step, tree = profs["drafter_step"]
    assert (step.name, tree.name) == ("step", "tree")
    assert step.shapes["input_ids"] == ((1, 1), (1, 1), (1, 4))
    assert tree.shapes["input_ids"] == ((1, 1), (1, 12), (1, 12))
    assert T.select_profile(profs["drafter_step"], {"input_ids": (1, 1)}) == 0     # smallest fitting profile
    assert T.select_profile(profs["drafter_step"], {"input_ids": (1, 9)}) == 1
    with pytest.raises(T.TrtRuntimeError, match="no optimisation profile"):
        T.select_profile(profs["drafter_step"], {"input_ids": (2, 3)})
    assert T.seq_capacity(profs["drafter_step"]) == 12
    assert B.ProfileSpec.from_dict(json.loads(json.dumps(tree.to_dict()))) == tree


def test_profile_limits(man):
    with pytest.raises(InputError, match="re-export with `lisa-trt export --max-tree"):
        B.profiles_from_io_spec(man, max_tree=man.max_tree + 1)
    with pytest.raises(InputError, match="max_batch"):
        B.profiles_from_io_spec(man, max_batch=0)


def test_io_shapes_and_dtypes(man):
    cfg = man.target_config
    from lisa_trt.models.io_spec import export_dims

    dims = export_dims(cfg, max_cache_len=man.max_cache_len)
    s = T.io_shapes(graph_spec(Graph.TARGET_VERIFY, n_layer=cfg.n_layer), dims, batch=2, seq=5)
    assert s["logits"] == (2, 5, cfg.vocab_size) and s["present.3.value"] == (2, cfg.kv_heads, 5, cfg.head_dim)
    assert s["past_key_values.3.value"] == (2, cfg.kv_heads, man.max_cache_len, cfg.head_dim)  # the cache: an input
    assert T.torch_dtype("act", "fp16") == torch.float16 and T.torch_dtype("bool", "fp16") == torch.bool


# ----------------------------------------------------------------------------- no TensorRT here

def test_modules_import_without_tensorrt():
    code = ("import sys; import lisa_trt.deploy.build, lisa_trt.engines.trt, lisa_trt.deploy.trt_lint, "
            "lisa_trt.engines.plugins.graph_rewrite; assert 'tensorrt' not in sys.modules; "
            "assert 'triton' not in sys.modules; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.skipif(HAS_TRT, reason="tensorrt is installed here")
def test_build_without_tensorrt_names_what_is_missing(bundle):
    with pytest.raises(TensorRTUnavailableError) as e:
        B.build_engines(bundle)
    msg = str(e.value)
    assert "import tensorrt" in msg and "--backend ort" in msg
    with pytest.raises(TensorRTUnavailableError, match="--backend ort"):
        T.load_trt_engines(bundle)
    with pytest.raises(TensorRTUnavailableError):
        T.TrtBackend(read_manifest(bundle)).check()
    from lisa_trt.engines.graph import load_engines

    with pytest.raises(TensorRTUnavailableError, match="--backend ort"):
        load_engines(bundle, "trt")


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is present")
def test_build_without_gpu_names_the_cuda_device(bundle, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", FakeTRT())
    with pytest.raises(B.NoCudaDeviceError, match="no CUDA device") as e:
        B.build_engines(bundle)
    assert "--backend ort" in str(e.value)


def test_dry_run_needs_no_tensorrt(bundle):
    plan = B.build_engines(bundle, dry_run=True, max_batch=2)
    assert plan["dry_run"] and plan["graphs"]["gasv"]["onnx"] == "gasv.trt.onnx"
    assert plan["graphs"]["target_verify"]["plan"] == "target_verify.plan"
    assert not (bundle / "gasv.trt.onnx").exists() and B.engines_record(bundle) is None  # nothing written


@pytest.fixture(scope="module")
def full_bundle(tmp_path_factory):
    """A `lisa-trt export`-style bundle (weights/ and tables.safetensors beside the graphs)."""
    from export_artifacts import make_artifacts

    from lisa_trt.export import export_bundle

    a = make_artifacts()
    out = tmp_path_factory.mktemp("full") / "eng"
    export_bundle(a["target"], a["drafter"], a["tables"], a["vq"], out, max_tree=16, progress=False,
                       lint=False, validate=False)
    return out


def test_dry_run_uses_the_bundles_own_tables(full_bundle, monkeypatch):
    """The GASV rewrite takes the bundle's tables.safetensors, not a recovery by role from gasv.onnx
    (which is ambiguous on the demo bundle: "cannot identify beta ... 2 candidates")."""
    from lisa_trt.engines.plugins import graph_rewrite as gr

    bundle = full_bundle

    def ambiguous(model):
        raise gr.GraphRewriteError("cannot identify beta (C >= 64) in the GASV graph (2 candidates)")

    monkeypatch.setattr(gr, "gasv_tables_from_onnx", ambiguous)
    assert (bundle / "tables.safetensors").is_file()
    plan = B.build_engines(bundle, dry_run=True)
    assert plan["graphs"]["gasv"]["onnx"] == "gasv.trt.onnx"


@pytest.mark.slow
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_cli_build_dry_run_on_the_demo_bundle(tmp_path, fp16):
    """What a new user runs: `lisa-trt export --model demo --drafter demo-lisa [--fp16]`, then
    `lisa-trt build DIR --dry-run` (the part of `build` a machine without TensorRT can check)."""
    from click.testing import CliRunner

    from lisa_trt.cli import main
    from lisa_trt.demo.registry import assets_present

    if not assets_present():
        pytest.skip("the bundled demo assets are absent")
    d = tmp_path / ("demo16" if fp16 else "demo")
    r = CliRunner()
    res = r.invoke(main, ["export", "--model", "demo", "--drafter", "demo-lisa", "--out", str(d), "--no-validate"]
                   + (["--fp16"] if fp16 else []))
    assert res.exit_code == 0, res.output
    res = r.invoke(main, ["build", str(d), "--dry-run", "--json", "-"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output[res.output.index("{"):])
    assert plan["dry_run"] and plan["graphs"]["gasv"]["onnx"] == "gasv.trt.onnx"
    # the demo's graphs attend with primitive ops (no ONNX Attention node): each distinct attention is
    # probed as the pattern it is, and passes the pattern and static checks (docs/tensorrt.md)
    probed = {n: g for n, g in plan["graphs"].items() if g.get("attention_probes")}
    assert {"target_verify", "drafter_fused"} <= set(probed)
    assert all(g["attention"] == "fused" and all(p["ok"] and p["kind"] == "pattern" for p in g["attention_probes"])
               for g in probed.values())
    assert all(g["attention"] is None for n, g in plan["graphs"].items() if n not in probed)
    res = r.invoke(main, ["build", str(d), "--dry-run", "--attention", "op"])
    assert res.exit_code == 0, res.output
    from test_attention_ops import _no_attention_anywhere  # ... and the plain rewrite has nothing to change

    _no_attention_anywhere(read_manifest(d))


@pytest.mark.trt
@pytest.mark.skipif(not (HAS_TRT and HAS_CUDA), reason="needs TensorRT (not installable on these machines, "
                    "docs/spec/deploy.md) and a CUDA GPU")
def test_real_tensorrt_build_and_parity(bundle, tmp_path):
    import shutil

    from export_artifacts import make_artifacts

    d = tmp_path / "engines"
    shutil.copytree(bundle, d)
    B.build_engines(d, timing_cache=tmp_path / "timing.cache", progress=False)
    eng = T.load_trt_engines(d)
    target = make_artifacts()["target"]
    cond = torch.tensor([1, 10])
    want = target.prefill(cond, target.new_cache(2, extra=16)).logits
    got = eng.target.prefill(cond, eng.target.new_cache(2, extra=16)).logits.cpu()
    assert (got - want).abs().max() < 1e-3


# ----------------------------------------------------------------------------- fake TensorRT

sys.path.insert(0, str(ROOT / "tests" / "contract"))
import trt_core  # noqa: E402
import trt_fake  # noqa: E402


class _StubCreator:
    """What tensorrt.plugin registers for lisa::gasv2 (name, version "1", namespace, the declared
    attribute as a field), used when NVIDIA's wheel is not unpacked; tests/contract checks this
    picture against the vendor's code."""

    name, plugin_version = "gasv2", "1"
    field_names = [trt_core.PluginField("num_warps", np.array([]), trt_core.PluginFieldType.INT64)]

    def create_plugin(self, name, namespace, fc, phase, request=None):
        return types.SimpleNamespace(name=name, namespace=namespace, fields={f.name: f.data for f in fc})


def FakeTRT(version="10.15.1.29"):
    """The fake native core of tests/contract/trt_fake.py (Polygraphy's real loaders run over it)."""
    return trt_fake.make_fake_trt(version)


def _install(fake, monkeypatch, request):
    from lisa_trt.engines.plugins import trt_plugin as tp

    trt_fake.reset_polygraphy_trt()                      # Polygraphy caches the tensorrt it imported first
    request.addfinalizer(trt_fake.reset_polygraphy_trt)
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    for mod in (B, T):
        monkeypatch.setattr(mod, "require_tensorrt_gpu", lambda: fake)
    monkeypatch.setattr(P, "gpu_name", lambda: "Fake GPU")
    monkeypatch.setattr(B, "device_info", lambda: {"gpu": "Fake GPU", "compute_capability": "8.9", "cuda": "12.8"})
    monkeypatch.setattr(tp, "register", lambda sm=None: fake.get_plugin_registry().register_creator(
        _StubCreator(), tp.NAMESPACE))


@pytest.fixture
def fake(bundle, tmp_path, monkeypatch, request):
    """A copy of the tiny bundle built by the REAL build_plan (Polygraphy's NetworkFromOnnxPath /
    CreateConfig / EngineFromNetwork / SaveEngine) over the fake native core; plans are JSON
    records the fake runtime executes with ONNX Runtime."""
    import shutil

    fake = FakeTRT()
    _install(fake, monkeypatch, request)
    d = tmp_path / "engines"
    shutil.copytree(bundle, d)
    man = read_manifest(d)
    profiles = B.profiles_from_io_spec(man, seq_split=4)  # step (S <= 4) and tree (S <= 16) profiles
    rec = B.build_engines(d, profiles=profiles, progress=False)
    return types.SimpleNamespace(trt=fake, dir=d, record=rec)


def test_build_records_engines_in_the_manifest(fake):
    rec = fake.record
    assert rec["tensorrt_version"] == "10.15.1.29" and rec["gpu"] == "Fake GPU" and rec["strongly_typed"]
    assert set(rec["graphs"]) == {"target_verify", "drafter_fused",  # one target engine, one drafter engine
                                  "gasv", "vq_decode"}
    g = rec["graphs"]["target_verify"]
    assert [p["name"] for p in g["profiles"]] == ["step", "tree"] and len(g["plan_sha256"]) == 64
    assert rec["graphs"]["gasv"]["onnx"] == "gasv.trt.onnx" and (fake.dir / "gasv.trt.onnx").is_file()
    man = read_manifest(fake.dir)  # the export's manifest still reads (engines kept as an extra key)
    assert man.has(Graph.GASV) and B.engines_built(fake.dir)
    assert json.loads((fake.dir / "manifest.json").read_text())["engines"] == rec


def _external_regions(onnx_path) -> set:
    """(file, offset, length) of every external-data initializer of a graph: the weight bytes its
    engine holds (the bundle stores each distinct tensor once, export/weights.py)."""
    import onnx

    out = set()
    for t in onnx.load(str(onnx_path), load_external_data=False).graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            out.add((info["location"], int(info.get("offset", 0)), int(info["length"])))
    return out


def test_one_drafter_copy_on_tensorrt(fake):
    """Issues 36 item 4 / 49 item 4: the drafter's weights are in one engine, drafter_fused, which runs
    every drafter call (a commit, fc inside, is one call). drafter_step and drafter_project are not
    built by default (each would copy part of it: TensorRT engines share no weights)."""
    assert not any((fake.dir / f"{g}.plan").exists() for g in ("drafter_commit", "drafter_step", "drafter_project"))
    assert "drafter_commit" not in read_manifest(fake.dir).graphs  # exported no more: drafter_fused replaces it
    n0 = len(fake.trt.engines)
    eng = T.load_trt_engines(fake.dir, device="cpu")
    assert eng.drafter.fused_commit and set(eng.drafter.runners) == {Graph.DRAFTER_FUSED}
    opened = [Path(e.plan["onnx"]).name for e in fake.trt.engines[n0:]]
    assert [n for n in opened if n.startswith("drafter_")] == ["drafter_fused.onnx"]
    fused = _external_regions(fake.dir / "drafter_fused.onnx")
    # it holds the fc (drafter_project's weights) and the layer and head (drafter_step's)
    for g in ("drafter_project", "drafter_step"):
        assert _external_regions(fake.dir / f"{g}.onnx") <= fused
    with pytest.raises(InputError, match="drafter_project"):
        eng.drafter.project_taps(torch.zeros(2, 1, read_manifest(fake.dir).dims["tap_dim"]))
    eng.close()


def test_plans_are_checked_before_deserialization(fake):
    plan = fake.dir / "target_verify.plan"
    data, g = B.load_plan(fake.dir, Graph.TARGET_VERIFY)
    assert data == plan.read_bytes()
    data = bytes(data)  # the plan is mapped (trt_plans.map_plan): keep a copy to write the file back
    plan.write_bytes(data + b" ")
    with pytest.raises(ArtifactMismatchError, match="changed after the build"):
        B.load_plan(fake.dir, Graph.TARGET_VERIFY)
    plan.write_bytes(data)
    fake.trt.__version__ = "10.98.0"
    with pytest.raises(ArtifactMismatchError, match="built with TensorRT 10.15.1.29"):
        B.load_plan(fake.dir, Graph.TARGET_VERIFY)
    rec = B.engines_record(fake.dir)
    del rec["graphs"]["vq_decode"]
    B.write_engines_record(fake.dir, rec)
    with pytest.raises(CheckpointError, match="no TensorRT engine for vq_decode"):
        B.load_plan(fake.dir, Graph.VQ_DECODE)


def _tree(cache, S, seed=0):
    g = torch.Generator().manual_seed(seed)
    Bt = cache.batch
    anc = torch.zeros(S, S, dtype=torch.bool)
    depth = [0] * S
    for i in range(S):
        anc[i, i] = True
        if i:
            p = int(torch.randint(0, i, (1,), generator=g))
            anc[i] |= anc[p]
            depth[i] = depth[p] + 1
    slots = cache.lengths[:, None] + torch.arange(S)[None]
    pos = cache.lengths[:, None] + torch.tensor(depth)[None]
    tok = torch.randint(0, 256, (Bt, S), generator=g)
    return tok, pos, slots, cache.attention_mask(slots, anc[None].expand(Bt, S, S))


def _close(a, b, tol=1e-4):
    return (a.float() - b.float()).abs().max().item() <= tol * max(1.0, b.float().abs().max().item())


def test_trt_target_matches_torch_through_the_binding_protocol(fake):
    """The cache is bound as an input only: present.* (the new rows) go to their own buffers, and
    the runner commits them, so after each call the cache equals the torch model's."""
    from export_artifacts import make_artifacts

    from lisa_trt.engines.base import DrafterEngine, TargetEngine
    from lisa_trt.models.checkpoints import target_hash

    a = make_artifacts()
    target, drafter = a["target"], a["drafter"]
    eng = T.load_trt_engines(fake.dir, device="cpu", target_hash=target_hash(target))
    assert list(eng.target.runners) == [Graph.TARGET_VERIFY]  # one target engine: the prefill is a verify call
    assert isinstance(eng.target, TargetEngine) and isinstance(eng.drafter, DrafterEngine)
    cond = torch.tensor([3, 10])                                   # [cond; uncond]
    tc, ec = target.new_cache(2, extra=16), eng.target.new_cache(2, extra=16)
    with torch.no_grad():
        w, g = target.prefill(cond, tc, taps=True), eng.target.prefill(cond, ec, taps=True)
        assert _close(g.logits, w.logits) and _close(g.taps, w.taps)
        assert torch.equal(ec.lengths, tc.lengths) and torch.equal(ec.col_valid, tc.col_valid)
        verify = eng.target._verify.engine   # the fake ICudaEngine (records its calls)
        for S, profile in ((1, "step"), (6, "tree")):
            tok, pos, slots, mask = _tree(tc, S, seed=S)
            w = target.forward_tokens(tok, pos, slots, mask, tc, taps=True)
            g = eng.target.forward_tokens(tok, pos, slots, mask, ec, taps=True)
            assert _close(g.logits, w.logits) and _close(g.taps, w.taps) and _close(g.hidden, w.hidden)
            call = verify.calls[-1]
            assert eng.target._verify.profiles[call["profile"]].name == profile
            assert call["addr"]["past_key_values.0.key"] == ec.k[0].data_ptr()  # the one cache, read in place
            cache_ptrs = {b.data_ptr() for b in ec.k + ec.v}
            assert not cache_ptrs & {call["addr"][n] for n in call["addr"] if n.startswith("present.")}
            assert call["shapes"]["past_key_values.0.key"][2] == eng.target.max_cache_len
        for kt, ke in zip(tc.k + tc.v, ec.k + ec.v):
            assert _close(ke, kt)
        # drafter (one engine, drafter_fused): a commit (fc on the taps inside), then an expansion
        dt, de = drafter.new_cache(2, 40), eng.drafter.new_cache(2, 40)
        dt.lengths.fill_(1), de.lengths.fill_(1)
        tok, pos, slots, mask = _tree(dt, 3, seed=7)
        lt, ht = drafter(drafter.project_taps(w.taps[:, :3]), tok, pos, slots, mask, dt)
        le, he = eng.drafter.commit(w.taps[:, :3], tok, pos, slots, mask, de)
        assert _close(le, lt) and _close(he, ht) and _close(de.k[0], dt.k[0])
        tok, pos, slots, mask = _tree(dt, 2, seed=8)
        lt, ht = drafter(ht[:, :2], tok, pos, slots, mask, dt)
        le, he = eng.drafter(he[:, :2], tok, pos, slots, mask, de)
        assert _close(le, lt) and _close(he, ht) and _close(de.k[0], dt.k[0])
        assert [c["shapes"]["taps"][1] for c in eng.drafter._step.engine.calls[-2:]] == [3, 0]  # empty taps


def test_the_fakes_output_hazard_cannot_reach_the_cache(fake):
    """The fake context writes its outputs (scratch first) while inputs may still be read, as
    TensorRT may. No output is bound to a cache buffer, so the hazard touches only the rows'
    own buffers: the cache and the logits equal torch's (a graph returning the cache as
    present.* bound in place would be corrupted here)."""
    from export_artifacts import make_artifacts

    assert fake.trt.poison_outputs
    target = make_artifacts()["target"]
    eng = T.load_trt_engines(fake.dir, device="cpu")
    tc, ec = target.new_cache(2, extra=16), eng.target.new_cache(2, extra=16)
    with torch.no_grad():
        target.prefill(torch.tensor([3, 10]), tc)
        eng.target.prefill(torch.tensor([3, 10]), ec)
        tok, pos, slots, mask = _tree(tc, 3, seed=3)
        w = target.forward_tokens(tok, pos, slots, mask, tc)
        g = eng.target.forward_tokens(tok, pos, slots, mask, ec)
    assert _close(g.logits, w.logits) and all(_close(ke, kt) for kt, ke in zip(tc.k + tc.v, ec.k + ec.v))
    call = eng.target._verify.engine.calls[-1]
    assert call["addr"]["present.0.key"] != call["addr"]["past_key_values.0.key"]


def test_fake_context_enforces_profiles_and_dtypes(fake):
    """set_input_shape is False outside the selected profile (the runner raises, not the fake);
    the runner refuses a tensor of another dtype than the engine's."""
    from lisa_trt.models.io_spec import export_dims

    man = read_manifest(fake.dir)
    dims = export_dims(man.target_config, max_cache_len=man.max_cache_len, drafter_cfg=man.drafter_config,
                       vq_cfg=man.vq_config)
    runner = T.TrtRunner(fake.dir, graph_spec(Graph.VQ_DECODE), dims, "fp32", "cpu")
    e = next(x for x in fake.trt.engines if x.inputs == ["image_tokens"])
    ctx = e.create_execution_context()
    ctx.set_optimization_profile_async(0, 0)
    lo, _, hi = e.profiles[0]["image_tokens"]
    assert ctx.set_input_shape("image_tokens", lo) and not ctx.set_input_shape("image_tokens", [hi[0] + 1, hi[1]])
    assert not ctx.set_input_shape("image_tokens", [1]) and not ctx.execute_async_v3(0)  # addresses unset
    with pytest.raises(T.TrtRuntimeError, match="the engine takes torch.int64"):
        runner.run({"image_tokens": torch.zeros(1, 16, dtype=torch.int32)})
    # a profile chosen for the call whose context then refuses the shape: the bool is checked
    runner.profiles[0].shapes["image_tokens"] = ((1, 16), (1, 16), (9, 16))   # lie about the bounds
    with pytest.raises(T.TrtRuntimeError, match="TensorRT refused image_tokens of shape"):
        runner.run({"image_tokens": torch.zeros(5, 16, dtype=torch.int64)})


def test_contexts_share_one_buffer_given_with_its_size(fake, monkeypatch):
    """USER_MANAGED contexts get the shared buffer and ITS size (setDeviceMemoryV2), which covers every
    profile (the fake refuses to enqueue with less); a refused optimisation profile is an error."""
    from lisa_trt.models.io_spec import export_dims

    eng = T.load_trt_engines(fake.dir, device="cpu")
    verify = eng.target._verify
    sizes = [verify.engine.get_device_memory_size_for_profile_v2(i) for i in range(len(verify.profiles))]
    assert len(set(sizes)) == 2 and verify.device_memory == max(sizes)   # step and tree profiles differ
    assert all(c.memory == (verify._memory.data_ptr(), max(sizes)) for c in verify.contexts)
    eng.close()
    man = read_manifest(fake.dir)
    dims = export_dims(man.target_config, max_cache_len=man.max_cache_len, drafter_cfg=man.drafter_config,
                       vq_cfg=man.vq_config)
    monkeypatch.setattr(trt_fake.Context, "set_optimization_profile_async", lambda self, i, stream: False)
    with pytest.raises(T.TrtRuntimeError, match="refused optimisation profile 0"):
        T.TrtRunner(fake.dir, graph_spec(Graph.VQ_DECODE), dims, "fp32", "cpu")


def test_alignment_helpers():
    raw = torch.zeros(4096, dtype=torch.uint8)
    off = (-raw.data_ptr()) % 256
    view = raw[off + 8: off + 8 + 1024]
    assert not T.aligned(view) and T.aligned(raw[off:])
    c = T.aligned_input(view)
    assert T.aligned(c) and torch.equal(c, view) and c.data_ptr() != view.data_ptr()


def test_trt_gasv_and_vq_match_the_references(fake):
    from export_artifacts import make_artifacts

    from lisa_trt.speculative.gasv import gasv_gates

    a = make_artifacts()
    eng = T.load_trt_engines(fake.dir, device="cpu")
    logits = torch.randn(5, 256) * 3
    logits[1, 50:] = float("-inf")
    tok, par = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([-1, 0, 0, 2, 1])
    got, want = eng.gasv(logits, tok, par), gasv_gates(logits, tok, par, a["tables"])
    for k in ("p", "delta_eff", "gate"):
        assert _close(getattr(got, k), getattr(want, k), 1e-5)
    assert torch.equal(got.cand, want.cand)
    toks = torch.randint(0, 256, (1, 16))                      # the default profiles: max_batch 1
    g = a["target"].config.grid_size
    with torch.no_grad():
        ref = a["vq"].decode_code(toks, (1, a["vq"].config.codebook_embed_dim, g, g))
    assert _close(eng.vq.decode_code(toks), ref, 1e-4)
    with pytest.raises(T.TrtRuntimeError, match="image_tokens"):
        eng.vq.decode_code(torch.randint(0, 256, (2, 16)))


def test_every_decoder_runs_on_the_trt_runner_with_the_eager_tokens(fake, check_stats):
    """Issue 27: every decoder (tree rules, the Jacobi family, ZipAR, coupled drafting) runs through
    the TensorRT runner's engines (built by Polygraphy over the fake core, which executes the plans
    with ONNX Runtime) and commits the eager models' tokens (CFG on, seeded sampling)."""
    from export_artifacts import make_artifacts

    from lisa_trt.config import SamplingConfig
    from lisa_trt.speculative.methods import SpecConfig, get_method
    from lisa_trt.speculative.run import run_method

    a = make_artifacts()
    eng = T.load_trt_engines(fake.dir, device="cpu")
    s, cond = SamplingConfig(cfg_scale=2.0, temperature=1.0), torch.tensor([1])  # the profiles' batch: 2 CFG rows
    for method in ("vanilla", "exact", "gasv", "sjd", "mcsjd", "sjd-pac", "gsd", "zipar", "coupled", "sjd-gasv"):
        spec = SpecConfig.make(method if get_method(method).kind == "tree" else "exact", top_k=3, depth=2,
                               total_tokens=8, sjd_pac_tree_width=2)  # SJD-PAC K2/D3: its tree fits S <= 16
        window = 4 if method == "sjd-pac" else 8  # windows inside the tree profile (S <= 16)
        want, wst = run_method(resolve_method(method), a["target"], a["drafter"], a["tables"], cond, sampling=s, spec=spec, seed=7,
                               sjd_window=window)
        got, st = run_method(resolve_method(method), eng.target, eng.drafter, a["tables"], cond, sampling=s, spec=spec, seed=7,
                             gasv=eng.gasv, sjd_window=window)
        assert torch.equal(got.cpu(), want.cpu()), method
        # the same decode step for step: the eager models' accept lengths and target forwards
        check_stats(st, got, ar=method == "vanilla")
        assert [c.tolist() for c in st.committed] == [c.tolist() for c in wst.committed], method
        assert st.target_forwards == wst.target_forwards, method


def test_runner_input_errors(fake):
    eng = T.load_trt_engines(fake.dir, device="cpu")
    with pytest.raises(InputError, match="re-export with a larger --max-tree"):
        eng.target.new_cache(1, extra=64)
    with pytest.raises(InputError, match="re-export with a larger --max-tree"):
        eng.drafter.new_cache(1, 100)
    cache = eng.target.new_cache(1, extra=16)
    eng.target.prefill(torch.tensor([2]), cache)
    with pytest.raises(T.TrtRuntimeError, match="no optimisation profile"):
        eng.target.forward_tokens(*_tree(cache, 17), cache)             # beyond the engines' tree budget
    tok, pos, slots, mask = _tree(cache, 3)
    with pytest.raises(InputError, match="image token ids"):
        eng.target.forward_tokens(tok + 1000, pos, slots, mask, cache)
    with pytest.raises(InputError, match="unknown class id"):
        eng.target.prefill(torch.tensor([99]), cache)
    with pytest.raises(InputError, match="kv_binding option was removed"):  # gone: the cache an input only
        T.load_engines(fake.dir, "trt", device="cpu", kv_binding="swap")


# ----------------------------------------------------------------------------- gpu_check

def test_gpu_check_cpu_smoke(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), str(out), "--cpu-smoke"],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(out.read_text())
    s = d["sections"]
    assert d["mode"] == "cpu-smoke" and set(s) == {"env", "gasv_kernel", "verify_latency", "demo_decode",
                                                    "compiled_decode", "decoders", "cuda_graph", "tensorrt"}
    assert all(v["status"] in ("ok", "skipped") for v in s.values()), {k: v.get("error") for k, v in s.items()}
    assert "importable" in s["env"]["tensorrt"]
    assert set(s["verify_latency"]["models"]["tiny"]["tree"]) == {"1", "4"}
    assert s["verify_latency"]["models"]["tiny-t2i"]["model_type"] == "t2i"  # the GPT-XL-T2I path, tiny
    ref = s["gasv_kernel"]["cases"][0]["torch_ref"]
    assert ref["min_ms"] <= ref["median_ms"], ref
    assert "--demo-on-cpu" in s["compiled_decode"]["skipped"]  # the smoke skips the demo sections
    assert "no CUDA" in s["cuda_graph"]["skipped"]  # CUDA-graph capture needs a GPU
    # ... but times every decoder on a tiny model in memory, with the speed-up against the fastest vanilla
    dec = s["decoders"]["modes"]["tiny-eager"]
    assert set(dec) == {"vanilla", "sjd", "mcsjd", "sjd-pac", "gsd", "zipar", "sjd-gasv", "coupled", "exact", "gasv"}
    fast = s["decoders"]["fastest_vanilla"]["seconds_per_image"]  # each decoder timed against the fastest vanilla
    assert all(r["speedup_vs_fastest_vanilla"] == pytest.approx(fast / r["seconds_per_image"], abs=1e-3)
               for r in dec.values()), dec
    assert dec["vanilla"]["speedup_vs_fastest_vanilla"] == 1.0 and dec["mcsjd"]["mean_tvd"] == 0.0
    assert s["decoders"]["fastest_vanilla"]["mode"] == "tiny-eager"
    if not HAS_TRT:
        assert s["tensorrt"]["available"] is False and "--backend ort" in s["tensorrt"]["skipped"]


def test_partial_rebuild_keeps_the_other_engines(fake):
    before = B.engines_record(fake.dir)["graphs"]
    rec = B.build_engines(fake.dir, graphs=["vq_decode"], progress=False)
    assert set(rec["graphs"]) == set(before) and rec["graphs"]["target_verify"] == before["target_verify"]
    with pytest.raises(InputError, match="has no graph"):
        B.build_engines(fake.dir, graphs=["nope"], progress=False)



def test_one_target_engine_unless_the_bundle_predates_it(bundle, man, tmp_path):
    """Issue 26: the verify graph embeds the class ids (the manifest's prefill_ids), so `lisa-trt
    build` makes no target_prefill engine (the target's weights on the GPU once) and the memory
    plan counts one copy; a bundle exported before builds both engines, and its plan counts two."""
    import shutil

    from lisa_trt.deploy.memory_plan import check_plan

    fused = {"drafter_step", "drafter_project"}  # drafter_fused replaces them (B.FUSED_REPLACES)
    assert B.default_build_graphs(man) == sorted(set(man.graphs) - {"target_prefill"} - fused)
    new = check_plan(bundle, memory_gib=80)
    assert not any("copies" in n for n in new.notes)
    one = new.engines["target"]["weights"]
    old = tmp_path / "old"
    shutil.copytree(bundle, old)
    m = json.loads((old / "manifest.json").read_text())
    del m["target"]["prefill_ids"]
    (old / "manifest.json").write_text(json.dumps(m))
    assert B.default_build_graphs(read_manifest(old)) == sorted(set(man.graphs) - fused)
    p = check_plan(old, memory_gib=80)
    assert p.engines["target"]["weights"] == 2 * one and any("2 copies" in n for n in p.notes)
    with pytest.raises(InputError, match="verify graph cannot run the prefill"):
        from lisa_trt.families.llamagen.engines import LlamaGenGraphTarget

        LlamaGenGraphTarget(read_manifest(old), {Graph.TARGET_VERIFY: types.SimpleNamespace(device=torch.device("cpu"))})


# ----------------------------------------------------------------------------- KV bytes written per step

def _kv_writes(engine) -> list:
    """(new rows S, cache length Lmax, {present.*: bytes written, full cache bytes}) per call."""
    out = []
    for c in engine.calls:
        B, S = c["shapes"]["cache_slots"]
        L = c["shapes"]["attention_mask"][-1]
        kv = {n: (w, B * L * int(np.prod(c["shapes"][n.replace("present.", "past_key_values.")][1::2])) * 4)  # fp32
              for n, w in c["written"].items() if n.startswith("present.")}
        out.append((S, L, kv))
    return out


def _decode_steps(fake, method="exact"):
    from export_artifacts import make_artifacts

    from lisa_trt.config import SamplingConfig
    from lisa_trt.speculative.methods import SpecConfig
    from lisa_trt.speculative.run import run_method

    a = make_artifacts()
    eng = T.load_trt_engines(fake.dir, device="cpu")
    spec = SpecConfig.make(method, top_k=3, depth=2, total_tokens=8)
    run_method(resolve_method(method), eng.target, eng.drafter, a["tables"], torch.tensor([1]),
               sampling=SamplingConfig(cfg_scale=2.0, temperature=1.0), spec=spec, seed=7)
    return eng


def test_the_fake_core_counts_the_bytes_each_execution_writes(fake):
    """The counter the next test relies on: each call's count of an output is its bytes, the
    whole tensor (logits (B, S, V) fp32 here), and the present.* outputs are S rows each."""
    eng = _decode_steps(fake)
    calls = eng.target._verify.engine.calls
    steps = _kv_writes(eng.target._verify.engine)
    assert len(steps) > 3
    for c, (S, L, kv) in zip(calls, steps):
        B = c["shapes"]["cache_slots"][0]
        assert c["written"]["logits"] == B * S * eng.target.config.vocab_size * 4
        assert kv and all(full > 0 and w == full * S // L for w, full in kv.values()), (S, L, kv)


def test_no_step_writes_the_full_kv_cache(fake, monkeypatch):
    """No target-verify or drafter-step execution writes more than its new rows to a KV output:
    S rows of (B, kv_heads, ., head_dim) out of Lmax, on the TensorRT runner; and the runner's
    commit writes exactly those S rows per layer into the one cache, leaving every other slot
    as it was."""
    import lisa_trt.models.layers as layers

    commits, real = [], layers.KVCache.commit

    def counted(cache, k_rows, v_rows, slots):  # the runner's one commit of a call, checked per layer
        bufs, new = cache.k + cache.v, [*k_rows, *v_rows]
        before = [b.clone() for b in bufs]
        real(cache, k_rows, v_rows, slots)
        for buf, prev, rows in zip(bufs, before, new):
            changed = (buf != prev).any(-1).any(1)  # (B, L): slots whose rows changed
            outside = torch.ones_like(changed)
            outside.scatter_(1, slots, False)
            commits.append((rows.numel() * rows.element_size(), buf.numel() * buf.element_size(),
                            bool((changed & outside).any()), tuple(slots.shape)))

    monkeypatch.setattr(layers.KVCache, "commit", counted)
    eng = _decode_steps(fake)
    for e in (eng.target._verify.engine, eng.drafter._step.engine):
        assert e.calls
        for S, L, kv in _kv_writes(e):
            for name, (w, full) in kv.items():
                assert w <= full * S // L, f"{name}: {w} bytes written for {S} new rows of a {full}-byte cache"
    n_layer = eng.target.config.n_layer
    assert len(commits) == 2 * n_layer * len(eng.target._verify.engine.calls) + 2 * len(eng.drafter._step.engine.calls)
    for wrote, full, outside, (_, S) in commits:
        assert not outside                                # no slot outside the call's slots changed
        assert wrote == full * S // eng.target.max_cache_len < full  # S rows, never the whole cache


def test_build_dry_run_prints_one_verdict_line_and_json_on_request(bundle, tmp_path):
    """Issue 52: `build --dry-run` says one line (no 1,000-line JSON); the JSON behind --json (- = stdout)."""
    from click.testing import CliRunner

    from lisa_trt.cli import main

    r = CliRunner().invoke(main, ["build", str(bundle), "--dry-run"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dry run:") and "nothing was written" in lines[0], r.stdout
    assert "target_verify" in lines[0] and "{" not in lines[0]
    r = CliRunner().invoke(main, ["build", str(bundle), "--dry-run", "--json", "-"])
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout)
    assert rec["dry_run"] and "target_verify" in rec["graphs"] and r.stderr.startswith("dry run:")
    r = CliRunner().invoke(main, ["build", str(bundle), "--dry-run", "--json", str(tmp_path / "b.json")])
    assert r.exit_code == 0 and json.loads((tmp_path / "b.json").read_text())["dry_run"], r.output
