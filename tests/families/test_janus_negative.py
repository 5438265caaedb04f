"""A negative prompt on Janus-Pro: CFG's unconditional row is the negative text in the prompt
template, left-padded with the prompt to one width. Greedy tokens equal a step-by-step reference
written here from the target's cache-free forward (the two rows, guided logits, argmax); a blank
negative is no negative; the ORT bundle's pipeline decodes the same tokens as the eager one and
refuses rows wider than its --max-prompt."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from test_janus import BOI, BOS, make_hf, save, save_tokenizer  # noqa: E402

import lisa_trt  # noqa: E402
from lisa_trt.errors import InputError  # noqa: E402
from lisa_trt.models.conditioning import TextPrompts  # noqa: E402
from lisa_trt.models.family import family_of  # noqa: E402
from lisa_trt.runtime.pipeline import Pipeline  # noqa: E402

USER, ASSISTANT = 3, 4  # "<|User|>:", "<|Assistant|>:" of test_janus.save_tokenizer
PROMPT, NEG = "w10 w11 w12", "w30 w31 w32 w33 w34"  # the negative is the longer row
SCALE = 3.0


@pytest.fixture(scope="module")
def janus(tmp_path_factory):
    d = save(make_hf(seed=3), tmp_path_factory.mktemp("janus_neg") / "model")
    save_tokenizer(d)
    target = lisa_trt.load_target(str(d))
    return d, target, Pipeline.from_models(target, threads=1)


def _template(words) -> list:
    """BOS + Janus' SFT format + BOI, as ids of the tiny word-level vocabulary."""
    return [BOS, USER, *words, ASSISTANT, BOI]


def _left_pad(rows):
    T = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (T - len(r)) + r for r in rows])
    mask = torch.tensor([[False] * (T - len(r)) + [True] * len(r) for r in rows])
    return ids, mask


@torch.no_grad()
def _reference(target, cond_row, uncond_row, scale, n):
    """Greedy CFG codes from the target's cache-free forward over [cond; uncond], one step at a time."""
    ids, mask = _left_pad([cond_row, uncond_row])
    out = torch.zeros(1, 0, dtype=torch.long)
    for _ in range(n):
        toks = torch.cat([out, torch.zeros(1, 1, dtype=torch.long)], 1).repeat(2, 1)  # last: a placeholder
        logits = target.forward_train((ids, mask), toks).logits[:, -1]  # (2, codebook): the next code
        c, u = logits[0], logits[1]
        out = torch.cat([out, (u + scale * (c - u)).argmax(-1).view(1, 1)], 1)
    return out


def _generate(pipe, prompts, cfg_scale=SCALE, **kw):
    return pipe.generate(prompts, verify="vanilla", greedy=True, cfg_scale=cfg_scale, decode=False, **kw)


def test_janus_takes_negative_texts():
    assert family_of("janus").conditioning("janus") == TextPrompts(negative=True)


def test_the_negative_row_is_its_text_in_the_template(janus):
    d, target, _ = janus
    req = family_of(target.config).prompter(target, d).encode([PROMPT], cfg=True, negative=NEG)
    assert req.cond.ids[0].tolist() == _template([10, 11, 12])
    assert req.cond.uncond.ids[0].tolist() == _template([30, 31, 32, 33, 34])
    full = target.cfg_rows(req.cond, target.null_cond(req.cond))  # one shared width, left-padded
    assert full.ids.shape == (2, 9) and full.valid[0].tolist() == [False] * 2 + [True] * 7 and full.valid[1].all()


def test_negative_prompt_tokens_equal_the_reference(janus):
    _, target, pipe = janus
    n = target.config.block_size
    got = _generate(pipe, [PROMPT], negative_prompt=NEG)
    want = _reference(target, _template([10, 11, 12]), _template([30, 31, 32, 33, 34]), SCALE, n)
    assert torch.equal(got.tokens, want)
    assert got.stats[0]["negative_prompt"] == NEG
    ids = torch.tensor([_template([10, 11, 12])])
    neg_ids = torch.tensor([_template([30, 31, 32, 33, 34])])
    public = lisa_trt.generate(target, ids, negative_prompt_ids=neg_ids, cfg_scale=SCALE, greedy=True)
    assert torch.equal(public, want)  # transformers' negative_prompt_ids form of the same rows
    with pytest.raises(InputError, match="negative_prompt_ids has 2 rows for 1 prompts"):
        lisa_trt.generate(target, ids, negative_prompt_ids=neg_ids.repeat(2, 1), cfg_scale=SCALE, greedy=True)
    plain = _generate(pipe, [PROMPT])
    assert not torch.equal(plain.tokens, got.tokens)  # the negative text guided this decode
    null = [BOS, 0, 0, 0, 0, 0, BOI]  # transformers' row: the prompt with BOS / BOI kept, the rest PAD
    assert torch.equal(plain.tokens, _reference(target, _template([10, 11, 12]), null, SCALE, n))


def test_a_shorter_negative_and_a_mixed_batch(janus):
    _, target, pipe = janus
    short = _generate(pipe, [PROMPT], negative_prompt="w40")
    want = _reference(target, _template([10, 11, 12]), _template([40]), SCALE, target.config.block_size)
    assert torch.equal(short.tokens, want)
    both = _generate(pipe, [PROMPT, "w20"], negative_prompt=[NEG, None], batch=True)
    assert torch.equal(both.tokens[:1], _generate(pipe, [PROMPT], negative_prompt=NEG).tokens)
    assert torch.equal(both.tokens[1:], _generate(pipe, ["w20"], seed=1).tokens)


def test_a_blank_negative_is_no_negative(janus):
    d, target, pipe = janus
    plain = _generate(pipe, [PROMPT])
    for blank in ("", "   ", [None], ["\t"]):
        assert torch.equal(_generate(pipe, [PROMPT], negative_prompt=blank).tokens, plain.tokens)
    pr = family_of(target.config).prompter(target, d)
    a, b = pr.encode([PROMPT], cfg=True).cond, pr.encode([PROMPT], cfg=True, negative=" ").cond
    assert isinstance(b, tuple) and all(torch.equal(x, y) for x, y in zip(a, b))  # the same condition form
    assert _generate(pipe, [PROMPT], negative_prompt=NEG, cfg_scale=1.0).tokens.equal(
        _generate(pipe, [PROMPT], cfg_scale=1.0).tokens)  # no CFG: nothing to negate


@pytest.mark.slow
def test_the_ort_bundle_decodes_negative_prompts_as_the_eager_pipeline(janus, tmp_path):
    pytest.importorskip("onnxruntime")
    from lisa_trt.families.janus.export import export_janus

    d, target, pipe = janus
    export_janus(target, None, None, None, d, tmp_path / "eng", max_prompt=16)
    with Pipeline.from_dir(tmp_path / "eng", backend="ort", threads=1) as ort:
        for neg in (NEG, "w40", None):
            got = _generate(ort, [PROMPT, "w20"], negative_prompt=neg, batch=True)
            assert torch.equal(got.tokens, _generate(pipe, [PROMPT, "w20"], negative_prompt=neg, batch=True).tokens)
        wide = " ".join(f"w{i}" for i in range(50, 63))  # 13 words: 17 tokens in the template
        with pytest.raises(InputError, match="17 tokens wide .*at most 16.*--max-prompt"):
            _generate(ort, [PROMPT], negative_prompt=wide)
        with pytest.raises(InputError, match="negative_prompt is 17 tokens; .*at most 16.*--max-prompt"):
            ort.check_prompt(PROMPT, wide)  # serve's per-row check before a batch decodes
        ort.check_prompt(PROMPT, NEG)
