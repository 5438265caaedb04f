"""An exported Emu3 engine directory (tokenizer.json, an EAGLE-3 drafter, GASV tables) deployed:
`Pipeline.from_dir` gives transformers' greedy CFG tokens for the same captions and the eager VQ's
images, `lisa-trt run` writes the same codes, and sampled it draws the eager models' tokens for
the same seed; the serve model and `lisa-trt serve` answer captions as the Pipeline does; int4
weights (the generic quantizer) stay within a stated tolerance of fp32; the bundle builds on the
fake TensorRT core (tests/contract/trt_fake.py) and the TensorRT runners decode the eager tokens."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "serve"))  # served.py: one caption through a real server
sys.path.insert(0, str(HERE.parent / "engines"))  # test_build: the fake TensorRT core's installer

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("onnxruntime")

from emu3_fixtures import cli, hf_generate, image_prompt, save_model_dir, save_tokenizer  # noqa: E402

import lisa_trt  # noqa: E402
from lisa_trt.speculative.methods import get_method

pytestmark = pytest.mark.slow
CAPTIONS = ["red fox", "a fox"]
SIZE, GRID, CFG = 8, 4, 3.0  # the tiny VQ: 2 px per code


@pytest.fixture(scope="module")
def deploy(tmp_path_factory):
    """(root, model dir, the transformers model, the exported fp32 engine directory)."""
    from lisa_trt.models.drafter import Drafter, save_drafter

    root = tmp_path_factory.mktemp("emu3_deploy")
    hf, d = save_model_dir(root / "m", seed=0)
    save_tokenizer(d)
    torch.manual_seed(0)
    save_drafter(Drafter.from_target(lisa_trt.load_target(d)).eval(), root / "drafter.safetensors")
    cli("calibrate", "--model", d, "--vq", d, "--out", root / "tables.safetensors", "--rollouts", 2,
        "--image-size", SIZE, "--cfg-scale", CFG)
    cli("export", "--model", d, "--drafter", root / "drafter.safetensors", "--tables", root / "tables.safetensors",
        "--vq", d, "--out", root / "eng", "--image-size", SIZE, "--max-prompt", 64, "--max-tree", 8,
        "--cfg-scale", CFG, "--top-k", 16, "--no-validate")  # top-k: the tiny vocabulary; validation: test_emu3_export
    return root, d, hf, root / "eng"


def _prompter(target, d):
    from lisa_trt.models.family import family_of

    return family_of(target.config).prompter(target, d).encode(CAPTIONS, image_size=SIZE, cfg=True)


def test_pipeline_gives_transformers_tokens_and_the_eager_images(deploy, tmp_path):
    from lisa_trt.models.family import family_of
    from lisa_trt.runtime.pipeline import Pipeline

    root, d, hf, eng = deploy
    target = lisa_trt.load_target(d)
    req = _prompter(target, d)
    assert req.cond.valid.all()  # same-length captions: no padding
    want = hf_generate(hf, req.cond.ids, GRID, GRID, guidance=CFG, negative=req.cond.uncond.ids,
                       attention_mask=req.cond.valid)
    assert len(set(want[:, :GRID].flatten().tolist())) > 1  # not a constant image
    with Pipeline.from_dir(eng, backend="ort", threads=1) as pipe:
        res = pipe.generate(CAPTIONS, verify="greedy", greedy=True, cfg_scale=CFG, seed=1, batch=True)
    assert torch.equal(res.tokens, want)  # tree speculation on ORT == transformers' greedy CFG
    fam = family_of(target.config)
    codes = fam.tokens_to_codes(target, want, req)
    assert torch.equal(res.codes, codes) and res.codes.shape == (2, GRID, GRID)
    with torch.no_grad():
        eager = fam.to_uint8(lisa_trt.tokens_to_pixels(lisa_trt.load_vq(d), want))
    for img, ref in zip(res.images, eager):
        assert np.abs(np.asarray(img).astype(int) - ref.astype(int)).max() <= 1  # ORT vs torch VQ rounding
    caps = tmp_path / "captions.txt"
    caps.write_text("\n".join(CAPTIONS) + "\n")
    out = cli("run", eng, caps, "--backend", "ort", "--verify", "greedy", "--greedy", "--cfg-scale", CFG,
              "--threads", 1, "--seed", 1, "--out", tmp_path / "run")
    assert "2 images" in out
    assert np.array_equal(np.load(tmp_path / "run" / "tokens.npy"), codes.numpy())


@pytest.mark.parametrize("verify", ["vanilla", "exact"])
def test_sampled_pipeline_tokens_equal_the_eager_models_for_the_same_seed(deploy, verify):
    """Sampling (top-k 16, CFG 3): the engine directory's Pipeline on ONNX Runtime and a Pipeline
    over the eager torch models (the same drafter, the same tree) draw the same tokens."""
    from lisa_trt.models.drafter import load_drafter
    from lisa_trt.runtime.pipeline import Pipeline

    root, d, _, eng = deploy
    target = lisa_trt.load_target(d)
    eager = Pipeline.from_models(target, load_drafter(root / "drafter.safetensors", target), None, lisa_trt.load_vq(d),
                                 generation={"image_size": SIZE})
    kw = dict(verify=verify, cfg_scale=CFG, top_k=16, seed=5, tree_top_k=2, tree_depth=2, tree_tokens=6)
    with Pipeline.from_dir(eng, backend="ort", threads=1) as pipe:
        got = pipe.generate(CAPTIONS, **kw)
    want = eager.generate(CAPTIONS, **kw)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.codes, want.codes)
    greedy = eager.generate(CAPTIONS, **{**kw, "greedy": True})
    assert not torch.equal(want.tokens, greedy.tokens)  # sampled, not the argmax


def _b(*s):
    return np.array([[x.encode()] for x in s], dtype=object)


def test_serve_model_answers_captions_as_the_pipeline(deploy):
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.runtime.prompts import Prompt
    from lisa_trt.serve.model import ServeModel

    *_, eng = deploy
    with Pipeline.from_dir(eng, backend="ort", threads=1) as pipe:
        (err, out), (err2, _) = ServeModel(pipe, max_batch=4).infer_each(
            [{"prompt": _b(*CAPTIONS), "seed": np.array([[7], [8]])},
             {"prompt": _b(" ".join(["fox"] * 80)), "seed": np.array([[1]])}])
        ref = pipe.generate([Prompt(0, caption=CAPTIONS[0], seed=7), Prompt(1, caption=CAPTIONS[1], seed=8)],
                            batch=True)
    assert err is None, err
    assert out["image"].shape == (2, SIZE, SIZE, 3) and out["image"].dtype == np.uint8
    assert all(np.array_equal(np.asarray(a), b) for a, b in zip(ref.images, out["image"]))
    assert err2 is not None and "--max-prompt" in str(err2)  # a long caption: its own error, named fix


def test_serve_command_answers_a_caption(deploy, tmp_path):
    """`lisa-trt serve DIR` (a real Triton server process) on the Emu3 bundle: a caption request
    returns the Pipeline's image for the same caption and seed."""
    from served import serve_one_caption

    *_, eng = deploy
    img, st, want = serve_one_caption(eng, tmp_path / "server.log", CAPTIONS[0], seed=8)
    assert img.shape == (SIZE, SIZE, 3) and np.array_equal(img, want)  # (and its stats: served.py)


