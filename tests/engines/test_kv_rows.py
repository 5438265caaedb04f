"""Attention over a read-only KV cache plus the step's new rows (models/layers.rows_attention):
the building block of the new-rows graphs (docs/tensorrt.md, "KV cache"), checked against the
cache-writing attention every model runs (cached_attention), and as an ONNX graph in ONNX Runtime.
"""

import numpy as np
import pytest
import torch

from lisa_trt.models.layers import CacheRows, cached_attention, commit_rows


def _case(H, n_kv, S=5, L=24, D=8, B=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, S, D, generator=g) for h in (H, n_kv, n_kv))
    kc, vc = torch.randn(B, n_kv, L, D, generator=g), torch.randn(B, n_kv, L, D, generator=g)  # stale rows too
    lengths = torch.tensor([7, 11])
    slots = lengths[:, None] + torch.stack([torch.randperm(S, generator=g) for _ in range(B)])  # distinct per row
    anc = torch.rand(B, S, S, generator=g) < 0.5
    anc |= torch.eye(S, dtype=torch.bool)
    cols = torch.arange(L)
    mask = (cols[None, None, :] < lengths[:, None, None]).expand(B, S, L).clone()
    mask.scatter_(2, slots[:, None, :].expand(B, S, S), anc)  # committed columns + each node's ancestors
    return q, k, v, kc, vc, slots, mask[:, None]


@pytest.mark.parametrize("H,n_kv", [(4, 4), (4, 2), (6, 1)])
def test_rows_attention_is_cached_attention_without_writing_the_cache(H, n_kv):
    q, k, v, kc, vc, slots, mask = _case(H, n_kv)
    want_k, want_v = kc.clone(), vc.clone()
    want = cached_attention(q, k, v, mask, (want_k, want_v), slots)  # writes the rows, reads the whole cache
    rk, rv = CacheRows(kc.clone()), CacheRows(vc.clone())
    got = cached_attention(q, k, v, mask, (rk, rv), slots)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(rk.buf, kc) and torch.equal(rv.buf, vc)   # the cache is not written
    assert torch.equal(rk.rows, k) and torch.equal(rv.rows, v)   # the step's rows, S of them
    commit_rows(rk.buf, rk.rows, slots)
    commit_rows(rv.buf, rv.rows, slots)
    assert torch.equal(rk.buf, want_k) and torch.equal(rv.buf, want_v)  # the commit is the scatter's write


def test_stale_rows_at_the_slots_are_not_read():
    """The cache's old rows at the step's slots (a rejected draft's) must not leak into attention."""
    q, k, v, kc, vc, slots, mask = _case(4, 2)
    a = cached_attention(q, k, v, mask, (CacheRows(kc), CacheRows(vc)), slots)
    kc2, vc2 = kc.clone(), vc.clone()
    commit_rows(kc2, torch.full_like(k, 1e3), slots)
    commit_rows(vc2, torch.full_like(v, -1e3), slots)
    b = cached_attention(q, k, v, mask, (CacheRows(kc2), CacheRows(vc2)), slots)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


class _Layer(torch.nn.Module):
    def forward(self, q, k, v, mask, slots, kc, vc):
        rk, rv = CacheRows(kc), CacheRows(vc)
        y = cached_attention(q, k, v, mask, (rk, rv), slots)
        return y, rk.rows, rv.rows


def test_the_onnx_graph_reads_the_cache_and_returns_only_the_rows(tmp_path):
    """Exported (dynamo, opset 23) and run in ONNX Runtime: same output as torch; the cache inputs
    feed only matmuls (through the K / V Concat with the new rows, Transpose / Cast), no scatter,
    and the outputs are the S new rows."""
    import onnx
    import onnxruntime as ort

    q, k, v, kc, vc, slots, mask = _case(4, 2)
    args = (q, k, v, mask, slots, kc, vc)
    names = ["q", "k", "v", "mask", "slots", "kc", "vc"]
    path = tmp_path / "rows.onnx"
    torch.onnx.export(_Layer(), args, str(path), dynamo=True, opset_version=23, input_names=names,
                      output_names=["y", "k_rows", "v_rows"], verbose=False)
    m = onnx.load(str(path))
    ops = {n.op_type for n in m.graph.node}
    assert not ops & {"ScatterElements", "ScatterND", "TensorScatter"}, ops
    readers = {n.op_type for n in m.graph.node for i in n.input if i in ("kc", "vc")}
    assert readers <= {"Concat", "MatMul", "Transpose", "Cast", "Shape"}, readers
    # the fused-attention form (docs/tensorrt.md): the cache and the new rows concatenated as the
    # keys / values of one BMM1 / BMM2, a graph-internal tensor, never an output
    cats = [o for n in m.graph.node if n.op_type == "Concat" and set(n.input) & {"kc", "vc"} for o in n.output]
    assert not set(cats) & {o.name for o in m.graph.output}
    out = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in m.graph.output}
    assert out["k_rows"] == list(k.shape) and out["v_rows"] == list(v.shape)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    y, kr, vr = sess.run(None, {n: a.numpy() for n, a in zip(names, args)})
    want = cached_attention(q, k, v, mask, (kc.clone(), vc.clone()), slots)
    np.testing.assert_allclose(y, want.numpy(), rtol=1e-5, atol=1e-5)
    assert np.array_equal(kr, k.numpy()) and np.array_equal(vr, v.numpy())
