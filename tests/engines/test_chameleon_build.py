"""`lisa-trt build` on a Chameleon-family engine directory runs the CPU-side checks LlamaGen bundles
get: optimisation profiles from the family's io specs (the prompt axis of the prefill graph, the
image-code axis of GASV, the latent grid of the VQGAN), the TensorRT compatibility check of every
graph (ops, dtypes, io spec, profiles; the GASV graph as its lisa::gasv2 plugin variant), the
operator audit against the TensorRT 10.14 parser table, the memory plan; and a dry run. No
TensorRT is needed (and none is installable here): a real build says what is missing."""

import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))

from chameleon_bundle import N_CODES, export_kwargs, make_chameleon_artifacts  # noqa: E402

from lisa_trt.deploy import build as B  # noqa: E402
from lisa_trt.models.io_spec import Graph  # noqa: E402

ALL = {"target_prefill", "target_verify", "drafter_project", "drafter_step", "gasv", "vq_decode"}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """fp32 and fp16 exports of the tiny Chameleon deployment (every graph; validation is the export tests')."""
    from chameleon_bundle import export_cli

    root = tmp_path_factory.mktemp("cham_build")
    art = make_chameleon_artifacts(root / "art")
    out = {}
    for prec in ("fp32", "fp16"):
        export_cli(art["model_dir"], root / prec, **export_kwargs(art, validate=False, fp16=prec == "fp16"))
        out[prec] = root / prec
    return out


@pytest.mark.parametrize("prec", ["fp32", "fp16"])
def test_dry_run_checks_and_plans_every_graph(bundles, prec):
    from lisa_trt.export.manifest import read_manifest

    d = bundles[prec]
    man = read_manifest(d)
    rec = B.build_engines(d, dry_run=True, max_batch=2, progress=False)  # check_trt_compat runs first
    # one target engine (issue 26): the verify engine runs the prompt's prefill too
    assert rec["dry_run"] and set(rec["graphs"]) == ALL - {"target_prefill"}
    assert rec["graphs"]["gasv"]["onnx"] == "gasv.trt.onnx"  # the plugin variant is what TensorRT parses
    prof = {n: g["profiles"] for n, g in rec["graphs"].items()}
    # max_tree 16 <= the step split: one tree profile; then prompts of 1 .. max_prompt tokens, 1 .. 2 x 2 CFG rows
    tree, pre = prof["target_verify"]
    assert (tree["name"], pre["name"]) == ("tree", "prefill")
    assert pre["shapes"]["input_ids"] == [[1, 1], [2, 16], [4, 32]]
    assert pre["shapes"]["attention_mask"][2] == [4, 32, man.max_cache_len]
    every = B.build_engines(d, dry_run=True, max_batch=2, progress=False, graphs=sorted(ALL), check=False)
    assert [p["name"] for p in every["graphs"]["target_prefill"]["profiles"]] == ["prefill"]  # when asked for
    (g,) = prof["gasv"]
    assert g["shapes"]["guided_logits"][2] == [2 * 16, N_CODES]  # the image-code sub-vocabulary
    (v,) = prof["vq_decode"]
    assert v["shapes"]["image_tokens"][2] == [2, 4, 4]  # the latent grid of a 64 px image


def test_compat_report_and_op_audit_pass(bundles):
    from lisa_trt.deploy import op_audit as oa
    from lisa_trt.deploy.trt_lint import check_trt_compat

    for prec, d in bundles.items():
        report = check_trt_compat(d, max_batch=2)
        assert report.ok and set(report.graphs) == ALL, report.summary()
        rows = oa.audit_bundle(d, name=f"chameleon-{prec}")
        oa.check_rows(rows)  # every op in TensorRT 10.14's ONNX parser table
        ops = {r.op for r in rows}
        assert {"Softmax", "LayerNormalization", "gasv2"} <= ops, ops
        assert not ops & {"ScatterElements", "TensorScatter"}, ops  # the graphs return new K/V rows


