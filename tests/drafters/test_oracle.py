"""Oracle drafter: the target's own top-k at every node (the MAL ceiling of a tree budget)."""

import pytest
import torch

from lisa_trt import generate
from lisa_trt.harness import parse_methods
from lisa_trt.config import SamplingConfig
from lisa_trt.errors import InputError
from lisa_trt.speculative.decode import SpecConfig, SpeculativeDecoder
from lisa_trt.speculative.oracle import OracleDrafter, RecordingTarget, drafter_efficiency, oracle_pair
from lisa_trt.speculative.run import run_method
from lisa_trt.testing import make_cond, make_target

EXACT, ORACLE = parse_methods("exact,oracle")  # resolved once (the bench's look-up); Methods from here on


@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
def test_greedy_oracle_accepts_whole_paths(model_type):
    """A chain tree (top_k 1) holds exactly the target's greedy continuation: all of it is accepted."""
    m = make_target(model_type, std=0.3)
    cond = make_cond(m, batch=2)
    ref = generate(m, cond, cfg_scale=2.0, greedy=True)
    proxy, oracle = oracle_pair(m)
    toks, stats = SpeculativeDecoder(proxy, oracle).generate(
        cond, sampling=SamplingConfig(cfg_scale=2.0, greedy=True),
        spec=SpecConfig.make("exact", top_k=1, depth=3, total_tokens=5), method=EXACT)
    assert torch.equal(toks, ref)
    # 16 tokens: the prefill gives 1, then every step commits root + 4 drafted levels
    assert stats.target_forwards == 4
    assert stats.mal == pytest.approx(5.0)


def test_greedy_oracle_on_a_dynamic_tree_is_lossless_and_near_full_depth():
    """EAGLE-2 reranking may drop the greedy chain's deepest node; tokens stay identical."""
    m = make_target(std=0.3)
    cond = make_cond(m, batch=2)
    ref = generate(m, cond, cfg_scale=2.0, greedy=True)
    proxy, oracle = oracle_pair(m)
    toks, stats = SpeculativeDecoder(proxy, oracle).generate(
        cond, sampling=SamplingConfig(cfg_scale=2.0, greedy=True),
        spec=SpecConfig.make("exact", top_k=2, depth=3, total_tokens=10), method=EXACT)
    assert torch.equal(toks, ref)
    assert stats.mal >= 4.0


def test_oracle_exact_mal_beats_an_untrained_drafter():
    from lisa_trt.models.drafter import Drafter

    m = make_target(std=0.3)
    cond = make_cond(m, batch=2)
    s = SamplingConfig(cfg_scale=2.0)
    spec = SpecConfig.make("exact", top_k=3, depth=3, total_tokens=10)
    mal_o = run_method(ORACLE, m, None, None, cond, sampling=s, spec=spec, seed=3)[1].mal
    mal_d = run_method(EXACT, m, Drafter.from_target(m).eval(), None, cond, sampling=s, spec=spec, seed=3)[1].mal
    assert mal_o > mal_d


def test_oracle_needs_a_prefill_and_a_recording_target():
    m = make_target(std=0.3)
    with pytest.raises(InputError, match="oracle_pair"):
        OracleDrafter(m)
    _, oracle = oracle_pair(m)
    with pytest.raises(InputError, match="prefill"):
        oracle.new_cache(1, m.config.seq_len)
    assert isinstance(oracle_pair(m)[0], RecordingTarget)


def test_drafter_efficiency():
    tree, flat = {"uses_tree": True}, {"uses_tree": False}  # the bench row's record of the point's Method
    res = {"vanilla": {"mal": 1.0, **flat}, "oracle": {"mal": 4.0, **tree}, "exact": {"mal": 3.0, **tree},
           "gasv": {"mal": 5.0, **tree}, "sjd": {"mal": 2.0, **flat}, "mcsjd": {"mal": 3.0, **flat},
           "gsd[group=3]": {"mal": 3.0, "method": "gsd", **flat}, "gasv[kappa=2]": {"mal": 6.0, "method": "gasv", **tree}}
    assert drafter_efficiency(res) == {"exact": 0.75, "gasv": 1.25, "gasv[kappa=2]": 1.5}  # no Jacobi decoder
    assert drafter_efficiency({"exact": {"mal": 2.0}}) == {}
    assert parse_methods("exact,oracle") == [EXACT, ORACLE]


@pytest.mark.slow
def test_demo_oracle_ceiling_is_above_the_bundled_drafter():
    """On the demo model, same prompts and seeds, greedy decoding: the oracle drafts the target's argmax at
    every node, so exact verification accepts (nearly) its whole chain every round (MAL 4.25-5 here,
    against 1.9 under sampling); the bundled drafter can at best tie it.

    (Under sampling the ceiling holds in expectation only: the retrained demo-lisa reaches 0.9 of the
    oracle, and 4 images cannot separate the two; bench/lisa_ablation.json measures it on 256.)"""
    from dataclasses import replace

    from lisa_trt.artifacts import load_drafter_by_name
    from lisa_trt.demo.registry import assets_present, demo_sampling, load_demo_target

    if not assets_present():
        pytest.skip("demo assets not present")
    target = load_demo_target()
    drafter = load_drafter_by_name("demo-lisa", target)
    s = replace(demo_sampling(), greedy=True)
    spec = SpecConfig.make("exact", top_k=3, depth=3, total_tokens=10)  # the CPU tree budget
    for i, c in enumerate([0, 5]):
        cond = torch.tensor([c])
        o = run_method(ORACLE, target, None, None, cond, sampling=s, spec=spec, seed=10 + i)[1]
        d = run_method(EXACT, target, drafter, None, cond, sampling=s, spec=spec, seed=10 + i)[1]
        assert o.mal >= 4.0
        assert o.mal >= d.mal and d.mal > 1.0


def test_run_bench_reports_the_oracle_and_drafter_efficiency():
    from lisa_trt.harness import run_bench
    from lisa_trt.models.drafter import Drafter

    m = make_target(std=0.3)
    rep = run_bench(m, Drafter.from_target(m).eval(), None, [EXACT, ORACLE], [0, 1],
                    sampling=SamplingConfig(cfg_scale=2.0), spec=SpecConfig.make(top_k=2, depth=2, total_tokens=6),
                    progress=False)
    r = rep["results"]
    assert set(r) == {"vanilla", "exact", "oracle"}
    assert r["exact"]["drafter_efficiency"] == pytest.approx(r["exact"]["mal"] / r["oracle"]["mal"])
    assert "drafter_efficiency" not in r["vanilla"] and "drafter_efficiency" not in r["oracle"]


def test_run_bench_takes_methods_not_names():
    """Bench points are resolved once, at the bench's entry (parse_methods / parse_sweep): a name
    reaching run_bench is a caller's bug, refused before anything runs."""
    from lisa_trt.harness import run_bench

    with pytest.raises(TypeError, match="resolved Methods"):
        run_bench(make_target(std=0.3), None, None, ["oracle"], [0], sampling=SamplingConfig(), spec=SpecConfig())
