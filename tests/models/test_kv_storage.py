"""One K/V storage for every layer (issue 49): KVCache.kv (2, n_layer, B, H, L, D) with contiguous
per-layer views k[i] / v[i] (what the engines bind by pointer), a compaction and a commit that are
one write for all layers (their op count does not grow with the layers), the same contents as the
per-layer writes, a prefill with gradients enabled, and the per-layer path for buffers assigned
from outside (the export shims)."""

from __future__ import annotations


import pytest
import torch

from lisa_trt.families.llamagen.config import tiny_config
from lisa_trt.models.drafter import Drafter, DrafterCache
from lisa_trt.models.layers import KVCache, commit_rows, kv_cache_shape
from lisa_trt.testing import make_target



def _cache(n_layer=3, B=2, L=16, seed=0):
    cfg = tiny_config(n_layer=n_layer)
    c = KVCache(cfg, B, L, torch.float32, "cpu")
    c.kv.copy_(torch.randn(c.kv.shape, generator=torch.Generator().manual_seed(seed)))
    return cfg, c


def test_one_storage_with_contiguous_per_layer_views():
    cfg, c = _cache()
    assert tuple(c.kv.shape) == kv_cache_shape(cfg, 2, 16)
    assert len(c.k) == len(c.v) == cfg.n_layer
    for i in range(cfg.n_layer):
        for part, bufs in ((0, c.k), (1, c.v)):
            assert bufs[i].is_contiguous() and bufs[i].data_ptr() == c.kv[part, i].data_ptr()
    c.k[1][0, 0, 3, 0] = 7.0                         # a write through a view is a write to the storage
    assert c.kv[0, 1, 0, 0, 3, 0] == 7.0
    dcfg = Drafter.from_target(make_target()).config
    d = DrafterCache(dcfg, 2, 16, torch.float32, "cpu")
    assert d.kv.shape[:2] == (2, 1) and d.k[0].data_ptr() == d.kv.data_ptr()
    assert dcfg.cls_token_num >= 1 and not d.col_valid[:, : dcfg.cls_token_num].any()  # the prefix: invalid


def test_compact_equals_per_layer_copies():
    _, c = _cache()
    c.lengths = torch.tensor([5, 7])
    src, counts = torch.tensor([[9, 11, 10], [7, 13, 0]]), torch.tensor([3, 2])
    want = c.kv.clone()
    for b in range(2):
        rows = want[..., b, :, src[b], :].clone()
        want[..., b, :, 5 + 2 * b: 5 + 2 * b + 3, :] = rows
    c.compact(src, counts)
    assert c.lengths.tolist() == [8, 9]
    for b, n in ((0, 8), (1, 9)):                    # the visible prefix; padding past it is unread
        assert torch.equal(c.kv[..., b, :, :n, :], want[..., b, :, :n, :])


def test_commit_equals_commit_rows_per_layer():
    cfg, c = _cache()
    ref = c.kv.clone()
    slots = torch.tensor([[4, 5], [9, 2]])
    g = torch.Generator().manual_seed(1)
    k_rows = [torch.randn(2, cfg.kv_heads, 2, cfg.head_dim, generator=g) for _ in range(cfg.n_layer)]
    v_rows = [torch.randn(2, cfg.kv_heads, 2, cfg.head_dim, generator=g) for _ in range(cfg.n_layer)]
    c.commit(k_rows, v_rows, slots)
    for i in range(cfg.n_layer):
        commit_rows(ref[0, i], k_rows[i], slots)
        commit_rows(ref[1, i], v_rows[i], slots)
    assert torch.equal(c.kv, ref)


def _ops(bench, fn) -> int:
    b = bench.StepBudget(count=True)
    with b:
        fn()
    return b.cur["glue_ops"]


def test_compact_and_commit_ops_do_not_grow_with_the_layers(bench):
    """One write for all layers: the same op count for 1 and 8 layers (a per-layer loop adds ops
    per layer)."""
    counts = {}
    for n in (1, 8):
        cfg, c = _cache(n_layer=n)
        rows = [torch.zeros(2, cfg.kv_heads, 3, cfg.head_dim) for _ in range(n)]
        slots = torch.tensor([[6, 7, 8], [6, 7, 8]])
        counts[n] = (_ops(bench, lambda: c.compact(torch.tensor([[1, 2, 3], [3, 2, 1]]), torch.tensor([2, 3]))),
                     _ops(bench, lambda: c.commit(rows, rows, slots)))
    assert counts[1] == counts[8], counts
    assert counts[8][0] <= 6, counts    # clamp, add, clamp, gather, scatter, lengths +=


def test_a_prefill_with_gradients_then_a_step():
    """A forward with autograd on (training / tests of a model) writes every layer's view of the one
    storage; the gradient reaches the call's own keys and values, the cache holds plain values."""
    t = make_target()
    cache = t.new_cache(1, 24)
    cond = torch.tensor([1])
    out = t.prefill(cond, cache)
    assert not cache.kv.requires_grad
    slots = cache.lengths[:, None] + torch.arange(2)[None]
    mask = cache.attention_mask(slots, torch.ones(1, 2, 2, dtype=torch.bool).tril())
    with torch.enable_grad():
        step = t.forward_tokens(torch.tensor([[3, 4]]), cache.positions(slots), slots, mask, cache)
        step.logits.sum().backward()
    assert not cache.kv.requires_grad and cache.kv.grad_fn is None
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in t.parameters())
    with torch.no_grad():  # the cache holds the step's rows: the same logits without a gradient
        again = t.forward_tokens(torch.tensor([[3, 4]]), cache.positions(slots), slots, mask, cache)
    assert torch.allclose(again.logits, step.logits.detach(), atol=1e-6)
    assert out.logits.shape[0] == 1


def test_assigned_buffers_detach_from_the_storage_and_still_compact():
    """The export shims assign their own per-layer buffers: kv is then None and compact /
    select_rows / commit work layer by layer on those buffers."""
    cfg, c = _cache(n_layer=2)
    bufs_k = [torch.randn(2, cfg.kv_heads, 16, cfg.head_dim) for _ in range(2)]
    bufs_v = [torch.randn(2, cfg.kv_heads, 16, cfg.head_dim) for _ in range(2)]
    c.k, c.v = bufs_k, bufs_v
    assert c.kv is None and c.k[0] is bufs_k[0]
    want = bufs_k[1][:, :, [3, 4]].clone()
    c.lengths = torch.tensor([0, 0])
    c.compact(torch.tensor([[3, 4], [3, 4]]), torch.tensor([2, 2]))
    assert torch.equal(bufs_k[1][:, :, :2], want)
    c.select_rows(torch.tensor([1]))
    assert c.k[0].shape[0] == 1 and c.lengths.tolist() == [2]


def test_select_rows_keeps_one_storage():
    _, c = _cache()
    keep = c.kv[:, :, 1].clone()
    c.select_rows(torch.tensor([1]))
    assert c.kv.shape[2] == 1 and torch.equal(c.kv[:, :, 0], keep)
    assert c.k[2].data_ptr() == c.kv[0, 2].data_ptr() and c.batch == 1


def test_the_drafter_cache_shape_is_the_plan_layout():
    cfg = Drafter.from_target(make_target()).config
    assert DrafterCache.storage_shape(cfg, 3, 40) == (2, 1, 3, cfg.n_head, 40, cfg.head_dim)
