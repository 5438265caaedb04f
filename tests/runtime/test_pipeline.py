"""The embedded runtime: ORT == torch tokens, run CLI, bundle checks, atomic export, threads."""

import json
import threading

import pytest
import torch
from click.testing import CliRunner

from lisa_trt import LisaError
from lisa_trt.calibration.profile import calibrate
from lisa_trt.cli import main
from lisa_trt.export import export_bundle
from lisa_trt.runtime.pipeline import Pipeline
from lisa_trt.testing import make_target

GEN = {"sampling": {"cfg_scale": 2.0, "top_k": 0}, "class_names": [f"c{i}" for i in range(10)],
       "tree": {"default": {"top_k": 3, "depth": 2, "total_tokens": 8}}}


@pytest.fixture(scope="module")
def bundle(parts, tmp_path_factory):
    out = tmp_path_factory.mktemp("b") / "eng"
    t, d, tables, vq = parts
    # torch_weights: the bench test below passes the bundle's fp32 PyTorch files as checkpoints
    export_bundle(t, d, tables, vq, out, generation=GEN, progress=False, lint=False, torch_weights=True)
    return out


@pytest.mark.parametrize("verify", ["greedy", "exact", "gasv", "lantern"])
def test_ort_equals_torch_tokens(bundle, verify):
    ort = Pipeline.from_dir(bundle, backend="ort", threads=1)
    tch = Pipeline.from_dir(bundle, backend="torch")
    assert ort.backend == "ort" and tch.backend == "torch"
    a = ort.generate([1, "c3"], seed=5, verify=verify)
    b = tch.generate([1, "c3"], seed=5, verify=verify)
    assert torch.equal(a.tokens, b.tokens)
    assert len(a.images) == 2 and a.images[0].size == (8, 8)
    assert a.stats[1]["class"] == 3
    # the same decode step for step: the same verification steps and accept lengths
    assert [(s["mal"], s["steps"]) for s in a.stats] == [(s["mal"], s["steps"]) for s in b.stats]


@pytest.mark.parametrize("verify", ["sjd", "mcsjd", "sjd-pac", "gsd", "zipar", "coupled", "sjd-gasv"])
def test_every_new_decoder_runs_through_pipeline_on_every_backend(parts, bundle, verify):
    """Issue 27's decoders via Pipeline on ORT, the torch graphs and the in-memory models, with CFG
    and two prompts, one decode per prompt and batch=True (per-row seeds): the same tokens
    everywhere; the stats say what ran."""
    t, d, tables, vq = parts
    mem = Pipeline.from_models(t, d, tables, vq, generation=GEN)
    kw = dict(seed=2, verify=verify, decode=False, sjd_window=4, sjd_pac_tree_width=2, zipar_window=2)
    with Pipeline.from_dir(bundle, backend="ort", threads=1) as ort, Pipeline.from_dir(bundle, backend="torch") as tch:
        for batch in (False, True):
            want = mem.generate([1, 4], batch=batch, **kw)
            assert [s["verify"] for s in want.stats] == [verify] * 2
            for pipe in (ort, tch):
                got = pipe.generate([1, 4], batch=batch, **kw)
                assert torch.equal(got.tokens, want.tokens), (verify, pipe.backend, batch)
                # the same decode step for step: the same verification steps and accept lengths
                assert [(s["mal"], s["steps"]) for s in got.stats] == [(s["mal"], s["steps"]) for s in want.stats], \
                    (verify, pipe.backend, batch)
            if batch:
                assert [s["batch_row"] for s in got.stats] == [0, 1] and [s["seed"] for s in got.stats] == [2, 3]


