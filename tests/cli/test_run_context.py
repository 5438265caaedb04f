"""The resolve step (runtime/context.py): objects made once, family entries chosen outside the CLI.

- `resolve` turns a run's names and loose values into a Method, a SamplingConfig and a SpecConfig;
- `RunContext.run` sends every family to the one generic entry; a Chameleon / Lumina-mGPT directory
  gets its family's defaults (sampling, tree, image size) and capabilities (training data) from
  the family's hooks;
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
from lisa_trt.speculative.methods import get_method


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
    s = C.resolve_spec(METHODS["vanilla"], tree={"tree_depth": 2},
                       tree_default={"top_k": 3, "depth": 3, "total_tokens": 10})
    assert s.method == "greedy"  # a non-tree method gets the first tree method's settings
    assert (s.tree.top_k, s.tree.depth, s.tree.total_tokens) == (3, 2, 10)
    assert C.resolve_spec(None).method == SpecConfig().method
    with pytest.raises(InputError, match="unknown speculation setting"):
        C.resolve_spec(METHODS["gasv"], knobs={"bogus": 1})
    with pytest.raises(TypeError, match="the resolved Method"):  # a name is looked up where the run resolves
        C.resolve_spec("gasv")


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
    ctx, kw = rc.run(lambda ctx, **kw: (ctx, kw), a=1)
    assert ctx is rc and kw == {"a": 1}


# ----------------------------------------------------------------------------- every family through the generic entries

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Chameleon / Lumina-mGPT directory (tokenizer + VQGAN), tests/calibration/table_cases.py's."""
    import sys
    from pathlib import Path

    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "calibration"))
    import table_cases as tc

    return tc.chameleon_model_dir(tmp_path_factory.mktemp("lumina"))


def test_run_context_has_no_family_entries():
    assert not hasattr(C, "_FAMILY_ENTRIES")
    rc = C.resolve("x.safetensors")
    assert rc.run(lambda ctx, **kw: kw, a=1) == {"a": 1}


