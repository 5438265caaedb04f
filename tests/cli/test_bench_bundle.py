"""Issue 52 items 7 and 8 (bench part) and 4 (bench records what auto runs): `bench ENGINE_DIR`
(positional, `--engine-dir` kept) takes the model, drafter and tables the bundle was exported
from; a mismatch names those files; bench.json records the GASV constants in effect; with
--record the bench's never-slower choice is kept beside the manifest and `--verify auto` runs it."""

import json

import pytest
from click.testing import CliRunner

from lisa_trt.cli import main
from lisa_trt.errors import ArtifactMismatchError

SOURCES = {"model": "demo", "drafter": "demo-eagle3", "tables": "demo"}


def _fake_bundle(tmp_path, sources=SOURCES):
    """An engine directory's manifest alone (what bench reads before any engine opens)."""
    d = tmp_path / "eng"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"precision": "fp32", "generation": {"sources": sources},
                                                 "tables": {"gasv": {"kappa": 2.0, "lam": 0.4, "delta": 0.3}}}))
    return d


class _Opened(Exception):
    pass


@pytest.fixture
def seen(monkeypatch):
    """load_engines stand-in: records what bench checked the bundle against, then stops."""
    got = {}

    def load(engine_dir, backend, **kw):
        got.update(kw, backend=backend, engine_dir=str(engine_dir))
        raise _Opened

    monkeypatch.setattr("lisa_trt.engines.graph.load_engines", load)
    return got


@pytest.mark.parametrize("spelling", ["positional", "--engine-dir"])
def test_bench_takes_the_bundles_own_artifacts(tmp_path, seen, spelling):
    from lisa_trt.artifacts import load_drafter_by_name
    from lisa_trt.demo.registry import load_demo_target
    from lisa_trt.export.manifest import drafter_hash

    d = _fake_bundle(tmp_path)
    where = [str(d)] if spelling == "positional" else ["--engine-dir", str(d)]
    r = CliRunner().invoke(main, ["bench", *where, "--methods", "vanilla,exact", "--num-images", "1",
                                  "--json", str(tmp_path / "b.json")])
    assert isinstance(r.exception, _Opened), r.output
    assert seen["backend"] == "ort" and seen["engine_dir"] == str(d)  # auto: no engines built -> ONNX Runtime
    # the recorded drafter (demo-eagle3), not the demo's default (demo-lisa)
    want = drafter_hash(load_drafter_by_name("demo-eagle3", load_demo_target()))
    assert seen["drafter_hash"] == want


def test_a_mismatch_names_the_files_the_bundle_was_made_from(tmp_path, monkeypatch):
    def load(engine_dir, backend, **kw):
        raise ArtifactMismatchError("the drafter's hash differs from the one the engines were exported with")

    monkeypatch.setattr("lisa_trt.engines.graph.load_engines", load)
    d = _fake_bundle(tmp_path)
    r = CliRunner().invoke(main, ["bench", str(d), "--drafter", "demo-lisa", "--methods", "vanilla,exact",
                                  "--num-images", "1", "--json", str(tmp_path / "b.json")])
    assert r.exit_code == 2
    assert f"{d} was made from --model demo --drafter demo-eagle3 --tables demo" in r.output


def test_bench_without_a_model_or_a_record_says_what_to_pass(tmp_path):
    r = CliRunner().invoke(main, ["bench", "--json", str(tmp_path / "b.json")])
    assert r.exit_code == 2 and "--model" in r.output and "ENGINE_DIR" in r.output
    d = _fake_bundle(tmp_path, sources={})
    r = CliRunner().invoke(main, ["bench", str(d), "--json", str(tmp_path / "b.json")])
    assert r.exit_code == 2 and "does not record the model" in r.output
    r = CliRunner().invoke(main, ["bench", str(d), "--engine-dir", str(tmp_path), "--json", str(tmp_path / "b.json")])
    assert r.exit_code == 2 and "differ" in r.output


def test_bench_json_records_the_gasv_constants_in_effect(tmp_path):
    """bench.json's settings said `"gasv": {}` (the overrides only): now the tables' constants
    with the run's knobs over them."""
    out = tmp_path / "b.json"
    r = CliRunner().invoke(main, ["bench", "--model", "demo", "--methods", "vanilla,gasv", "--num-images", "1",
                                  "--kappa", "1.5", "--tree-tokens", "4", "--tree-depth", "1", "--tree-top-k", "2",
                                  "--json", str(out)])
    assert r.exit_code == 0, r.output
    from lisa_trt.artifacts import load_tables_by_name
    from lisa_trt.demo.registry import load_demo_target

    tables = load_tables_by_name("demo", load_demo_target()).config
    g = json.loads(out.read_text())["settings"]["gasv"]
    assert g["kappa"] == 1.5 and g["lam"] == tables.lam and g["delta"] == tables.delta
    assert g["neighbours"] == tables.neighbours
    from lisa_trt.speculative.methods import SpecConfig

    knobs = json.loads(out.read_text())["settings"]["knobs"]  # every method's knob in effect
    assert knobs["zipar_window"] == SpecConfig().flat()["zipar_window"] and knobs["gasv_kappa"] == 1.5