def test_gasv_knobs_reach_every_backend(parts, bundle):
    """Pipeline.generate knobs: the lossless setting reproduces exact; ORT (the GASV graph with
    run-time knobs) == torch (the reference) on loose knobs, which accept more."""
    t, d, tables, vq = parts
    mem = Pipeline.from_models(t, d, tables, vq, generation=GEN)
    ex = mem.generate([1, 2], seed=3, verify="exact", decode=False)
    ll = mem.generate([1, 2], seed=3, verify="gasv", decode=False, gasv_kappa=0.0, gasv_lambda=1.0)
    assert torch.equal(ex.tokens, ll.tokens)
    knobs = dict(gasv_kappa=3.0, gasv_lambda=0.2, gasv_delta=0.5, gasv_neighbours=8)
    ort = Pipeline.from_dir(bundle, backend="ort", threads=1).generate([1, 2], seed=3, verify="gasv", decode=False,
                                                                     **knobs)
    tch = Pipeline.from_dir(bundle, backend="torch").generate([1, 2], seed=3, verify="gasv", decode=False, **knobs)
    assert torch.equal(ort.tokens, tch.tokens)
    assert sum(s["mal"] for s in tch.stats) > sum(s["mal"] for s in ex.stats)
    lan = mem.generate([1, 2], seed=3, verify="lantern", decode=False, lantern_delta=0.2, lantern_gamma=1.0)
    assert sum(s["mean_tvd"] for s in lan.stats) > 0  # a budget of 0.2 moves mass onto the drafts


def test_pipeline_matches_library_decoder(parts, bundle):
    """The bundle's torch backend == the in-memory models (weights round-trip exactly)."""
    t, d, tables, vq = parts
    mem = Pipeline.from_models(t, d, tables, vq, generation=GEN)
    disk = Pipeline.from_dir(bundle, backend="torch")
    assert torch.equal(mem.generate([2], seed=1, verify="gasv").tokens, disk.generate([2], seed=1, verify="gasv").tokens)


def test_thread_safe_shared_pipeline(bundle):
    pipe = Pipeline.from_dir(bundle, backend="ort", threads=1)
    ref = [pipe.generate([i], seed=i, verify="exact").tokens for i in range(4)]
    got = [None] * 4

    def work(i):
        got[i] = pipe.generate([i], seed=i, verify="exact").tokens

    ths = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    [th.start() for th in ths]
    [th.join() for th in ths]
    assert all(torch.equal(a, b) for a, b in zip(ref, got))


def test_run_cli_and_malformed_prompts(bundle, tmp_path):
    r = CliRunner()
    p = tmp_path / "p.jsonl"
    p.write_text('{"class": 1, "seed": 3}\n{"class": "c2", "cfg": 1.5}\n')
    res = r.invoke(main, ["run", str(bundle), str(p), "--out", str(tmp_path / "o"), "--backend", "ort"])
    assert res.exit_code == 0, res.output
    stats = json.loads((tmp_path / "o" / "stats.json").read_text())
    assert [s["seed"] for s in stats["images"]] == [3, 1] and len(list((tmp_path / "o").glob("*.png"))) == 2
    bad = tmp_path / "bad.txt"
    bad.write_text("1\nnope\n42\n")
    res = r.invoke(main, ["run", str(bundle), str(bad), "--out", str(tmp_path / "o2")])
    assert res.exit_code == 2 and "bad.txt:2:" in res.output and "bad.txt:3:" in res.output
    assert not (tmp_path / "o2").exists()
    res = r.invoke(main, ["run", str(bundle), str(p), "--out", str(tmp_path / "o3"), "--negative-prompt", "blurry"])
    assert res.exit_code == 2 and "classifier-free guidance runs against the null class" in res.output
    assert not (tmp_path / "o3").exists()


