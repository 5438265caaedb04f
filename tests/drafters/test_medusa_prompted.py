"""Medusa heads for the prompted families (Chameleon / Lumina-mGPT, Janus-Pro) through the family seam,
end to end on tiny random checkpoints built by transformers: `lisa-trt train --arch medusa`
(self-distilled prompts, the heads over the layout's allowed ids, forced row ends without loss),
`lisa-trt generate --drafter` (torch), `export --drafter` (the heads graph validated in the
token-prompt bundle), and `run` with every tree rule, `bench` and `Pipeline.from_dir` on ONNX
Runtime. Greedy Medusa speculation is token-identical to the plain AR loop (row ends included),
on torch and on ORT."""

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
from lisa_trt.speculative.methods import get_method

pytestmark = pytest.mark.slow
CAPTIONS = {"chameleon": ["a red fox", "tok70 tok71 tok72 tok73", "a lighthouse"],  # different lengths: left padding
            "janus": ["w10 w11 w12", "w20", "w30 w31"]}


def _cli(*args):
    from click.testing import CliRunner

    from lisa_trt.cli import main

    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output + repr(r.exception)
    return r.output


def _chameleon(root):
    from chameleon_fixtures import save_model_dir

    return save_model_dir(root / "model", seed=5, num_key_value_heads=2, swin_norm=True), ["--image-size", 64]


def _janus(root):
    from test_janus import make_hf, save, save_tokenizer

    d = save(make_hf(seed=3), root / "model")
    save_tokenizer(d)
    return d, []


@pytest.fixture(scope="module", params=["chameleon", "janus"])
def run(request, tmp_path_factory):
    """train --arch medusa, calibrate and export --drafter (every graph validated) for one family."""
    root = tmp_path_factory.mktemp(f"medusa_{request.param}")
    d, size = {"chameleon": _chameleon, "janus": _janus}[request.param](root)
    caps = root / "captions.txt"
    caps.write_text("\n".join(CAPTIONS[request.param]) + "\n")
    common = ["--model", d, *size, "--captions-file", caps, "--seed", 0, "--cfg-scale", 2.0]
    out = _cli("train", *common, "--arch", "medusa", "--out", root / "run", "--steps", 3, "--num-samples", 3,
               "--batch-size", 2, "--medusa-heads", 3, "--eval-images", 2)
    assert "held-out decoding (2 images" in out
    _cli("calibrate", *common, "--out", root / "tables.safetensors", "--rollouts", 3, "--samples-per-pos", 2,
         "--clusters", 4, "--lantern-k", 8, "--top-k", 16)
    out = _cli("export", "--model", d, *size, "--drafter", root / "run" / "medusa.safetensors", "--tables",
               root / "tables.safetensors", "--out", root / "eng", "--max-prompt", 32, "--max-tree", 16,
               "--cfg-scale", 2.0, "--top-k", 16)
    assert "medusa_heads" in out and "wrote" in out
    return request.param, root, d, caps


def _request(target, d):
    from lisa_trt.models.family import family_of

    fam = family_of(target.config)
    size = 64 if fam.name == "chameleon" else None
    return fam.prompter(target, d).encode(CAPTIONS[fam.name][:2], image_size=size, cfg=True)


def test_training_writes_heads_over_the_allowed_ids(run):
    """The heads predict what the layout lets the loop sample (Chameleon: the image codes, not the
    whole vocabulary; Janus: the codebook, the whole generation head), warm-started from those rows."""
    from lisa_trt.models.draft_vocab import OUT_OF_VOCAB_LOGIT
    from lisa_trt.models.medusa import load_medusa

    fam, root, d, _ = run
    target = lisa_trt.load_target(str(d))
    heads = load_medusa(root / "run" / "medusa.safetensors", target)
    layout = _request(target, d).layout
    assert heads.config.n_heads == 3 and heads.config.dim == target.output.in_features
    if layout.allowed is None:  # Janus: every head id may be sampled
        assert heads.d2t is None and heads.config.draft_vocab == 0
    else:
        assert fam == "chameleon" and heads.d2t.tolist() == layout.allowed.tolist()
        assert heads.config.draft_vocab == layout.allowed.numel() < target.output.out_features
        lo = heads.head_logits(torch.randn(1, 2, heads.config.dim), torch.tensor([[0, 2]]))
        outside = torch.ones(lo.shape[-1], dtype=torch.bool)
        outside[layout.allowed] = False
        assert (lo[..., outside] == OUT_OF_VOCAB_LOGIT).all() and (lo[..., ~outside] != OUT_OF_VOCAB_LOGIT).all()
    log = json.loads((root / "run" / "train_log.json").read_text())
    assert log["family"] == fam and log["steps"] == 3 and log["losses_this_run"]
    ev = json.loads((root / "run" / "eval_decode.json").read_text())  # what it checks: the held-out decode ran
    assert ev["images"] == len(ev["prompts"]) == 2 and ev["spec"]["method"] == "exact"  # (MAL not claimed: 3 steps)


