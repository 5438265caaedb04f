"""The Emu3 family against transformers' Emu3ForConditionalGeneration (tiny random models built
here): logits, greedy tokens with and without CFG (the model card's layout rule, the grid read
from the prompt), VQ pixels, hub names, and the errors a user meets."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytest.importorskip("transformers")

from emu3_fixtures import EOF, EOI, EOL, EOS, hf_generate, image_prompt, save_model_dir  # noqa: E402

import lisa_trt  # noqa: E402
from lisa_trt.errors import InputError  # noqa: E402


@pytest.fixture(scope="module")
def emu3(tmp_path_factory):
    model, path = save_model_dir(tmp_path_factory.mktemp("emu3") / "Emu3-tiny", seed=0)
    return model, path, lisa_trt.load_target(path)


def prompts(h, w, batch=2):
    return torch.tensor([image_prompt([40 + b, 41, 42 + 3 * b], h, w) for b in range(batch)])


def test_teacher_forced_logits_equal_transformers(emu3):
    model, _, target = emu3
    ids = torch.cat([prompts(3, 4), torch.randint(32, 96, (2, 9))], dim=1)
    with torch.no_grad():
        ref = model(ids).logits
    out = lisa_trt.teacher_forced_logits(target, ids)
    assert out.shape == ref.shape == (2, ids.shape[1], 128)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("h,w", [(3, 4), (2, 5)])
def test_greedy_tokens_equal_transformers_with_the_layout_rule(emu3, h, w):
    model, _, target = emu3
    ids = prompts(h, w)
    mine = lisa_trt.generate(target, ids, greedy=True)
    assert mine.shape == (2, h * (w + 1) + 3)
    assert torch.equal(mine, hf_generate(model, ids, h, w))
    assert torch.equal(lisa_trt.generate(target, ids, cfg_scale=1.0, greedy=True), mine)  # 1: no guidance
    rows = mine[:, : h * (w + 1)].view(2, h, w + 1)
    assert bool((rows[:, :, w] == EOL).all()) and mine[:, -3:].tolist() == [[EOF, EOI, EOS]] * 2
    assert bool(((rows[:, :, :w] >= 32) & (rows[:, :, :w] < 96)).all())  # visual tokens only


@pytest.mark.parametrize("G", [3.0, 1.5])
def test_cfg_with_negative_prompt_equals_transformers(emu3, G):
    model, _, target = emu3
    ids = prompts(3, 4)
    neg = torch.tensor([[1, 50, 51, 3, 13, 20, 14, 4], [1, 52, 53, 3, 13, 20, 14, 4]])
    mine = lisa_trt.generate(target, ids, negative_prompt_ids=neg, cfg_scale=G, greedy=True)
    assert torch.equal(mine, hf_generate(model, ids, 3, 4, G, neg))
    assert not torch.equal(mine, lisa_trt.generate(target, ids, greedy=True))  # guidance changed tokens


def test_cfg_without_negative_uses_transformers_fallback(emu3):
    model, _, target = emu3
    ids = prompts(3, 4)
    mine = lisa_trt.generate(target, ids, cfg_scale=3.0, greedy=True)
    assert torch.equal(mine, hf_generate(model, ids, 3, 4, 3.0))
    assert not torch.equal(mine, lisa_trt.generate(target, ids, greedy=True))


def _left_padded():
    """Two prompts of 13 and 10 tokens, the shorter LEFT-padded with pad id 0: (ids, mask)."""
    a, b = image_prompt([40, 41, 42, 43, 44], 3, 4), image_prompt([45, 46], 3, 4)
    pad = len(a) - len(b)
    mask = torch.ones(2, len(a), dtype=torch.bool)
    mask[1, :pad] = False
    return torch.tensor([a, [0] * pad + b]), mask


@pytest.mark.parametrize("G", [None, 3.0])
def test_left_padded_batch_equals_transformers(emu3, G):
    """Rows of different lengths, left-padded with an attention mask (transformers counts each
    row's positions from its first real token, as lisa_trt does), with and without CFG's fallback."""
    model, _, target = emu3
    ids, mask = _left_padded()
    kw = {} if G is None else {"cfg_scale": G}
    mine = lisa_trt.generate(target, ids, attention_mask=mask, greedy=True, **kw)
    assert torch.equal(mine, hf_generate(model, ids, 3, 4, G, attention_mask=mask))
    alone = lisa_trt.generate(target, ids[1:, 3:], greedy=True, **kw)  # the short row unpadded
    assert torch.equal(mine[1:], alone)


def test_left_padded_batch_with_negative_prompts_equals_transformers(emu3):
    model, _, target = emu3
    ids, mask = _left_padded()
    neg = torch.tensor([[1, 50, 51, 3, 13, 20, 14, 4], [1, 52, 53, 3, 13, 20, 14, 4]])
    mine = lisa_trt.generate(target, ids, attention_mask=mask, negative_prompt_ids=neg, cfg_scale=3.0, greedy=True)
    assert torch.equal(mine, hf_generate(model, ids, 3, 4, 3.0, neg, attention_mask=mask))


def test_tokens_to_pixels_equal_decode_image_tokens(emu3):
    model, path, target = emu3
    ids = prompts(3, 4)
    tokens = lisa_trt.generate(target, ids, greedy=True)
    vq = lisa_trt.load_vq(path)
    with torch.no_grad():
        ref = model.decode_image_tokens(image_tokens=tokens, height=3, width=4)  # (B, 3, 24, 32) frame 0
    px = lisa_trt.tokens_to_pixels(vq, tokens)
    assert px.shape == ref.shape == (2, 3, 3 * 2, 4 * 2)
    torch.testing.assert_close(px, ref, atol=1e-4, rtol=0)
    codes = model.vocabulary_mapping.convert_bpe2img(tokens[:, :-3].view(2, 3, 5)).long()
    torch.testing.assert_close(lisa_trt.tokens_to_pixels(vq, codes), ref, atol=1e-4, rtol=0)  # a bare grid
    torch.testing.assert_close(lisa_trt.tokens_to_pixels(vq, tokens[:, :-3]), ref, atol=1e-4, rtol=0)


def test_hub_name_loads_from_the_hf_cache(emu3, tmp_path, monkeypatch):
    import shutil

    _, path, target = emu3
    snap = tmp_path / "hub" / "models--BAAI--Emu3-tiny-hf" / "snapshots" / ("a" * 40)
    shutil.copytree(path, snap)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as C

    monkeypatch.setattr(C, "HF_HUB_CACHE", str(tmp_path / "hub"))
    loaded = lisa_trt.load_target("BAAI/Emu3-tiny-hf")
    assert type(loaded).__name__ == "Emu3Target"
    torch.testing.assert_close(loaded.lm_head.weight, target.lm_head.weight)


def test_prompts_without_a_grid_or_of_two_sizes_are_refused(emu3):
    _, _, target = emu3
    with pytest.raises(InputError, match=r"ends with <\|image start\|>H\*W<\|image token\|>"):
        lisa_trt.generate(target, torch.tensor([[1, 40, 41]]), greedy=True)
    bad = torch.tensor([[1, 40, 3, 13, 40, 14, 4]])  # "3tok404" is no H*W
    with pytest.raises(InputError, match="is not 'H\\*W'"):
        lisa_trt.generate(target, bad, greedy=True)
    mixed = torch.cat([prompts(3, 4, 1), prompts(2, 4, 1)])
    with pytest.raises(InputError, match="different image grids"):
        lisa_trt.generate(target, mixed, greedy=True)
    with pytest.raises(InputError, match="negative_prompt_ids has 1 rows for 2 prompts"):
        lisa_trt.generate(target, prompts(3, 4), negative_prompt_ids=prompts(3, 4, 1), cfg_scale=2.0)


def test_text_prompts_follow_the_model_card_template(emu3, tmp_path):
    """The prompter writes BOS + caption + the positive suffix + <|image start|>H*W<|image token|>,
    the negative prompt as CFG's rows, and its Request decodes as generate with those ids."""
    pytest.importorskip("tokenizers")
    import shutil

    from emu3_fixtures import save_tokenizer

    from lisa_trt.families.emu3.prompts import NEGATIVE, POSITIVE
    from lisa_trt.models.family import family_of
    from lisa_trt.speculative.autoregressive import generate as ar_generate

    _, path, target = emu3
    d = tmp_path / "m"
    shutil.copytree(path, d)
    save_tokenizer(d)
    fam = family_of(target.config)
    pr = fam.prompter(target, d)
    req = pr.encode(["red fox"], image_size=6, width=8, cfg=True)  # a 3 x 4 grid (the tiny VQ: 2 px per code)
    assert req.grid == (3, 4) and req.layout.n_tokens == 3 * 5 + 3
    ids = req.cond.ids[0].tolist()
    n_pos = len(pr.tok.encode(POSITIVE, add_special_tokens=False).ids)
    assert ids[:3] == [1, 22, 23] and len(ids) == 3 + n_pos + 5
    assert ids[-5:] == [3, 13, 20, 14, 4]  # <|image start|> 3 * 4 <|image token|>
    neg = req.cond.uncond.ids
    assert neg[0, 0] == 1 and neg.shape[1] == 1 + len(pr.tok.encode(NEGATIVE, add_special_tokens=False).ids) + 5
    toks = ar_generate(target, req.cond, cfg_scale=3.0, greedy=True, layout=req.layout)
    want = lisa_trt.generate(target, req.cond.ids, negative_prompt_ids=neg, cfg_scale=3.0, greedy=True)
    assert torch.equal(toks, want)
    with pytest.raises(InputError, match="multiples of 2 px"):
        pr.encode(["x"], image_size=5)


def test_cli_generate_takes_emu3_text_prompts(emu3, tmp_path):
    """`lisa-trt generate --model DIR --prompt ...`: the prompter's request, CFG with the negative
    prompt, the same tokens as the Python API, and a PNG through the family's VQ."""
    pytest.importorskip("tokenizers")
    import shutil

    import numpy as np
    from click.testing import CliRunner
    from emu3_fixtures import save_tokenizer

    from lisa_trt.cli import main
    from lisa_trt.models.family import family_of

    _, path, target = emu3
    d = tmp_path / "m"
    shutil.copytree(path, d)
    save_tokenizer(d)
    r = CliRunner().invoke(main, ["generate", "--model", str(d), "--vq", str(d), "--prompt", "red fox", "--image-size",
                                  "8", "--cfg-scale", "3", "--greedy", "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    got = torch.from_numpy(np.load(tmp_path / "out" / "tokens.npy"))
    req = family_of(target.config).prompter(target, d).encode(["red fox"], image_size=8, cfg=True)
    want = lisa_trt.generate(target, req.cond.ids, negative_prompt_ids=req.cond.uncond.ids, cfg_scale=3.0, greedy=True)
    codes = family_of(target.config).tokens_to_codes(target, want, req)  # tokens.npy holds the code grid
    assert want.shape == (1, 4 * 5 + 3) and torch.equal(got.reshape(codes.shape), codes)
    assert (tmp_path / "out" / "img_0000.png").is_file()
