"""Exactness of the target: cached == teacher forced, tree == sequential, RoPE facts."""

import math

import pytest
import torch

from lisa_trt import LisaError, generate
from lisa_trt.models.rope import apply_rotary_emb, precompute_freqs_cis_2d
from lisa_trt.speculative.autoregressive import step_inputs
from lisa_trt.testing import make_cond, make_target


def cached_logits(model, cond, tokens):
    cache = model.new_cache(tokens.shape[0])
    outs = [model.prefill(cond, cache).logits]
    for i in range(tokens.shape[1] - 1):
        x = tokens[:, i: i + 1]
        pos, slots, mask = step_inputs(cache, x)
        outs.append(model.forward_tokens(x, pos, slots, mask, cache).logits)
        cache.lengths += 1
    return torch.cat(outs, 1), cache


@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
def test_cached_decode_equals_teacher_forced(model_type):
    m = make_target(model_type)
    cond = make_cond(m, batch=3)
    tokens = torch.randint(0, m.config.vocab_size, (3, m.config.block_size))
    ref = m.teacher_forced_logits(cond, tokens)
    with torch.no_grad():
        got, _ = cached_logits(m, cond, tokens)
    assert ref.dtype == torch.float32 and ref.shape == (3, 16, m.config.vocab_size)
    assert (got - ref).abs().max() < 1e-5
    assert ref.std() > 0.1  # non-trivial logits, so the comparison means something


