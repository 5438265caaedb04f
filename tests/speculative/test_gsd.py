"""GSD (speculative/gsd.py): group = 1 is SJD token for token, the reported TVD is the TVD of the
law each slot really commits (Monte Carlo, chi-square), larger groups accept more and report a
positive TVD, and the knobs reach the rule through SpecConfig and the CLI option list."""

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.errors import InputError
from lisa_trt.speculative.gsd import GSDSettings, committed_law, group_acceptance, gsd_accept
from lisa_trt.speculative.methods import SpecConfig, cli_options, get_method
from lisa_trt.speculative.run import run_method
from lisa_trt.speculative.sampling import tvd
from lisa_trt.testing import make_target

from test_decode import chi2_critical


def _pair(V=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(V, generator=g) * 1.5, -1), torch.softmax(torch.randn(V, generator=g), -1)


def test_group_of_one_is_the_sjd_ratio_and_a_wide_group_accepts_more():
    pn, pp = _pair()
    a1 = group_acceptance(pn, pp, 1, 0.15)
    assert torch.allclose(a1, (pn / pp).clamp(max=1.0))
    a5 = group_acceptance(pn, pp, 5, 1.0)
    # the whole vocabulary as one group: p_now(G) / p_prev(G) = 1 for every token
    assert torch.allclose(group_acceptance(pn, pp, 2 * len(pn), 1.0), torch.ones_like(pn))
    assert float((pp * a5).sum()) > float((pp * a1).sum())


def test_reported_tvd_is_the_committed_laws_distance():
    """Draw the first slot many times with gsd_accept; its empirical law is committed_law."""
    V, n = 8, 40000
    pn, pp = _pair(V, seed=2)
    g = torch.Generator().manual_seed(5)
    s = GSDSettings(group=4, prob_gap=1.0)
    drafts = torch.multinomial(pp, n, replacement=True, generator=g)[:, None]
    res, slot_tvd = gsd_accept(pn.expand(n, 1, V), pp.expand(n, 1, V), drafts, g, s)
    tok = torch.where(res.accept_len > 0, drafts[:, 0], res.token)
    law = committed_law(pn, pp, group_acceptance(pn, pp, s.group, s.prob_gap))
    counts = torch.bincount(tok, minlength=V).float()
    keep = law > 0
    chi2 = ((counts - n * law)[keep] ** 2 / (n * law[keep])).sum().item()
    assert chi2 < chi2_critical(int(keep.sum()) - 1), chi2
    assert float(law.sum()) == pytest.approx(1.0, abs=1e-5)
    assert float(slot_tvd[0, 0]) == pytest.approx(float(tvd(pn, law)), abs=1e-6) and float(slot_tvd[0, 0]) > 0.01
    # and the empirical law is NOT p_now: GSD is lossy
    chi2_p = ((counts - n * pn) ** 2 / (n * pn)).sum().item()
    assert chi2_p > chi2_critical(V - 1)


@pytest.fixture(scope="module")
def tiny():
    return make_target(std=0.3)


def test_gsd_group_one_is_sjd_token_for_token(tiny):
    s, cond = SamplingConfig(cfg_scale=2.0), torch.tensor([1, 4])  # batch 2 with CFG
    a, sa = run_method(get_method("sjd"), tiny, None, None, cond, sampling=s, spec=SpecConfig(), seed=3, sjd_window=4)
    b, sb = run_method(get_method("gsd"), tiny, None, None, cond, sampling=s, spec=SpecConfig.make("exact", gsd_group=1),
                       seed=3, sjd_window=4)
    assert torch.equal(a, b) and sb.mal == pytest.approx(sa.mal)
    assert sb.mean_tvd == pytest.approx(0.0, abs=1e-6)


def test_gsd_wide_groups_accept_more_and_report_tvd(tiny):
    s, cond = SamplingConfig(cfg_scale=2.0), torch.tensor([1, 4, 7])
    _, sj = run_method(get_method("sjd"), tiny, None, None, cond, sampling=s, spec=SpecConfig(), seed=3, sjd_window=8)
    spec = SpecConfig.make("exact", gsd_group=64, gsd_prob_gap=1.0)
    _, sg = run_method(get_method("gsd"), tiny, None, None, cond, sampling=s, spec=spec, seed=3, sjd_window=8)
    assert sg.mal > sj.mal and sg.mean_tvd > 0.0


def test_gsd_knobs_are_registered_by_its_file():
    m = get_method("gsd")
    assert m.kind == "sjd" and m.settings is GSDSettings and not m.needs_drafter
    assert SpecConfig.make("exact", gsd_group=3).settings("gsd") == GSDSettings(group=3)
    assert SpecConfig().flat()["gsd_prob_gap"] == GSDSettings().prob_gap
    flags = [o.flag for o in cli_options()]
    assert "--gsd-group" in flags and "--gsd-prob-gap" in flags
    with pytest.raises(InputError, match="group must be >= 1"):
        SpecConfig.make("exact", gsd_group=0)


def test_bench_sweeps_reach_gsds_own_knobs():
    from lisa_trt.harness import parse_sweep

    runs = parse_sweep("gsd:group=1,25;prob_gap=1")
    assert [r[2] for r in runs] == [{"gsd_group": 1, "gsd_prob_gap": 1}, {"gsd_group": 25, "gsd_prob_gap": 1}]
    with pytest.raises(InputError, match="bad sweep"):
        parse_sweep("mcsjd:group=1")  # MC-SJD has no settings of its own
    with pytest.raises(InputError, match="unknown sweep knob 'group' for sjd"):
        parse_sweep("sjd:group=1")
    assert [r[2] for r in parse_sweep("sjd:window=4,8")] == [{"sjd_window": 4}, {"sjd_window": 8}]  # the Jacobi window