def test_memory_plan_of_the_engine_directory(bundles):
    from lisa_trt.deploy.memory_plan import check_plan, preflight
    from lisa_trt.export.manifest import read_manifest

    d = bundles["fp16"]
    man = read_manifest(d)
    p = check_plan(d, memory_gib=4, batch=1, tree=8)
    assert p.family == "chameleon" and p.max_cache_len == man.max_cache_len and p.precision == "fp16"
    assert p.cfg  # Lumina-mGPT decodes with CFG: two rows per prompt
    assert preflight(d, memory_gib=4, gpu_backend=True, batch=1, cfg=True).fits
    from click.testing import CliRunner

    from lisa_trt.cli import main

    r = CliRunner().invoke(main, ["plan", str(d), "--memory-gib", "4"])  # the command: exit 0 when it fits
    assert r.exit_code == 0 and "(chameleon)" in r.output and "fits: yes" in r.output, r.output
    with pytest.raises(B.InputError, match="does not fit|needs"):
        check_plan(d, memory_gib=0.01, batch=1, tree=8)


def test_a_real_build_without_tensorrt_says_what_is_missing(bundles):
    with pytest.raises(B.TensorRTUnavailableError, match="--backend ort"):
        B.build_engines(bundles["fp32"], progress=False)


# ----------------------------------------------------------------------------- fake TensorRT core

@pytest.fixture
def built(bundles, tmp_path, monkeypatch, request):
    """A copy of the fp32 bundle built by the REAL build_plan (Polygraphy's loaders) over the fake
    native core of tests/contract/trt_fake.py, whose engines run the ONNX graphs (the GASV plugin
    variant emulated) through the bound addresses (tests/engines/test_build.py does the same for LlamaGen)."""
    import shutil
    import types

    from test_build import FakeTRT, _install

    fake = FakeTRT()
    _install(fake, monkeypatch, request)
    d = tmp_path / "eng"
    shutil.copytree(bundles["fp32"], d)
    rec = B.build_engines(d, max_batch=2, progress=False)
    return types.SimpleNamespace(trt=fake, dir=d, record=rec)


def test_build_records_engines_and_the_trt_backend_decodes_like_ort(built):
    import torch

    from lumina_calls import load_chameleon_engines
    from lumina_calls import LuminaSpec, speculative_image_tokens

    rec = built.record
    assert set(rec["graphs"]) == ALL - {"target_prefill"} and rec["strongly_typed"] and B.engines_built(built.dir)
    assert [p["name"] for p in rec["graphs"]["target_verify"]["profiles"]] == ["tree", "prefill"]
    caps = ["a red fox", "tok70 tok71 tok72 tok73 tok74"]  # left padding + the CFG unconditional rows
    spec = LuminaSpec(method="gasv", cfg_scale=2.0, top_k=16, tree_top_k=3, depth=3, total_tokens=8)
    out = {}
    for backend, kw in (("ort", dict(threads=1)), ("trt", dict(device="cpu"))):
        eng = load_chameleon_engines(built.dir, backend=backend, **kw)
        with torch.no_grad():
            res, st = speculative_image_tokens(eng.target, eng.drafter, eng.tokenizer, caps, 64, 64, spec, seed=1,
                                               tables=eng.tables, gasv=eng.gasv)
        out[backend] = (res.codes, st.as_dict()["target_forwards"], eng)
    t = out["trt"][2].target  # each call writes only its new rows to present.*, never a whole cache
    for c in t._verify.engine.calls:
        S, full = c["shapes"]["input_ids"][1], math.prod(c["shapes"]["past_key_values.0.key"]) * t.dtype.itemsize
        kv = {n: w for n, w in c["written"].items() if n.startswith("present.")}
        assert kv and all(w * t.max_cache_len == full * S for w in kv.values()), (S, kv)
    assert list(out["trt"][2].target.runners) == [Graph.TARGET_VERIFY]  # one target engine: the prefill is a verify call
    assert torch.equal(out["trt"][0], out["ort"][0]) and out["trt"][1] == out["ort"][1]
    vq = out["trt"][2].vq
    pixels = vq.decode_code(out["trt"][0])
    assert pixels.shape == (2, 3, 4 * vq.downsample, 4 * vq.downsample) and torch.isfinite(pixels).all()
    assert torch.allclose(pixels, out["ort"][2].vq.decode_code(out["ort"][0]), atol=1e-5)
