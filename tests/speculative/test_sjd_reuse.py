"""SJD++-style reuse (speculative/sjd_reuse.py): the kept drafts' law, the Jacobi loop's
losslessness with reuse on SJD and on MC-SJD (the chi-square test of `exact`, `sjd`, `mcsjd`),
why the law correction is needed, and the option's one route (a settings group declared in its
own file)."""

import functools

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.errors import InputError
from lisa_trt.speculative.methods import FLAT_FIELDS, OPTION_GROUPS, SpecConfig, cli_options
from lisa_trt.speculative.run import run_method
from lisa_trt.speculative.sjd_reuse import reuse_redraft, reuse_update
from lisa_trt.testing import make_target

from test_decode import chi2_critical
from test_mcsjd import _chi2_failures, _loop_samples


@pytest.mark.parametrize("coupled", [False, True], ids=["sjd", "mcsjd"])
def test_reused_drafts_follow_the_returned_law(coupled):
    """Monte Carlo: the new draft's law is the returned one, and x is kept whenever p_new(x) >= TAU."""
    g = torch.Generator().manual_seed(5)
    V, n, tau = 6, 40000, 0.2
    p_old = torch.softmax(torch.randn(V, generator=g), -1)
    p_new = torch.softmax(2 * torch.randn(V, generator=g), -1)
    x = torch.multinomial(p_old, n, replacement=True, generator=g)
    has_old = torch.ones(n, 1, dtype=torch.bool)
    y, law = reuse_redraft(p_new.expand(n, 1, V), p_old.expand(n, 1, V), x[:, None], has_old, g,
                           threshold=tau, coupled=coupled)
    r = law[0, 0]
    assert torch.allclose(law, r.expand_as(law)) and float(r.sum()) == pytest.approx(1.0, abs=1e-5)
    counts = torch.bincount(y[:, 0], minlength=V).float()
    chi2 = ((counts - n * r) ** 2 / (n * r).clamp(min=1e-9)).sum().item()
    assert chi2 < chi2_critical(V - 1), chi2
    high = p_new[x] >= tau
    assert bool((y[high, 0] == x[high]).all())
    if not bool((p_new >= tau).any()) or bool((p_new >= tau).all()):
        pytest.fail("the case must have both high- and low-confidence tokens")


def test_off_is_the_methods_own_update():
    assert reuse_update(SpecConfig(), coupled=False) is None and reuse_update(SpecConfig(), coupled=True) is None
    on = reuse_update(SpecConfig.make(sjd_reuse_threshold=0.3), coupled=True)
    assert on.keywords == {"threshold": 0.3, "coupled": True}


TAU = 0.1  # most previous drafts in the small test model's laws (top-k 8 of 10, CFG 2) clear it: reuse dominates


@pytest.mark.parametrize("coupled", [False, True], ids=["sjd-reuse", "mcsjd-reuse"])
def test_jacobi_loop_with_reuse_is_lossless(coupled):
    """Every position and adjacent pair has the target's AR law (chi-square, alpha 1e-3, 3000 rows)."""
    toks, ref, stats, V = _loop_samples(functools.partial(reuse_redraft, threshold=TAU, coupled=coupled))
    assert stats.mal > 1.05
    assert _chi2_failures(toks, ref, V) == []


def test_the_law_correction_matters():
    """Kept drafts are NOT distributed as p_new (here TV > 0.1): verifying them against p_new would
    bias the committed token whenever its prefix is confirmed. (On the small loop model above the
    uncorrected variant still passes the chi-square test: its prefixes change too often for the
    bias to show at 3000 rows, so the loop test alone is no evidence for the correction.)"""
    g = torch.Generator().manual_seed(5)
    V = 6
    p_old = torch.softmax(torch.randn(1, 1, V, generator=g), -1)
    p_new = torch.softmax(2 * torch.randn(1, 1, V, generator=g), -1)
    for coupled in (False, True):
        _, law = reuse_redraft(p_new, p_old, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool),
                               g, threshold=0.2, coupled=coupled)
        assert 0.5 * float((law - p_new).abs().sum()) > 0.1, coupled
    _, off = reuse_redraft(p_new, p_old, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool), g,
                           threshold=1.0, coupled=True)  # nothing clears 1.0: MC-SJD's law, p_new
    assert torch.allclose(off, p_new, atol=1e-6)


def test_the_option_is_declared_once_and_reaches_every_chain_loop(monkeypatch):
    assert "sjd-reuse" in OPTION_GROUPS and FLAT_FIELDS["sjd_reuse_threshold"] == ("sjd_reuse", "threshold")
    assert "--sjd-reuse" in {o.flag for o in cli_options()}
    with pytest.raises(InputError, match="--sjd-reuse"):
        SpecConfig.make(sjd_reuse_threshold=1.5)
    from lisa_trt.speculative import sjd_reuse

    calls = []
    real = sjd_reuse.reuse_redraft
    monkeypatch.setattr(sjd_reuse, "reuse_redraft", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    t = make_target(std=0.3)
    s, cond = SamplingConfig(cfg_scale=2.0), torch.tensor([1, 4])  # batch 2 with CFG
    for m, coupled in (("sjd", False), ("mcsjd", True), ("gsd", False)):
        calls.clear()
        run_method(m, t, None, None, cond, sampling=s, spec=SpecConfig(), seed=0, sjd_window=4)
        assert not calls  # off by default
        toks, st = run_method(m, t, None, None, cond, sampling=s, spec=SpecConfig.make(sjd_reuse_threshold=0.05),
                              seed=0, sjd_window=4)
        assert toks.shape == (2, t.config.block_size) and st.mal >= 1.0
        assert calls and all(kw == {"threshold": 0.05, "coupled": coupled} for kw in calls), m