def test_generate_on_a_directory_uses_the_family_defaults(model_dir, tmp_path):
    import numpy as np

    r = CliRunner().invoke(main, ["generate", "--model", str(model_dir), "--prompt", "a", "--prompt", "b",
                                  "--image-size", "32", "--seed", "2", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    st = json.loads((tmp_path / "o" / "stats.json").read_text())
    assert st["family"] == "chameleon" and st["verify"] == "vanilla" and st["prompts"] == ["a", "b"]
    s = st["sampling"]
    assert (s["cfg_scale"], s["temperature"], s["top_k"]) == (3.0, 1.0, 2000)  # Lumina-mGPT's defaults
    assert np.load(tmp_path / "o" / "tokens.npy").shape == (2, 2, 2) and len(list((tmp_path / "o").glob("*.png"))) == 2
    rc = C.resolve(str(model_dir), verify="exact", tree={"tree_depth": 3})
    rc = rc.bind(lisa_trt_load(model_dir))
    assert (rc.spec.tree.top_k, rc.spec.tree.depth, rc.spec.tree.total_tokens) == (4, 3, 16)  # the family's tree
    r = CliRunner().invoke(main, ["generate", "--model", str(model_dir), "--out", str(tmp_path / "p")])
    assert r.exit_code == 2 and "--prompt" in r.output and not (tmp_path / "p").exists()
    r = CliRunner().invoke(main, ["generate", "--model", str(model_dir), "--prompt", "a", "--image-size", "32",
                                  "--verify", "sjd", "--out", str(tmp_path / "q")])
    assert r.exit_code == 0, r.output  # the Jacobi decoders read the family's layout (forced row ends)
    assert json.loads((tmp_path / "q" / "stats.json").read_text())["verify"] == "sjd"


def lisa_trt_load(d):
    import lisa_trt

    return lisa_trt.load_target(str(d))


def test_calibrate_and_train_on_a_directory(model_dir, tmp_path):
    from lisa_trt.calibration.tables import load_tables

    out = tmp_path / "t.safetensors"
    r = CliRunner().invoke(main, ["calibrate", "--model", str(model_dir), "--out", str(out), "--rollouts", "2",
                                  "--image-size", "32", "--samples-per-pos", "2", "--clusters", "3", "--lantern-k", "4"])
    assert r.exit_code == 0, r.output
    t = load_tables(out)
    assert "3 clusters over" in r.output and t.settings["family"] == "chameleon"
    from lisa_trt.calibration.profile import CALIBRATION_GASV as neutral  # the quality-neutral knobs (issue 52)

    assert (t.config.kappa, t.config.lam, t.config.delta) == (neutral.kappa, neutral.lam, neutral.delta)
    s = t.settings["sampling"]
    assert (s["cfg_scale"], s["temperature"], s["top_k"]) == (3.0, 1.0, 2000)
    r = CliRunner().invoke(main, ["train", "--model", str(model_dir), "--out", str(tmp_path / "run"), "--data",
                                  "tokens", "--token-file", "x.npy"])
    assert r.exit_code == 2 and "train on --data self only" in r.output
    r = CliRunner().invoke(main, ["train", "--model", str(model_dir), "--out", str(tmp_path / "run"), "--arch", "medusa",
                                  "--image-size", "32", "--draft-vocab", "4"])  # Medusa heads train (drafters/test_medusa_prompted.py), not this
    assert r.exit_code == 2 and "--arch eagle3" in r.output
    r = CliRunner().invoke(main, ["train", "--model", str(model_dir), "--out", str(tmp_path / "run"), "--steps", "2",
                                  "--num-samples", "2", "--batch-size", "2", "--image-size", "32", "--cfg-scale", "2.5",
                                  "--eval-images", "2"])
    assert r.exit_code == 0, r.output
    ev = json.loads((tmp_path / "run" / "eval_decode.json").read_text())  # held-out prompts, real decoding
    assert ev["images"] == 2 and len(ev["prompts"]) == 2 and ev["sampling"]["cfg_scale"] == 2.5
    cfg = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert cfg["steps"] == 2 and cfg["data"]["cfg_scale"] == 2.5 and cfg["data"]["top_k"] == 2000
    assert (tmp_path / "run" / "drafter.safetensors").is_file()
    r = CliRunner().invoke(main, ["bench", "--model", str(model_dir), "--methods", "exact", "--num-images", "2",
                                  "--image-size", "32", "--drafter", str(tmp_path / "run" / "drafter.safetensors"),
                                  "--tree-tokens", "6", "--json", str(tmp_path / "b.json")])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "b.json").read_text())
    assert set(rep["results"]) == {"vanilla", "exact"} and rep["settings"]["num_images"] == 2
    assert rep["settings"]["captions"][:2] == ["a red fox in the snow", "a bowl of ramen on a wooden table"]
    # issue 27: `bench --methods vanilla,sjd,mcsjd,sjd-pac,gsd,zipar` on a Chameleon-family model, and LISA's
    # drafter combined with them (coupled: the trained drafter; sjd-gasv: the calibrated tables)
    r = CliRunner().invoke(main, ["bench", "--model", str(model_dir), "--methods",
                                  "vanilla,sjd,mcsjd,sjd-pac,gsd,zipar,coupled,sjd-gasv", "--num-images", "2",
                                  "--image-size", "32", "--drafter", str(tmp_path / "run" / "drafter.safetensors"),
                                  "--tables", str(out), "--tree-tokens", "6", "--top-k", "10", "--sjd-window", "3",
                                  "--sjd-pac-width", "2", "--json", str(tmp_path / "j.json")])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "j.json").read_text())
    res = rep["results"]
    assert set(res) == {"vanilla", "sjd", "mcsjd", "sjd-pac", "gsd", "zipar", "coupled", "sjd-gasv"}
    assert all(res[m]["mean_tvd"] == 0.0 for m in ("sjd", "mcsjd", "sjd-pac", "coupled")), res
    assert rep["settings"]["sjd_window"] == 3
    # one image per decode: each method's MAL is the plain loop's steps over its own (the forwards it counted)
    van = res["vanilla"]["target_forwards_per_image"]
    for m, r_ in res.items():
        assert r_["mal"] == pytest.approx((van - 1) / (r_["target_forwards_per_image"] - 1)), m