def test_sjd_window_reaches_run_pipeline_and_stats(bundle, tmp_path):
    """`lisa-trt run --sjd-window`, `Pipeline.from_dir(sjd_window=)` (the pipeline's default) and
    `generate(sjd_window=)` (the call's, which wins) reach the Jacobi loop on ORT; the stats record
    the window; a bad one is refused before any engine loads."""
    r = CliRunner()
    p = tmp_path / "p.txt"
    p.write_text("1\n")
    stats = {}
    for w in (1, 6):
        res = r.invoke(main, ["run", str(bundle), str(p), "--out", str(tmp_path / f"w{w}"), "--backend", "ort",
                              "--verify", "sjd", "--sjd-window", str(w)])
        assert res.exit_code == 0, res.output
        stats[w] = json.loads((tmp_path / f"w{w}" / "stats.json").read_text())["images"][0]
        assert stats[w]["sjd_window"] == w and stats[w]["verify"] == "sjd"
    assert stats[1]["target_forwards"] > stats[6]["target_forwards"], stats  # the window mattered
    res = r.invoke(main, ["run", str(bundle), str(p), "--out", str(tmp_path / "w0"), "--sjd-window", "0"])
    assert res.exit_code == 2 and "--sjd-window" in res.output and not (tmp_path / "w0").exists()
    with pytest.raises(LisaError, match="--sjd-window"):
        Pipeline.from_dir(bundle, backend="ort", sjd_window=0)
    with Pipeline.from_dir(bundle, backend="ort", sjd_window=3) as pipe:
        for verify in ("mcsjd", "gsd"):
            assert [s["sjd_window"] for s in pipe.generate([1, 2], verify=verify, decode=False).stats] == [3, 3]
        got = pipe.generate([1, 2], verify="sjd", decode=False, batch=True, sjd_window=5).stats
        assert [s["sjd_window"] for s in got] == [5, 5]
        assert "sjd_window" not in pipe.generate([1], verify="zipar", decode=False).stats[0]  # ZipAR: no window


def test_bundle_with_foreign_tables_refused(parts, bundle, tmp_path):
    import shutil

    from lisa_trt.calibration.tables import save_tables

    other = make_target(std=0.3, seed=9)
    t2 = calibrate(other, parts[3].codebook().detach(), num_rollouts=2, progress=False)
    copy = tmp_path / "eng"
    shutil.copytree(bundle, copy)
    save_tables(t2, copy / "tables.safetensors")
    with pytest.raises(LisaError, match="calibrated for target"):
        Pipeline.from_dir(copy, backend="ort")


def test_interrupted_export_leaves_nothing(parts, tmp_path, monkeypatch):
    import lisa_trt.runtime.bundle as B

    t, d, tables, vq = parts

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("lisa_trt.calibration.tables.save_tables", boom)  # after the graphs, before the manifest
    out = tmp_path / "eng"
    with pytest.raises(KeyboardInterrupt):
        export_bundle(t, d, tables, vq, out, generation=GEN, progress=False, validate=False, lint=False)
    assert list(tmp_path.iterdir()) == []


def test_bench_ort_backend_same_json_as_torch(bundle, tmp_path):
    r = CliRunner()
    common = ["bench", "--model", str(bundle / "weights" / "target.safetensors"), "--drafter",
              str(bundle / "weights" / "drafter.safetensors"), "--tables", str(bundle / "tables.safetensors"),
              "--methods", "vanilla,exact,gasv", "--num-images", "2", "--cfg-scale", "2", "--tree-top-k", "3",
              "--tree-depth", "2", "--tree-tokens", "8"]
    reps = {}
    for backend in ("torch", "ort"):
        res = r.invoke(main, common + ["--backend", backend, "--engine-dir", str(bundle),
                                       "--json", str(tmp_path / f"{backend}.json")])
        assert res.exit_code == 0, res.output
        reps[backend] = json.loads((tmp_path / f"{backend}.json").read_text())
    assert reps["ort"]["settings"]["backend"] == "ort"
    for m in ("vanilla", "exact", "gasv"):
        assert set(reps["ort"]["results"][m]) == set(reps["torch"]["results"][m])
        # same seeds, same numerics -> same acceptance
        assert reps["ort"]["results"][m]["mal"] == pytest.approx(reps["torch"]["results"][m]["mal"])


