"""GASV v2 reference (docs/spec/lisa.md steps 1-4): formulas against an independent float64 loop,
the exact lossless limit, monotone knobs, scopes, edge cases."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lisa_trt.calibration.profile import lantern_neighbors
from lisa_trt.calibration.tables import GASVTables, whiten, whitening
from lisa_trt.errors import InputError
from lisa_trt.speculative.gasv import (GASVConfig, candidates, cluster_logsumexp, gasv_gates, moved_mass, tvd,
                                       uncertainty)

NEG_INF = float("-inf")


def make_tables(V=97, H=24, C=7, theta_geo=3.0, seed=0, bound=True, K=12, **cfg) -> GASVTables:
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(V, H, generator=g)
    invstd = whitening(W)
    wt = whiten(W, invstd)
    t = GASVTables(invstd=invstd, w_tilde_norm2=(wt * wt).sum(1),
                   cluster=torch.randint(0, C, (V,), generator=g, dtype=torch.int32),
                   centroids=torch.randn(C, 4, generator=g), beta=0.5 + 2 * torch.rand(C, generator=g),
                   lantern_neighbors=lantern_neighbors(torch.randn(V, 6, generator=g), K),
                   config=GASVConfig(theta_geo=theta_geo, **{"neighbours": min(8, K), **cfg}),
                   target_hash="0" * 16, vocab_size=V)
    return t.bind(W) if bound else t


def topk_filter(l, k):
    kth = torch.topk(l, k, dim=-1).values[..., -1:]
    return l.masked_fill(l < kth, NEG_INF)


def tree_inputs(N, V, seed):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (N,), generator=g)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, N)])
    return tokens, parents


def naive_gates(logits, tokens, parents, t, cfg):
    """Independent float64 loop straight from docs/spec/lisa.md (neighbours scope)."""
    l = logits.double()
    N, V = l.shape
    W = t.w_tilde.double()
    out = torch.zeros(N, cfg.neighbours, dtype=torch.float64)
    for n in range(N):
        if parents[n] < 0:
            continue
        row = l[int(parents[n])]
        d = int(tokens[n])
        if row[d] == NEG_INF:
            continue
        p = torch.softmax(row, 0)
        U = -sum(float(q) * math.log(float(q)) for q in p if q > 0) / math.log(V)
        srt = torch.sort(row, descending=True).values
        m_norm = 1.0 / (1.0 + math.exp(-float(srt[0] - srt[1]))) if srt[1] > NEG_INF else 1.0
        r = U * (2 - 2 * m_norm)
        k_eff = cfg.kappa * (1 + cfg.gamma_kappa * r)
        log_lam = (1 + cfg.gamma_lambda * r) * math.log(cfg.lam)
        C = t.beta.shape[0]
        pi = [torch.logsumexp(row[t.cluster.long() == c], 0).item() if (t.cluster == c).any() else NEG_INF
              for c in range(C)]
        cd = int(t.cluster[d])
        for j, v in enumerate(t.lantern_neighbors[d, : cfg.neighbours].tolist()):
            if row[v] == NEG_INF:
                continue
            s = abs(float(row[d] - row[v])) / (float((W[d] - W[v]).norm()) + cfg.eps)
            g_geo = max(0.0, math.tanh(cfg.theta_geo / 2 * (k_eff * float(t.beta[cd]) - s)))
            g_clu = max(0.0, math.tanh(cfg.theta_clu / 2 * (pi[cd] - max(pi) - log_lam))) \
                if int(t.cluster[v]) == cd else 0.0
            out[n, j] = max(g_geo, g_clu)
    return out


def test_matches_independent_float64_reference():
    t = make_tables(kappa=1.3, lam=0.5)
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(9, 97, generator=g) * 2
    logits[2] = topk_filter(logits[2:3], 10)[0]
    logits[4] = topk_filter(logits[4:5], 40)[0]
    tokens, parents = tree_inputs(9, 97, 3)
    out = gasv_gates(logits, tokens, parents, t)
    ref = naive_gates(logits, tokens, parents, t, t.config)
    torch.testing.assert_close(out.gate.double(), ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out.p, torch.softmax(logits, -1))
    assert torch.equal(out.cand, t.lantern_neighbors[tokens, :8].long())
    real = out.gate[parents >= 0]
    assert 0.05 < (real > 0).float().mean() < 0.95     # teeth: the gates are neither all 0 nor all >0
    assert (out.gate[0] == 0).all()                     # the root has no gates


def test_lossless_limit_gates_are_exactly_zero():
    logits = torch.randn(12, 97, generator=torch.Generator().manual_seed(2)) * 3
    tokens, parents = tree_inputs(12, 97, 4)
    for scope in ("neighbours", "cluster", "support"):
        t = make_tables(kappa=0.0, lam=1.0, scope=scope)
        assert t.config.lossless
        assert (gasv_gates(logits, tokens, parents, t).gate == 0).all()
    out = gasv_gates(logits, tokens, parents, make_tables(delta=0.0))
    assert (out.delta_eff == 0).all()
    r = torch.softmax(logits, -1)
    assert (moved_mass(r, out.cand, out.gate, out.delta_eff) == 0).all()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k1=st.floats(0, 3), dk=st.floats(0, 2), l1=st.floats(0.05, 1.0),
       dl=st.floats(0, 0.9), d1=st.floats(0, 1), dd=st.floats(0, 1))
def test_knobs_are_monotone(seed, k1, dk, l1, dl, d1, dd):
    """Gates never decrease as kappa grows or lambda shrinks; moved mass never decreases with delta."""
    logits = torch.randn(8, 97, generator=torch.Generator().manual_seed(seed)) * 2
    tokens, parents = tree_inputs(8, 97, seed)
    l2 = max(0.01, l1 - dl)
    base = make_tables(kappa=k1, lam=l1, delta=d1)
    g0 = gasv_gates(logits, tokens, parents, base)
    g_k = gasv_gates(logits, tokens, parents, base, GASVConfig(**{**base.config.to_dict(), "kappa": k1 + dk}))
    g_l = gasv_gates(logits, tokens, parents, base, GASVConfig(**{**base.config.to_dict(), "lam": l2}))
    assert (g_k.gate >= g0.gate - 1e-6).all()
    assert (g_l.gate >= g0.gate - 1e-6).all()
    r = torch.softmax(logits, -1)[parents.clamp(min=0)]
    d2 = torch.clamp(g0.delta_eff + dd, max=1.0)[parents.clamp(min=0)]
    m1 = moved_mass(r, g0.cand, g0.gate, g0.delta_eff[parents.clamp(min=0)]).sum(-1)
    m2 = moved_mass(r, g0.cand, g0.gate, d2).sum(-1)
    assert (m2 >= m1 - 1e-6).all() and (m1 <= g0.delta_eff[parents.clamp(min=0)] + 1e-6).all()


def test_modulation_relaxes_with_uncertainty():
    t = make_tables(gamma_delta=1.0, delta=0.2)
    flat = torch.zeros(2, 97)                      # maximal uncertainty
    sharp = torch.full((2, 97), -20.0)
    sharp[:, 3] = 20.0                             # none
    tok, par = torch.tensor([0, 5]), torch.tensor([-1, 0])
    hi, lo = gasv_gates(flat, tok, par, t), gasv_gates(sharp, tok, par, t)
    assert torch.allclose(hi.delta_eff, torch.tensor(0.4)) and torch.allclose(lo.delta_eff, torch.tensor(0.2))
    assert uncertainty(flat).min() > 0.99 and uncertainty(sharp).max() < 1e-6


def test_scopes_candidates():
    t = make_tables(C=5)
    tok = torch.tensor([3, 10, 50])
    cl = candidates(tok, t, GASVConfig(theta_geo=3.0, scope="cluster"))
    for i, d in enumerate(tok.tolist()):
        want = set((t.cluster == t.cluster[d]).nonzero().flatten().tolist()) - {d}
        assert set(cl[i][cl[i] >= 0].tolist()) == want
    sup = candidates(tok, t, GASVConfig(theta_geo=3.0, scope="support"))
    assert ((sup >= 0).sum(1) == 96).all() and not (sup == tok[:, None]).any()
    with pytest.raises(InputError, match="neighbour lists"):
        candidates(tok, t, GASVConfig(theta_geo=3.0, neighbours=13))


def test_off_support_candidates_and_drafts_get_no_gate():
    t = make_tables(kappa=3.0, lam=0.05)
    logits = topk_filter(torch.randn(1, 97, generator=torch.Generator().manual_seed(5)) * 2, 20)
    logits = torch.cat([logits, logits])
    inside = int(logits[0].argmax())
    outside = int((logits[0] == NEG_INF).nonzero()[0])
    out = gasv_gates(logits, torch.tensor([0, inside]), torch.tensor([-1, 0]), t)
    off = torch.isneginf(logits[0][out.cand[1]])
    assert (out.gate[1][off] == 0).all() and (out.gate[1][~off] > 0).any()
    out2 = gasv_gates(logits, torch.tensor([0, outside]), torch.tensor([-1, 0]), t)
    assert (out2.gate == 0).all()


def test_cluster_logsumexp_matches_loop():
    g = torch.Generator().manual_seed(3)
    logits = topk_filter(torch.randn(3, 50, generator=g), 20)
    cl = torch.randint(0, 6, (50,), generator=g)
    pi = cluster_logsumexp(logits, cl, 7)
    for n in range(3):
        for c in range(7):
            sel = logits[n][cl == c]
            want = torch.logsumexp(sel, 0) if len(sel) else torch.tensor(NEG_INF)
            assert torch.allclose(pi[n, c], want, atol=1e-5) or (pi[n, c] == want == NEG_INF)


@pytest.mark.parametrize("bad,msg", [(float("nan"), "NaN"), (float("inf"), r"\+inf")])
def test_bad_logits_are_refused(bad, msg):
    logits = torch.randn(2, 97)
    logits[1, 4] = bad
    with pytest.raises(InputError, match=msg):
        gasv_gates(logits, torch.zeros(2, dtype=torch.long), torch.tensor([-1, 0]), make_tables())


def test_bad_config_and_tables_are_refused():
    for kw in (dict(lam=1.5), dict(lam=0.0), dict(kappa=-1), dict(delta=-0.1), dict(scope="all"),
               dict(neighbours=0), dict(gamma_delta=-1)):
        with pytest.raises(InputError):
            GASVConfig(**kw)
    logits = torch.randn(2, 97)
    tp = (torch.zeros(2, dtype=torch.long), torch.tensor([-1, 0]))
    with pytest.raises(InputError, match="bind"):
        gasv_gates(logits, *tp, make_tables(bound=False))
    with pytest.raises(InputError, match="calibrate"):
        gasv_gates(logits, *tp, make_tables(theta_geo=None))
    gasv_gates(logits, *tp, make_tables(), GASVConfig(neighbours=4))  # theta_geo from the tables
    with pytest.raises(InputError, match="tokens and parents"):
        gasv_gates(logits, torch.zeros(3, dtype=torch.long), tp[1], make_tables())


def test_tvd():
    p = torch.tensor([[0.5, 0.5, 0.0]])
    q = torch.tensor([[0.0, 0.5, 0.5]])
    assert torch.allclose(tvd(p, q), torch.tensor([0.5]))
