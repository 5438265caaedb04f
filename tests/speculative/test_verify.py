"""Verification rules: greedy == greedy AR token for token, exact rules reproduce the target's
sampling distribution (chi-square, alpha = 1e-3, fixed seeds), LANTERN / GASV reductions to
exact, LANTERN's mass budget (property-based), SJD acceptance law.

Toy target ("Markov model"): p(s_{i+1} | s_0..s_i) = softmax(T[i, s_i]). A tree node at depth d
under a root at position i has the distribution softmax(T[i + d, token]); joint laws of whole
sequences are then known in closed form.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from lisa_trt.errors import InputError
from lisa_trt.speculative.tree import (DraftTree, build_dynamic_tree, build_static_tree,
                                       preset_template, static_tree_from_topk)
from lisa_trt.speculative.verify import (lantern_delta_eff, lantern_relaxed_distribution, sjd_accept, tvd,
                                         verify_exact, verify_exact_sampled, verify_gasv, verify_gasv_greedy,
                                         verify_greedy, verify_lantern, verify_lantern_greedy)

ALPHA = 1e-3   # significance level of every chi-square test below (fixed seeds: deterministic)


def chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness of fit of integer samples against probs; cells with expected < 5
    are pooled."""
    n = samples.numel()
    obs = torch.bincount(samples.flatten(), minlength=probs.numel()).double()
    exp = probs.double().flatten() * n
    assert obs[exp == 0].sum() == 0, "a zero-probability outcome was produced"
    small = exp < 5
    o = torch.cat([obs[~small], obs[small].sum()[None]]) if small.any() else obs[~small]
    e = torch.cat([exp[~small], exp[small].sum()[None]]) if small.any() else exp[~small]
    keep = e > 0
    stat = (((o - e) ** 2) / e)[keep].sum().item()
    return float(stats.chi2.sf(stat, keep.sum().item() - 1))


class Markov:
    def __init__(self, V, L, seed, scale=1.0):
        g = torch.Generator().manual_seed(seed)
        self.V, self.L = V, L
        self.T = torch.randn(L + 1, V, V, generator=g) * scale
        self.noise = torch.randn(L + 1, V, V, generator=g)

    def probs(self, tree: DraftTree, root_pos):
        pos = tree.positions(root_pos).clamp(max=self.L)
        return torch.softmax(self.T[pos, tree.tokens], -1)                # (B, N, V)

    def drafter(self, root_pos, noise=1.0):
        def expand(req):
            pos = (root_pos[:, None] + req.depth).clamp(max=self.L)
            return torch.log_softmax(self.T[pos, req.tokens] + noise * self.noise[pos, req.tokens], -1)
        return expand

    def root_logprobs(self, root, root_pos, noise=1.0):
        return torch.log_softmax(self.T[root_pos, root] + noise * self.noise[root_pos, root], -1)

    def joint(self, start, n):
        """Exact law of (s_1..s_n) given s_0 = start: (V,)*n tensor."""
        out = torch.softmax(self.T[0, start], -1)
        for i in range(1, n):
            step = torch.softmax(self.T[i], -1)                            # (V prev, V next)
            out = out[..., None] * step.view((1,) * (i - 1) + (self.V, self.V))
        return out


def decode(model: Markov, start, L, build, verify):
    """Speculative decode loop over rows (vectorised): returns (B, L) tokens and forwards."""
    B = start.shape[0]
    out = torch.full((B, L + 64), -1, dtype=torch.long)
    root, pos = start.clone(), torch.zeros(B, dtype=torch.long)
    forwards = torch.zeros(B, dtype=torch.long)
    while (pos < L).any():
        active = pos < L
        tree = build(root, pos).truncate(L - pos - 1)
        res = verify(model.probs(tree, pos), tree)
        n = torch.where(active, res.n_committed, 0)
        D1 = res.tokens.shape[1]
        cols = pos[:, None] + torch.arange(D1)
        write = torch.arange(D1) < n[:, None]
        out.scatter_(1, torch.where(write, cols, L + 63), torch.where(write, res.tokens, -1))
        root = torch.where(active, res.bonus, root)
        forwards += active.long()
        pos = pos + n
    return out[:, :L], forwards