def test_gasv_in_effect_reads_the_bundles_tables_when_none_loaded(tmp_path):
    from lisa_trt.harness import gasv_in_effect
    from lisa_trt.speculative.methods import SpecConfig

    d = _fake_bundle(tmp_path)
    assert gasv_in_effect(SpecConfig.make(gasv_delta=0.5), None, d) == {"kappa": 2.0, "lam": 0.4, "delta": 0.5}
    assert gasv_in_effect(SpecConfig(), None, None) is None


def _results(gasv_neutral):
    return {"vanilla": {"method": "vanilla", "knobs": {}, "speedup": 1.0, "mean_tvd": 0.0},
            "exact": {"method": "exact", "knobs": {}, "speedup": 1.3, "mean_tvd": 0.0, "uses_tree": True},
            "gasv": {"method": "gasv", "knobs": {}, "speedup": 1.6, "mean_tvd": 0.02, "quality_neutral": gasv_neutral,
                     "uses_tree": True},
            "zipar": {"method": "zipar", "knobs": {"zipar_window": 4}, "speedup": 1.4, "mean_tvd": 0.03,
                      "quality_neutral": False}}


@pytest.mark.parametrize("neutral,want", [(None, "exact"), (True, "gasv")])
def test_a_recorded_bench_decides_auto(tmp_path, neutral, want):
    from lisa_trt.runtime.autotune import auto_method, bench_choice, record_measured, with_measured

    tree = {"top_k": 2, "depth": 1, "total_tokens": 3}
    c = bench_choice(_results(neutral), backend="ort", precision="fp32", baseline="vanilla", drafter_hash="h1",
                     tree=tree)
    assert c.method == want and c.tree == tree and c.measured_with == {"drafter": "h1"}
    assert "measured by `lisa-trt bench` on this bundle" in c.reason
    record_measured(tmp_path, c)
    gen = with_measured({"decode": {"ort": {"int8": {"method": "vanilla"}}}}, tmp_path)
    assert gen["decode"]["ort"]["int8"] == {"method": "vanilla"}  # the export's other choices stay
    m, settings, why = auto_method(gen, "ort", "fp32", "gasv", drafter_hash="h1")
    assert (m, settings) == (want, tree) and why == c.reason
    assert auto_method(gen, "ort", "fp32", "gasv", drafter_hash="h2")[0] == "gasv"  # another drafter's


def test_one_zipar_window_on_a_bundle(tmp_path):
    """The demo's ZipAR window was 8 in bench and 4 in auto: on a bundle, the window it measured is
    the default of bench, of `run --verify zipar` and of auto alike; explicit values win."""
    from types import SimpleNamespace

    from lisa_trt.harness import bundle_knobs
    from lisa_trt.runtime.autotune import DecodeChoice, record_choices
    from lisa_trt.runtime.pipeline import Pipeline

    c = DecodeChoice(backend="ort", precision="fp32", method="zipar", tree=None, speedup=1.4, measured=True,
                     best_tree=None, best_tree_speedup=None, reason="ort/fp32: zipar[window=4]",
                     knobs={"zipar_window": 4}, lossless=False)
    gen = record_choices({}, [c], {"drafter": "h1"})
    d = tmp_path / "eng"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"precision": "fp32", "generation": gen, "drafter": {"hash": "h1"}}))
    assert bundle_knobs(d, "ort", {"zipar_window": None, "gasv_kappa": None}) == {"zipar_window": 4}
    assert bundle_knobs(d, "ort", {"zipar_window": 2}) == {"zipar_window": 2}
    assert bundle_knobs(None, "torch", {"zipar_window": None}) == {"zipar_window": None}
    pipe = SimpleNamespace(_e=SimpleNamespace(generation=gen, backend="ort", drafter=object(), tables=object(),
                                              gasv=None, manifest=SimpleNamespace(drafter={"hash": "h1"},
                                                                                  precision="fp32", quantization="none")))
    pipe.precision = "fp32"
    resolve = Pipeline.resolve_verify.__get__(pipe)
    assert resolve("zipar")[1] == {"zipar_window": 4} and resolve("auto")[:2] == ("zipar", {"zipar_window": 4})
    assert resolve("gasv")[1] == {}
    pipe._e.manifest.drafter = {"hash": "h2"}  # measured with another drafter: not this bundle's
    assert resolve("zipar")[1] == {} and resolve("auto")[0] == "gasv"
