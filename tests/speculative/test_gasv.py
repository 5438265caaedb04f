"""GASV reference (docs/spec/lisa.md steps 1-5): formulas, support paths, edge cases, TVD."""

import math

import pytest
import torch

from lisa_trt.calibration.tables import GASVTables, whitening, whiten
from lisa_trt.errors import InputError
from lisa_trt.speculative.gasv import GASVConfig, cluster_logsumexp, gasv_gate, tvd, uncertainty

NEG_INF = float("-inf")


def make_tables(V=97, H=24, C=7, theta_geo=3.0, seed=0, bound=True, **cfg) -> GASVTables:
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(V, H, generator=g)
    invstd = whitening(W)
    wt = whiten(W, invstd)
    t = GASVTables(invstd=invstd, w_tilde_norm2=(wt * wt).sum(1),
                   cluster=torch.randint(0, C, (V,), generator=g, dtype=torch.int32),
                   centroids=torch.randn(C, 4, generator=g), beta=0.5 + 2 * torch.rand(C, generator=g),
                   lantern_neighbors=torch.zeros(V, 3, dtype=torch.int16),
                   config=GASVConfig(theta_geo=theta_geo, **cfg), target_hash="0" * 16, vocab_size=V)
    return t.bind(W) if bound else t


def topk_filter(l, k):
    kth = torch.topk(l, k, dim=-1).values[..., -1:]
    return l.masked_fill(l < kth, NEG_INF)


def naive_gasv(logits, t, cfg):
    """Independent float64 loop over tokens, straight from docs/spec/lisa.md."""
    l = logits.double()
    N, V = l.shape
    W = t.w_tilde.double()
    sig = lambda x: 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0  # noqa: E731
    gates = torch.zeros(N, V, dtype=torch.float64)
    for n in range(N):
        row = l[n]
        p = torch.softmax(row, 0)
        ent = -sum(float(q) * math.log(float(q)) for q in p if q > 0)
        U = ent / math.log(V)
        srt = torch.sort(row, descending=True).values
        m_norm = sig(float(srt[0] - srt[1]))
        r = U * (2 - 2 * m_norm)
        k_eff = cfg.kappa * (1 + cfg.gamma_kappa * r)
        lam_eff = cfg.lam * math.exp(-cfg.gamma_lambda * r)
        i = int(row.argmax())
        C = t.beta.shape[0]
        pi = [torch.logsumexp(row[t.cluster.long() == c], 0).item() if (t.cluster == c).any() else NEG_INF
              for c in range(C)]
        ci = int(t.cluster[i])
        for v in range(V):
            if row[v] == NEG_INF:
                continue
            dist = float((W[i] - W[v]).norm())
            s = float(row[i] - row[v]) / (dist + cfg.eps)
            g_geo = sig(t.theta_geo * (k_eff * float(t.beta[ci]) - s))
            g_clu = sig(cfg.theta_clu * (pi[int(t.cluster[v])] - pi[ci] - math.log(lam_eff)))
            gates[n, v] = max(g_geo, g_clu)
    p_raw = torch.softmax(l, -1)
    w = p_raw * gates
    return gates, p_raw, w / w.sum(-1, keepdim=True)


def test_matches_independent_float64_reference():
    t = make_tables()
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 97, generator=g) * 3
    logits[2] = topk_filter(logits[2:3], 10)[0]
    out = gasv_gate(logits, t)
    ref = naive_gasv(logits, t, t.config)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a.double(), b, atol=2e-5, rtol=1e-4)
    # the test has teeth: the gate is neither all 0 nor all 1 on this input
    assert 0.05 < out.gate[out.p_raw > 0].mean() < 0.95


@pytest.mark.parametrize("k", [1, 5, 40])
def test_topk_support_path_equals_dense(k):
    t = make_tables(V=300, H=32, C=17)
    logits = topk_filter(torch.randn(6, 300, generator=torch.Generator().manual_seed(k)) * 2, k)
    dense = gasv_gate(logits, t)
    for K in (k, k + 7, 299):
        supp = gasv_gate(logits, t, support_k=K)
        for a, b in zip(dense, supp):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_outputs_are_distributions_and_gate_in_range():
    t = make_tables()
    logits = torch.randn(8, 97, generator=torch.Generator().manual_seed(3)) * 4
    logits[:, 50:60] = NEG_INF
    gate, p_raw, p_soft = gasv_gate(logits, t)
    assert torch.all((gate >= 0) & (gate <= 1))
    torch.testing.assert_close(p_soft.sum(-1), torch.ones(8))
    assert torch.all(p_soft[:, 50:60] == 0) and torch.all(gate[:, 50:60] == 0)
    i = logits.argmax(-1)
    assert torch.all(gate.gather(1, i[:, None]) > 0.5)  # s_geo(i) = 0 and lambda_eff < 1


