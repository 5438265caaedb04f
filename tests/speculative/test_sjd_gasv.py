"""GASV inside Jacobi windows (speculative/sjd_gasv.py): the lossless limit is SJD (and MC-SJD)
token for token; the relaxed acceptance's committed law (Monte Carlo) and the reported TVD
bounding its distance to the target law; GASV's gates through their seam; the knob's
registration and the tables check."""

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.speculative import sjd_gasv as G
from lisa_trt.speculative.methods import FLAT_FIELDS, SpecConfig, cli_options, get_method
from lisa_trt.speculative.run import run_method
from lisa_trt.speculative.sampling import tvd
from lisa_trt.speculative.verify import jacobi_residual
from lisa_trt.testing import make_target
from lisa_trt.speculative.methods import resolve_method

from test_decode import _gasv_tables, chi2_critical


@pytest.fixture(scope="module")
def tiny():
    m = make_target(std=0.3)
    return m, _gasv_tables(m)


@pytest.mark.parametrize("base", ["sjd", "mcsjd"])
def test_lossless_limit_is_the_jacobi_decoder(tiny, base):
    """delta 0 (no budget) or zero gates: the same tokens as sjd / mcsjd (batch 2, CFG), TVD 0."""
    m, tb = tiny
    s = SamplingConfig(cfg_scale=2.0)
    cond = torch.tensor([1, 4])
    ref, _ = run_method(resolve_method(base), m, None, None, cond, sampling=s, spec=SpecConfig(), seed=3, sjd_window=4)
    for kw in (dict(gasv_delta=0.0), dict(gasv_kappa=0.0, gasv_lambda=1.0)):
        spec = SpecConfig.make("gasv", sjd_gasv_redraft=base, **kw)
        got, st = run_method(get_method("sjd-gasv"), m, None, tb, cond, sampling=s, spec=spec, seed=3, sjd_window=4)
        assert torch.equal(got, ref), kw
        assert st.mean_tvd == 0.0


def test_relaxed_acceptance_accepts_at_least_as_much_and_reports_tvd(tiny):
    m, tb = tiny
    s = SamplingConfig(cfg_scale=2.0)
    cond = torch.tensor([1, 4, 6])
    _, st_sjd = run_method(get_method("sjd"), m, None, None, cond, sampling=s, spec=SpecConfig(), seed=0, sjd_window=6)
    toks, st = run_method(get_method("sjd-gasv"), m, None, tb, cond, sampling=s, seed=0, sjd_window=6,
                          spec=SpecConfig.make("gasv", gasv_kappa=5.0, sjd_gasv_redraft="sjd"))
    assert st.mal >= st_sjd.mal and 0 < st.mean_tvd < 0.2  # (a tiny random model: gains are measured on the demo)
    assert ((toks >= 0) & (toks < m.config.vocab_size)).all()


def test_moved_mass_comes_from_the_gasv_gates(tiny):
    """M(x) = sum of gasv.moved_mass over x's candidates at the slot's own law (the seam), 0 at a
    one-hot (forced) law."""
    from lisa_trt.speculative.gasv import gasv_gates, moved_mass

    m, tb = tiny
    g = torch.Generator().manual_seed(0)
    V = m.config.vocab_size
    p = torch.softmax(2 * torch.randn(2, 3, V, generator=g), -1)
    p[1, 2] = torch.nn.functional.one_hot(torch.tensor(5), V).float()
    x = torch.randint(0, V, (2, 3), generator=g)
    x[1, 2] = 5
    cfg = G.gasv_config(SpecConfig.make("gasv", gasv_kappa=5.0), tb)
    got = G.moved_onto_drafts(p, x, tb, cfg)
    out = gasv_gates(torch.log(p[0]), x[0], torch.arange(3), tb, cfg)
    want = moved_mass(out.p, out.cand, out.gate, out.delta_eff).sum(-1)
    assert torch.allclose(got[0], want) and float(got[0].max()) > 0
    assert float(got[1, 2]) == 0.0


def test_committed_law_and_its_tvd_bound():
    """One slot, 40k rows: the committed token follows p_prev * a' + (1 - sum p_prev a') R
    (chi-square), and its TV distance to p_now is at most the mean reported TVD."""
    g = torch.Generator().manual_seed(1)
    V, n = 8, 40000
    pn = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    pp = torch.softmax(torch.randn(V, generator=g), -1)
    x = torch.multinomial(pp, n, replacement=True, generator=g)

    def moved(p, d):  # a draft-dependent lent mass (what the GASV gates give), here 0.3 p(x + 1)
        return 0.3 * p.gather(-1, ((d + 1) % V)[..., None])[..., 0]

    res, slot_tvd = G.gasv_jacobi_accept(pn.expand(n, 1, V), pp.expand(n, 1, V), x[:, None], g, moved)
    tok = torch.where(res.accept_len > 0, x, res.token)
    a = torch.minimum(torch.minimum(pn / pp, torch.ones(V)) + 0.3 * pn.roll(-1), torch.ones(V))
    R = jacobi_residual(pn, pp)
    R = R / R.sum()
    law = pp * a + (1 - (pp * a).sum()) * R
    counts = torch.bincount(tok, minlength=V).float()
    chi2 = ((counts - n * law) ** 2 / (n * law)).sum().item()
    assert chi2 < chi2_critical(V - 1), chi2
    assert 0 < float(tvd(law, pn)) <= float(slot_tvd.mean()) + 0.01
    assert float(slot_tvd.max()) <= 0.3  # at most the lent mass: GASV's budget per slot


def test_sjd_gasv_is_registered_with_its_knob(tiny):
    m, tb = tiny
    meth = get_method("sjd-gasv")
    assert meth.kind == "sjd" and meth.needs_tables and not meth.needs_drafter and meth.settings is not None
    assert "sjd_gasv_redraft" in FLAT_FIELDS and "--sjd-gasv-redraft" in {o.flag for o in cli_options()}
    assert SpecConfig().settings("sjd-gasv").redraft == "mcsjd"  # the measured default (docs/spec/decoders.md)
    with pytest.raises(Exception, match="redraft"):
        SpecConfig.make("sjd-gasv", sjd_gasv_redraft="bogus").settings("sjd-gasv")
    with pytest.raises(Exception, match="needs calibration tables"):
        run_method(get_method("sjd-gasv"), m, None, None, torch.tensor([1]), sampling=SamplingConfig(), spec=SpecConfig(),
                   seed=0, sjd_window=4)