def test_run_and_build_on_a_legacy_engine_directory(tmp_path):
    e = tmp_path / "eng"
    e.mkdir()
    (e / "chameleon_engine.json").write_text(json.dumps({"image_size": 64}))
    prompts = tmp_path / "p.txt"
    prompts.write_text("a fox\n")
    r = CliRunner().invoke(main, ["run", str(e), str(prompts), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "lisa-trt export" in r.output
    r = CliRunner().invoke(main, ["build", str(e)])
    assert r.exit_code == 2 and "no manifest.json" in r.output and "lisa-trt export" in r.output


# ----------------------------------------------------------------------------- Pipeline / bench / serve

def test_pipeline_runs_a_prompted_family(model_dir):
    """Pipeline over an in-memory Chameleon target: captions through the family's prompter, the
    family's sampling defaults, code grids in `codes`; one generator per batch with row_seeds=False
    equals the generic dispatch on the whole request."""
    import lisa_trt
    from lisa_trt.models.family import family_of
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.speculative.run import run_method

    t = lisa_trt.load_target(str(model_dir))
    pipe = Pipeline.from_models(t, vq=lisa_trt.load_vq(str(model_dir)), generation={"image_size": 32}, threads=1)
    assert pipe.sampling().cfg_scale == 3.0 and pipe.sampling().top_k == 2000  # the family's defaults
    res = pipe.generate(["a red fox", "tok70 tok71"], verify="vanilla", seed=1)
    assert res.codes.shape == (2, 2, 2) and len(res.images) == 2 and res.images[0].size == (4, 4)
    assert res.stats[0]["caption"] == "a red fox"
    both = pipe.generate(["a red fox", "tok70 tok71"], verify="vanilla", seed=1, batch=True, row_seeds=False,
                         decode=False)
    req = family_of(t.config).prompter(t).encode(["a red fox", "tok70 tok71"], image_size=32, cfg=True)
    want, _ = run_method(get_method("vanilla"), t, None, None, req.cond, sampling=pipe.sampling(), spec=SpecConfig(), seed=1,
                         layout=req.layout)
    assert torch.equal(both.tokens, want)
    with pytest.raises(InputError, match="caption strings"):
        pipe.generate([3], verify="vanilla")


def test_the_jacobi_decoders_batch_and_serve_a_prompted_family(model_dir):
    """Pipeline.generate(batch=True) (what serve runs) with the Jacobi-family decoders on a
    Chameleon target: each row decoded alone with its own seed (the loops have no per-row
    generators), equal to one call per prompt; the serve model answers them (it used to refuse:
    'the SJD loop has no per-row generators')."""
    import numpy as np

    import lisa_trt
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.serve.model import ServeModel

    t = lisa_trt.load_target(str(model_dir))
    pipe = Pipeline.from_models(t, vq=lisa_trt.load_vq(str(model_dir)), generation={"image_size": 32}, threads=1)
    caps = ["a red fox", "tok70 tok71"]
    for v in ("sjd", "mcsjd", "sjd-pac", "gsd", "zipar"):
        both = pipe.generate(caps, verify=v, seed=1, batch=True, decode=False, sjd_window=3, sjd_pac_tree_width=2)
        alone = pipe.generate(caps, verify=v, seed=1, decode=False, sjd_window=3, sjd_pac_tree_width=2)
        assert torch.equal(both.tokens, alone.tokens) and torch.equal(both.codes, alone.codes), v
        assert [s["batch_row"] for s in both.stats] == [0, 1] and both.stats[1]["caption"] == caps[1]
    served = ServeModel(pipe, max_batch=4).infer_each(
        [{"prompt": np.array([[c.encode()] for c in caps], dtype=object), "seed": np.array([[1], [2]]),
          "verify": np.array([[b"mcsjd"], [b"mcsjd"]], dtype=object),
          "top_k": np.array([[10], [10]], np.int32)}])  # the family's default (2000) exceeds this tiny vocabulary
    (err, out), = served
    assert err is None and out["image"].shape[0] == 2, err


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
    from lisa_trt.harness import run_bench
    from lisa_trt.testing import make_target

    t = make_target()
    rep = run_bench(t, None, None, [METHODS["vanilla"], METHODS["sjd"]], [1], sampling=SamplingConfig(),
                    spec=SpecConfig(), progress=False)
    assert set(rep["results"]) == {"vanilla", "sjd"} and rep["results"]["sjd"]["method"] == "sjd"
    assert rep["results"]["vanilla"]["mal"] == 1.0  # the baseline (Method.baseline): MAL 1 by definition
    assert not rep["results"]["sjd"]["uses_tree"]  # a Jacobi point records no draft tree (autotune.bench_choice)
    with pytest.raises(TypeError, match="resolved Methods"):  # names resolve once, at the bench's entry
        run_bench(t, None, None, ["sjd"], [1], sampling=SamplingConfig(), spec=SpecConfig(), progress=False)
