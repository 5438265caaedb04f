"""Negative prompts on T5-caption (LlamaGen t2i) bundles: the negative text is encoded by the same
caption encoder (the tiny random T5 here) and its features replace the learned null caption in
CFG's unconditional rows, as diffusion negative prompts do; without one nothing changes. Through
Pipeline.generate here; `lisa-trt run --negative-prompt` and the served model's card on an
exported bundle in the slow test; the OpenAI front end in tests/serve/test_openai.py."""

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from lisa_trt.errors import InputError  # noqa: E402
from lisa_trt.runtime.pipeline import Pipeline  # noqa: E402
from lisa_trt.runtime.prompts import Prompt  # noqa: E402
from lisa_trt.speculative.autoregressive import generate  # noqa: E402
from lisa_trt.testing import make_target  # noqa: E402

NEG = "blue sky"  # 3 caption tokens: a mask of its own beside the prompts' 4
CFG = 3.0


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return make_target("t2i", std=0.3)  # 6 caption slots, 12-wide features


@pytest.fixture(scope="module")
def pipe(target, t5_dir):
    from lisa_trt.models.drafter import Drafter

    return Pipeline.from_models(target, Drafter.from_target(target), generation={"sampling": {"cfg_scale": CFG}},
                                text_encoder=t5_dir)


def _tokens(pipe, captions, **kw):
    return pipe.generate(captions, verify="vanilla", decode=False, **kw).tokens


def _direct(target, pipe, t5_dir, caption, seed, null):
    """The plain AR loop on `caption`'s features with CFG's unconditional rows `null` (features,
    mask): the target's null_cond replaced for this decode, nothing of the pipeline's negative path."""
    from lisa_trt.families.llamagen.captions import CaptionEncoder

    cond = CaptionEncoder(t5_dir, max_length=target.config.cls_token_num).encode([caption])
    target.null_cond = lambda c: null
    try:
        return generate(target, cond, seeds=[seed], **dataclasses.asdict(pipe.sampling()))
    finally:
        del target.null_cond


def test_a_negative_prompt_changes_the_image_and_none_changes_nothing(pipe):
    plain = _tokens(pipe, ["a red car"], seed=3)
    assert torch.equal(_tokens(pipe, ["a red car"], seed=3, negative_prompt=None), plain)
    assert torch.equal(_tokens(pipe, ["a red car"], seed=3, negative_prompt="   "), plain)  # blank: none
    neg = pipe.generate(["a red car"], verify="vanilla", decode=False, seed=3, negative_prompt=NEG)
    assert not torch.equal(neg.tokens, plain)
    assert neg.stats[0]["negative_prompt"] == NEG
    # guidance off: the unconditional rows are not used, so the negative changes nothing
    assert torch.equal(_tokens(pipe, ["a red car"], seed=3, cfg_scale=1.0, negative_prompt=NEG),
                       _tokens(pipe, ["a red car"], seed=3, cfg_scale=1.0))


def test_the_negative_features_are_the_null_rows_of_a_direct_decode(target, pipe, t5_dir):
    """The pipeline's tokens equal the plain loop's with the negative's T5 features and mask as
    CFG's unconditional rows; without a negative, with the learned null caption."""
    from lisa_trt.families.llamagen.captions import CaptionEncoder

    nf, nm = CaptionEncoder(t5_dir, max_length=target.config.cls_token_num).encode([NEG])
    got = _tokens(pipe, ["a red car"], seed=4, negative_prompt=NEG)
    assert torch.equal(got, _direct(target, pipe, t5_dir, "a red car", 4, (nf, nm)))
    learned = target.null_cond(CaptionEncoder(t5_dir, max_length=target.config.cls_token_num).encode(["a red car"]))
    assert torch.equal(_tokens(pipe, ["a red car"], seed=4), _direct(target, pipe, t5_dir, "a red car", 4, learned))


def test_per_prompt_negatives_in_a_batch_equal_each_alone(pipe):
    both = _tokens(pipe, [Prompt(0, caption="a red car", seed=5), Prompt(1, caption="a dog", seed=6)],
                   negative_prompt=[NEG, None], batch=True)
    assert torch.equal(both[:1], _tokens(pipe, [Prompt(0, caption="a red car", seed=5)], negative_prompt=NEG))
    assert torch.equal(both[1:], _tokens(pipe, [Prompt(0, caption="a dog", seed=6)]))  # None: the null caption
    tree = pipe.generate(["a red car"], verify="greedy", decode=False, negative_prompt=NEG, tree_top_k=2,
                         tree_depth=2, tree_tokens=5).tokens  # a tree decode takes the same rows
    assert torch.equal(tree, pipe.generate(["a red car"], verify="vanilla", greedy=True, decode=False,
                                           negative_prompt=NEG).tokens)