def test_batched_generation_returns_one_independent_stats_dict_per_prompt(bundle):
    pipe = Pipeline.from_dir(bundle, backend="torch")
    res = pipe.generate([1, 2, 3], seed=4, verify="exact", batch=True, decode=False)
    assert len(res.stats) == 3 and len({id(s) for s in res.stats}) == 3
    assert [s["class"] for s in res.stats] == [1, 2, 3] and [s["batch_row"] for s in res.stats] == [0, 1, 2]
    before = [dict(s) for s in res.stats]
    res.stats[0]["mal"] = -1.0  # editing one prompt's stats leaves the others alone
    assert res.stats[1:] == before[1:] and before[0]["mal"] != -1.0


def test_unknown_method_and_backend_are_lisa_errors(bundle):
    pipe = Pipeline.from_dir(bundle, backend="torch")
    with pytest.raises(LisaError, match="unknown verification 'nope'.*vanilla"):
        pipe.generate([1], verify="nope")
    with pytest.raises(LisaError, match="unknown backend 'nope'"):
        Pipeline.from_dir(bundle, backend="nope")


def test_pipeline_lifetime_closes_its_engines(bundle):
    with Pipeline.from_dir(bundle, backend="ort", threads=1) as pipe:
        assert pipe.generate([1], seed=0, verify="exact", decode=False).tokens.shape == (1, 16)
    with pytest.raises(LisaError, match="closed"):
        pipe.generate([1], seed=0, verify="exact", decode=False)


def test_unset_tree_options_keep_the_bundles_tuned_budget(bundle):
    """`run` passes tree_top_k=None etc. when the user gives no tree option: the Pipeline must then
    decode with the budget recorded for its backend, not SpecConfig's GPU-sized default."""
    pipe = Pipeline.from_dir(bundle, backend="ort", threads=1)
    from lisa_trt.runtime.pipeline import _tree_budget
    from lisa_trt.speculative.methods import SpecConfig

    recorded = _tree_budget(pipe._e.generation, "ort")
    assert recorded and recorded["total_tokens"] < SpecConfig().tree.total_tokens  # the test has teeth
    spec = pipe.spec("gasv", top_k=None, depth=None, total_tokens=None, gasv_kappa=None)
    assert (spec.tree.top_k, spec.tree.depth, spec.tree.total_tokens) == \
        (recorded["top_k"], recorded["depth"], recorded["total_tokens"])
    res = pipe.generate([1], seed=0, verify="exact", decode=False, tree_top_k=None, tree_depth=None, tree_tokens=None)
    assert res.stats[0]["mal"] <= recorded["depth"] + 2  # the longest path of the recorded tree + bonus
    assert pipe.spec("gasv", total_tokens=7).tree.total_tokens == 7


def _choice(backend, precision, method, tree=None):
    from lisa_trt.runtime.autotune import DecodeChoice

    return DecodeChoice(backend=backend, precision=precision, method=method, tree=tree, speedup=1.0, measured=True,
                        best_tree=None, best_tree_speedup=0.75, reason=f"{backend}/{precision}: recorded {method}").to_dict()


