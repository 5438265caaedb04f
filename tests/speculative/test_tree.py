"""Draft trees: hand-checked buffers, EAGLE-2 dynamic trees against a plain reference, static
trees, truncation. Proves the buffers the decode loop feeds to the target are right."""

from __future__ import annotations

import math

import pytest
import torch

from lisa_trt.errors import ConfigError, InputError
from lisa_trt.speculative.tree import (PRESET_TREES, DraftTree, ExpandRequest, build_dynamic_tree,
                                       build_static_tree, likely_tree_paths, preset_template,
                                       sample_without_replacement, static_tree_from_topk,
                                       tree_template)

PATHS = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
#        node:  0 root, 1 [0], 2 [1], 3 [0,0], 4 [0,1], 5 [1,0], 6 [0,0,0]


def _hand_tree(B=2):
    t = tree_template(PATHS)
    topk = torch.arange(B * 7 * 2).view(B, 7, 2)           # node n's candidates: 2n, 2n+1 (+14b)
    return static_tree_from_topk(t, torch.tensor([100, 200])[:B], topk,
                                 topk_logprobs=-torch.arange(B * 7 * 2).view(B, 7, 2).float())


def test_hand_checked_static_tree_buffers():
    tr = _hand_tree()
    assert tr.parents[0].tolist() == [-1, 0, 0, 1, 1, 2, 3]
    assert tr.depths[0].tolist() == [0, 1, 1, 2, 2, 2, 3]
    # token = topk[parent, rank]: node 1 = topk[0,0]=0, node 2 = topk[0,1]=1, node 3 = topk[1,0]=2,
    # node 4 = topk[1,1]=3, node 5 = topk[2,0]=4, node 6 = topk[3,0]=6
    assert tr.tokens[0].tolist() == [100, 0, 1, 2, 3, 4, 6]
    assert tr.tokens[1].tolist() == [200, 14, 15, 16, 17, 18, 20]
    expected_anc = [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0],
        [1, 0, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 0, 1],
    ]
    assert tr.ancestors[0].int().tolist() == expected_anc
    assert tr.retrieve[0].tolist() == [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]]
    assert tr.children()[0].tolist() == [[1, 2], [3, 4], [5, -1], [6, -1],
                                         [-1, -1], [-1, -1], [-1, -1]]
    assert tr.positions(torch.tensor([10, 3]))[1].tolist() == [3, 4, 4, 5, 5, 5, 6]
    # logprobs = topk_logprobs[parent, rank]; scores = cumulative along the path
    assert tr.logprobs[0].tolist() == [0, 0, -1, -2, -3, -4, -6]
    assert tr.scores[0].tolist() == [0, 0, -1, -2, -3, -5, -8]
    assert tr.max_depth == 3


def test_truncate_per_row():
    tr = _hand_tree().truncate(torch.tensor([1, 2]))
    assert tr.valid[0].tolist() == [True, True, True, False, False, False, False]
    assert tr.valid[1].tolist() == [True] * 6 + [False]
    assert tr.retrieve[0].tolist() == [[0, 1, -1], [0, 2, -1], [-1, -1, -1]]
    assert tr.retrieve[1].tolist() == [[0, 1, 3], [0, 1, 4], [0, 2, 5]]
    assert tr.ancestors[0, 6].int().tolist() == [0, 0, 0, 0, 0, 0, 1]    # invalid: self only
    assert tr.positions(torch.tensor([10, 3]))[0].tolist() == [10, 11, 11, 10, 10, 10, 10]
    assert tr.children()[0, 1].tolist() == [-1, -1]
    root_only = _hand_tree().truncate(-1)
    assert root_only.valid.sum().item() == 2 and root_only.max_depth == 0


def test_template_errors_and_presets():
    with pytest.raises(InputError, match="prefix-closed"):
        tree_template([[0], [0, 1, 0]])
    with pytest.raises(InputError, match="distinct"):
        tree_template([[0], [0]])
    with pytest.raises(ConfigError, match="chain4"):
        preset_template("nope")
    for name, paths in PRESET_TREES.items():
        t = preset_template(name)
        assert t.n_nodes == len(paths) + 1 == int(name.lstrip("abcdefghijklmnopqrstuvwxyz_")) + 1
        assert (t.parents[1:] < torch.arange(1, t.n_nodes)).all()
    mc = likely_tree_paths([0.5, 0.2, 0.1], 6, 3)
    assert mc == [[0], [0, 0], [1], [0, 0, 0], [0, 1], [1, 0]]


