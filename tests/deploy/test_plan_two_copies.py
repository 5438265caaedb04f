"""The memory plan of a two-copy directory (separate prefill and verify engines: a bundle exported
before the verify graph ran the prefill) against the one-copy plan, component by component (issue 53):
only the target's weights double; its KV cache is the runtime's one cache whatever the copies, and
every other engine is the same. The KV caches are checked against the caches the torch runtime
allocates (the same shapes every backend binds), and the TensorRT context memory against the
recorded per-profile sizes of the engines (one activation buffer for the whole bundle, of the
largest engine's largest profile, held by the target)."""

import pytest
import torch

from lisa_trt.deploy import memory_plan as P
from lisa_trt.deploy.memory_plan import make_plan
from lisa_trt.engines.allocation import context_memory_bytes
from lisa_trt.families.llamagen import shapes as LS
from lisa_trt.models.drafter import Drafter
from lisa_trt.models.layers import KVCache
from lisa_trt.models.target_config import target_config
from lisa_trt.testing import make_target


def _shape():
    return LS.config_shape(target_config("tiny"), "tiny")


def _nbytes(cache) -> int:
    return sum(t.numel() * t.element_size() for t in cache.k + cache.v)


def _plans(**kw):
    s = _shape()
    return [make_plan(s, memory_gib=8, batch=2, tree=8, search=False, weight_copies=c, **kw) for c in (1, 2)]


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_two_copies_double_the_target_weights_and_nothing_else(precision):
    one, two = _plans(precision=precision, backend="ort")
    assert set(one.engines) == set(two.engines) == {"target", "drafter", "gasv", "vq_decode"}
    t1, t2 = one.engines["target"], two.engines["target"]
    assert set(t1) == set(t2) == {"weights", "kv_cache", "activations", "io"}
    assert t2["weights"] == 2 * t1["weights"] > 0
    assert t2["kv_cache"] == t1["kv_cache"] > 0, "the KV cache is one buffer whatever the weight copies"
    assert t2["activations"] == t1["activations"] and t2["io"] == t1["io"]
    for name in ("drafter", "gasv", "vq_decode"):
        assert two.engines[name] == one.engines[name], name
    assert (one.rows, one.max_cache_len) == (two.rows, two.max_cache_len)
    assert two.total - one.total == t1["weights"]  # one more copy of the weights, nothing more
    assert any("2 copies" in n for n in two.notes) and not any("copies" in n for n in one.notes)


def test_each_kv_cache_is_what_the_runtime_allocates():
    """fp32 plan of the tiny model (batch 2, CFG: 4 rows) -> the bytes of the target's and the
    drafter's torch caches at the plan's rows and cache length, for one and for two weight copies."""
    target = make_target()
    drafter = Drafter.from_target(target)
    for plan in _plans(precision="fp32", backend="ort"):
        rows, L = plan.rows, plan.max_cache_len
        assert rows == 4
        want_t = _nbytes(KVCache(target.config, rows, L, torch.float32, "cpu"))
        want_d = _nbytes(drafter.new_cache(rows, L, dtype=torch.float32))
        assert plan.engines["target"]["kv_cache"] == want_t
        assert plan.engines["drafter"]["kv_cache"] == want_d
        # by hand: k and v x layers x rows x heads x slots x head_dim x 4 bytes
        tc, dc = target.config, drafter.config
        assert want_t == 2 * tc.n_layer * rows * tc.kv_heads * L * tc.head_dim * 4
        assert want_d == 2 * 1 * rows * dc.n_head * L * dc.head_dim * 4


RECORD = {"target_verify": [300, 700], "target_prefill": [500, 200, 100], "drafter_project": [40, 90],
          "drafter_step": [60], "gasv": [11, 13], "vq_decode": [1000, 900]}


def test_recorded_context_memory_is_one_shared_buffer_for_the_whole_bundle(monkeypatch):
    """A TensorRT directory whose build recorded each engine's per-profile device memory: every
    engine of the bundle runs in ONE activation buffer (engines/trt.SharedActivations) of the
    largest engine's largest profile (here the VQ decoder's 1000), counted once, in the target,
    whatever the weight copies; the other engines add nothing; the KV cache is unchanged."""
    rt = P.Runtime("trt", {g: {"device_memory": m} for g, m in RECORD.items()})
    monkeypatch.setattr(P, "resolve_runtime", lambda model, backend="trt", manifest=None: rt)
    one, two = _plans(precision="fp16")
    biggest = max(max(m) for m in RECORD.values())
    assert biggest == 1000
    for p in (one, two):
        assert p.engines["target"]["activations"] == biggest
        for name in ("drafter", "gasv", "vq_decode"):
            assert p.engines[name]["activations"] == 0, name
        assert sum(e["activations"] for e in p.engines.values()) == biggest  # one buffer, not one per engine
    assert one.engines["target"]["kv_cache"] == two.engines["target"]["kv_cache"]


def test_context_memory_bytes_shared_and_not():
    assert context_memory_bytes([300, 700, 500]) == 700
    assert context_memory_bytes([300, 700, 500], shared=False) == 3 * 700  # each context the engine's largest
    assert context_memory_bytes([42]) == context_memory_bytes([42], shared=False) == 42
    assert context_memory_bytes([]) == 0


def test_a_missing_record_falls_back_to_the_estimate(monkeypatch):
    """The target's own engine without a record (two copies: the prefill engine): the target's
    activations are the estimate, not a max over a partial record."""
    est = _plans(precision="fp16", backend="ort")[1].engines["target"]["activations"]
    rec = {g: {"device_memory": m} for g, m in RECORD.items() if g != "target_prefill"}
    monkeypatch.setattr(P, "resolve_runtime", lambda model, backend="trt", manifest=None: P.Runtime("trt", rec))
    one, two = _plans(precision="fp16")
    assert one.engines["target"]["activations"] == 1000  # one copy opens no prefill engine: the record is whole
    assert two.engines["target"]["activations"] == est