def test_force_gate_one_is_exactly_p_raw():
    t = make_tables()
    logits = topk_filter(torch.randn(5, 97, generator=torch.Generator().manual_seed(4)), 20)
    gate, p_raw, p_soft = gasv_gate(logits, t, force_gate_one=True)
    assert torch.equal(p_soft, p_raw)
    assert torch.equal(gate, (logits > NEG_INF).float())
    assert torch.all(tvd(p_raw, p_soft) == 0)
    # with real gates the distribution moves
    assert tvd(*gasv_gate(logits, t)[1:]).max() > 1e-3


def test_relaxing_thresholds_raises_gates():
    logits = torch.randn(6, 97, generator=torch.Generator().manual_seed(5)) * 3
    base = gasv_gate(logits, make_tables()).gate
    more_kappa = gasv_gate(logits, make_tables(kappa=2.0)).gate
    less_lambda = gasv_gate(logits, make_tables(lam=0.1)).gate
    assert torch.all(more_kappa >= base - 1e-7) and (more_kappa > base + 1e-3).any()
    assert torch.all(less_lambda >= base - 1e-7) and (less_lambda > base + 1e-3).any()


def test_uncertainty_extremes():
    V = 64
    flat = torch.zeros(1, V)                        # U = 1, margin 0 -> m_norm 0.5 -> r = 1
    peaked = torch.full((1, V), NEG_INF)
    peaked[0, 3] = 0.0                             # one token: U = 0, no runner-up -> r = 0
    torch.testing.assert_close(uncertainty(flat), torch.ones(1))
    torch.testing.assert_close(uncertainty(peaked), torch.zeros(1))


def test_cluster_logsumexp_matches_loop():
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(3, 50, generator=g) * 5
    logits[0, :25] = NEG_INF
    cluster = torch.randint(0, 6, (50,), generator=g)
    cluster[cluster == 5] = 4                       # cluster 5 empty
    pi = cluster_logsumexp(logits, cluster, 6)
    for c in range(6):
        sel = cluster == c
        want = torch.logsumexp(logits[:, sel], -1) if sel.any() else torch.full((3,), NEG_INF)
        torch.testing.assert_close(pi[:, c], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bad,msg", [(float("nan"), "NaN"), (float("inf"), r"\+inf")])
def test_bad_logits_are_refused(bad, msg):
    logits = torch.randn(2, 97)
    logits[1, 7] = bad
    with pytest.raises(InputError, match=msg):
        gasv_gate(logits, make_tables())


def test_empty_support_row_is_refused():
    logits = torch.randn(3, 97)
    logits[1] = NEG_INF
    with pytest.raises(InputError, match=r"rows \[1\].*empty support"):
        gasv_gate(logits, make_tables())


def test_unbound_tables_and_missing_theta_are_refused():
    logits = torch.randn(2, 97)
    with pytest.raises(InputError, match="bind"):
        gasv_gate(logits, make_tables(bound=False))
    with pytest.raises(InputError, match="theta_geo"):
        gasv_gate(logits, make_tables(theta_geo=None))
    gasv_gate(logits, make_tables(), GASVConfig())  # theta_geo falls back to the tables' value
    with pytest.raises(InputError, match="lambda"):
        GASVConfig(lam=0.0)


def test_tvd():
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    q = torch.tensor([[0.25, 0.5, 0.25], [0.0, 0.0, 1.0]])
    torch.testing.assert_close(tvd(p, q), torch.tensor([0.25, 1.0]))
    torch.testing.assert_close(tvd(q, p), tvd(p, q))


def test_support_path_on_wider_support_masks_to_top_k():
    t = make_tables(V=120)
    logits = torch.randn(3, 120, generator=torch.Generator().manual_seed(7))
    supp = gasv_gate(logits, t, support_k=15)
    dense = gasv_gate(topk_filter(logits, 15), t)
    for a, b in zip(dense, supp):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert torch.all((supp.p_raw > 0).sum(-1) == 15)