def dyn_builder(model, K=3, depth=2, total=8, noise=1.0):
    def build(root, pos):
        return build_dynamic_tree(root, model.root_logprobs(root, pos, noise),
                                  model.drafter(pos, noise), top_k=K, depth=depth,
                                  total_tokens=total)
    return build


def static_builder(model, name, sample=False, generator=None, noise=1.0):
    t = preset_template(name)

    def build(root, pos):
        return build_static_tree(t, root, model.root_logprobs(root, pos, noise),
                                 model.drafter(pos, noise), sample=sample, generator=generator)
    return build


# ----------------------------------------------------------------------------- greedy

@pytest.mark.parametrize("builder", ["dynamic", "tree31", "chain4", "star8"])
def test_greedy_speculative_equals_greedy_ar(builder):
    V, L, B = 16, 24, 3
    m = Markov(V, L, seed=0, scale=2.0)
    start = torch.tensor([1, 5, 9])
    ref = torch.empty(B, L, dtype=torch.long)
    cur = start
    for i in range(L):
        cur = m.T[i, cur].argmax(-1)
        ref[:, i] = cur
    build = dyn_builder(m, K=4, depth=3, total=14, noise=0.5) if builder == "dynamic" else \
        static_builder(m, builder, noise=0.5)
    # logits passed (argmax over logits, exactly like the reference loop)
    verify = lambda p, tree: verify_greedy(torch.log(p), tree)
    toks, forwards = decode(m, start, L, build, verify)
    assert toks.equal(ref)
    assert (forwards < L).all(), "the drafter never got a token accepted: test is vacuous"


def test_greedy_hand_example():
    # root(0) -> children tokens [2, 1]; node 1 (tok 2) -> child tok 0 (node 3)
    tree = DraftTree.from_parents(torch.tensor([[7, 2, 1, 0]]), torch.tensor([[-1, 0, 0, 1]]))
    p = torch.zeros(1, 4, 4)
    p[0, 0, 2] = p[0, 1, 0] = p[0, 2, 3] = p[0, 3, 1] = 1.0
    r = verify_greedy(p, tree)
    assert r.path.tolist() == [[0, 1, 3]] and r.accept_len.tolist() == [2]
    assert r.bonus.tolist() == [1] and r.tokens.tolist() == [[2, 0, 1]]
    p[0, 1, 0], p[0, 1, 3] = 0.0, 1.0        # mismatch at depth 2: bonus = argmax at node 1
    r = verify_greedy(p, tree)
    assert r.path.tolist() == [[0, 1, -1]] and r.tokens.tolist() == [[2, 3, -1]]


# ----------------------------------------------------------------------------- exact

def _fixed_tree(B):
    """tree15 with fixed tokens (same in every row): node candidates = a permutation."""
    g = torch.Generator().manual_seed(11)
    t = preset_template("tree15")
    topk = torch.stack([torch.randperm(6, generator=g)[:4] for _ in range(t.n_nodes)])
    return static_tree_from_topk(t, torch.zeros(B, dtype=torch.long),
                                 topk.expand(B, -1, -1).clone())


def _two_token_samples(m, tree, res, g):
    """First and second committed tokens; when only one was committed the second is drawn
    from the target after it (what the next step would do)."""
    t1 = res.tokens[:, 0]
    second_needed = res.accept_len == 0
    nxt = torch.multinomial(torch.softmax(m.T[1, t1], -1), 1, generator=g)[:, 0]
    t2 = torch.where(second_needed, nxt, res.tokens[:, 1])
    return t1 * m.V + t2


def test_exact_deterministic_drafts_lossless():
    B, V = 20000, 6
    m = Markov(V, 4, seed=1)
    tree = _fixed_tree(B)
    g = torch.Generator().manual_seed(123)
    p = m.probs(tree, torch.zeros(B, dtype=torch.long))
    res = verify_exact(p, tree, g)
    assert res.accept_len.float().mean() > 0.3           # the tree gets tokens accepted
    assert res.pos_tvd.abs().max() < 1e-5                 # closed-form law of each token == p
    joint = m.joint(0, 2)
    assert chi2_pvalue(_two_token_samples(m, tree, res, g), joint) > ALPHA


