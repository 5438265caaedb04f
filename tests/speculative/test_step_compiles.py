"""The tree step between engine calls has no host read left (issue 49), so it traces whole: the
verification walk (exact and GASV rules) and the fixed-shape tree structure compile with
torch.compile(fullgraph=True) (a graph break would raise), and give the eager outputs."""

import pytest
import torch

from lisa_trt.speculative import verify as V
from lisa_trt.speculative.tree import DraftTree, build_dynamic_tree

B, VOCAB, K, DEPTH, TOTAL = 2, 32, 2, 1, 4


def _tree():
    g = torch.Generator().manual_seed(0)

    def expand(req):
        return torch.log_softmax(torch.randn(B, req.tokens.shape[1], VOCAB, generator=g), -1)

    root = torch.log_softmax(torch.randn(B, VOCAB, generator=g), -1)
    return build_dynamic_tree(torch.zeros(B, dtype=torch.long), root, expand, top_k=K, depth=DEPTH, total_tokens=TOTAL)


def _rules(tree):
    g = torch.Generator().manual_seed(1)
    cand = torch.randint(0, VOCAB, (B, tree.n_nodes, 3), generator=g)
    gate = torch.rand(B, tree.n_nodes, 3, generator=g)
    return {"exact": V.ExactRule(), "gasv": V.GASVRule(cand, gate, torch.full((B, tree.n_nodes), 0.3))}


@pytest.mark.parametrize("rule", ["exact", "gasv"])
def test_verification_walk_compiles_without_a_graph_break(rule):
    tree = _tree()
    p = torch.softmax(torch.randn(B, tree.n_nodes, VOCAB, generator=torch.Generator().manual_seed(2)), -1)
    u = torch.Generator().manual_seed(3)
    r = _rules(tree)[rule]

    def walk(p, tokens, parents):
        t = DraftTree.from_parents(tokens, parents, static=(DEPTH + 1, K))
        res = V.verify_tree(p, t, None, r)
        return res.tokens, res.accept_len, res.path

    compiled = torch.compile(walk, fullgraph=True, backend="eager")  # tracing is the point, not codegen
    for _ in range(3):
        seed = int(torch.randint(0, 1000, (1,), generator=u))
        torch.manual_seed(seed)
        want = walk(p, tree.tokens, tree.parents)
        torch.manual_seed(seed)
        have = compiled(p, tree.tokens, tree.parents)
        for a, b in zip(have, want):
            assert torch.equal(a, b)
