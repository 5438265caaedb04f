"""Lumina-mGPT protocol on a tiny random Chameleon checkpoint: prompt template, forced span
tokens, image-code-only sampling, CFG against the span-only unconditional sequence, codes ->
pixels, and `lisa-trt generate --model DIR --prompt ...`."""

import pytest
import torch

import lisa_trt
from lisa_trt import LisaError

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from chameleon_fixtures import N_CODES, make_hf_model, save_hf, save_tokenizer  # noqa: E402
from lisa_trt.families.chameleon import CHAMELEON  # noqa: E402
from lisa_trt.families.chameleon.vq import ChameleonVQConfig, ChameleonVQGAN, save_chameleon_vq  # noqa: E402
from lumina_calls import (LuminaTokenizer, generate_image_tokens, grids, row_end_mask,  # noqa: E402
                                    tokens_to_codes)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = save_hf(make_hf_model(seed=3, num_key_value_heads=2, swin_norm=True), tmp_path_factory.mktemp("lumina"))
    save_tokenizer(d)
    torch.manual_seed(0)
    vq = ChameleonVQGAN(ChameleonVQConfig(embed_dim=8, n_embed=N_CODES, z_channels=32, ch=32, ch_mult=(1, 2),
                                          num_res_blocks=1, resolution=16))
    save_chameleon_vq(vq, d / "vqgan")
    return d


def test_prompt_template_and_span_prefix(model_dir):
    tok = LuminaTokenizer(model_dir)
    ids = tok.prompt_ids("a red fox", 64, 96)
    assert ids[0] == tok.bos == 1 and ids[-1] == tok.sep == 43
    assert tok.span_prefix(64, 96) == [40, 46, 45]  # start, height 3 grids, width 2 grids
    with pytest.raises(LisaError, match="multiples of 32"):
        grids(50, 64)


def test_span_structure_and_cfg_math(model_dir):
    target, tok = lisa_trt.load_target(str(model_dir)), LuminaTokenizer(model_dir)
    scale = 2.5
    res = generate_image_tokens(target, tok, ["a red fox", "tok60 tok61"], 64, 64, cfg_scale=scale, greedy=True)
    h_lat = w_lat = 4
    span = res.tokens
    assert span.shape == (2, h_lat * (w_lat + 1)) and res.codes.shape == (2, 4, 4)
    ends = row_end_mask(h_lat, w_lat)
    assert (span[:, ends] == tok.newline).all()
    assert ((span[:, ~ends] >= 4) & (span[:, ~ends] < 4 + N_CODES)).all()
    assert torch.equal(res.codes, span.view(2, 4, 5)[:, :, :4] - 4)
    # teacher forcing: every sampled position is the argmax of the guided, code-restricted logits,
    # the unconditional sequence being the image span alone (from position 0)
    for b, cap in enumerate(["a red fox", "tok60 tok61"]):
        cond = torch.tensor([tok.prompt_ids(cap, 64, 64) + tok.span_prefix(64, 64)])
        unc = torch.tensor([tok.span_prefix(64, 64)])
        c = lisa_trt.teacher_forced_logits(target, torch.cat([cond, span[b:b + 1, :-1]], 1))[0, cond.shape[1] - 1:]
        u = lisa_trt.teacher_forced_logits(target, torch.cat([unc, span[b:b + 1, :-1]], 1))[0, unc.shape[1] - 1:]
        want = CHAMELEON.free_layout(target, 1, image_tokens_only=True).law(u + scale * (c - u), None, lambda x: x).argmax(-1)
        assert torch.equal(span[b, ~ends], want[~ends])


def test_sampling_is_seeded_and_restricted(model_dir):
    target, tok = lisa_trt.load_target(str(model_dir)), LuminaTokenizer(model_dir)
    a = generate_image_tokens(target, tok, ["x"], 32, 64, top_k=5, seed=1)
    b = generate_image_tokens(target, tok, ["x"], 32, 64, top_k=5, seed=1)
    assert torch.equal(a.tokens, b.tokens) and a.codes.shape == (1, 4, 2)  # height 64 = 4 latent rows, width 32 = 2 codes
    assert torch.equal(tokens_to_codes(target, a.tokens, 4, 2), a.codes)


def test_cli_generate_writes_images(model_dir, tmp_path):
    from click.testing import CliRunner

    from lisa_trt.cli import main

    r = CliRunner().invoke(main, ["generate", "--model", str(model_dir), "--prompt", "a red fox", "--prompt", "b",
                                  "--image-size", "64", "--top-k", "8", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    pngs = sorted((tmp_path / "o").glob("*.png"))
    assert len(pngs) == 2 and (tmp_path / "o" / "tokens.npy").is_file()
    from PIL import Image

    assert Image.open(pngs[0]).size == (8, 8)  # 4x4 codes, tiny VQ downsamples by 2
    r = CliRunner().invoke(main, ["generate", "--model", str(model_dir), "--out", str(tmp_path / "p")])
    assert r.exit_code != 0 and "--prompt" in r.output


def test_missing_tokenizer_is_clear(tmp_path):
    d = save_hf(make_hf_model(), tmp_path / "m")
    with pytest.raises(LisaError, match="no tokenizer.json"):
        LuminaTokenizer(d)