@pytest.mark.slow
def test_exact_full_decode_loop_lossless():
    """Whole 3-token sequences from the decode loop (dynamic trees, truncation at the end)."""
    B, V, L = 20000, 4, 3
    m = Markov(V, L, seed=2, scale=0.7)
    g = torch.Generator().manual_seed(7)
    toks, _ = decode(m, torch.zeros(B, dtype=torch.long), L, dyn_builder(m, K=3, depth=2, total=7),
                     lambda p, tree: verify_exact(p, tree, g))
    codes = (toks[:, 0] * V + toks[:, 1]) * V + toks[:, 2]
    assert chi2_pvalue(codes, m.joint(0, 3)) > ALPHA


def test_exact_sampled_drafts_lossless():
    B, V, L = 20000, 6, 3
    m = Markov(V, L, seed=3)
    g = torch.Generator().manual_seed(5)
    zero = torch.zeros(B, dtype=torch.long)
    tree = static_builder(m, "tree15", sample=True, generator=g, noise=1.5)(zero, zero)
    res = verify_exact_sampled(m.probs(tree, zero), tree, g)
    assert res.accept_len.float().mean() > 0.3
    assert res.pos_tvd.abs().max() < 1e-5
    assert chi2_pvalue(_two_token_samples(m, tree, res, g), m.joint(0, 2)) > ALPHA


@pytest.mark.slow
def test_exact_sampled_drafts_full_decode_loop_lossless():
    """Whole 3-token sequences, trees re-sampled every step."""
    B, V, L = 20000, 6, 3
    m = Markov(V, L, seed=3)
    g = torch.Generator().manual_seed(5)
    zero = torch.zeros(B, dtype=torch.long)
    toks, _ = decode(m, zero, L, static_builder(m, "tree15", sample=True, generator=g, noise=1.5),
                     lambda p, tree: verify_exact_sampled(p, tree, g))
    codes = (toks[:, 0] * V + toks[:, 1]) * V + toks[:, 2]
    assert chi2_pvalue(codes, m.joint(0, 3)) > ALPHA


def test_chi_square_has_power():
    """Negative control: a lossy rule (LANTERN, delta 0.3) is detected by the same test."""
    B, V = 20000, 6
    m = Markov(V, 4, seed=1)
    tree = _fixed_tree(B)
    g = torch.Generator().manual_seed(123)
    res = verify_lantern(m.probs(tree, torch.zeros(B, dtype=torch.long)), tree, g,
                         _ring_neighbors(V), k=V - 1, delta=0.3)
    assert chi2_pvalue(_two_token_samples(m, tree, res, g), m.joint(0, 2)) < ALPHA


def test_sampled_rule_needs_q():
    tree = _fixed_tree(2)
    with pytest.raises(InputError, match="child_q"):
        verify_exact_sampled(torch.full((2, 16, 6), 1 / 6), tree, None)


def test_shape_errors():
    tree = _fixed_tree(2)
    with pytest.raises(InputError, match="one per tree node"):
        verify_exact(torch.full((2, 15, 6), 1 / 6), tree, None)


# ----------------------------------------------------------------------------- LANTERN

def _ring_neighbors(V):
    """Neighbours on a ring metric, nearest first, self excluded: v+1, v-1, v+2, v-2, ..."""
    rows = []
    for v in range(V):
        order = sorted((u for u in range(V) if u != v),
                       key=lambda u: (min((u - v) % V, (v - u) % V), (u - v) % V))
        rows.append(order)
    return torch.tensor(rows)


