"""The generic seams a fourth family exposed, each failing before its fix: ZipAR reads a layout
with a forced tail (Emu3's end tokens), the oracle drafter sizes its cache from the target's
own rule (no LlamaGen `seq_len`), the default free layout needs no `block_size`, and the public
generate passes negative prompts only to families that take them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytest.importorskip("transformers")

from emu3_fixtures import image_prompt, save_model_dir  # noqa: E402

import lisa_trt  # noqa: E402
from lisa_trt.config import SamplingConfig  # noqa: E402
from lisa_trt.errors import InputError  # noqa: E402
from lisa_trt.models.family import ModelFamily, SequenceLayout, family_of  # noqa: E402
from lisa_trt.speculative.methods import SpecConfig  # noqa: E402
from lisa_trt.speculative.run import run_method  # noqa: E402
from lisa_trt.speculative.zipar import row_length  # noqa: E402
from lisa_trt.speculative.methods import get_method

H, W = 3, 4


@pytest.fixture(scope="module")
def emu3(tmp_path_factory):
    _, path = save_model_dir(tmp_path_factory.mktemp("emu3s") / "m", seed=1)
    target = lisa_trt.load_target(path)
    ids = torch.tensor([image_prompt([40, 41], H, W), image_prompt([43, 44], H, W)])
    cond, _, layout = family_of(target.config).generation_inputs(target, ids)
    return target, cond, layout


def test_zipar_row_length_allows_a_forced_tail(emu3):
    target, _, layout = emu3
    assert int((layout.forced >= 0).sum()) == H + 3  # H row ends, then end-of-frame / image / sequence
    assert row_length(target, layout) == W + 1
    bad = layout.forced.clone()
    bad[-1] = -1  # a free token after the forced tail: no regular grid
    with pytest.raises(InputError, match="row ends"):
        row_length(target, SequenceLayout(layout.n_tokens, forced=bad))


def test_zipar_with_a_full_row_window_is_the_ar_loop_on_emu3(emu3):
    target, cond, layout = emu3
    ref = lisa_trt.generate(target, cond, cfg_scale=2.0, greedy=True)
    toks, st = run_method(get_method("zipar"), target, None, None, cond, sampling=SamplingConfig(cfg_scale=2.0, greedy=True),
                          spec=SpecConfig.make("gasv", zipar_window=W + 1), seed=0, layout=layout)
    assert torch.equal(toks, ref)
    fast, st1 = run_method(get_method("zipar"), target, None, None, cond, sampling=SamplingConfig(cfg_scale=2.0, greedy=True),
                           spec=SpecConfig.make("gasv", zipar_window=1), seed=0, layout=layout)
    assert st1.target_forwards < st.target_forwards
    assert torch.equal(fast[:, layout.forced >= 0], ref[:, layout.forced >= 0])  # forced tokens in place


def test_oracle_runs_on_a_prompt_target_without_seq_len(emu3):
    target, cond, layout = emu3
    assert not hasattr(target.config, "seq_len")
    ref = lisa_trt.generate(target, cond, cfg_scale=2.0, greedy=True)
    toks, st = run_method(get_method("oracle"), target, None, None, cond, sampling=SamplingConfig(cfg_scale=2.0, greedy=True),
                          spec=SpecConfig.make("exact", top_k=1, depth=3, total_tokens=4), seed=0, layout=layout)
    assert torch.equal(toks, ref)
    assert st.mal > 3.0  # the target's own greedy chain: whole paths accepted


def test_default_free_layout_needs_no_block_size():
    class Cfg:
        model_type = "?"

    class Target:
        config = Cfg()

    fam = ModelFamily()
    assert fam.free_layout(Target(), 5).n_tokens == 5
    with pytest.raises(InputError, match="no fixed image length"):
        fam.free_layout(Target())


def test_negative_prompts_are_refused_where_a_family_has_none():
    from lisa_trt.testing import make_cond, make_target

    m = make_target(std=0.3)
    with pytest.raises(InputError, match="takes no negative_prompt_ids"):
        lisa_trt.generate(m, make_cond(m, batch=1), negative_prompt_ids=torch.tensor([[1]]), cfg_scale=2.0)


def test_one_teacher_forced_logits_contract_for_every_family(emu3):
    from lisa_trt.testing import make_cond, make_target

    target, cond, _ = emu3
    tokens = lisa_trt.generate(target, cond, greedy=True)
    full = lisa_trt.teacher_forced_logits(target, torch.cat([cond.ids, tokens[:, :-1]], 1))
    tf = lisa_trt.teacher_forced_logits(target, cond, tokens)  # the (cond, tokens) form of every family
    torch.testing.assert_close(tf, full[:, cond.ids.shape[1] - 1:], atol=1e-5, rtol=0)
    m = make_target(std=0.3)
    c = make_cond(m, batch=2)
    toks = lisa_trt.generate(m, c, greedy=True)
    assert torch.equal(lisa_trt.teacher_forced_logits(m, c, toks), m.teacher_forced_logits(c, toks))
    with pytest.raises(InputError, match="needs the generated tokens"):
        lisa_trt.teacher_forced_logits(m, c)
