"""Issue 52 item 4 (and the demo's summary of item 8): `--verify auto` prefers the drafter the
bundle carries; a recorded choice decides only when it was measured with this bundle's drafter;
otherwise the documented default (gasv with the bundle's drafter) runs, said in one line. The
demo ends with the command to deploy and what its auto runs; summary.json counts target forwards."""

import dataclasses

import pytest

from lisa_trt.config import SamplingConfig
from lisa_trt.export.manifest import drafter_hash
from lisa_trt.models.drafter import Drafter
from lisa_trt.runtime.autotune import DecodeChoice, auto_method, default_auto_method, record_choices
from lisa_trt.runtime.pipeline import Pipeline

GEN = {"sampling": {"cfg_scale": 2.0, "top_k": 0}, "class_names": [f"c{i}" for i in range(10)],
       "tree": {"default": {"top_k": 2, "depth": 1, "total_tokens": 3}}}


def _zipar(**kw) -> DecodeChoice:
    return DecodeChoice(backend="ort", precision="fp32", method="zipar", tree=None, speedup=1.4, measured=True,
                        best_tree=None, best_tree_speedup=None, reason="ort/fp32: zipar[window=4] measured 1.40x",
                        knobs={"zipar_window": 4}, lossless=False, **kw)


def test_a_choice_measured_with_another_drafter_is_not_this_bundles():
    gen = record_choices({}, [_zipar()], measured_with={"drafter": "demo-hash"})
    assert gen["decode"]["ort"]["fp32"]["measured_with"] == {"drafter": "demo-hash"}
    m, settings, why = auto_method(gen, "ort", "fp32", "gasv", drafter_hash="my-hash")
    assert (m, settings) == ("gasv", None)
    assert "another drafter" in why and "bench ENGINE_DIR" in why and "with the bundle's drafter" in why
    assert "\n" not in why
    assert auto_method(gen, "ort", "fp32", "gasv", drafter_hash="demo-hash")[:2] == ("zipar", {"zipar_window": 4})
    m, _, why = auto_method({}, "ort", "fp32", "gasv", drafter_hash="my-hash")
    assert m == "gasv" and "no measurement of this bundle" in why


def test_the_default_uses_the_bundles_drafter():
    assert default_auto_method(True, True) == "gasv"
    assert default_auto_method(True, False) == "exact"
    assert default_auto_method(False, False) == "vanilla"


def _bundle_of(pipe, drafter):
    """The manifest facts resolve_verify reads of an exported bundle (an export takes minutes here):
    its drafter's hash and precision."""
    from types import SimpleNamespace

    pipe._e.manifest = SimpleNamespace(drafter={"hash": drafter_hash(drafter)}, precision="fp32",
                                       quantization="none", dir=None)
    return pipe


@pytest.mark.parametrize("same_drafter", [True, False])
def test_a_bundle_runs_its_own_measurement_or_its_drafter(parts, tmp_path, same_drafter):
    """The user's drafter with a choice timed on another drafter (the demo's zipar, recorded in
    its export): auto runs gasv with the bundle's drafter; timed with this one, the recorded zipar."""
    from lisa_trt.runtime.demo import deploy_line

    t, d, tables, vq = parts
    choice = dataclasses.replace(_zipar(), backend="torch")
    gen = record_choices(GEN, [choice], {"drafter": drafter_hash(d) if same_drafter else "f" * 64})
    pipe = _bundle_of(Pipeline.from_models(t, d, tables, vq, generation=gen), d)
    method, _, why = pipe.resolve_verify("auto")
    assert method == ("zipar" if same_drafter else "gasv"), why
    res = pipe.generate([1], seed=0, decode=False)
    assert res.stats[0]["verify"] == method and res.stats[0]["verify_reason"] == why
    line = deploy_line(pipe, tmp_path / "eng", "gasv")
    assert f"lisa-trt run {tmp_path / 'eng'} PROMPTS.txt" in line and "\n" not in line
    assert ("runs zipar there, not gasv, the method compared above" if same_drafter else
            "runs gasv there, the method compared above") in line


def test_export_records_the_shipped_choices_only_for_their_own_drafter():
    from lisa_trt.artifacts import load_drafter_by_name
    from lisa_trt.demo.registry import load_demo_target
    from lisa_trt.runtime.outputs import generation_defaults

    target = load_demo_target()
    own = load_drafter_by_name("demo-lisa", target)
    gen = generation_defaults("demo", target, SamplingConfig(), drafter="demo-lisa", drafter_model=own)
    recorded = gen["decode"]["ort"]["fp32"]
    assert recorded["measured_with"] == {"drafter": drafter_hash(own)}
    mine = Drafter.from_target(target).eval()
    gen = generation_defaults("demo", target, SamplingConfig(), drafter="runs/me/drafter.safetensors",
                              drafter_model=mine, tables="demo")
    assert "decode" not in gen
    assert gen["sources"] == {"model": "demo", "drafter": "runs/me/drafter.safetensors", "tables": "demo"}


def test_demo_summary_counts_target_forwards(parts):
    """summary.json read `target_forwards`, a key the stats call `forwards`: it was always 0."""
    from lisa_trt.runtime.demo import speed_row

    t, d, tables, vq = parts
    pipe = Pipeline.from_models(t, d, tables, vq, generation=GEN)
    for verify in ("vanilla", "gasv"):
        res = pipe.generate([1, 2], seed=0, verify=verify, decode=False)
        row = speed_row(res, 0.5)
        want = sum(s["forwards"] for s in res.stats) / 2
        assert row["target_forwards"] == want > 0
        if verify == "vanilla":
            assert row["target_forwards"] == t.config.block_size  # one forward per token (prefill included)