def test_from_parents_refuses_bad_trees():
    tok = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(InputError, match="topological"):
        DraftTree.from_parents(tok, torch.tensor([[-1, 2, 0]]))
    with pytest.raises(InputError, match="root"):
        DraftTree.from_parents(tok, torch.tensor([[0, 0, 0]]))
    with pytest.raises(InputError, match="invalid parent"):
        DraftTree.from_parents(tok, torch.tensor([[-1, 0, 1]]),
                               valid=torch.tensor([[True, False, True]]))


# ----------------------------------------------------------------------------- dynamic trees

def _markov_drafter(table, root_pos=None):
    """Fake drafter: log q(. | node) = log_softmax(table[token]); records the requests."""
    calls = []

    def expand(req: ExpandRequest):
        calls.append(req)
        return torch.log_softmax(table[req.tokens], dim=-1)
    return expand, calls


def test_dynamic_tree_hand_checked():
    # root q = [.5, .25, .15, .10]; q(.|0) = [.1, .2, .6, .1]; q(.|1) = [.7, .05, .15, .1]
    root = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.10]]))
    table = torch.log(torch.tensor([[0.1, 0.2, 0.6, 0.1], [0.7, 0.05, 0.15, 0.1],
                                    [0.25] * 4, [0.25] * 4]))
    expand, calls = _markov_drafter(table)
    tr = build_dynamic_tree(torch.tensor([3]), root, expand, top_k=2, depth=1, total_tokens=5)
    # candidates: c0 tok0 .5 | c1 tok1 .25 | c2 (c0) tok2 .30 | c3 (c0) tok1 .10 |
    #             c4 (c1) tok0 .175 | c5 (c1) tok2 .0375 ; best 4 = c0, c2, c1, c4
    assert tr.tokens[0].tolist() == [3, 0, 1, 2, 0]
    assert tr.parents[0].tolist() == [-1, 0, 0, 1, 2]
    assert torch.allclose(tr.scores[0].exp(), torch.tensor([1, 0.5, 0.25, 0.3, 0.175]))
    assert len(calls) == 1 and calls[0].tokens.tolist() == [[0, 1]]
    assert calls[0].depth == 1 and calls[0].slot_offset == 0
    assert calls[0].parent_slot.tolist() == [[0, 0]]
    assert calls[0].mask[0].int().tolist() == [[1, 0], [0, 1]]


def _reference_eagle2(root_lp, table, K, depth, M):
    """Plain-Python EAGLE-2 for one row (docs/spec/speculative.md), Markov drafter."""
    cands = []   # (score, token, parent_cand, logprob)
    beam = []
    for t in torch.topk(root_lp, K).indices.tolist():
        cands.append((root_lp[t].item(), t, -1))
        beam.append(len(cands) - 1)
    for rnd in range(depth):
        new = []
        for bc in beam:
            lp = torch.log_softmax(table[cands[bc][1]], -1)
            for t in torch.topk(lp, K).indices.tolist():
                cands.append((cands[bc][0] + lp[t].item(), t, bc))
                new.append(len(cands) - 1)
        beam = sorted(new, key=lambda c: (-cands[c][0], c))[:K]
    keep = sorted(sorted(range(len(cands)), key=lambda c: (-cands[c][0], c))[:M])
    node = {c: i + 1 for i, c in enumerate(keep)}
    return [cands[c][1] for c in keep], [0 if cands[c][2] < 0 else node[cands[c][2]] for c in keep]


