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


def test_the_draft_rounds_inputs_compile_without_a_graph_break():
    """The per-step frame of the EAGLE-2 expansions (slots, positions, token indices, the committed
    columns) and a round's parent gather and mask compile whole, and give the eager outputs and
    KVCache.attention_mask's mask (both CFG halves)."""
    from lisa_trt.models.drafter import Drafter
    from lisa_trt.speculative.decode import SpeculativeDecoder, _DraftFrame
    from lisa_trt.speculative.tree import ExpandRequest
    from lisa_trt.testing import make_target

    torch.manual_seed(0)
    dcache = Drafter.from_target(make_target()).new_cache(2 * B, 48)
    dcache.lengths.copy_(torch.tensor([5, 7, 5, 7]))
    consts = SpeculativeDecoder(None, None)._frame_consts(3, 2, torch.device("cpu"))
    g = torch.Generator().manual_seed(4)
    h = torch.randn(2 * B, 3, 8, generator=g)
    parent = torch.randint(0, 3, (B, 3), generator=g)
    req = ExpandRequest(torch.zeros(B, 3, dtype=torch.long), parent, 2, torch.rand(B, 3, 6, generator=g) < 0.5, 3)

    def rounds(root_pos, n_done, h, parent_slot):
        fr = _DraftFrame.make(consts, dcache, root_pos, n_done, 40, 2)
        return fr.slots, fr.pos, fr.token_index, fr.gather_parents(h, parent_slot), fr.mask(req)

    args = (torch.tensor([9, 11, 9, 11]), torch.tensor([4, 6]), h, parent)
    want = rounds(*args)
    have = torch.compile(rounds, fullgraph=True, backend="eager")(*args)
    for a, b in zip(have, want):
        assert torch.equal(a, b)
    flat = dcache.lengths[:, None] + torch.arange(6)                        # the 2 rounds' slots (CFG rows)
    assert torch.equal(want[0], flat.view(2 * B, 2, 3).transpose(0, 1))
    assert torch.equal(want[1], (args[0][None, :, None] + torch.tensor([1, 2])[:, None, None]).expand(2, 2 * B, 3))
    assert torch.equal(want[2], (args[1][None, :, None] + torch.tensor([1, 2])[:, None, None]).expand(2, B, 3))
    anc = torch.zeros(2 * B, 6, 6, dtype=torch.bool)
    anc[:, 3:] = req.mask.repeat(2, 1, 1)                                   # round 2's rows
    assert torch.equal(want[4], dcache.attention_mask(flat, anc)[:, 3:])
    assert torch.equal(want[3], torch.cat([h[:B].gather(1, parent[..., None].expand(-1, -1, 8)),
                                           h[B:].gather(1, parent[..., None].expand(-1, -1, 8))]))