def test_rope_table_facts():
    g, D, T = 4, 16, 3
    f = precompute_freqs_cis_2d(g, D, 10000.0, T)
    assert f.shape == (T + g * g, D // 2, 2)
    assert torch.all(f[:T] == 0)  # zero rows (cos AND sin) for the prefix
    half = D // 2
    freqs = [10000.0 ** (-(2 * k) / half) for k in range(half // 2)]
    for i in range(g * g):
        r, c = divmod(i, g)  # row-major cells; first half of the pairs uses the row
        ang = [r * w for w in freqs] + [c * w for w in freqs]
        exp = torch.tensor([[math.cos(a), math.sin(a)] for a in ang])
        assert torch.allclose(f[T + i], exp, atol=1e-6)


def test_rope_rotates_adjacent_pairs():
    x = torch.arange(8.0).reshape(1, 1, 1, 8)
    ang = torch.tensor([0.3, 0.7, 1.1, 1.9])
    f = torch.stack([ang.cos(), ang.sin()], -1)[None, None]
    y = apply_rotary_emb(x, f)[0, 0, 0]
    for j in range(4):
        x0, x1 = x[0, 0, 0, 2 * j], x[0, 0, 0, 2 * j + 1]
        assert torch.isclose(y[2 * j], x0 * ang[j].cos() - x1 * ang[j].sin())
        assert torch.isclose(y[2 * j + 1], x1 * ang[j].cos() + x0 * ang[j].sin())


@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
def test_prefix_q_k_exactly_zero(model_type):
    m = make_target(model_type)
    cond = make_cond(m)
    seen = {}

    def hook(mod, args, out):
        seen["q"] = out

    T = m.config.cls_token_num
    x = torch.randn(2, T, 4, m.config.head_dim)
    rot = apply_rotary_emb(x, m.freqs_cis[:T][None])
    assert torch.count_nonzero(rot) == 0
    cache = m.new_cache(2)
    with torch.no_grad():
        m.prefill(cond, cache)
    for k in cache.k:
        assert torch.count_nonzero(k[:, :, :T]) == 0  # prefix keys are exactly zero
    assert all(torch.count_nonzero(v[:, :, :T]) > 0 for v in cache.v)  # values carry the condition


@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
def test_tree_masked_forward_equals_sequential_branches(model_type):
    """One forward over a tree (several branches) == decoding each branch on its own."""
    m = make_target(model_type)
    cond = make_cond(m, batch=2)
    V = m.config.vocab_size
    prefix = torch.randint(0, V, (2, 5))
    # tree: root r; children a, b; a -> c, a -> d; b -> e. Topological order [r, a, b, c, d, e].
    parents = [-1, 0, 0, 1, 1, 2]
    S = len(parents)
    anc = torch.zeros(S, S, dtype=torch.bool)
    for i in range(S):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = parents[j]
    depth = anc.sum(1) - 1
    tree_tokens = torch.randint(0, V, (2, S))
    with torch.no_grad():
        _, cache = cached_logits(m, cond, prefix)  # prefix[:, :-1] cached; prefix[:, -1] pending
        # the tree root is the last committed token (not yet in the cache)
        tree_tokens[:, 0] = prefix[:, -1]
        L = cache.lengths.clone()
        slots = L[:, None] + torch.arange(S)[None]
        pos = L[:, None] + depth[None]
        mask = cache.attention_mask(slots, anc[None].expand(2, S, S))
        tree_logits = m.forward_tokens(tree_tokens, pos, slots, mask, cache).logits
    for leaf in [3, 4, 5]:
        path = [i for i in range(S) if anc[leaf, i]]
        seq = torch.cat([prefix[:, :-1], tree_tokens[:, path]], 1)
        ref = m.teacher_forced_logits(cond, torch.cat([seq, seq[:, :1]], 1))
        start = prefix.shape[1] - 1 + 1  # logits index of the root position + 1
        for k, node in enumerate(path):
            assert (tree_logits[:, node] - ref[:, start + k]).abs().max() < 1e-5


def test_compaction_matches_sequential_cache():
    m = make_target("c2i")
    cond = make_cond(m, batch=2)
    V = m.config.vocab_size
    toks = torch.randint(0, V, (2, 8))
    with torch.no_grad():
        _, ref_cache = cached_logits(m, cond, torch.cat([toks, toks[:, :1]], 1))
        _, cache = cached_logits(m, cond, toks[:, :3])  # committed: prefix + toks[:, :2]
        # write a "tree" of 4 nodes: [toks2, junk, toks3, toks4] (root toks2; accept slots 0,2,3 for row 0)
        junk = torch.randint(0, V, (2, 1))
        nodes = torch.cat([toks[:, 2:3], junk, toks[:, 3:5]], 1)
        parents = [-1, 0, 0, 2]
        anc = torch.zeros(4, 4, dtype=torch.bool)
        for i in range(4):
            j = i
            while j >= 0:
                anc[i, j] = True
                j = parents[j]
        depth = anc.sum(1) - 1
        L = cache.lengths.clone()
        slots = L[:, None] + torch.arange(4)
        m.forward_tokens(nodes, L[:, None] + depth, slots, cache.attention_mask(slots, anc[None].expand(2, 4, 4)), cache)
        src = torch.stack([slots[0, [0, 2, 3]], slots[1, [0, 2, 3]]])
        counts = torch.tensor([3, 1])  # row 1 accepts only the root
        cache.compact(src, counts)
    assert cache.lengths.tolist() == [L[0].item() + 3, L[1].item() + 1]
    for b, n in enumerate(cache.lengths.tolist()):
        for k, kr in zip(cache.k + cache.v, ref_cache.k + ref_cache.v):
            assert (k[b, :, :n] - kr[b, :, :n]).abs().max() < 1e-5


def test_taps_are_layer_inputs():
    m = make_target("c2i", n_layer=8)
    assert m.config.tap_layers == (2, 4, 5)
    cond = make_cond(m)
    toks = torch.randint(0, 256, (2, 16))
    ins = {}
    hooks = [layer.register_forward_pre_hook(lambda mod, a, i=i: ins.__setitem__(i, a[0]))
             for i, layer in enumerate(m.layers)]
    with torch.no_grad():
        out = m.forward_train(cond, toks, taps=True)
    for h in hooks:
        h.remove()
    H = m.config.dim
    assert out.taps.shape == (2, 16, 3 * H)
    for j, layer in enumerate((2, 4, 5)):
        assert torch.equal(out.taps[..., j * H:(j + 1) * H], ins[layer][:, 0:])
    assert torch.allclose(m.output(out.hidden).float(), out.logits)


def test_bad_conditions_are_clear_errors():
    m = make_target("c2i")
    with pytest.raises(LisaError, match="unknown class id 11"):
        generate(m, torch.tensor([1, 11]))
    t = make_target("t2i")
    with pytest.raises(LisaError, match=r"expected \(B, 6, 12\)"):
        generate(t, (torch.randn(1, 6, 7), torch.ones(1, 6)))
    with pytest.raises(LisaError, match="NaN"):
        generate(t, (torch.full((1, 6, 12), float("nan")), torch.ones(1, 6)))