@pytest.mark.parametrize("K,depth,total", [(2, 2, 9), (3, 3, 20), (4, 2, 12), (3, 0, 3)])
def test_dynamic_tree_matches_reference(K, depth, total):
    g = torch.Generator().manual_seed(K * 10 + depth)
    V, B = 12, 3
    table = torch.randn(V, V, generator=g) * 2
    root_lp = torch.log_softmax(torch.randn(B, V, generator=g) * 2, -1)
    expand, calls = _markov_drafter(table)
    tr = build_dynamic_tree(torch.arange(B), root_lp, expand, top_k=K, depth=depth,
                            total_tokens=total)
    assert tr.tokens.shape == (B, total) and len(calls) == depth
    for b in range(B):
        toks, pars = _reference_eagle2(root_lp[b], table, K, depth, total - 1)
        assert tr.tokens[b, 1:].tolist() == toks
        assert tr.parents[b, 1:].tolist() == pars
    # invariants: topological, scores consistent, siblings in descending draft log-prob
    assert (tr.parents[:, 1:] < torch.arange(1, total)).all()
    par_scores = tr.scores.gather(1, tr.parents.clamp(min=0))
    assert torch.allclose(tr.scores[:, 1:], (par_scores + tr.logprobs)[:, 1:], atol=1e-5)
    kids = tr.children()
    lp_kids = torch.where(kids >= 0, tr.logprobs.gather(1, kids.clamp(min=0).flatten(1))
                          .view_as(kids), -math.inf)
    assert (lp_kids[..., 1:] <= lp_kids[..., :-1]).all()
    # requests: each call's mask is the ancestor relation among the fed nodes, parent_slot
    # points at a node of the previous call that is the parent in the mask.
    for r, req in enumerate(calls):
        assert req.mask.shape == (B, K, (r + 1) * K) and req.slot_offset == r * K
        assert req.mask[:, :, r * K:].equal(torch.eye(K, dtype=torch.bool).expand(B, K, K))
        if r:
            prev = calls[r - 1]
            par_col = prev.slot_offset + req.parent_slot
            assert req.mask.gather(2, par_col[:, :, None]).all()
            # ancestors of a node = its parent's ancestors + itself
            pm = prev.mask.gather(1, req.parent_slot[:, :, None].expand(B, K, prev.mask.shape[-1]))
            assert req.mask[:, :, :r * K].equal(pm)


def test_dynamic_tree_refuses_bad_budget():
    expand, _ = _markov_drafter(torch.zeros(4, 4))
    with pytest.raises(InputError, match="total_tokens"):
        build_dynamic_tree(torch.zeros(1, dtype=torch.long), torch.zeros(1, 4), expand,
                           top_k=2, depth=1, total_tokens=8)


def test_dynamic_tree_expand_shape_checked():
    with pytest.raises(InputError, match="expand_fn"):
        build_dynamic_tree(torch.zeros(1, dtype=torch.long), torch.log_softmax(torch.randn(1, 5), -1),
                           lambda req: torch.zeros(1, 5), top_k=2, depth=1, total_tokens=4)


# ----------------------------------------------------------------------------- static builder

def test_build_static_tree_topk_matches_fill():
    g = torch.Generator().manual_seed(1)
    V, B = 10, 2
    table = torch.randn(V, V, generator=g)
    root_lp = torch.log_softmax(torch.randn(B, V, generator=g), -1)
    t = preset_template("tree15")
    expand, calls = _markov_drafter(table)
    tr = build_static_tree(t, torch.tensor([3, 4]), root_lp, expand)
    # reference: candidates at every node = top-k of the Markov drafter at that node's token
    for b in range(B):
        for n in range(1, t.n_nodes):
            par = int(t.parents[n])
            lp = root_lp[b] if par == 0 else torch.log_softmax(table[tr.tokens[b, par]], -1)
            assert tr.tokens[b, n] == torch.topk(lp, 4).indices[int(t.ranks[n])]
            assert torch.isclose(tr.logprobs[b, n], lp[tr.tokens[b, n]])
    assert [c.depth for c in calls] == [1, 2, 3]
    for c in calls:       # nodes fed are the non-leaves of each depth; mask = tree ancestors
        n = c.tokens.shape[1]
        assert c.mask.shape == (B, n, c.slot_offset + n)


