"""`lisa-trt demo` smoke test on the bundled model (small settings), as CI runs it."""

import json

import pytest
from click.testing import CliRunner

from lisa_trt.models.artifact_sets import bundled_file
from lisa_trt.cli import main
from lisa_trt.demo.registry import assets_present

pytestmark = pytest.mark.skipif(
    not (assets_present() and bundled_file("demo-lisa", "drafters").is_file() and bundled_file("demo", "tables").is_file()),
    reason="bundled demo assets not built (scripts/demo/*)")


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    r = CliRunner()
    res = r.invoke(main, ["demo", "--out", str(tmp_path), "--num-images", "2"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["backend"] == "ort" and set(summary["results"]) == {"vanilla", "gasv"}
    g, v = summary["results"]["gasv"], summary["results"]["vanilla"]
    # LISA + GASV beats the plain loop on the same prompts: fewer target forwards, MAL above a floor
    # under the demo bundle's measured 1.50 on ORT (bench/demo_ort_bench.json)
    assert g["target_forwards"] < v["target_forwards"] and g["mal"] > 1.2, (g, v)
    assert (tmp_path / "vanilla_vs_lisa.png").read_bytes()[:4] == b"\x89PNG"
    # second run reuses the cached export
    res = r.invoke(main, ["demo", "--out", str(tmp_path), "--num-images", "2"])
    assert res.exit_code == 0 and "using cached export" in res.output


def test_demo_names_resolve():
    from lisa_trt.artifacts import load_drafter_by_name, load_tables_by_name
    from lisa_trt.demo.registry import load_demo_target
    from lisa_trt.models.checkpoints import target_hash

    t = load_demo_target()
    for name in ("demo-lisa", "demo-eagle3"):
        assert load_drafter_by_name(name, t).config.target_hash == target_hash(t)
    assert load_tables_by_name("demo", t).target_hash == target_hash(t)
