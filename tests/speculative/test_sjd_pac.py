"""SJD-PAC (speculative/sjd_pac.py): the window tree's shape, recursive rejection sampling's law
(one column, Monte Carlo; each sibling's acceptance chance and the residual against the recursion
written out, exact where the rejections are certain), the whole loop's losslessness (the chi-square test of exact / sjd /
mcsjd), a broken sibling rule failing the same test (the test has power), batch 2 + CFG, a
deterministic target reproducing the AR loop token for token, and the knobs' registration."""

import pytest
import torch

from lisa_trt import generate
from lisa_trt.config import SamplingConfig
from lisa_trt.speculative import sjd_pac
from lisa_trt.speculative.methods import FLAT_FIELDS, SpecConfig, cli_options, get_method
from lisa_trt.speculative.run import run_method
from lisa_trt.speculative.sjd_pac import rrs_column, sjd_pac_generate, window_tree, without_replacement
from lisa_trt.testing import make_target

from test_decode import chi2_critical
from test_mcsjd import N_ROWS, _chi2_failures, _reference


def test_window_tree_is_k_ary_then_a_chain_below_the_first_child_path():
    tr = window_tree(3, 3, 5)
    assert tr.col.tolist().count(1) == 3 and tr.col.tolist().count(2) == 9
    assert [tr.col.tolist().count(c) for c in (3, 4, 5)] == [1, 1, 1]
    assert tr.main.tolist()[:3] == [0, 1, 4]  # the first child of the first child
    assert int(tr.parent[tr.main[3]]) == int(tr.main[2])
    assert bool(tr.ancestors[tr.main[5], 0]) and not bool(tr.ancestors[2, 1])  # siblings do not see each other
    assert window_tree(1, 3, 4).col.tolist() == [0, 1, 2, 3, 4]  # width 1: the SJD chain


def test_recursive_rejection_sampling_keeps_the_target_law():
    """Siblings drawn without replacement from q, tested in order, all rejected -> residual: the
    committed token is distributed as p (chi-square, 40k draws), whatever q is."""
    g = torch.Generator().manual_seed(0)
    V, n, K = 7, 40000, 3
    p = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(V, generator=g), -1)
    first = torch.multinomial(q, n, replacement=True, generator=g)
    cand = without_replacement(q.expand(n, 1, V), first[:, None], K, g)[:, 0]
    pick, resid = rrs_column(p.expand(n, V), q.expand(n, V), cand, torch.ones(n, dtype=torch.bool), g)
    draw = torch.multinomial(resid, 1, generator=g)[:, 0]
    tok = torch.where(pick >= 0, cand.gather(1, pick.clamp(min=0)[:, None])[:, 0], draw)
    counts = torch.bincount(tok, minlength=V).float()
    chi2 = ((counts - n * p) ** 2 / (n * p)).sum().item()
    assert chi2 < chi2_critical(V - 1), chi2
    assert float((pick >= 0).float().mean()) > 0.5  # several candidates: most slots accept one



def _rrs_reference(p, q, cand):
    """Recursive rejection sampling written out for one candidate tuple: per sibling, the chance it
    is accepted once reached (min(1, p_j(x) / q_j(x)), q_j: q without the tried siblings, normalised),
    and the residual law p_K after every sibling was rejected (p_{j+1} ~ max(0, p_j - q_j))."""
    p, q = p.double().clone(), q.double().clone()
    accept = []
    for x in cand:
        qn = q / q.sum()
        accept.append(min(1.0, float(p[x] / qn[x])) if qn[x] > 0 else float(p[x] > 0))
        r = (p - qn).clamp(min=0)
        p = r / r.sum() if r.sum() > 0 else p
        q[x] = 0.0
    return accept, p


P_RRS = torch.tensor([0.0, 0.0, 0.15, 0.05, 0.3, 0.5])
Q_RRS = torch.tensor([0.45, 0.3, 0.05, 0.1, 0.05, 0.05])


def test_recursive_rejection_removes_each_rejected_sibling_from_the_draft_law():
    """Exact: siblings the target gives no mass are always rejected, and the residual law after them
    is the recursion's, with each tried sibling taken out of q before the next (a rejected sibling
    left in q gives another residual)."""
    n, cand = 8, torch.tensor([0, 1])
    pick, resid = rrs_column(P_RRS.expand(n, -1), Q_RRS.expand(n, -1), cand.expand(n, -1),
                             torch.ones(n, dtype=torch.bool), torch.Generator().manual_seed(0))
    _, want = _rrs_reference(P_RRS, Q_RRS, cand.tolist())
    assert (pick == -1).all()
    assert torch.allclose(resid.double(), want.expand(n, -1), atol=1e-6), (resid[0], want)