def test_build_static_tree_sampled_children_distinct_and_q_kept():
    g = torch.Generator().manual_seed(2)
    V, B = 6, 50
    table = torch.randn(V, V, generator=g)
    root_lp = torch.log_softmax(torch.randn(B, V, generator=g), -1)
    expand, _ = _markov_drafter(table)
    tr = build_static_tree(preset_template("tree15"), torch.zeros(B, dtype=torch.long), root_lp,
                           expand, sample=True, generator=g)
    kids = tr.children()
    for b in range(B):
        for n in range(tr.n_nodes):
            ks = [int(k) for k in kids[b, n] if k >= 0]
            toks = tr.tokens[b, ks].tolist()
            assert len(set(toks)) == len(toks)
    assert torch.allclose(tr.child_q[:, 0], root_lp.exp(), atol=1e-6)


def test_sample_without_replacement_first_draw_law():
    g = torch.Generator().manual_seed(3)
    q = torch.tensor([0.5, 0.3, 0.15, 0.05])
    draws = sample_without_replacement(q.expand(40000, 4), 2, g)
    first = torch.bincount(draws[:, 0], minlength=4).float() / 40000
    assert torch.allclose(first, q, atol=0.01)
    # second draw given first = 0 is q without 0, renormalised
    sec = draws[draws[:, 0] == 0, 1]
    emp = torch.bincount(sec, minlength=4).float() / len(sec)
    assert torch.allclose(emp, torch.tensor([0, 0.6, 0.3, 0.1]), atol=0.02)


def test_cached_structure_and_noop_truncate_match_a_fresh_computation():
    """Small trees reuse their shape's buffers across steps; they must equal a fresh build."""
    from lisa_trt.speculative import tree as T

    tr = _hand_tree()
    T._STRUCTURES.clear()
    fresh = DraftTree.from_parents(tr.tokens, tr.parents, logprobs=tr.logprobs)   # computes, caches
    again = DraftTree.from_parents(tr.tokens, tr.parents, logprobs=tr.logprobs)   # cache hit
    T._STRUCTURES.clear()
    old = T._CACHE_NODES
    T._CACHE_NODES = 0                                                             # no cache at all
    try:
        plain = DraftTree.from_parents(tr.tokens, tr.parents, logprobs=tr.logprobs)
        plain_cut = plain.truncate(torch.tensor([1, 2]))
    finally:
        T._CACHE_NODES = old
    for t in (fresh, again):
        for name in ("depths", "ancestors", "valid", "retrieve", "scores"):
            assert torch.equal(getattr(t, name), getattr(plain, name)), name
        assert torch.equal(t.children(), T.children_table(plain.parents, plain.valid))
    assert plain.kids is None and again.kids is not None
    assert fresh.truncate(3) is fresh                        # nothing deeper than 3: the same tree
    cut = fresh.truncate(torch.tensor([1, 2]))               # hides nodes: a new, consistent tree
    for name in ("valid", "ancestors", "retrieve", "depths"):
        assert torch.equal(getattr(cut, name), getattr(plain_cut, name)), name
    assert torch.equal(cut.children(), plain_cut.children())


def test_compact_moves_only_what_changes_with_the_same_visible_cache():
    """KVCache.compact skips entries already in place; the visible cache equals a full copy."""
    from lisa_trt.models.layers import KVCache
    from lisa_trt.families.llamagen.model import TargetConfig

    cfg = TargetConfig(vocab_size=64, n_layer=2, n_head=2, dim=16, block_size=16, num_classes=4)
    g = torch.Generator().manual_seed(0)
    for src_rows, counts in (([[5, 6, 7], [5, 7, 9]], [2, 3]), ([[5, 6, 0], [5, 6, 7]], [2, 3]),
                             ([[5, 8, 9], [5, 6, 7]], [3, 1])):
        a = KVCache(cfg, 2, 24, torch.float32, "cpu")
        for buf in a.k + a.v:
            buf.copy_(torch.randn(buf.shape, generator=g))
        a.lengths.fill_(5)
        b_k, b_v = [t.clone() for t in a.k], [t.clone() for t in a.v]
        src, cnt = torch.tensor(src_rows), torch.tensor(counts)
        a.compact(src, cnt)
        for ref, got in zip(b_k + b_v, a.k + a.v):  # reference: copy every entry
            for r in range(2):
                ref[r, :, 5:5 + 3] = ref[r, :, src[r]].clone()
            for r in range(2):
                n = 5 + int(cnt[r])
                assert torch.equal(got[r, :, :n], ref[r, :, :n])
        assert a.lengths.tolist() == [5 + c for c in counts]