def _random_case(seed, B=64, V=8):
    g = torch.Generator().manual_seed(seed)
    t = preset_template("tree15")
    topk = torch.stack([torch.randperm(V, generator=g)[:4] for _ in range(B * t.n_nodes)])
    tree = static_tree_from_topk(t, torch.zeros(B, dtype=torch.long), topk.view(B, t.n_nodes, 4))
    p = torch.softmax(torch.randn(B, t.n_nodes, V, generator=g) * 1.5, -1)
    return tree, p


def _same(a, b):
    return all(getattr(a, f).equal(getattr(b, f)) for f in ("path", "accept_len", "bonus", "tokens"))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lantern_delta_zero_is_exact(seed):
    tree, p = _random_case(seed)
    nb = _ring_neighbors(8)
    a = verify_exact(p, tree, torch.Generator().manual_seed(seed))
    b = verify_lantern(p, tree, torch.Generator().manual_seed(seed), nb, k=7, delta=0.0)
    assert _same(a, b)
    assert b.pos_tvd.abs().max() < 1e-5


def test_lantern_repo_residual_overprunes():
    """p = [.05, .3, .3, .35] at the root, draft 0 (one child); neighbours of 0: 1, 2, 3.
    k = 2, delta = 0: nothing merged, accept w.p. .05. On rejection the clean residual keeps
    {1, 2, 3}; the repo residual zeroes x and its first k = 2 neighbours, leaving only 3."""
    B = 4000
    tree = DraftTree.from_parents(torch.tensor([[9, 0]]).expand(B, 2), torch.tensor([[-1, 0]]).expand(B, 2))
    p = torch.tensor([0.05, 0.3, 0.3, 0.35]).expand(B, 2, 4)
    nb = torch.tensor([[1, 2, 3], [0, 2, 3], [1, 3, 0], [2, 1, 0]])
    clean = verify_lantern(p, tree, torch.Generator().manual_seed(0), nb, k=2, delta=0.0)
    repo = verify_lantern(p, tree, torch.Generator().manual_seed(0), nb, k=2, delta=0.0,
                          residual="lantern_repo")
    rej = clean.accept_len == 0
    assert set(clean.bonus[rej].tolist()) == {1, 2, 3}
    assert set(repo.bonus[repo.accept_len == 0].tolist()) == {3}
    with pytest.raises(InputError, match="residual"):
        verify_lantern(p, tree, None, nb, k=2, delta=0.0, residual="nope")


def test_lantern_single_draft_samples_relaxed_distribution():
    B, V = 20000, 6
    p1 = torch.tensor([0.10, 0.25, 0.05, 0.20, 0.30, 0.10])
    nb = _ring_neighbors(V)
    x = 2
    tree = DraftTree.from_parents(torch.tensor([[0, x]]).expand(B, 2), torch.tensor([[-1, 0]]).expand(B, 2))
    res = verify_lantern(p1.expand(B, 2, V), tree, torch.Generator().manual_seed(3), nb,
                         k=4, delta=0.3)
    relaxed, moved = lantern_relaxed_distribution(p1[None], torch.tensor([x]), nb, k=4, delta=0.3)
    # neighbours of 2: 3 (.20), 1 (.25) -> c_1 = .20 <= .3 < c_2 = .45: m = 1, moved .20
    assert torch.isclose(moved, torch.tensor([0.20])).all()
    assert torch.allclose(relaxed[0], torch.tensor([0.10, 0.25, 0.25, 0.0, 0.30, 0.10]))
    assert torch.allclose(res.pos_tvd[:, 0], torch.tensor(0.20), atol=1e-6)
    assert chi2_pvalue(res.tokens[:, 0], relaxed[0]) > ALPHA


@settings(max_examples=60, deadline=None)
@given(V=st.integers(3, 16), seed=st.integers(0, 10_000), k_frac=st.floats(0.0, 1.0),
       delta=st.one_of(st.floats(0.0, 1.0), st.floats(1.0001, 3.0)), sharp=st.floats(0.1, 4.0))
