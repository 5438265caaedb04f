"""The drifts of the parallel Chameleon stack (issue 24), each fixed by the one shared loop.
Every test here failed on c9f708b (before the family seam)."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))

import lisa_trt  # noqa: E402
import cases  # noqa: E402
from lisa_trt.config import SamplingConfig  # noqa: E402
from lumina_calls import speculative_image_tokens  # noqa: E402
from lumina_calls import generate_image_tokens  # noqa: E402
from lisa_trt.speculative.methods import SpecConfig  # noqa: E402


@pytest.fixture(scope="module")
def ch(tmp_path_factory):
    return cases.chameleon_setup(tmp_path_factory.mktemp("drift"))


def test_cfg_turns_on_above_one_in_every_family(ch):
    """decode.py guided at cfg > 1; the Chameleon copy at cfg != 1 (0.5 extrapolated away)."""
    t, tok = ch["target"], ch["tok"]
    a = generate_image_tokens(t, tok, cases.CAPS, 64, 64, cfg_scale=0.5, greedy=True).tokens
    b = generate_image_tokens(t, tok, cases.CAPS, 64, 64, cfg_scale=1.0, greedy=True).tokens
    c = generate_image_tokens(t, tok, cases.CAPS, 64, 64, cfg_scale=3.0, greedy=True).tokens
    assert torch.equal(a, b) and not torch.equal(b, c)


def test_chameleon_lantern_reads_gamma_and_residual(ch):
    """The Chameleon LANTERN had no residual mode or gamma; now the generic settings reach it."""
    s = SamplingConfig(cfg_scale=2.0, top_k=16)
    run = lambda **kw: speculative_image_tokens(  # noqa: E731
        ch["target"], ch["drafter"], ch["tok"], cases.CAPS * 3, 64, 96,
        SpecConfig.make("lantern", top_k=3, depth=3, total_tokens=8, lantern_k=8, lantern_delta=0.05, **kw),
        seed=0, tables=ch["tables"], sampling=s)
    base, base_stats = run()
    wide, wide_stats = run(lantern_gamma=20.0)  # budget min(1, delta (1 + gamma r)) >> delta
    assert wide_stats.mal > base_stats.mal
    with pytest.raises(lisa_trt.LisaError, match="lantern_gamma"):
        run(lantern_gamma=-1.0)


def test_chameleon_rows_have_their_own_seeds_and_stats(ch):
    s = SamplingConfig(cfg_scale=2.0, top_k=16)
    spec = SpecConfig.make("exact", top_k=3, depth=3, total_tokens=8)
    go = lambda caps, seeds: speculative_image_tokens(  # noqa: E731
        ch["target"], ch["drafter"], ch["tok"], caps, 64, 64, spec, tables=ch["tables"], sampling=s, seeds=seeds)
    alone, _ = go(["a red fox"], [7])
    both, stats = go(["tok70 tok71", "a red fox"], [8, 7])
    assert torch.equal(both.tokens[1], alone.tokens[0])
    assert stats.rows and stats.row(1)["steps"] > 0


def test_only_a_chameleon_directory_is_a_chameleon_model(tmp_path):
    """`_is_chameleon` took any directory; detection now asks each family (config.json model_type)."""
    from lisa_trt.models.family import detect_family

    (tmp_path / "plain").mkdir()
    with pytest.raises(lisa_trt.LisaError, match="no config.json"):
        detect_family(tmp_path / "plain")
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(lisa_trt.LisaError, match="model_type 'llama', which no family loads"):
        detect_family(tmp_path / "llama")