@torch.no_grad()
def _teacher_forced(target, ids, tokens, step: int = 8):
    """Logits (B, N, V) predicting tokens[:, j] from the prompt and tokens[:, :j], through the
    decode loops' calls (prefill, then causal chunks of forward_tokens): torch and engine targets."""
    cache = target.new_cache(ids.shape[0], target.max_cache_len if hasattr(target, "max_cache_len") else 64)
    outs = [target.prefill(ids, cache).logits[:, -1:]]
    for s in range(0, tokens.shape[1] - 1, step):
        chunk = tokens[:, s:min(s + step, tokens.shape[1] - 1)]
        S = chunk.shape[1]
        slots = cache.lengths[:, None] + torch.arange(S)
        pos = cache.positions(cache.lengths[:, None]) + torch.arange(S)
        causal = torch.ones(S, S, dtype=torch.bool).tril()[None].expand(ids.shape[0], S, S)
        outs.append(target.forward_tokens(chunk, pos, slots, cache.attention_mask(slots, causal), cache).logits)
        cache.lengths += S
    return torch.cat(outs, 1)


def test_int4_bundle_is_within_tolerance_of_fp32(deploy, tmp_path):
    """int4 weights (MatMulNBits, block 16): every model graph validated at 0.6 (the tiny random
    model is int4's worst case, as for Chameleon), teacher-forced logits over a greedy image within
    0.3 of fp32 (scaled by the largest logit; measured 0.18) with top-1 agreement >= 0.6 (measured
    0.80); greedy tokens are not identical on this flat random head (a flipped argmax diverges)."""
    from lisa_trt.engines.graph import load_engines
    from lisa_trt.export.quantize import op_counts, quantize_bundle
    from lisa_trt.models.drafter import load_drafter
    from lisa_trt.models.family import family_of
    from lisa_trt.models.io_spec import Graph

    root, d, _, eng = deploy
    target = lisa_trt.load_target(d)
    out = tmp_path / "int4"
    shutil.copytree(eng, out)
    arts = dict(target=target, drafter=load_drafter(root / "drafter.safetensors", target), tables=None, vq=None)
    man = quantize_bundle(out, "int4", arts, block_size=16, threshold=0.6)
    assert man.quantization == "int4" and man.family == "emu3"
    for name in ("target_prefill", "target_verify", "drafter_project", "drafter_step"):
        assert op_counts(man.graph_path(Graph(name))).get("MatMulNBits", 0) > 0 and man.graphs[name].validation["ok"]
    ids = torch.tensor([image_prompt([40, 41, 42], GRID, GRID), image_prompt([43, 44, 45], GRID, GRID)])
    ref = lisa_trt.generate(target, ids, greedy=True)
    e32, e4 = load_engines(eng, backend="ort", threads=1), load_engines(out, backend="ort", threads=1)
    a = _teacher_forced(target, ids, ref)
    full = lisa_trt.teacher_forced_logits(target, torch.cat([ids, ref], 1))[:, ids.shape[1] - 1:-1]
    torch.testing.assert_close(a, full, atol=1e-4, rtol=0)  # the helper is teacher forcing
    torch.testing.assert_close(_teacher_forced(e32.target, ids, ref), a, atol=1e-4, rtol=0)
    b = _teacher_forced(e4.target, ids, ref)
    assert float((a - b).abs().max()) / float(a.abs().max()) < 0.3
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.6
    got = lisa_trt.generate(e4.target, ids, greedy=True)  # the layout holds: forced tokens where they belong
    forced = family_of(target.config).generation_inputs(target, ids)[2].forced >= 0
    assert torch.equal(got[:, forced], ref[:, forced])


