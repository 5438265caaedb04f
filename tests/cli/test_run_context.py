"""The resolve step (runtime/context.py): objects made once, family entries chosen outside the CLI.

- `resolve` turns a run's names and loose values into a Method, a SamplingConfig and a SpecConfig;
- `RunContext.run` sends a Chameleon / Lumina-mGPT directory (or engine directory) to the
  runtime/chameleon.py functions with the signatures and defaults the CLI used, and everything
  else to the generic entry;
- Pipeline, bench and serve take their settings from the same functions (one lookup by name).
"""

import json

import pytest
import torch
from click.testing import CliRunner

from lisa_trt.cli import main
from lisa_trt.config import SamplingConfig
from lisa_trt.errors import InputError
from lisa_trt.runtime import context as C
from lisa_trt.speculative.methods import METHODS, SpecConfig


def test_resolve_makes_the_objects_once():
    rc = C.resolve("demo", verify="gasv", sampling={"cfg_scale": 4.0, "top_k": None, "greedy": False, "seed": 3},
                   tree={"tree_depth": 3, "tree_top_k": None}, knobs={"gasv_kappa": 2.0, "lantern_delta": None})
    assert rc.method is METHODS["gasv"] and rc.verify == "gasv" and rc.seed == 3
    assert isinstance(rc.sampling, SamplingConfig) and rc.sampling.cfg_scale == 4.0
    assert isinstance(rc.spec, SpecConfig) and rc.spec.method == "gasv" and rc.spec.tree.depth == 3
    assert rc.spec.gasv.kappa == 2.0 and rc.spec.lantern.delta == SpecConfig().lantern.delta
    assert rc.family.name == "llamagen" and rc.source == "demo"
    demo_default = C.resolve("demo").sampling  # the artifact set's own sampling defaults
    from lisa_trt.demo.registry import demo_sampling

    assert demo_default == demo_sampling()


def test_resolve_method_and_its_errors():
    assert C.resolve_method("exact") is METHODS["exact"]
    assert C.resolve_method(METHODS["exact"]) is METHODS["exact"]
    assert C.resolve_method("auto", auto=True) is None and C.resolve_method(None) is None
    assert C.resolve_method(None, default="vanilla") is METHODS["vanilla"]
    with pytest.raises(InputError, match="unknown verification 'nope'; valid: auto, vanilla"):
        C.resolve_method("nope", auto=True)
    with pytest.raises(InputError, match="unknown verify rule 'x'"):
        C.resolve_method("x", auto=True, noun="verify rule")
    with pytest.raises(InputError, match="unknown verification 'auto'"):
        C.resolve_method("auto")  # only where "auto" means something


def test_resolve_spec_defaults_and_overrides():
    s = C.resolve_spec("vanilla", tree={"tree_depth": 2}, tree_default={"top_k": 3, "depth": 3, "total_tokens": 10})
    assert s.method == "greedy"  # a non-tree method gets the first tree method's settings
    assert (s.tree.top_k, s.tree.depth, s.tree.total_tokens) == (3, 2, 10)
    assert C.resolve_spec(None).method == SpecConfig().method
    with pytest.raises(InputError, match="unknown speculation setting"):
        C.resolve_spec("gasv", knobs={"bogus": 1})


def test_bind_tunes_the_tree_and_checks_top_k_against_the_vocabulary():
    from lisa_trt.testing import make_target

    t = make_target()
    rc = C.resolve("x.safetensors", verify="exact", tree={"tree_tokens": 7}).bind(t)
    tuned = C.tuned_tree("x.safetensors", t, "torch")
    assert rc.target is t and rc.spec.tree.total_tokens == 7 and rc.spec.tree.depth == tuned["depth"]
    with pytest.raises(InputError, match="larger than the vocabulary"):
        C.resolve("x.safetensors", sampling={"top_k": t.config.vocab_size + 1}).bind(t)


def test_generic_entries_are_used_for_other_families():
    rc = C.resolve("x.safetensors")
    ctx, kw = rc.run("generate", lambda ctx, **kw: (ctx, kw), a=1)
    assert ctx is rc and kw == {"a": 1}


# ----------------------------------------------------------------------------- family entries via the CLI

@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "lumina"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "chameleon"}')
    return d


def _record(monkeypatch, name, ret=None):
    seen = {}

    def fn(*a, **kw):
        seen["args"], seen["kw"] = a, kw
        return ret

    monkeypatch.setattr(f"lisa_trt.runtime.chameleon.{name}", fn)
    return seen


