"""A negative prompt through the Pipeline: on a text-prompt family (a tiny random Emu3 built here)
CFG's unconditional rows are the negative text encoded by the family's prompter, token-identical to
`lisa_trt.generate(..., negative_prompt_ids=...)` with the same ids (which tests/families/test_emu3.py
holds equal to transformers'; Janus-Pro's: tests/families/test_janus_negative.py; T5-caption bundles':
tests/text/test_t2i_negative.py); class-conditional families refuse it naming why."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "families"))

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import lisa_trt  # noqa: E402
from lisa_trt.errors import InputError  # noqa: E402
from lisa_trt.models.family import family_of  # noqa: E402
from lisa_trt.runtime.conditions import run_conditions  # noqa: E402
from lisa_trt.runtime.pipeline import Pipeline  # noqa: E402
from lisa_trt.testing import make_target  # noqa: E402

SIZE = 8  # a 4 x 4 code grid of the tiny VQ (2 px per code)
NEG = "tok100 tok101 tok102"  # words of the tiny vocabulary (emu3_fixtures.vocabulary_map)


@pytest.fixture(scope="module")
def emu3(tmp_path_factory):
    from emu3_fixtures import save_model_dir, save_tokenizer

    _, path = save_model_dir(tmp_path_factory.mktemp("emu3neg") / "Emu3-tiny", seed=0)
    save_tokenizer(path)
    target = lisa_trt.load_target(path)
    return path, target, Pipeline.from_models(target, generation={"image_size": SIZE}, threads=1)


def _generate(pipe, prompts, **kw):
    return pipe.generate(prompts, verify="vanilla", greedy=True, cfg_scale=3.0, decode=False, **kw)


def test_pipeline_negative_prompt_equals_generate_with_its_ids(emu3):
    path, target, pipe = emu3
    pr = family_of(target.config).prompter(target, path)
    req = pr.encode(["red fox"], image_size=SIZE, cfg=True, negative=NEG)
    neg_ids = torch.tensor([pr.ids(NEG, *req.grid)])  # BOS + the negative text + the image header
    assert torch.equal(req.cond.uncond.ids, neg_ids)
    want = lisa_trt.generate(target, req.cond.ids, negative_prompt_ids=neg_ids, cfg_scale=3.0, greedy=True)
    got = _generate(pipe, ["red fox"], negative_prompt=NEG)
    assert torch.equal(got.tokens, want)
    assert got.stats[0]["negative_prompt"] == NEG
    plain = _generate(pipe, ["red fox"])  # the card's negative prompt
    assert not torch.equal(plain.tokens, got.tokens)
    assert "negative_prompt" not in plain.stats[0]


def test_per_prompt_negatives_in_a_batch_equal_each_alone(emu3):
    _, _, pipe = emu3
    both = _generate(pipe, ["red fox", "a fox"], negative_prompt=[NEG, None], batch=True)
    assert torch.equal(both.tokens[:1], _generate(pipe, ["red fox"], negative_prompt=NEG).tokens)
    assert torch.equal(both.tokens[1:], _generate(pipe, ["a fox"], seed=1).tokens)  # None: the card's negative
    assert torch.equal(_generate(pipe, ["a fox"], negative_prompt="  ", seed=1).tokens, both.tokens[1:])  # blank: none


def test_bad_negative_prompts_are_refused_before_decoding(emu3):
    _, _, pipe = emu3
    with pytest.raises(InputError, match="negative_prompt has 1 texts for 2 prompts"):
        _generate(pipe, ["red fox", "a fox"], negative_prompt=[NEG])
    with pytest.raises(InputError, match="negative_prompt must be a text or a list of texts"):
        _generate(pipe, ["red fox"], negative_prompt=3)


def test_families_without_a_negative_text_refuse_it_naming_why():
    c2i, t2i = make_target("c2i"), make_target("t2i")
    with pytest.raises(InputError, match="not supported by the llamagen family .class-conditional: classifier-free "
                                         "guidance runs against the null class"):
        run_conditions(family_of(c2i.config), c2i.config).negatives("blurry", 1)
    # T5-caption bundles take one: its caption features become the null rows (tests/text/test_t2i_negative.py)
    assert run_conditions(family_of(t2i.config), t2i.config).negatives(["blurry"], 1) == ["blurry"]
    for mt in ("chameleon", "emu3", "janus"):  # the text-prompt families take one (their prompters' rows)
        assert run_conditions(family_of(mt), mt).negatives("blurry", 2) == ["blurry", "blurry"]
    assert run_conditions(family_of(c2i.config), c2i.config).negatives(None, 1) is None  # none given: nothing to refuse
    with pytest.raises(InputError, match="class-conditional"):
        Pipeline.from_models(c2i).generate([0], negative_prompt="blurry", decode=False)
