"""`lisa-trt build` through Polygraphy's REAL loaders and NVIDIA's REAL tensorrt.plugin.

build_engines -> build_plan -> Polygraphy NetworkFromOnnxPath / CreateConfig / EngineFromNetwork /
SaveEngine over the fake native core of trt_fake.py, with lisa::gasv2 registered through the
vendor's `tensorrt.plugin` (10.14 and 11.x wheels, trt_core.load_vendor_plugin): the parser finds
the GASV node's creator by (name, version, namespace) and the builder runs the vendor plugin's
build phase (shape inference, format combinations, get_launch_params with the Triton PTX).

Failing on the pre-issue-25 code: plugin_version "2" (Plugin not found), `constant_value` read
as an attribute (TypeError in get_launch_params), TF32 cleared by CreateConfig.
"""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

import trt_core
import trt_fake

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "export"))

from lisa_trt.deploy import build as B  # noqa: E402
from lisa_trt.engines.plugins import trt_plugin as tp  # noqa: E402
from lisa_trt.export.manifest import read_manifest  # noqa: E402

pytestmark = [pytest.mark.contract,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                 reason="triton (the `kernels` extra) compiles the AOT PTX inside aot_impl")]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """The tiny full bundle (made before any fake `tensorrt` is installed: torch.export probes it)."""
    from export_artifacts import make_artifacts

    from lisa_trt.export import export_bundle

    a = make_artifacts()
    out = tmp_path_factory.mktemp("engines") / "eng"
    export_bundle(a["target"], a["drafter"], a["tables"], a["vq"], out, max_tree=16, progress=False,
                       lint=False, validate=False)
    return out


@pytest.fixture
def core(trt_bindings, monkeypatch, request):
    """The fake native core with NVIDIA's tensorrt.plugin of `trt_bindings` loaded over it."""
    fake = trt_fake.make_fake_trt(trt_bindings)
    _, trtp = _load(fake, trt_bindings, monkeypatch)
    trt_fake.reset_polygraphy_trt()
    request.addfinalizer(trt_fake.reset_polygraphy_trt)
    monkeypatch.setattr(B, "require_tensorrt_gpu", lambda: fake)
    monkeypatch.setattr(B, "device_info", lambda: {"gpu": "Fake GPU", "compute_capability": "8.9", "cuda": "12.8"})
    monkeypatch.setattr(tp, "_REGISTERED", False)
    return fake


def _load(fake, version, monkeypatch):
    """trt_core.load_vendor_plugin, but over the given (builder-capable) fake core."""
    orig = trt_core.make_core
    monkeypatch.setattr(trt_core, "make_core", lambda v: fake)
    try:
        return trt_core.load_vendor_plugin(version, monkeypatch)
    finally:
        monkeypatch.setattr(trt_core, "make_core", orig)


def _copy(bundle, tmp_path):
    d = tmp_path / "eng"
    shutil.copytree(bundle, d)
    return d


def test_build_engines_through_polygraphy_and_the_vendor_plugin(core, bundle, tmp_path):
    d = _copy(bundle, tmp_path)
    rec = B.build_engines(d, timing_cache=tmp_path / "timing.cache", progress=False)
    assert set(rec["graphs"]) >= {"target_verify", "gasv", "vq_decode"}
    assert "target_prefill" not in rec["graphs"]  # one target engine: the verify engine runs the prefill too
    plans = {Path(p["onnx"]).name: p for p in core.builds}
    assert all(p["tf32"] for p in core.builds)                       # CreateConfig(tf32=True): kept
    assert all(p["strongly_typed"] for p in core.builds)
    # the flag is set on 10.x and on 11.x, which keeps it (deprecated, ignored): the path real 11.x takes
    assert all(p["strongly_typed_flag"] for p in core.builds)
    for g in rec["graphs"].values():  # each engine's per-profile device memory, for `lisa-trt plan`
        assert len(g["device_memory"]) == len(g["profiles"]) and min(g["device_memory"]) > 0
    gasv = plans["gasv.trt.onnx"]["plugins"]
    assert [g["op"] for g in gasv] == [tp.PLUGIN_NAME]                 # found by ("gasv2", "1", "lisa")
    launch = gasv[0]["launch"]
    assert launch["block_x"] == 128 and launch["grid_x"] == 16          # the vendor's get_launch_params ran (opt N)
    assert gasv[0]["extra_args"][0] == 256 and gasv[0]["kernel"] == "gasv_kernel"   # V first
    plan = json.loads((d / rec["graphs"]["target_verify"]["plan"]).read_bytes())   # what SaveEngine wrote
    assert [sorted(p) for p in plan["profiles"]] == [sorted(p["shapes"]) for p in rec["graphs"]["target_verify"]
                                                     ["profiles"]]