def test_recursive_rejection_accepts_each_sibling_with_its_recursive_chance():
    """One candidate tuple (a sibling the target gives no mass, then two more), 20k rows: each
    sibling is accepted as often as the recursion says (5 sigma), and a row that rejects all three
    draws from the exact residual law (chi-square)."""
    g = torch.Generator().manual_seed(1)
    p, q = torch.tensor([0.0, 0.15, 0.25, 0.28, 0.16, 0.16]), torch.tensor([0.51, 0.0, 0.17, 0.1, 0.18, 0.04])
    n, cand = 20000, [0, 2, 3]
    acc, resid_want = _rrs_reference(p, q, cand)
    assert acc[0] == 0.0 and 0.1 < acc[1] < 0.9 and 0.1 < acc[2] < 0.9  # both later siblings are random
    pick, resid = rrs_column(p.expand(n, -1), q.expand(n, -1), torch.tensor(cand).expand(n, -1),
                             torch.ones(n, dtype=torch.bool), g)
    reach, want = 1.0, []
    for a in acc:
        want.append(reach * a)
        reach *= 1 - a
    for j, w in enumerate(want):
        got = float((pick == j).float().mean())
        assert abs(got - w) < 5 * (w * (1 - w) / n) ** 0.5 + 1e-9, (j, got, w)
    none = pick < 0
    assert torch.allclose(resid[none].double(), resid_want.expand(int(none.sum()), -1), atol=1e-6)

def _pac_samples(monkeypatch=None, broken=None, K=3):
    m, ref = _reference()
    if broken is not None:
        monkeypatch.setattr(sjd_pac, "rrs_column", broken)
    s = SamplingConfig(cfg_scale=2.0, temperature=1.0, top_k=8)
    spec = SpecConfig.make("gasv", sjd_pac_tree_width=K, sjd_pac_tree_depth=3)
    toks, stats = sjd_pac_generate(m, torch.full((N_ROWS,), 3), sampling=s, window=3, seed=2, spec=spec)
    return toks, ref, stats


def test_sjd_pac_loop_is_lossless():
    """Every position and adjacent pair has the target's AR law (chi-square, alpha 1e-3)."""
    toks, ref, stats = _pac_samples()
    assert stats.mal > 1.05
    assert float(torch.cat(stats.tvd).abs().max()) == 0.0
    assert _chi2_failures(toks, ref, 10) == []


def test_a_broken_sibling_rule_fails_the_loop_test(monkeypatch):
    """Power: testing every sibling against the unreduced target law (no residual between
    siblings, no removal of tried ones from q) accepts too often and breaks the law."""
    def greedy_siblings(p, q, cand, alive, gen, siblings=None):
        B, K = cand.shape
        u = torch.rand((B, K), generator=gen)
        pick = torch.full((B,), -1, dtype=torch.long)
        for j in range(K):
            x = cand[:, j].clamp(min=0)[:, None]
            a = (p.gather(1, x)[:, 0] / q.gather(1, x)[:, 0].clamp(min=1e-30)).clamp(max=1.0)
            acc = alive & (pick < 0) & (cand[:, j] >= 0) & (u[:, j] < a)
            pick = torch.where(acc, j, pick)
        return pick, p

    toks, ref, _ = _pac_samples(monkeypatch, greedy_siblings)
    assert _chi2_failures(toks, ref, 10)


@pytest.fixture(scope="module")
def tiny():
    return make_target(std=0.3)


def test_deterministic_target_reproduces_the_ar_loop_with_batch_and_cfg(tiny):
    """top-k 1 makes every law one-hot: any lossless decoder must give the AR loop's tokens."""
    cond = torch.tensor([1, 4])
    ref = generate(tiny, cond, cfg_scale=2.0, top_k=1)
    s = SamplingConfig(cfg_scale=2.0, top_k=1)
    for K in (1, 4):
        toks, st = run_method(get_method("sjd-pac"), tiny, None, None, cond, sampling=s,
                              spec=SpecConfig.make("gasv", sjd_pac_tree_width=K), seed=0, sjd_window=5)
        assert torch.equal(toks, ref), K


def test_sjd_pac_is_registered_with_its_own_knobs(tiny, check_stats):
    m = get_method("sjd-pac")
    assert m.kind == "sjd" and not m.needs_drafter and m.settings is not None
    assert {"sjd_pac_tree_width", "sjd_pac_tree_depth"} <= set(FLAT_FIELDS)
    assert {"--sjd-pac-width", "--sjd-pac-depth"} <= {o.flag for o in cli_options()}
    s = SamplingConfig(cfg_scale=2.0)
    cond = torch.tensor([1, 4])
    toks, st = run_method(get_method("sjd-pac"), tiny, None, None, cond, sampling=s, spec=SpecConfig(), seed=0, sjd_window=4)
    again, _ = run_method(get_method("sjd-pac"), tiny, None, None, cond, sampling=s, spec=SpecConfig(), seed=0, sjd_window=4)
    assert toks.shape == (2, tiny.config.block_size) and torch.equal(toks, again)
    assert ((toks >= 0) & (toks < tiny.config.vocab_size)).all() and st.mean_tvd == 0.0
    check_stats(st, toks)
    with pytest.raises(Exception, match="tree_width"):
        SpecConfig.make("sjd-pac", sjd_pac_tree_width=0).settings("sjd-pac")