def test_lantern_moves_at_most_delta(V, seed, k_frac, delta, sharp):
    g = torch.Generator().manual_seed(seed)
    B = 8
    p = torch.softmax(torch.randn(B, V, generator=g) * sharp, -1)
    p = torch.where(torch.rand(B, V, generator=g) < 0.2, 0.0, p)          # some zero mass
    p[:, 0] += 1e-3
    p = p / p.sum(-1, keepdim=True)
    nb = torch.stack([torch.cat([torch.randperm(V, generator=g)]) for _ in range(V)])
    nb = torch.stack([row[row != v] for v, row in enumerate(nb)])        # self excluded
    k = max(1, round(k_frac * (V - 1)))
    x = torch.randint(0, V, (B,), generator=g)
    relaxed, moved = lantern_relaxed_distribution(p, x, nb, k=k, delta=delta)
    bound = delta if delta <= 1 else (delta - 1) * p.gather(1, x[:, None])[:, 0]
    assert (moved <= bound + 1e-6).all()
    assert torch.allclose(tvd(p, relaxed), moved, atol=1e-5)
    assert torch.allclose(relaxed.sum(-1), torch.ones(B), atol=1e-5) and (relaxed >= 0).all()
    # the sampling rule at a single-draft node commits exactly the relaxed law
    tree = DraftTree.from_parents(torch.stack([torch.zeros(B, dtype=torch.long), x], 1),
                                  torch.tensor([[-1, 0]]).expand(B, 2))
    res = verify_lantern(p[:, None].expand(B, 2, V), tree, g, nb, k=k, delta=delta)
    assert torch.allclose(res.pos_tvd[:, 0], moved, atol=1e-5)


def test_lantern_greedy_hand_example():
    # root p = [.30, .25, .15, .05, .25]; children tokens [2, 3]; neighbours on a ring.
    V = 5
    nb = _ring_neighbors(V)          # nb[2] = [3, 1, 4, 0], nb[3] = [4, 2, 0, 1]
    tree = DraftTree.from_parents(torch.tensor([[0, 2, 3]]), torch.tensor([[-1, 0, 0]]))
    p = torch.tensor([0.30, 0.25, 0.15, 0.05, 0.25]).expand(1, 3, V).clone()
    # delta .1: x=2 merges 3 (.05; .05+.25 > .1): p(A) = .20 < .30 -> reject; x=3 merges 4? .25 > .1
    # no: p(A) = .05 -> reject. Bonus argmax = 0.
    r = verify_lantern_greedy(p, tree, nb, k=4, delta=0.1)
    assert r.accept_len.tolist() == [0] and r.bonus.tolist() == [0]
    # delta .3: x=2 merges 3 and 1 (.05 + .25 = .30 <= .3): p(A) = .45 >= max(.30, .25) -> accept
    r = verify_lantern_greedy(p, tree, nb, k=4, delta=0.3)
    assert r.path.tolist() == [[0, 1]] and r.tokens.tolist() == [[2, 0]]
    # delta 0 reduces to greedy
    tree2, p2 = _random_case(5)
    assert _same(verify_lantern_greedy(p2, tree2, _ring_neighbors(8), k=7, delta=0.0),
                 verify_greedy(p2, tree2))


# ----------------------------------------------------------------------------- GASV v2

def _gasv_inputs(tree, V, seed, K=3, zero_frac=0.3, delta=(0.05, 0.6)):
    """Synthetic per-node candidates (ring neighbours of the node token), gates and budgets."""
    g = torch.Generator().manual_seed(seed)
    B, N = tree.tokens.shape
    cand = _ring_neighbors(V)[tree.tokens.clamp(min=0)][..., :K].long()        # (B, N, K)
    gate = torch.rand(B, N, K, generator=g)
    gate = torch.where(torch.rand(B, N, K, generator=g) < zero_frac, 0.0, gate)
    d_eff = delta[0] + (delta[1] - delta[0]) * torch.rand(B, N, generator=g)
    return cand, gate, d_eff


