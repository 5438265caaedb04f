"""TrtRunner binds once (issue 51): on the fake native core (tests/contract/trt_fake.py, which counts
every binding call) a steady-state step sets no cache address or shape again, chooses no profile
again, allocates no buffer, and hands no device memory; outputs are reused only once the caller
has dropped them; every engine of a bundle runs on one activation buffer of the largest need."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_build import _close, _tree, bundle, fake  # noqa: E402,F401 (fixtures)

from lisa_trt.engines import trt as T  # noqa: E402


def _runners(eng):
    return [r for e in (eng.target, eng.drafter, eng.gasv, eng.vq) if e is not None for r in e.runners.values()]


def test_a_steady_state_step_binds_no_cache_and_allocates_nothing(fake, monkeypatch):
    from export_artifacts import make_artifacts

    target = make_artifacts()["target"]
    eng = T.load_trt_engines(fake.dir, device="cpu")
    verify = eng.target._verify
    log, counters, binds = verify.log, fake.trt.counters, fake.trt.binds
    selections = []
    real_select = T.select_profile
    monkeypatch.setattr(T, "select_profile", lambda p, s: selections.append(1) or real_select(p, s))
    tc, ec = target.new_cache(2, extra=16), eng.target.new_cache(2, extra=16)
    with torch.no_grad():
        target.prefill(torch.tensor([3, 10]), tc)
        eng.target.prefill(torch.tensor([3, 10]), ec)
        g = None
        for step in range(5):
            tok, pos, slots, mask = _tree(tc, 6, seed=step)
            if step == 2:  # warm: every signature seen once
                before = (dict(counters), len(binds), log.count(), len(selections))
            w = target.forward_tokens(tok, pos, slots, mask, tc, taps=True)
            g = eng.target.forward_tokens(tok, pos, slots, mask, ec, taps=True)   # the previous g is held
            assert _close(g.logits, w.logits) and _close(g.taps, w.taps)
    c0, n0, a0, s0 = before
    new_binds = binds[n0:]
    assert not [b for b in new_binds if b[1].startswith("past_key_values.")]  # caches bound once per cache
    assert log.count() == a0                                                  # 0 new allocations
    assert len(selections) == s0                                              # profile chosen once per signature
    assert counters["set_device_memory"] == c0.get("set_device_memory", 0)
    assert counters["set_input_shape"] == c0.get("set_input_shape", 0)         # same shapes: none set again
    # per step at most one address per per-call tensor (the step's fresh inputs, the outputs' pool
    # buffers alternating while the caller holds the previous step's): never the 2 x n_layer caches
    per_call = len(verify.input_names) + len(verify.output_names) - sum(n.startswith("past") for n in verify.input_names)
    assert {k for k, _ in new_binds} == {"address"} and len(new_binds) <= 3 * per_call


def test_an_output_the_caller_holds_is_never_overwritten(fake):
    """Outputs come from a pool, reused only when no caller holds them: logits kept from every
    step still equal what that step computed."""
    from export_artifacts import make_artifacts

    target = make_artifacts()["target"]
    eng = T.load_trt_engines(fake.dir, device="cpu")
    tc, ec = target.new_cache(2, extra=16), eng.target.new_cache(2, extra=16)
    kept = []
    with torch.no_grad():
        target.prefill(torch.tensor([3, 10]), tc)
        eng.target.prefill(torch.tensor([3, 10]), ec)
        for step in range(4):
            tok, pos, slots, mask = _tree(tc, 5, seed=10 + step)
            w = target.forward_tokens(tok, pos, slots, mask, tc)
            kept.append((eng.target.forward_tokens(tok, pos, slots, mask, ec).logits, w.logits.clone()))
    for got, want in kept:
        assert _close(got, want)
    ptrs = {g.data_ptr() for g, _ in kept}
    assert len(ptrs) == len(kept)  # all held: each step had its own buffer


def test_every_engine_of_the_bundle_shares_one_activation_buffer(fake):
    """One USER_MANAGED buffer (IExecutionContext::setDeviceMemoryV2) for every context of every
    engine, of the largest profile need of any engine; the fake refuses an enqueue with less."""
    eng = T.load_trt_engines(fake.dir, device="cpu")
    runners = _runners(eng)
    assert len(runners) >= 4
    need = max(r.engine.get_device_memory_size_for_profile_v2(i) for r in runners for i in range(len(r.profiles)))
    mem = {c.memory for r in runners for c in r.contexts}
    assert len(mem) == 1                                   # one buffer, handed with its size
    ((ptr, size),) = mem
    assert size == need and all(r.device_memory == need for r in runners)
    live = [b for c, _, b in runners[0].log.entries if c == "activations"]
    assert live[-1] == need and sum(live) < 2 * need * len(runners)  # not one buffer per engine
    eng.close()
