"""`lisa-trt plan` is the runtime's allocation list (issue 36 item 5): a bundle opened on ONNX Runtime
and on TensorRT (the fake native core of tests/contract/trt_fake.py under Polygraphy's real loaders;
no libnvinfer) allocates, component by component, what the plan of that directory counts: each
model's KV cache, the KV shadows of TensorRT's "swap" binding, and the TensorRT contexts' device
memory that `lisa-trt build` recorded per profile."""

import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
for sub in ("tests/export", "tests/engines", "tests/contract"):
    sys.path.insert(0, str(ROOT / sub))
from test_build import FakeTRT, _install, _tree  # noqa: E402
from test_trt_compat import tiny_bundle  # noqa: E402

from lisa_trt.deploy import build as B  # noqa: E402
from lisa_trt.deploy.memory_plan import make_plan  # noqa: E402
from lisa_trt.engines import trt as T  # noqa: E402
from lisa_trt.engines.graph import load_engines  # noqa: E402
from lisa_trt.export.manifest import read_manifest  # noqa: E402


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _run_once(eng):
    """Allocate what a decode allocates: both caches, one target step (tree) and one drafter commit."""
    tc, dc = eng.target.new_cache(2, extra=16), eng.drafter.new_cache(2, 40)
    with torch.no_grad():
        out = eng.target.prefill(torch.tensor([3, 10]), tc, taps=True)
        eng.target.forward_tokens(*_tree(tc, 4, seed=1), tc)
        dc.lengths.fill_(1)
        tok, pos, slots, mask = _tree(dc, 1, seed=2)
        eng.drafter.commit(out.taps, tok, pos, slots, mask, dc)
    return tc, dc


def _allocated(eng, tc, dc) -> dict:
    """What the runtime holds per model: the one cache each (engines/graph.py), context memory (TrtRunner)."""
    everyone = [r for e in (eng.target, eng.drafter, eng.gasv, eng.vq) for r in e.runners.values()]
    buffers = {id(getattr(r, "_memory", None)): getattr(r, "device_memory", None) for r in everyone}

    def memory(runners):  # TensorRT: the one activation buffer of the bundle, counted in the target's
        sizes = [getattr(r, "device_memory", None) for r in runners]
        if None in sizes:
            return None
        if len(buffers) == 1:
            return next(iter(buffers.values())) if runners is eng.target.runners.values() or \
                list(runners) == list(eng.target.runners.values()) else 0
        return sum(sizes)

    return {"target": {"kv_cache": _nbytes(tc.k + tc.v), "activations": memory(eng.target.runners.values())},
            "drafter": {"kv_cache": _nbytes(dc.k + dc.v), "activations": memory(eng.drafter.runners.values())},
            "gasv": {"activations": memory(eng.gasv.runners.values())},
            "vq_decode": {"activations": memory(eng.vq.runners.values())}}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return tiny_bundle(tmp_path_factory)


def test_ort_allocates_what_the_ort_plan_counts(bundle):
    man = read_manifest(bundle)
    plan = make_plan(str(bundle), memory_gib=8, batch=1, cfg=True, backend="ort")
    assert plan.max_cache_len == man.max_cache_len
    with load_engines(bundle, "ort", threads=1) as eng:
        got = _allocated(eng, *_run_once(eng))
    for model in ("target", "drafter"):
        assert set(plan.engines[model]) == {"weights", "kv_cache", "activations"}  # one cache, no second copy
        assert got[model]["kv_cache"] == plan.engines[model]["kv_cache"] > 0, model


@pytest.fixture
def built(bundle, tmp_path, monkeypatch, request):
    fake = FakeTRT()
    _install(fake, monkeypatch, request)
    d = tmp_path / "engines"
    shutil.copytree(bundle, d)
    # max_batch 1 (2 CFG rows); step (S <= 4) and tree (S <= 16) profiles, so sizes differ per profile
    rec = B.build_engines(d, profiles=B.profiles_from_io_spec(read_manifest(d), seq_split=4), progress=False)
    return fake, d, rec


def test_build_records_each_engines_device_memory(built):
    fake, d, rec = built
    for name, g in rec["graphs"].items():
        e = next(x for x in fake.builds if Path(x["onnx"]).name == g["onnx"])
        assert len(g["device_memory"]) == len(g["profiles"]) == len(e["profiles"])  # one size per profile
        assert all(m > 0 for m in g["device_memory"]) and g["aliased"] == {}  # the new-rows graphs: no alias
    profs = rec["graphs"]["target_verify"]["device_memory"]
    assert len(profs) == 2 and profs[0] != profs[1]  # step and tree profiles differ: the record is per profile


def test_tensorrt_allocates_what_the_plan_counts(built):
    fake, d, rec = built
    plan = make_plan(str(d), memory_gib=8, batch=1, cfg=True)
    assert plan.backend == "trt" and set(plan.engines["target"]) == {"weights", "kv_cache", "activations"}
    assert any("device memory recorded" in n for n in plan.notes)
    eng = T.load_trt_engines(d, device="cpu")
    got = _allocated(eng, *_run_once(eng))
    for model, parts in got.items():
        for part, n in parts.items():
            assert n == plan.engines[model][part], (model, part, n)
    assert got["target"]["kv_cache"] > 0 and got["drafter"]["kv_cache"] > 0  # one cache each, on TensorRT too
    # one context buffer for every engine: the largest recorded profile size of any, not a sum
    verify = eng.target.runners[next(iter(eng.target.runners))]
    assert verify.device_memory == max(max(g["device_memory"]) for g in rec["graphs"].values())
    assert plan.engines["target"]["activations"] == verify.device_memory
    assert all(plan.engines[m]["activations"] == 0 for m in ("drafter", "gasv", "vq_decode"))
    live = [b for c, _, b in verify.log.entries if c == "activations"]
    assert live[-1] == verify.device_memory  # the allocation log's buffer is the one the plan counts
    eng.close()
