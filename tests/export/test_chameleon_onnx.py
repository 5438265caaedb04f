"""Chameleon family end to end on a tiny random checkpoint: `lisa-trt train` (resumable),
`calibrate`, `export` (every graph validated against torch) and `run` through ONNX Runtime with
every verification rule, images out; greedy speculation through the ORT graphs is
token-identical to the torch reference loop; clear errors for wrong engine directories."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import lisa_trt  # noqa: E402
from chameleon_fixtures import N_CODES, save_model_dir  # noqa: E402

pytestmark = pytest.mark.slow
SIZE = 64  # 4 x 4 latent codes + 4 row ends per image


def _cli(*args):
    from click.testing import CliRunner

    from lisa_trt.cli import main

    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output + repr(r.exception)
    return r.output


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("cham_e2e")
    d = save_model_dir(root / "model", seed=5, num_key_value_heads=2, swin_norm=True)
    caps = root / "captions.txt"
    caps.write_text("# captions\na red fox\n\ntok70 tok71 tok72\na lighthouse\n")
    common = ["--model", d, "--image-size", SIZE, "--captions-file", caps, "--seed", 0]
    _cli("train", *common, "--out", root / "run", "--steps", 3, "--num-samples", 3, "--batch-size", 2,
         "--drafter-hidden", 16, "--drafter-heads", 2, "--cfg-scale", 2.0, "--checkpoint-every", 1, "--eval-images", 0)
    _cli("calibrate", *common, "--out", root / "tables.safetensors", "--rollouts", 4, "--samples-per-pos", 2,
         "--clusters", 4, "--lantern-k", 8, "--top-k", 16, "--cfg-scale", 2.0)
    out = _cli("export", "--model", d, "--image-size", SIZE, "--drafter", root / "run" / "drafter.safetensors",
               "--tables", root / "tables.safetensors", "--out", root / "eng", "--max-prompt", 32, "--max-tree", 16,
               "--cfg-scale", 2.0, "--top-k", 16)
    assert "wrote" in out and "gasv" in out and "vq_decode" in out
    return root, d, caps


def test_train_resumes_from_its_state(pipeline):
    root, d, caps = pipeline
    log = json.loads((root / "run" / "train_log.json").read_text())
    assert log["steps"] == 3 and len(log["losses_this_run"]) == 3
    # the same command with more steps continues from train_state.pt (3 new steps, not 6)
    _cli("train", "--model", d, "--image-size", SIZE, "--captions-file", caps, "--out", root / "run", "--steps", 6,
         "--batch-size", 2, "--drafter-hidden", 16, "--drafter-heads", 2, "--checkpoint-every", 1, "--eval-images", 0)
    log = json.loads((root / "run" / "train_log.json").read_text())
    assert len(log["losses_this_run"]) == 3


def test_export_manifest_and_validation(pipeline):
    root, _, _ = pipeline
    man = json.loads((root / "eng" / "manifest.json").read_text())
    assert man["family"] == "chameleon" and man["precision"] == "fp32"
    assert set(man["graphs"]) == {"target_prefill", "target_verify", "drafter_project", "drafter_step", "gasv",
                                  "vq_decode"}
    for g in man["graphs"].values():  # vs the torch models' public API (export/validate.py, fp32 threshold)
        assert g["validation"]["ok"] and g["validation"]["max_error"] < 1e-4
    assert man["tables"]["vocab_size"] == N_CODES and man["layout"]["image_size"] == SIZE


@pytest.mark.parametrize("verify", ["vanilla", "greedy", "exact", "lantern", "gasv"])
def test_run_every_rule_through_ort(pipeline, verify, tmp_path, check_run_stats):
    root, _, caps = pipeline
    out = _cli("run", root / "eng", caps, "--out", tmp_path, "--verify", verify, "--threads", 1)
    assert "3 images" in out
    st = json.loads((tmp_path / "stats.json").read_text())
    assert st["backend"] == "ort" and len(st["images"]) == 3
    codes = np.load(tmp_path / "tokens.npy")
    assert codes.shape == (3, 4, 4) and codes.min() >= 0 and codes.max() < N_CODES
    n = check_run_stats(st)  # each image's MAL and forwards are its decode's
    if verify == "vanilla":
        assert st["mal"] == 1.0 and all(i["forwards"] == n for i in st["images"])


def test_ort_greedy_speculation_matches_torch(pipeline):
    from lumina_calls import load_chameleon_engines
    from lisa_trt.families.chameleon.drafter import load_chameleon_drafter
    from lumina_calls import LuminaTokenizer, generate_image_tokens
    from lumina_calls import LuminaSpec, speculative_image_tokens

    root, d, _ = pipeline
    target, tok = lisa_trt.load_target(d), LuminaTokenizer(d)
    eng = load_chameleon_engines(root / "eng", threads=1)
    caps = ["a red fox", "tok70 tok71 tok72 tok73 tok74"]  # different lengths: left padding
    ref = generate_image_tokens(target, tok, caps, SIZE, SIZE, cfg_scale=2.0, greedy=True)
    spec = LuminaSpec(method="greedy", cfg_scale=2.0, tree_top_k=3, depth=3, total_tokens=8)
    got, _ = speculative_image_tokens(eng.target, eng.drafter, eng.tokenizer, caps, SIZE, SIZE, spec)
    assert torch.equal(got.tokens, ref.tokens)
    drafter = load_chameleon_drafter(root / "run" / "drafter.safetensors", target)
    tor, _ = speculative_image_tokens(target, drafter, tok, caps, SIZE, SIZE, spec)
    assert torch.equal(tor.tokens, ref.tokens)
    # GASV v2 graph == torch gasv_gates on code logits, a tree of code tokens and its parents
    from lumina_calls import load_chameleon_tables
    from lisa_trt.speculative.gasv import gasv_gates

    tables = load_chameleon_tables(root / "tables.safetensors", target)
    assert eng.gasv.config == tables.config and tables.metadata()["gasv_version"] == 2
    g = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(6, N_CODES, generator=g)
    x[3, x[3] < x[3].median()] = float("-inf")  # a top-k filtered row: off-support candidates get no gate
    toks = torch.randint(0, N_CODES, (6,), generator=g)
    parents = torch.tensor([-1, 0, 0, 1, -1, 4])  # two trees (batch rows flattened with offsets)
    a, b = eng.gasv(x, toks, parents), gasv_gates(x, toks, parents, tables, tables.config)
    assert a.cand.shape == b.cand.shape == (6, tables.config.neighbours)
    assert torch.equal(a.cand, b.cand)
    assert torch.allclose(a.p, b.p, atol=1e-5) and torch.allclose(a.delta_eff, b.delta_eff, atol=1e-5)
    assert torch.allclose(a.gate, b.gate, atol=1e-5)
    assert bool((b.gate[[0, 4]] == 0).all()) and bool((b.gate > 0).any())  # roots: no gates; some gate opens


def test_wrong_engine_directories_are_clear(pipeline, tmp_path):
    from lumina_calls import load_chameleon_engines

    root, _, caps = pipeline
    with pytest.raises(lisa_trt.LisaError, match="not a complete lisa-trt engine directory"):
        load_chameleon_engines(tmp_path)
    long_caps = tmp_path / "long.txt"
    long_caps.write_text(" ".join(["tok70"] * 40) + "\n")
    from click.testing import CliRunner

    from lisa_trt.cli import main

    r = CliRunner().invoke(main, ["run", str(root / "eng"), str(long_caps), "--out", str(tmp_path / "o")])
    assert r.exit_code != 0 and "--max-prompt" in r.output
    r = CliRunner().invoke(main, ["build", str(root / "eng"), "--memory-gib", "24"])
    assert r.exit_code != 0 and "--backend ort" in r.output  # the generic build: no TensorRT here
    r = CliRunner().invoke(main, ["run", str(root / "eng"), str(caps), "--verify", "sjd", "--out", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output  # the Jacobi decoders run on the engine directory's graphs too


def test_issue_27_decoders_run_and_serve_on_ort(pipeline):
    """Issue 27's decoders on the ORT bundle, with CFG and two prompts: Pipeline one call per prompt
    and batch=True (the serve path; equal tokens for every rule but `coupled`), and
    the serve model with the knobs as inputs; the stats say what ran."""
    from prompted_decoders import check_new_decoders_run_and_serve_on_ort

    check_new_decoders_run_and_serve_on_ort(pipeline[0] / "eng", ["a red fox", "tok70 tok71 tok72"], N_CODES)