def test_a_negative_prompt_needs_the_caption_encoder(target, tmp_path):
    from lisa_trt.families.llamagen.captions import CaptionEncoder  # noqa: F401  (the family's plug-in)
    from lisa_trt.models.captions import save_caption_features

    bare = Pipeline.from_models(target, None, generation={"sampling": {"cfg_scale": CFG}})
    feats = torch.randn(1, target.config.cls_token_num, target.config.caption_dim)
    mask = torch.ones(1, target.config.cls_token_num, dtype=torch.bool)
    save_caption_features(tmp_path / "f.safetensors", feats, mask, ["x"])
    p = [Prompt(0, caption_features=str(tmp_path / "f.safetensors"))]
    assert _tokens(bare, p).shape == (1, target.config.block_size)  # features alone need no encoder
    with pytest.raises(InputError, match="negative_prompt on a T5-caption bundle is encoded by its caption encoder"):
        _tokens(bare, p, negative_prompt=NEG)


@pytest.mark.slow
def test_run_and_the_served_card_take_a_negative_prompt_on_an_exported_bundle(target, t5_dir, tmp_path, monkeypatch):
    """`lisa-trt run --negative-prompt` on an exported t2i bundle (ONNX Runtime): its PNG is the
    Pipeline's image with that negative prompt, not the one without; without an encoder it is
    refused before any engine loads; the OpenAI card (ModelInfo.from_dir) says negative_prompt."""
    from click.testing import CliRunner
    from PIL import Image

    from lisa_trt.cli import main
    from lisa_trt.families.llamagen.vq import VQModel
    from lisa_trt.models.checkpoints import save_model
    from lisa_trt.models.target_config import vq_config
    from lisa_trt.serve.openai_request import ModelInfo

    monkeypatch.delenv("LISA_TRT_TEXT_ENCODER", raising=False)
    save_model(target, target.config, tmp_path / "t.safetensors")
    cfg = vq_config("VQ-16", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32, codebook_size=256)
    torch.manual_seed(0)
    save_model(VQModel(cfg), cfg, tmp_path / "vq.safetensors")
    r, eng = CliRunner(), tmp_path / "engines"
    res = r.invoke(main, ["export", "--model", str(tmp_path / "t.safetensors"), "--vq", str(tmp_path / "vq.safetensors"),
                          "--out", str(eng), "--cfg-scale", str(CFG)])
    assert res.exit_code == 0, res.output
    (tmp_path / "p.txt").write_text("a red car\n")
    run = ["run", str(eng), str(tmp_path / "p.txt"), "--backend", "ort", "--verify", "vanilla", "--seed", "7"]
    from lisa_trt.models.captions import save_caption_features

    feats = torch.randn(1, target.config.cls_token_num, target.config.caption_dim)
    save_caption_features(tmp_path / "f.safetensors", feats, torch.ones(feats.shape[:2], dtype=torch.bool), ["x"])
    (tmp_path / "f.jsonl").write_text('{"caption_features": "%s"}\n' % (tmp_path / "f.safetensors"))
    with monkeypatch.context() as mp:  # features need no encoder; their negative prompt does, refused before loading
        mp.setattr(Pipeline, "from_dir", classmethod(lambda *a, **k: pytest.fail("engines loaded")))
        res = r.invoke(main, [*run[:2], str(tmp_path / "f.jsonl"), *run[3:], "--negative-prompt", NEG,
                              "--out", str(tmp_path / "x")])
        assert res.exit_code == 2 and "--negative-prompt on a T5-caption bundle" in res.output, res.output
        assert "--encoder" in res.output and "Traceback" not in res.output
    for name, extra in (("neg", ["--negative-prompt", NEG]), ("plain", [])):
        res = r.invoke(main, [*run, *extra, "--encoder", str(t5_dir), "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
    png = {n: np.asarray(Image.open(next((tmp_path / n).glob("*.png")))) for n in ("neg", "plain")}
    with Pipeline.from_dir(eng, backend="ort", threads=1, text_encoder=t5_dir) as p:
        want = p.generate([Prompt(0, caption="a red car", seed=7)], verify="vanilla", negative_prompt=NEG).images[0]
    assert np.array_equal(png["neg"], np.asarray(want)) and not np.array_equal(png["neg"], png["plain"])
    card = ModelInfo.from_dir(eng, max_batch=4).card()
    assert card["prompt"] == "caption" and card["negative_prompt"] is True