def _naive_gasv_law(p, sibs, cand, gate, delta):
    """Law of the committed token at one node, straight from spec/lisa.md step 5 (float64)."""
    r = p.double().clone()
    law = torch.zeros_like(r)
    reach = 1.0
    for d, c, g in zip(sibs, cand, gate):
        w = torch.zeros_like(r)
        for v, gv in zip(c.tolist(), g.tolist()):
            w[v] += r[v] * gv
        M = float(w.sum())
        m = w * (min(1.0, delta / M) if M > 0 else 0.0)
        a = min(1.0, float(r[d] + m.sum()))
        law[d] += reach * a
        reach *= 1 - a
        r = (r - m).clamp(min=0)
        r[d] = 0
        r = r / r.sum()
    return law + reach * r


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gasv_zero_gates_or_zero_budget_is_exact(seed):
    tree, p = _random_case(seed)
    cand, gate, d_eff = _gasv_inputs(tree, 8, seed)
    a = verify_exact(p, tree, torch.Generator().manual_seed(seed))
    b = verify_gasv(p, tree, torch.Generator().manual_seed(seed), cand, torch.zeros_like(gate), d_eff)
    c = verify_gasv(p, tree, torch.Generator().manual_seed(seed), cand, gate, torch.zeros_like(d_eff))
    assert _same(a, b) and _same(a, c)
    assert b.pos_tvd.abs().max() < 1e-5 and c.pos_tvd.abs().max() < 1e-5
    d = verify_gasv(p, tree, torch.Generator().manual_seed(seed), cand, gate, d_eff)
    assert d.accept_len.sum() > a.accept_len.sum()       # the test has teeth: gates do accept more


def test_gasv_committed_token_law_matches_closed_form():
    """Sequential siblings with the residual: empirical first-token frequencies == the spec's law
    (chi-square, 4 siblings at the root), and pos_tvd == TVD(p, law)."""
    B, V = 20000, 6
    m = Markov(V, 4, seed=4)
    tree = _fixed_tree(B)
    p = m.probs(tree, torch.zeros(B, dtype=torch.long))
    cand, gate, d_eff = _gasv_inputs(tree, V, 7, K=4, zero_frac=0.2)
    cand, gate, d_eff = cand[:1].expand(B, -1, -1), gate[:1].expand(B, -1, -1), d_eff[:1].expand(B, -1)
    res = verify_gasv(p, tree, torch.Generator().manual_seed(9), cand, gate, d_eff)
    kids = tree.children()[0, 0]
    kids = kids[kids >= 0]
    law = _naive_gasv_law(p[0, 0], tree.tokens[0, kids].tolist(), cand[0, kids], gate[0, kids], float(d_eff[0, 0]))
    assert len(kids) >= 3
    assert chi2_pvalue(res.tokens[:, 0], law) > ALPHA
    assert chi2_pvalue(res.tokens[:, 0], p[0, 0]) < ALPHA                 # it is not p
    assert torch.allclose(res.pos_tvd[:, 0], tvd(p[0, 0].double(), law).float().expand(B), atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_gasv_single_sibling_tvd_is_at_most_delta_eff(seed):
    B, V = 256, 8
    g = torch.Generator().manual_seed(seed)
    t = preset_template("chain4")
    topk = torch.randint(0, V, (B, t.n_nodes, 4), generator=g)
    tree = static_tree_from_topk(t, torch.zeros(B, dtype=torch.long), topk)
    p = torch.softmax(torch.randn(B, t.n_nodes, V, generator=g) * 1.5, -1)
    cand, gate, d_eff = _gasv_inputs(tree, V, seed, K=5, zero_frac=0.0)
    res = verify_gasv(p, tree, torch.Generator().manual_seed(seed), cand, gate, d_eff)
    budget = d_eff.gather(1, res.path.clamp(min=0))                         # parent of each position
    assert (res.pos_tvd <= budget + 1e-5).all()
    assert res.pos_tvd.max() > 0.05


def test_gasv_greedy_with_zero_gates_is_greedy_and_gates_relax_it():
    for seed in (0, 3):
        tree, p = _random_case(seed)
        cand, gate, d_eff = _gasv_inputs(tree, 8, seed)
        a = verify_greedy(p, tree)
        b = verify_gasv_greedy(p, tree, cand, torch.zeros_like(gate), d_eff)
        assert _same(a, b)
        c = verify_gasv_greedy(p, tree, cand, gate, d_eff)
        assert (c.accept_len >= a.accept_len).all() and c.accept_len.sum() > a.accept_len.sum()
    # hand example: root children tokens [1, 2]; p = [.40, .35, .25 ...]: token 1 is not the argmax,
    # but its neighbour 0 lends it 0.1 (gate 1, delta 0.1): a = 0.45 >= max(0.30, 0.25) -> accepted
    tree = DraftTree.from_parents(torch.tensor([[5, 1, 2]]), torch.tensor([[-1, 0, 0]]))
    p = torch.tensor([0.40, 0.35, 0.25, 0.0, 0.0, 0.0]).expand(1, 3, 6).clone()
    cand = torch.tensor([[[0, -1], [0, -1], [0, -1]]])
    gate = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]])
    r = verify_gasv_greedy(p, tree, cand, gate, torch.full((1, 3), 0.1))
    assert r.path.tolist() == [[0, 1]] and r.tokens.tolist() == [[1, 0]]
    r = verify_gasv_greedy(p, tree, cand, gate, torch.full((1, 3), 0.02))   # 0.37 < 0.38: rejected
    assert r.accept_len.tolist() == [0] and r.bonus.tolist() == [0]


