"""MC-SJD (speculative/mcsjd.py): the maximal coupling's laws, the whole Jacobi loop's
losslessness (chi-square against the target's own AR sampling, like `exact`), a lossy coupling
failing the same test (the test has power), and MC-SJD's MAL against SJD's on the demo model."""

import functools

import pytest
import torch

from lisa_trt import generate
from lisa_trt.config import SamplingConfig
from lisa_trt.speculative.mcsjd import coupled_redraft, maximal_coupling
from lisa_trt.speculative.methods import SpecConfig, get_method
from lisa_trt.speculative.run import run_method
from lisa_trt.speculative.sjd import sjd_generate
from lisa_trt.testing import make_target
from lisa_trt.speculative.methods import resolve_method

from test_decode import _chi2_homogeneity, chi2_critical


def test_maximal_coupling_marginal_and_agreement():
    """y ~ p_new whatever x was, and P(y = x) = 1 - TV(p_old, p_new) (the maximum)."""
    g = torch.Generator().manual_seed(3)
    V, n = 6, 40000
    p_old = torch.softmax(torch.randn(V, generator=g), -1)
    p_new = torch.softmax(torch.randn(V, generator=g), -1)
    x = torch.multinomial(p_old, n, replacement=True, generator=g)
    y = maximal_coupling(p_new.expand(n, V), p_old.expand(n, V), x, g)
    counts = torch.bincount(y, minlength=V).float()
    chi2 = ((counts - n * p_new) ** 2 / (n * p_new)).sum().item()
    assert chi2 < chi2_critical(V - 1), chi2
    tv = 0.5 * (p_new - p_old).abs().sum().item()
    agree = (y == x).float().mean().item()
    assert agree == pytest.approx(1 - tv, abs=4 * (0.25 / n) ** 0.5)
    # independent redraws agree far less often: sum p_old * p_new
    assert agree > (p_old * p_new).sum().item() + 0.1


def test_coupled_redraft_keeps_draft_when_distribution_is_unchanged():
    g = torch.Generator().manual_seed(4)
    p = torch.softmax(torch.randn(3, 5, 9, generator=g), -1)
    old = torch.multinomial(p.reshape(-1, 9), 1, generator=g).reshape(3, 5)
    has_old = torch.ones(3, 5, dtype=torch.bool)
    has_old[:, -1] = False
    out = coupled_redraft(p, p, old, has_old, g)
    assert torch.equal(out[:, :-1], old[:, :-1])


N_ROWS, V_SMALL = 3000, 10


@functools.lru_cache(maxsize=1)
def _reference():
    """A small-vocabulary target and N_ROWS of its own AR samples (shared by the loop tests)."""
    m = make_target(vocab_size=V_SMALL, std=0.3, block_size=9)
    return m, generate(m, torch.full((N_ROWS,), 3), cfg_scale=2.0, top_k=8, seed=1)


def _loop_samples(redraft):
    m, ref = _reference()
    s = SamplingConfig(cfg_scale=2.0, temperature=1.0, top_k=8)
    toks, stats = sjd_generate(m, torch.full((N_ROWS,), 3), sampling=s, window=3, seed=2, redraft=redraft)
    return toks, ref, stats, V_SMALL


def _chi2_failures(toks, ref, V):
    bad = []
    for j in range(toks.shape[1]):
        chi2, df = _chi2_homogeneity(toks[:, j], ref[:, j], V)
        if chi2 >= chi2_critical(df):
            bad.append((j, chi2, df))
    for j in range(toks.shape[1] - 1):
        chi2, df = _chi2_homogeneity(toks[:, j] * V + toks[:, j + 1], ref[:, j] * V + ref[:, j + 1], V * V)
        if chi2 >= chi2_critical(df):
            bad.append(("pair", j, chi2, df))
    return bad


@pytest.mark.parametrize("redraft", [None, coupled_redraft], ids=["sjd", "mcsjd"])
def test_jacobi_loop_is_lossless(redraft):
    """Every position and every adjacent pair has the target's AR law (chi-square, alpha 1e-3)."""
    toks, ref, stats, V = _loop_samples(redraft)
    assert stats.mal > 1.05  # drafts are accepted and rejected along the way
    assert float(torch.cat(stats.tvd).abs().max()) == 0.0
    assert _chi2_failures(toks, ref, V) == []


def test_a_lossy_coupling_fails_the_loop_test():
    """Power: keeping every previous draft (no min(1, p_new / p_old) test) breaks the law."""
    def sticky(p_new, p_old, old, has_old, g):
        return torch.where(has_old, old, coupled_redraft(p_new, p_old, old, has_old, g))

    toks, ref, _, V = _loop_samples(sticky)
    assert _chi2_failures(toks, ref, V)


def test_mcsjd_is_registered_and_runs_through_run_method(check_stats):
    """run_method(get_method("mcsjd")) is the SJD loop with coupled drafts: the coupled loop's tokens and counts
    for the same seed, which SJD's independent redraws do not reproduce; where every law is one-hot
    (top-k 1) the coupling cannot change a draft, and MC-SJD, SJD and the AR loop give the same tokens."""
    m = get_method("mcsjd")
    assert m.kind == "sjd" and not m.needs_drafter and m.decoder is not get_method("sjd").decoder
    t = make_target(std=0.3)
    cond = torch.tensor([1, 4])  # batch 2 with CFG

    def run(method, s):
        return run_method(resolve_method(method), t, None, None, cond, sampling=s, spec=SpecConfig(), seed=0, sjd_window=4)

    s = SamplingConfig(cfg_scale=2.0)
    toks, st = run("mcsjd", s)
    check_stats(st, toks)
    coupled, cst = sjd_generate(t, cond, sampling=s, window=4, seed=0, redraft=coupled_redraft)
    assert torch.equal(toks, coupled) and [c.tolist() for c in st.committed] == [c.tolist() for c in cst.committed]
    sjd, sst = run("sjd", s)
    check_stats(sst, sjd)
    assert not torch.equal(toks, sjd)  # same seed, same first window: the redraws after it differ
    ref = generate(t, cond, cfg_scale=2.0, top_k=1)
    for method in ("mcsjd", "sjd"):
        det, dst = run(method, SamplingConfig(cfg_scale=2.0, top_k=1))
        assert torch.equal(det, ref), method
        check_stats(dst, det)


def test_mcsjd_mal_is_at_least_sjds_on_the_demo():
    """Demo target, demo sampling, the first 128 tokens of 3 images (fixed seeds): the coupled
    drafts are accepted more often. (bench/decoders.py measures more images.)"""
    from lisa_trt.demo.registry import assets_present, demo_sampling, load_demo_target

    if not assets_present():
        pytest.skip("demo assets not present")
    t, s = load_demo_target(), demo_sampling()
    mal = {}
    for name, redraft in (("sjd", None), ("mcsjd", coupled_redraft)):
        c = f = 0.0
        for i, cls in enumerate([0, 3, 7]):
            _, st = sjd_generate(t, torch.tensor([cls]), sampling=s, window=16, seed=50 + i, num_tokens=128,
                                 redraft=redraft)
            c += float(torch.cat(st.committed).sum())
            f += len(torch.cat(st.committed))
        mal[name] = c / f
    assert mal["mcsjd"] >= mal["sjd"], mal