def test_verify_auto_runs_the_recorded_choice_for_the_backend_and_precision(parts, tmp_path):
    """Issue 27 item 5: run / Pipeline default to the bundle's recorded never-slower choice; an
    explicit --verify still wins; a bundle with no record runs gasv, as before."""
    t, d, tables, vq = parts
    gen = {**GEN, "decode": {"ort": {"fp32": _choice("ort", "fp32", "vanilla")},
                             "torch": {"fp32": _choice("torch", "fp32", "tree", {"top_k": 2, "depth": 1,
                                                                                  "total_tokens": 3})}}}
    out = tmp_path / "eng"
    export_bundle(t, d, tables, vq, out, generation=gen, progress=False, lint=False, validate=False)
    ort = Pipeline.from_dir(out, backend="ort", threads=1)
    assert ort.precision == "fp32"
    a = ort.generate([1], seed=2)
    assert a.stats[0]["verify"] == "vanilla" and "recorded vanilla" in a.stats[0]["verify_reason"]
    assert torch.equal(a.tokens, ort.generate([1], seed=2, verify="vanilla").tokens)
    assert ort.generate([1], seed=2, verify="gasv").stats[0]["verify"] == "gasv"  # explicit wins
    tch = Pipeline.from_dir(out, backend="torch")
    m, tree, why = tch.resolve_verify("auto")
    assert (m, tree) == ("gasv", {"top_k": 2, "depth": 1, "total_tokens": 3}) and "recorded tree" in why
    assert tch.generate([1], seed=2).stats[0]["verify"] == "gasv"
    assert Pipeline.from_models(t, d, tables, vq, generation=GEN).resolve_verify("auto")[0] == "gasv"  # no record
    with pytest.raises(LisaError, match="valid: auto, "):
        ort.generate([1], verify="fastest")
    r = CliRunner().invoke(main, ["run", str(out), str(_prompt_file(tmp_path)), "--out", str(tmp_path / "o"),
                                  "--backend", "ort", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert "verify auto: ort/fp32: recorded vanilla" in r.output and "(ort, vanilla)" in r.output
    assert json.loads((tmp_path / "o" / "stats.json").read_text())["verify"] == "vanilla"


def test_verify_auto_applies_the_recorded_knobs_under_explicit_ones(parts):
    """A recorded decoder choice carries its knobs (zipar_window): auto runs them; an explicit
    knob still wins. ZipAR's forwards are fixed by its window, so the MAL tells which ran."""
    from lisa_trt.runtime.autotune import DecodeChoice

    t, d, tables, vq = parts
    rec = DecodeChoice(backend="torch", precision="fp32", method="zipar", tree=None, speedup=1.5, measured=True,
                       best_tree=None, best_tree_speedup=None, reason="torch/fp32: recorded zipar",
                       knobs={"zipar_window": 1}, lossless=False).to_dict()
    pipe = Pipeline.from_models(t, d, tables, vq, generation={**GEN, "decode": {"torch": {"fp32": rec}}})
    auto = pipe.generate([1], seed=3, decode=False)
    assert auto.stats[0]["verify"] == "zipar" and "recorded zipar" in auto.stats[0]["verify_reason"]
    one = pipe.generate([1], seed=3, decode=False, verify="zipar", zipar_window=1)
    wide = pipe.generate([1], seed=3, decode=False, verify="zipar", zipar_window=3)
    assert auto.stats[0]["mal"] == one.stats[0]["mal"] != wide.stats[0]["mal"]  # the knob was applied
    assert torch.equal(auto.tokens, one.tokens)
    over = pipe.generate([1], seed=3, decode=False, zipar_window=3)  # auto, explicit knob
    assert over.stats[0]["verify"] == "zipar" and over.stats[0]["mal"] == wide.stats[0]["mal"]


def _prompt_file(tmp_path):
    p = tmp_path / "auto.txt"
    p.write_text("1\n")
    return p


def test_a_partial_decode_before_any_free_token_is_refused():
    """PartialDecode fills the undecoded tokens with the row's first free one: asked before that token
    exists it refuses (it would fill with whatever the loop's buffer held), and after it the filler is it."""
    import torch

    from lisa_trt.errors import InputError
    from lisa_trt.runtime.pipeline import PartialDecode

    toks = torch.tensor([[5, 6, -1, -1], [7, -1, -1, -1]])
    with pytest.raises(InputError, match="first free token"):
        PartialDecode(None, 0, toks, torch.tensor([2, 0]), None, None).filled()
    got = PartialDecode(None, 0, toks, torch.tensor([2, 1]), None, None).filled()
    assert got.tolist() == [[5, 6, 5, 5], [7, 7, 7, 7]]