def test_a_profile_that_contradicts_the_network_fails_the_build(core, bundle, tmp_path):
    """Polygraphy fills a profile's missing inputs from the network (Profile.fill_defaults), so
    what reaches TensorRT is checked by the builder: static dims must match the network's."""
    d = _copy(bundle, tmp_path)
    profiles = B.profiles_from_io_spec(read_manifest(d), graphs=["vq_decode"])
    (p,) = profiles["vq_decode"]
    p.shapes["image_tokens"] = tuple((b, blk + 1) for b, blk in p.shapes["image_tokens"])  # block is static
    with pytest.raises(B.EngineBuildError, match="TensorRT could not build vq_decode.onnx"):
        B.build_engines(d, graphs=["vq_decode"], profiles=profiles, check=False, progress=False)
    assert any("does not match the network" in e for e in core.build_errors), core.build_errors


def test_bad_profile_bounds_raise_runtime_error_as_tensorrt_does(core, bundle, tmp_path):
    """IOptimizationProfile.set_shape with min > max: TensorRT's Python binding raises RuntimeError
    (the fake follows it); build_plan reports it as an EngineBuildError naming it."""
    d = _copy(bundle, tmp_path)
    profiles = B.profiles_from_io_spec(read_manifest(d), graphs=["vq_decode"])
    (p,) = profiles["vq_decode"]
    lo, opt, hi = p.shapes["image_tokens"]
    p.shapes["image_tokens"] = (hi, opt, lo) if hi != lo else ((hi[0] + 1,) + hi[1:], opt, lo)
    with pytest.raises(B.EngineBuildError, match="RuntimeError"):
        B.build_engines(d, graphs=["vq_decode"], profiles=profiles, check=False, progress=False)


def test_a_plugin_node_with_another_version_is_not_found(core, bundle, tmp_path, capfd):
    """What the GASV graph of main carried (plugin_version "2"): the parser cannot find it."""
    import onnx

    from lisa_trt.engines.plugins import graph_rewrite as gr

    d = _copy(bundle, tmp_path)
    out = gr.write_trt_variant(d / "gasv.onnx")
    m = onnx.load(str(out))
    (node,) = gr.plugin_nodes(m)
    for a in node.attribute:
        if a.name == "plugin_version":
            a.s = b"2"
    onnx.save(m, str(out))
    tp.register()
    with pytest.raises(B.EngineBuildError, match="Could not parse ONNX"):
        B.build_plan(out, B.profiles_from_io_spec(read_manifest(d))["gasv"], d / "gasv.plan")
    log = capfd.readouterr()
    assert "Plugin not found, are the plugin name, version, and namespace correct?" in log.out + log.err


@pytest.fixture(scope="module")
def chameleon_bundle(tmp_path_factory):
    """A tiny Chameleon-family bundle (image-code GASV over K = 32 codes), made before any fake `tensorrt`."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from chameleon_bundle import export_kwargs, make_chameleon_artifacts

    from chameleon_bundle import export_cli

    root = tmp_path_factory.mktemp("cham")
    art = make_chameleon_artifacts(root / "art")
    export_cli(art["model_dir"], root / "eng", **export_kwargs(art, validate=False))
    return root / "eng"


def test_a_chameleon_bundle_builds_through_polygraphy_and_the_vendor_plugin(core, chameleon_bundle, tmp_path):
    from chameleon_bundle import N_CODES

    d = _copy(chameleon_bundle, tmp_path)
    rec = B.build_engines(d, max_batch=2, progress=False)
    assert set(rec["graphs"]) == {"target_verify", "drafter_project", "drafter_step", "gasv", "vq_decode"}
    plans = {Path(p["onnx"]).name: p for p in core.builds}
    assert all(p["tf32"] and p["strongly_typed"] for p in core.builds)
    gasv = plans["gasv.trt.onnx"]["plugins"]
    assert [g["op"] for g in gasv] == [tp.PLUGIN_NAME]                 # found by ("gasv2", "1", "lisa")
    assert gasv[0]["extra_args"][0] == N_CODES                          # V: the image-code sub-vocabulary
    (pre,) = [p for p in rec["graphs"]["target_verify"]["profiles"] if p["name"] == "prefill"]  # the prompt axis
    assert pre["shapes"]["input_ids"][2] == [4, 32]