# ----------------------------------------------------------------------------- fake TensorRT core

def test_build_on_the_fake_core_and_the_trt_runners_decode_the_eager_tokens(deploy, tmp_path, monkeypatch,
                                                                            request):
    """The REAL build_plan (Polygraphy's loaders) over the fake native core, whose engines run the
    ONNX graphs through the bound addresses (tests/engines/test_build.py does the same for
    LlamaGen, tests/engines/test_chameleon_build.py for Chameleon)."""
    from test_build import FakeTRT, _install

    from lisa_trt.config import SamplingConfig
    from lisa_trt.deploy import build as B
    from lisa_trt.engines.graph import load_engines
    from lisa_trt.models.family import family_of
    from lisa_trt.models.io_spec import Graph
    from lisa_trt.speculative.methods import SpecConfig
    from lisa_trt.speculative.run import run_method

    _, d, _, eng = deploy
    _install(FakeTRT(), monkeypatch, request)
    out = tmp_path / "eng"
    shutil.copytree(eng, out)
    rec = B.build_engines(out, max_batch=2, progress=False)
    assert {"target_verify", "drafter_project", "drafter_step", "gasv", "vq_decode"} == set(rec["graphs"])
    assert B.engines_built(out) and rec["strongly_typed"]
    target = lisa_trt.load_target(d)
    ids = torch.tensor([image_prompt([40, 41, 42], GRID, GRID), image_prompt([43, 44, 45], GRID, GRID)])
    ref = lisa_trt.generate(target, ids, cfg_scale=CFG, greedy=True)  # the CFG fallback rows
    trt = load_engines(out, backend="trt", device="cpu")
    assert list(trt.target.runners) == [Graph.TARGET_VERIFY]  # one target engine: prefill is a verify call
    assert torch.equal(lisa_trt.generate(trt.target, ids, cfg_scale=CFG, greedy=True), ref)
    fam = family_of(target.config)
    cond, _, layout = fam.generation_inputs(trt.target, ids)
    s = SamplingConfig(cfg_scale=CFG, greedy=True)
    tree, _ = run_method(get_method("greedy"), trt.target, trt.drafter, None, cond, sampling=s,
                         spec=SpecConfig.make("greedy", top_k=2, depth=2, total_tokens=6), seed=0, layout=layout)
    assert torch.equal(tree, ref)  # lossless tree speculation through the TensorRT runners
    codes = fam.tokens_to_codes(target, ref, None)
    torch.testing.assert_close(trt.vq.decode_code(codes), lisa_trt.load_vq(d).decode_code(codes), atol=1e-4, rtol=0)