def test_greedy_medusa_speculation_equals_the_ar_loop_on_torch_and_ort(run):
    """Lossless: greedy tree speculation with the heads (forced row ends in the tree) reproduces the
    greedy AR loop with CFG, on the torch target and through the exported bundle."""
    from lisa_trt.config import SamplingConfig
    from lisa_trt.models.medusa import load_medusa
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.speculative.methods import SpecConfig
    from lisa_trt.speculative.run import run_method

    fam, root, d, _ = run
    target = lisa_trt.load_target(str(d))
    req = _request(target, d)
    s = SamplingConfig(cfg_scale=2.0, top_k=16, greedy=True)
    want, _ = run_method(get_method("vanilla"), target, None, None, req.cond, sampling=s, spec=SpecConfig.make("greedy"), seed=0,
                         layout=req.layout)
    assert len(set(want.flatten().tolist())) > 2  # not a constant image
    heads = load_medusa(root / "run" / "medusa.safetensors", target)
    spec = SpecConfig.make("greedy", top_k=3, depth=3, total_tokens=8)
    got, st = run_method(get_method("greedy"), target, heads, None, req.cond, sampling=s, spec=spec, seed=0, layout=req.layout)
    assert torch.equal(got, want) and st.target_forwards < want.shape[1]  # some drafts accepted
    with Pipeline.from_dir(root / "eng", backend="ort", threads=1) as pipe:
        out = pipe.generate(CAPTIONS[fam][:2], verify="greedy", greedy=True, cfg_scale=2.0, top_k=16, decode=False)
    assert torch.equal(torch.as_tensor(np.asarray(out.tokens)).reshape(want.shape), want)


def test_bundle_records_the_heads_graph_validated_and_builds(run):
    """The heads graph is validated in the bundle and passes `lisa-trt build --dry-run` (TensorRT
    compatibility of every graph, the scatter back to the head vocabulary included)."""
    _, root, _, _ = run
    man = json.loads((root / "eng" / "manifest.json").read_text())
    assert man["drafter"]["arch"] == "medusa" and "drafter_step" not in man["graphs"]
    graphs = {"target_prefill", "target_verify", "medusa_heads", "gasv", "vq_decode"}
    assert set(man["graphs"]) == graphs
    for g in man["graphs"].values():
        assert g["validation"]["ok"] and g["validation"]["max_error"] < 1e-4
    out = _cli("build", root / "eng", "--dry-run", "--json", "-")
    rec = json.loads(out[out.index("{"):])
    assert rec["dry_run"] and set(rec["graphs"]) == graphs - {"target_prefill"}  # one target engine


@pytest.mark.parametrize("verify", ["greedy", "exact", "lantern", "gasv"])
def test_run_every_tree_rule_through_ort(run, verify, tmp_path, check_run_stats):
    fam, root, _, caps = run
    out = _cli("run", root / "eng", caps, "--out", tmp_path, "--verify", verify, "--threads", 1)
    assert "3 images" in out
    st = json.loads((tmp_path / "stats.json").read_text())
    assert st["backend"] == "ort" and st["family"] == fam and len(st["images"]) == 3
    check_run_stats(st)  # each image's MAL and forwards are its decode's
    assert len(list(tmp_path.glob("*.png"))) == 3


def test_generate_and_bench_with_the_heads(run, tmp_path):
    fam, root, d, caps = run
    size = ["--image-size", 64] if fam == "chameleon" else []
    out = _cli("generate", "--model", d, *size, "--prompt", CAPTIONS[fam][0], "--prompt", CAPTIONS[fam][1], "--drafter",
               root / "run" / "medusa.safetensors", "--verify", "exact", "--cfg-scale", 2.0, "--out", tmp_path / "g")
    assert np.load(tmp_path / "g" / "tokens.npy").shape[0] == 2 and len(list((tmp_path / "g").glob("*.png"))) == 2
    # bench encodes the prompts at the bundle's image size (no --image-size needed)
    _cli("bench", "--model", d, "--backend", "ort", "--engine-dir", root / "eng", "--captions", caps, "--drafter",
         root / "run" / "medusa.safetensors", "--tables", root / "tables.safetensors", "--methods", "vanilla,gasv",
         "--num-images", 2, "--json", tmp_path / "bench.json")
    rep = json.loads((tmp_path / "bench.json").read_text())
    assert {r["method"] for r in rep["results"].values()} >= {"vanilla", "gasv"}
