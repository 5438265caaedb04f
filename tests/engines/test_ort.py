"""ONNX Runtime engines: parity with the torch models, in-place KV caches, manifest checks."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from export_artifacts import make_artifacts  # noqa: E402

from lisa_trt.engines.base import DrafterEngine, TargetEngine  # noqa: E402
from lisa_trt.errors import ArtifactMismatchError, InputError  # noqa: E402
from lisa_trt.speculative.autoregressive import generate  # noqa: E402
from lisa_trt.models.io_spec import Graph  # noqa: E402
from lisa_trt.speculative.methods import get_method

TIGHT = 1e-4


def close(a, b, tol=TIGHT):
    a, b = a.float(), b.float()
    return (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


@pytest.fixture(scope="module")
def engines(artifacts, tmp_path_factory):
    from lisa_trt.engines.ort import load_ort_engines
    from lisa_trt.export import export_bundle

    a = artifacts
    out = tmp_path_factory.mktemp("ort") / "tiny"
    export_bundle(a["target"], a["drafter"], a["tables"], a["vq"], out, max_tree=16, lint=False, progress=False)
    return load_ort_engines(out, threads=1)


def tree_inputs(cache, S, seed=0):
    """A random tree of S nodes appended after the committed prefix (parents earlier in order)."""
    g = torch.Generator().manual_seed(seed)
    B = cache.batch
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, S)]
    anc = torch.zeros(S, S, dtype=torch.bool)
    depth = [0] * S
    for i, p in enumerate(parents):
        anc[i, i] = True
        if p >= 0:
            anc[i] |= anc[p]
            depth[i] = depth[p] + 1
    slots = cache.lengths[:, None] + torch.arange(S)[None]  # (B, S)
    positions = cache.lengths[:, None] + torch.tensor(depth)[None]
    tokens = torch.randint(0, 256, (B, S), generator=g)
    return tokens, positions, slots, cache.attention_mask(slots, anc[None].expand(B, S, S))


def test_engines_satisfy_the_runner_protocols(engines):
    assert isinstance(engines.target, TargetEngine)
    assert isinstance(engines.drafter, DrafterEngine)
    so = engines.target._verify.session.get_session_options()
    assert so.intra_op_num_threads == 1 and so.graph_optimization_level.name == "ORT_ENABLE_ALL"


def test_prefill_and_tree_verification_match_torch_and_update_the_cache_in_place(engines, artifacts):
    tgt, ref = engines.target, artifacts["target"]
    cond = torch.tensor([3, 7, 10])  # 10 = unconditional
    c_ort, c_ref = tgt.new_cache(3, extra=8), ref.new_cache(3, extra=8)
    ptrs = [t.data_ptr() for t in c_ort.k + c_ort.v]
    L = c_ref.max_len  # the engine's static cache is longer (max_tree 16): compare the common part
    o1, r1 = tgt.prefill(cond, c_ort, taps=True), ref.prefill(cond, c_ref, taps=True)
    assert close(o1.logits, r1.logits) and close(o1.taps, r1.taps) and close(o1.hidden, r1.hidden)
    assert torch.equal(c_ort.lengths, c_ref.lengths) and torch.equal(c_ort.col_valid[:, :L], c_ref.col_valid)
    before = [t.clone() for t in c_ort.k]
    args = tree_inputs(c_ort, 6)
    o2 = tgt.forward_tokens(*args, c_ort, taps=True)
    r2 = ref.forward_tokens(args[0], args[1], args[2], args[3][:, :, :L], c_ref, taps=True)
    assert o2.logits.shape == (3, 6, 256) and o2.logits.dtype == torch.float32
    assert close(o2.logits, r2.logits) and close(o2.taps, r2.taps)
    assert tgt.forward_tokens(*args, c_ort).taps is None  # taps only when asked, like torch
    # in place: same buffers, new rows written at the slots, identical to torch's cache
    assert [t.data_ptr() for t in c_ort.k + c_ort.v] == ptrs
    assert not torch.equal(c_ort.k[0], before[0])
    for k_o, k_r in zip(c_ort.k + c_ort.v, c_ref.k + c_ref.v):
        assert close(k_o[:, :, :L], k_r)


def test_greedy_and_sampled_generation_match_torch_tokens(engines, artifacts):
    cond = torch.tensor([1, 4])
    for kw in (dict(greedy=True), dict(temperature=1.0, top_k=20)):
        a = generate(engines.target, cond, cfg_scale=2.0, generator=torch.Generator().manual_seed(3), **kw)
        b = generate(artifacts["target"], cond, cfg_scale=2.0, generator=torch.Generator().manual_seed(3), **kw)
        assert torch.equal(a, b), kw


def test_drafter_matches_torch_and_updates_its_cache_in_place(engines, artifacts):
    drf, ref = engines.drafter, artifacts["drafter"]
    taps = torch.randn(2, 4, 192)
    assert close(drf.project_taps(taps), ref.project_taps(taps))
    c_ort, c_ref = drf.new_cache(2, 24), ref.new_cache(2, 24)
    c_ort.lengths.fill_(1)
    c_ref.lengths.fill_(1)
    ptr = c_ort.k[0].data_ptr()
    tokens, positions, slots, mask = tree_inputs(c_ort, 4, seed=1)
    h = ref.project_taps(taps)
    lo, ho = drf(h, tokens, positions, slots, mask, c_ort)
    L = c_ref.max_len
    lr, hr = ref(h, tokens, positions, slots, mask[:, :, :L], c_ref)
    assert close(lo, lr) and close(ho, hr)
    assert c_ort.k[0].data_ptr() == ptr and close(c_ort.k[0][:, :, :L], c_ref.k[0])
    # a second step (expansion from the drafter's own hidden) reads the rows just written
    t2, p2, s2, m2 = tokens[:, :2], positions[:, :2] + 1, slots[:, :2] + 4, mask[:, :2].clone()
    m2.scatter_(2, s2[:, :, None], True)
    lo2, _ = drf(ho[:, :2], t2, p2, s2, m2, c_ort)
    lr2, _ = ref(hr[:, :2], t2, p2, s2, m2[:, :, :L], c_ref)
    assert close(lo2, lr2)


def test_drafter_fused_commit_is_project_then_step_in_one_call(engines, artifacts):
    """drafter_fused (exported by default; ORT's drafter by default): a commit (fc on the taps inside)
    is one call and equals fc + step, and an expansion equals drafter_step, torch and ORT."""
    from lisa_trt.engines.ort import load_ort_engines

    drf, ref = engines.drafter, artifacts["drafter"]
    assert drf.fused_commit and set(drf.runners) <= {Graph.DRAFTER_FUSED, Graph.DRAFTER_PROJECT}
    split = load_ort_engines(engines.manifest.dir, threads=1, fused_drafter=False)
    two = split.drafter
    assert not two.fused_commit
    taps = torch.randn(2, 3, 192)
    c_one, c_two, c_ref = drf.new_cache(2, 24), two.new_cache(2, 24), ref.new_cache(2, 24)
    for c in (c_one, c_two, c_ref):
        c.lengths.fill_(1)
    tokens, positions, slots, mask = tree_inputs(c_one, 3, seed=4)
    calls = {"n": 0}
    fused_run = drf._step.run_static

    def counted(*a, **k):
        calls["n"] += 1
        return fused_run(*a, **k)

    drf._step.run_static = counted
    try:
        lo, ho = drf.commit(taps, tokens, positions, slots, mask, c_one)
    finally:
        drf._step.run_static = fused_run
    assert calls["n"] == 1 and drf._step is drf.runners[Graph.DRAFTER_FUSED]  # one call of drafter_fused
    l2, h2 = two(two.project_taps(taps), tokens, positions, slots, mask, c_two)
    L = c_ref.max_len
    lr, hr = ref(ref.project_taps(taps), tokens, positions, slots, mask[:, :, :L], c_ref)
    assert close(lo, l2) and close(ho, h2) and close(lo, lr) and close(ho, hr)
    assert close(c_one.k[0], c_two.k[0]) and close(c_one.k[0][:, :, :L], c_ref.k[0])
    t2, p2, s2, m2 = tokens[:, :2], positions[:, :2] + 1, slots[:, :2] + 4, mask[:, :2].clone()
    m2.scatter_(2, s2[:, :, None], True)
    le, _ = drf(ho[:, :2], t2, p2, s2, m2, c_one)  # an expansion: no taps rows
    l2e, _ = two(h2[:, :2], t2, p2, s2, m2, c_two)
    assert close(le, l2e) and close(c_one.k[0], c_two.k[0])
    split.close()


def test_bundle_without_drafter_fused_still_loads_and_decodes(engines, artifacts, tmp_path):
    """drafter_fused is optional: an older bundle commits through project + step, same tokens;
    export.upgrade.add_graphs gives it drafter_fused back (the default drafter runner, same tokens)."""
    import json
    import shutil

    from lisa_trt.engines.ort import load_ort_engines
    from lisa_trt.export.upgrade import add_graphs
    from lisa_trt.speculative.decode import SpeculativeDecoder, SpecConfig

    old = tmp_path / "old"
    shutil.copytree(engines.manifest.dir, old)
    raw = json.loads((old / "manifest.json").read_text())
    del raw["graphs"]["drafter_fused"]
    (old / "manifest.json").write_text(json.dumps(raw))
    (old / "drafter_fused.onnx").unlink()
    with load_ort_engines(old, threads=1) as e_old:
        assert not e_old.drafter.fused_commit
        spec = SpecConfig.make("exact", top_k=2, depth=1, total_tokens=4)
        cond = torch.tensor([3])
        t_old, _ = SpeculativeDecoder(e_old.target, e_old.drafter).generate(cond, method=get_method(spec.method), spec=spec, seed=0, num_tokens=12)
        t_new, _ = SpeculativeDecoder(engines.target, engines.drafter).generate(cond, method=get_method(spec.method), spec=spec, seed=0,
                                                                                num_tokens=12)
        assert torch.equal(t_old, t_new)
    # export_bundle indexes the models into its shared weights file: add_graphs rebuilds them from it
    assert add_graphs(old, validate=False) == ["drafter_fused"]
    assert add_graphs(old, validate=False) == []  # already there: skipped
    with load_ort_engines(old, threads=1) as e_up:  # the default drafter runner again: one graph
        assert e_up.drafter._fused is not None
        t_up, _ = SpeculativeDecoder(e_up.target, e_up.drafter).generate(cond, method=get_method(spec.method), spec=spec, seed=0, num_tokens=12)
        assert torch.equal(t_up, t_new)


def test_gasv_and_vq_runners_match_torch(engines, artifacts):
    import dataclasses

    from lisa_trt.speculative.gasv import gasv_gates

    logits = torch.randn(5, 256) * 3
    logits[2, 10:] = float("-inf")
    tok, par = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([-1, 0, 0, 2, 1])
    tables = artifacts["tables"]
    for cfg in (None, dataclasses.replace(tables.config, kappa=2.5, lam=0.2, neighbours=4)):  # run-time knobs
        have, want = engines.gasv(logits, tok, par, cfg), gasv_gates(logits, tok, par, tables, cfg)
        assert torch.equal(have.cand, want.cand)
        assert close(have.gate, want.gate) and close(have.p, want.p) and close(have.delta_eff, want.delta_eff)
    with pytest.raises(InputError, match="torch backend"):
        engines.gasv(logits, tok, par, dataclasses.replace(tables.config, scope="cluster"))
    tok = torch.randint(0, 256, (2, 16))
    vq = artifacts["vq"]
    assert close(engines.vq.decode_code(tok), vq.decode_code(tok, (2, 8, 4, 4)))


def test_bad_inputs_are_refused_like_torch(engines):
    tgt = engines.target
    with pytest.raises(InputError, match="re-export with a larger --max-tree"):
        tgt.new_cache(1, extra=100)
    with pytest.raises(InputError, match="unknown class id"):
        tgt.prefill(torch.tensor([11]), tgt.new_cache(1))
    cache = tgt.new_cache(1)
    tgt.prefill(torch.tensor([1]), cache)
    tok, pos, slots, mask = tree_inputs(cache, 2)
    with pytest.raises(InputError, match="image token ids"):
        tgt.forward_tokens(tok + 1000, pos, slots, mask, cache)
    with pytest.raises(InputError, match="past the end"):
        tgt.forward_tokens(tok, pos + 100, slots, mask, cache)
    with pytest.raises(InputError, match="Lmax"):
        tgt.forward_tokens(tok, pos, slots, mask[:, :, :8], cache)
    foreign = make_artifacts()["target"].new_cache(1, extra=16)
    foreign.k[0] = foreign.k[0].half()
    with pytest.raises(InputError, match="new_cache"):
        tgt.forward_tokens(tok, pos, slots, mask, foreign)
    from lisa_trt.validation import debug_checks_on

    with pytest.raises(InputError, match="empty support"), debug_checks_on():  # after its first call: debug only
        engines.gasv(torch.full((1, 256), float("-inf")), torch.zeros(1, dtype=torch.long), torch.tensor([-1]))


def test_loading_refuses_engines_of_another_target(engines):
    from lisa_trt.engines.ort import load_ort_engines

    d = engines.manifest.dir
    with pytest.raises(ArtifactMismatchError) as e:
        load_ort_engines(d, target_hash="ffffffffffffffff")
    assert "ffffffffffffffff" in str(e.value) and engines.manifest.target_hash in str(e.value)


def test_cache_binding_is_reused_and_refreshed(engines, artifacts):
    """A second cache (another request) gets its own binding; the first one still works after."""
    tgt, ref = engines.target, artifacts["target"]
    a, b = tgt.new_cache(1), tgt.new_cache(1)
    tgt.prefill(torch.tensor([2]), a)
    tgt.prefill(torch.tensor([5]), b)
    ra = ref.new_cache(1, extra=16)  # same length as the engine's cache
    ref.prefill(torch.tensor([2]), ra)
    args = tree_inputs(a, 3)
    out = tgt.forward_tokens(*args, a)
    want = ref.forward_tokens(*args, ra)
    assert close(out.logits, want.logits)


def test_static_kv_binding_survives_a_plain_run_on_another_cache(engines, artifacts):
    """The KV caches stay bound between steps (run_static); a plain `run` with other buffers in
    between must not leave the next step writing into (or reading) those buffers."""
    from lisa_trt.engines.base import RunnerError, StaticTensors

    tgt, ref = engines.target, artifacts["target"]
    a, b = tgt.new_cache(1), tgt.new_cache(1)
    tgt.prefill(torch.tensor([2]), a)
    tgt.prefill(torch.tensor([5]), b)
    ra = ref.new_cache(1, extra=16)
    ref.prefill(torch.tensor([2]), ra)
    args = tree_inputs(a, 3)
    tgt.forward_tokens(*args, a)  # binds a's buffers once
    ref.forward_tokens(*args, ra)
    a.compact(args[2][:, :1], torch.ones(1, dtype=torch.long))
    ra.compact(args[2][:, :1], torch.ones(1, dtype=torch.long))
    tok, pos, slots, mask = tree_inputs(b, 2, seed=1)
    kv = {}
    for i in range(tgt.config.n_layer):
        kv[f"past_key_values.{i}.key"], kv[f"past_key_values.{i}.value"] = b.k[i], b.v[i]
    outs = {n.replace("past_key_values", "present"): t.new_empty(t.shape[0], t.shape[1], tok.shape[1], t.shape[3])
            for n, t in kv.items()}  # the graph's new rows: their own buffers
    b_k = [t.clone() for t in b.k]
    tgt._verify.run(dict(input_ids=tok, position_ids=pos, cache_slots=slots, attention_mask=mask, **kv), outs)
    assert all(torch.equal(x, y) for x, y in zip(b.k, b_k))  # a graph never writes the cache it reads
    args2 = tree_inputs(a, 2, seed=2)
    out = tgt.forward_tokens(*args2, a)  # must run on a again, not on b
    want = ref.forward_tokens(*args2, ra)
    assert close(out.logits, want.logits)
    assert all(torch.equal(x, y) for x, y in zip(b.k, b_k))
    with pytest.raises(RunnerError, match="unbound"):  # names are checked once per signature
        tgt._verify.run_static(dict(input_ids=tok), {}, StaticTensors(kv, outs))


@pytest.mark.slow
def test_fp16_engines_track_fp32_torch(artifacts, tmp_path):
    from lisa_trt.engines.ort import load_ort_engines
    from lisa_trt.export import export_bundle

    a = artifacts
    export_bundle(a["target"], a["drafter"], None, None, tmp_path / "e16", fp16=True, max_tree=8, lint=False,
                  progress=False, external_data=True)  # ORT loads the external weight files
    eng = load_ort_engines(tmp_path / "e16", threads=1)
    cache, ref_cache = eng.target.new_cache(2), a["target"].new_cache(2, extra=8)
    assert cache.k[0].dtype == torch.float16
    cond = torch.tensor([0, 10])
    o, r = eng.target.prefill(cond, cache), a["target"].prefill(cond, ref_cache)
    assert close(o.logits, r.logits, 5e-2) and not close(o.logits, r.logits, 1e-6)
    args = tree_inputs(cache, 5)
    o, r = eng.target.forward_tokens(*args, cache, taps=True), a["target"].forward_tokens(*args, ref_cache, taps=True)
    assert o.logits.dtype == torch.float32 and o.taps.dtype == torch.float16
    assert close(o.logits, r.logits, 5e-2)
    # greedy parity on every token that is not a near-tie: both fed the fp32 greedy tokens (teacher
    # forcing, so one flip does not shift the rest); a token may differ only where fp32's top two
    # guided logits are within fp16's error, and at most 1 in 20 positions
    ref = generate(a["target"], cond[:1], cfg_scale=1.5, greedy=True, generator=torch.Generator())
    g16, g32 = _teacher_forced(eng.target, cond[:1], ref, 1.5), _teacher_forced(a["target"], cond[:1], ref, 1.5)
    assert torch.equal(g32.argmax(-1), ref[0])                       # the harness reproduces greedy decoding
    top2 = g32.topk(2, -1).values
    near_tie = (top2[:, 0] - top2[:, 1]) < 5e-2 * g32.abs().amax(-1)
    differ = g16.argmax(-1) != ref[0]
    assert not (differ & ~near_tie).any(), f"fp16 flipped clear tokens at {(differ & ~near_tie).nonzero().flatten()}"
    assert differ.float().mean() <= 0.05 and (g16 - g32).abs().max() < 5e-2 * g32.abs().max()
    # the fp16 graphs compute scores and softmax in fp32 in TensorRT's fused form (issue 53: computing
    # them in fp16 passed every other test); the fp32 graphs need no cast
    import onnx

    from lisa_trt.engines.attention_ops import fused_attention_report

    for g in ("target_verify", "drafter_step"):
        rs = fused_attention_report(onnx.load(str(tmp_path / "e16" / f"{g}.onnx"), load_external_data=False))
        assert rs and all(r["softmax_dtype"] == onnx.TensorProto.FLOAT and not r["violations"] for r in rs), g


def _teacher_forced(target, cond, tokens, cfg_scale):
    """(N, V) guided logits of a greedy CFG decode whose every step is fed `tokens` (1, N)."""
    from lisa_trt.speculative.autoregressive import cfg_batch, new_target_cache, step_inputs
    from lisa_trt.speculative.sampling import guided_logits

    N = tokens.shape[1]
    full = cfg_batch(target, cond, cfg_scale)
    cache = new_target_cache(target, 2, full, N)
    with torch.no_grad():
        raw = target.prefill(full, cache).logits[:, -1]
        out = [guided_logits(raw, cfg_scale, True)[0].float()]
        for i in range(1, N):
            x = tokens[:, i - 1: i].repeat(2, 1)
            pos, slots, mask = step_inputs(cache, x)
            raw = target.forward_tokens(x, pos, slots, mask, cache).logits[:, -1]
            cache.lengths += 1
            out.append(guided_logits(raw, cfg_scale, True)[0].float())
    return torch.stack(out)


@pytest.mark.slow
def test_t2i_prefill_with_padded_captions_and_null_condition(tmp_path):
    from lisa_trt.engines.ort import load_ort_engines
    from lisa_trt.export import export_bundle
    from lisa_trt.testing import make_cond, make_target

    target = make_target("t2i")
    export_bundle(target, None, None, None, tmp_path / "t2i", max_tree=8, lint=False, progress=False)
    eng = load_ort_engines(tmp_path / "t2i", threads=1)
    assert eng.drafter is None and eng.gasv is None
    cond = make_cond(target, batch=2)
    null_o, null_r = eng.target.null_cond(cond), target.null_cond(cond)
    assert torch.equal(null_o[0], null_r[0]) and torch.equal(null_o[1], null_r[1])
    full = tuple(torch.cat([c, n]) for c, n in zip(cond, null_r))
    c_o, c_r = eng.target.new_cache(4), target.new_cache(4, extra=8)
    o, r = eng.target.prefill(full, c_o, taps=True), target.prefill(full, c_r, taps=True)
    assert close(o.logits, r.logits) and close(o.taps, r.taps)
    assert torch.equal(c_o.col_valid, c_r.col_valid)
    args = tree_inputs(c_o, 4)
    assert close(eng.target.forward_tokens(*args, c_o).logits, target.forward_tokens(*args, c_r).logits)


def test_runner_refuses_to_run_with_stale_bindings(engines):
    """Every input must be given on each run (a leftover binding would point at freed memory)."""
    from lisa_trt.engines.base import RunnerError

    tgt = engines.target
    cache = tgt.new_cache(1)
    tgt.prefill(torch.tensor([1]), cache)
    tok, pos, slots, mask = tree_inputs(cache, 2)
    ins = dict(input_ids=tok, position_ids=pos, cache_slots=slots)
    with pytest.raises(RunnerError, match="unbound \\['attention_mask'"):
        tgt._verify.run(ins)
    with pytest.raises(RunnerError, match="unknown \\['bogus'\\]"):
        tgt._verify.run(dict(ins, attention_mask=mask, bogus=tok))


def test_runner_protocol_allocates_outputs_by_name_and_closes(engines):
    """run(inputs, outputs=None | [names] | {name: buffer}) -> dict; close() ends the lifetime."""
    from lisa_trt.engines.base import RunnerError
    from lisa_trt.models.io_spec import Graph

    proj = engines.drafter.runners[Graph.DRAFTER_PROJECT]
    taps = torch.randn(2, 3, 192)
    all_out = proj.run(dict(taps=taps))
    assert set(all_out) == {"hidden"} and all_out["hidden"].shape == (2, 3, 64)
    buf = torch.empty(2, 3, 64)
    got = proj.run(dict(taps=taps), dict(hidden=buf))
    assert got["hidden"] is buf and torch.equal(buf, all_out["hidden"])
    assert list(proj.run(dict(taps=taps), ["hidden"])) == ["hidden"]
    with pytest.raises(RunnerError, match="unknown outputs"):
        proj.run(dict(taps=taps), ["nope"])


def test_engines_close_every_runner(artifacts, tmp_path):
    from lisa_trt.engines.base import RunnerError
    from lisa_trt.engines.graph import load_engines
    from lisa_trt.export import export_bundle

    a = artifacts
    export_bundle(a["target"], None, None, None, tmp_path / "e", max_tree=8, lint=False, progress=False)
    with load_engines(tmp_path / "e", "ort", threads=1) as eng:
        cache = eng.target.new_cache(1)
        eng.target.prefill(torch.tensor([1]), cache)
    assert eng.target._verify.closed and all(r.closed for r in eng.target.runners.values())
    with pytest.raises(RunnerError, match="closed"):
        eng.target.prefill(torch.tensor([1]), eng.target.new_cache(1))


def test_drafter_refuses_a_cache_it_did_not_make(engines, artifacts):
    drf = engines.drafter
    cache = artifacts["drafter"].new_cache(1, 24)  # torch drafter's cache: shorter than the engine's
    tok, pos, slots, mask = tree_inputs(cache, 2)
    with pytest.raises(InputError):
        drf(torch.randn(1, 2, 64), tok, pos, slots, mask, cache)