def test_generate_on_a_directory_calls_the_family_entry_as_before(model_dir, monkeypatch, tmp_path):
    seen = _record(monkeypatch, "cli_generate")
    r = CliRunner().invoke(main, ["generate", "--model", str(model_dir), "--prompt", "a", "--prompt", "b",
                                  "--tree-depth", "3", "--top-k", "50", "--seed", "2", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    a = seen["args"]
    assert a[0] == str(model_dir) and a[1] == ("a", "b") and a[2] == str(tmp_path / "o")
    assert a[3] is None and a[5:10] == (None, None, 50, False, 2)  # image size / sampling: the family's defaults
    assert a[10] is None and a[12] == (4, 3, 16)  # verify not given; tree (4, 4, 16) with the depth given
    r = CliRunner().invoke(main, ["generate", "--model", str(model_dir), "--prompt", "a", "--image-size", "384"])
    assert r.exit_code == 0 and seen["args"][3] == 384


def test_calibrate_train_export_on_a_directory(model_dir, monkeypatch, tmp_path):
    class T:
        n_clusters, vocab_size = 5, 8192

    seen = _record(monkeypatch, "calibrate_cli", T())
    r = CliRunner().invoke(main, ["calibrate", "--model", str(model_dir), "--out", str(tmp_path / "t.safetensors"),
                                  "--rollouts", "3"])
    assert r.exit_code == 0, r.output
    assert "5 clusters over 8192 image codes" in r.output
    kw = seen["kw"]
    assert kw["image_size"] == 512 and kw["rollouts"] == 3 and (kw["gasv"].kappa, kw["gasv"].lam) == (1.0, 0.6)
    assert (kw["cfg_scale"], kw["temperature"], kw["top_k"]) == (3.0, 1.0, 2000)

    seen = _record(monkeypatch, "train_cli", {"steps": 2})
    r = CliRunner().invoke(main, ["train", "--model", str(model_dir), "--out", str(tmp_path / "run"), "--steps", "2",
                                  "--cfg-scale", "2.5"])
    assert r.exit_code == 0, r.output
    assert seen["kw"]["steps"] == 2 and seen["kw"]["cfg_scale"] == 2.5 and "batch_size" not in seen["kw"]
    r = CliRunner().invoke(main, ["train", "--model", str(model_dir), "--out", str(tmp_path / "run"), "--bf16"])
    assert r.exit_code == 2 and "train on target rollouts only" in r.output

    seen = _record(monkeypatch, "export_cli", {"graphs": {"target": {}}, "max_cache_len": 99})
    r = CliRunner().invoke(main, ["export", "--model", str(model_dir), "--out", str(tmp_path / "e"), "--top-k", "7"])
    assert r.exit_code == 0, r.output
    assert seen["kw"]["generation"] == {"top_k": 7} and seen["kw"]["validate"] is True and "99 slots" in r.output
    r = CliRunner().invoke(main, ["export", "--model", str(model_dir), "--out", str(tmp_path / "e"), "--fp16",
                                  "--quantize", "int8"])
    assert r.exit_code == 0, r.output
    assert seen["kw"]["fp16"] is True and seen["kw"]["quantize"] == "int8"


def test_run_and_build_on_a_family_engine_directory(monkeypatch, tmp_path):
    e = tmp_path / "eng"
    e.mkdir()
    (e / "chameleon_engine.json").write_text(json.dumps({"image_size": 64}))
    prompts = tmp_path / "p.txt"
    prompts.write_text("a fox\n")
    seen = _record(monkeypatch, "run_cli", {"captions": ["a fox"], "seconds": 0.5, "mal": 2.0})
    r = CliRunner().invoke(main, ["run", str(e), str(prompts), "--out", str(tmp_path / "o"), "--tree-tokens", "9"])
    assert r.exit_code == 0, r.output
    assert "running gasv" in r.output and "(ort, gasv), MAL 2.00" in r.output
    assert seen["kw"]["verify"] == "gasv" and seen["kw"]["tree"] == (None, None, 9)
    r = CliRunner().invoke(main, ["run", str(e), str(prompts), "--backend", "torch"])
    assert r.exit_code == 2 and "ONNX Runtime only" in r.output
    r = CliRunner().invoke(main, ["build", str(e)])
    assert r.exit_code == 2 and "no manifest.json" in r.output and "lisa-trt export" in r.output  # a legacy dir


# ----------------------------------------------------------------------------- Pipeline / bench / serve

def test_pipeline_looks_the_method_up_once(monkeypatch):
    from lisa_trt.runtime import pipeline as P
    from lisa_trt.testing import make_target

    calls = []
    real = P.resolve_method
    monkeypatch.setattr(P, "resolve_method", lambda v, **kw: calls.append(v) or real(v, **kw))
    pipe = P.Pipeline.from_models(make_target(), threads=1)
    res = pipe.generate([1, 2], verify="vanilla", decode=False)
    assert res.tokens.shape[0] == 2 and res.stats[0]["verify"] == "vanilla"
    assert calls[0] == "vanilla" and all(not isinstance(c, str) for c in calls[1:])  # then the Method itself
    res2 = pipe.generate([1, 2], verify=METHODS["vanilla"], decode=False)  # a Method is accepted as is
    assert torch.equal(res.tokens, res2.tokens)


def test_bench_takes_methods_as_objects():
    from lisa_trt.bench import run_bench
    from lisa_trt.testing import make_target

    t = make_target()
    rep = run_bench(t, None, None, [METHODS["vanilla"], "sjd"], [1], sampling=SamplingConfig(), spec=SpecConfig(),
                    progress=False)
    assert set(rep["results"]) == {"vanilla", "sjd"} and rep["results"]["sjd"]["method"] == "sjd"