def test_modulated_lantern():
    tree, p = _random_case(0)
    nb = _ring_neighbors(8)
    logits = p.log()
    a = verify_lantern(p, tree, torch.Generator().manual_seed(0), nb, k=7, delta=0.2)
    same = lantern_delta_eff(logits, 0.2, 0.0)
    assert torch.allclose(same, torch.tensor(0.2))
    b = verify_lantern(p, tree, torch.Generator().manual_seed(0), nb, k=7, delta=0.2, delta_nodes=same)
    assert _same(a, b)
    mod = lantern_delta_eff(logits, 0.2, 1.0)
    assert (mod >= 0.2 - 1e-6).all() and (mod > 0.21).any() and (mod <= 0.4 + 1e-6).all()
    c = verify_lantern(p, tree, torch.Generator().manual_seed(0), nb, k=7, delta=0.2, delta_nodes=mod)
    assert c.accept_len.sum() >= a.accept_len.sum()
    g1 = verify_lantern_greedy(p, tree, nb, k=7, delta=0.2)
    assert _same(g1, verify_lantern_greedy(p, tree, nb, k=7, delta=0.2, delta_nodes=same))
    with pytest.raises(InputError):
        lantern_delta_eff(logits, 1.5, 1.0)


# ----------------------------------------------------------------------------- SJD

def test_sjd_first_token_law():
    B, V, W = 20000, 6, 3
    g = torch.Generator().manual_seed(21)
    p_prev = torch.softmax(torch.randn(W, V, generator=g), -1).expand(B, W, V)
    p_now = torch.softmax(torch.randn(W, V, generator=g), -1).expand(B, W, V)
    drafts = torch.multinomial(p_prev.reshape(-1, V), 1, generator=g).view(B, W)
    res = sjd_accept(p_now, p_prev, drafts, g)
    first = torch.where(res.accept_len > 0, drafts[:, 0], res.token)
    assert chi2_pvalue(first, p_now[0, 0]) > ALPHA
    # slot 1 given slot 0 accepted (context-free toy): again distributed as p_now[1]
    ok = res.accept_len > 0
    second = torch.where(res.accept_len[ok] > 1, drafts[ok, 1], res.token[ok])
    assert chi2_pvalue(second, p_now[0, 1]) > ALPHA
    assert (res.token[res.accept_len == W] == -1).all()
    assert ((res.token >= 0) == (res.accept_len < W)).all()


def test_sjd_identical_distributions_accept_all():
    p = torch.softmax(torch.randn(5, 4, 7), -1)
    res = sjd_accept(p, p.clone(), torch.multinomial(p.view(-1, 7), 1).view(5, 4), None)
    assert (res.accept_len == 4).all() and (res.token == -1).all()
