"""`lisa-trt generate --verify sjd-pac / zipar` and `lisa-trt bench --methods
vanilla,sjd,mcsjd,sjd-pac,gsd,zipar` on a tiny random checkpoint (batch 2, CFG): the knobs each
file registers reach its rule through the CLI, and the bench report has every point."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from lisa_trt.cli import main


def test_generate_and_bench_run_the_new_decoders(tmp_path, check_mal):
    r = CliRunner()
    pt = tmp_path / "tiny.pt"
    assert r.invoke(main, ["random-checkpoint", str(pt), "--config", "tiny"]).exit_code == 0
    base = ["generate", "--model", str(pt), "--config", "tiny", "--classes", "1,2", "--cfg-scale", "2", "--seed", "4"]
    stats = {}
    for name, extra in (("pac", ["--verify", "sjd-pac", "--sjd-pac-width", "2", "--sjd-pac-depth", "2"]),
                        ("zip1", ["--verify", "zipar", "--zipar-window", "1"]),
                        ("zip4", ["--verify", "zipar", "--zipar-window", "4"])):
        res = r.invoke(main, base + extra + ["--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        assert np.load(tmp_path / name / "tokens.npy").shape == (2, 16)
        stats[name] = json.loads((tmp_path / name / "stats.json").read_text())
    assert stats["pac"]["mean_tvd"] == 0.0
    # speculation on this random checkpoint (a nearly flat law: the window's drafts are accepted; measured
    # 4 forwards for the batch of 2): fewer target forwards than the plain loop's 16, and the MAL is the decode's
    assert stats["pac"]["target_forwards"] < 16
    check_mal(stats["pac"]["mal"], stats["pac"]["target_forwards"], 16, rows=2)
    # the knob reached ZipAR: a full-row window (4 x 4 grid) is AR (TVD 0), a window of 1 is not
    assert stats["zip4"]["mean_tvd"] < 1e-5 and stats["zip1"]["mean_tvd"] > 1e-4
    assert stats["zip1"]["target_forwards"] < stats["zip4"]["target_forwards"]
    res = r.invoke(main, ["bench", "--model", str(pt), "--config", "tiny", "--methods",
                          "vanilla,sjd,mcsjd,sjd-pac,gsd,zipar", "--num-images", "2", "--cfg-scale", "2",
                          "--sjd-window", "4", "--zipar-window", "2", "--json", str(tmp_path / "b.json")])
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "b.json").read_text())["results"]
    assert set(rep) == {"vanilla", "sjd", "mcsjd", "sjd-pac", "gsd", "zipar"}
    assert rep["sjd-pac"]["mean_tvd"] == 0.0 and rep["zipar"]["mean_tvd"] > 0 and rep["gsd"]["mean_tvd"] > 0
    assert rep["zipar"]["target_forwards_per_image"] < rep["vanilla"]["target_forwards_per_image"]


def test_generate_takes_the_sjd_window(tmp_path):
    """`lisa-trt generate --sjd-window` reaches the Jacobi loop (other windows, other decodes; the
    tokens stay the AR loop's under a one-hot law); stats.json records it; 0 is refused."""
    r = CliRunner()
    pt = tmp_path / "tiny.pt"
    assert r.invoke(main, ["random-checkpoint", str(pt), "--config", "tiny"]).exit_code == 0
    base = ["generate", "--model", str(pt), "--config", "tiny", "--classes", "1", "--seed", "4", "--verify", "sjd",
            "--top-k", "1"]
    stats = {}
    for w in (1, 8):
        res = r.invoke(main, base + ["--sjd-window", str(w), "--out", str(tmp_path / f"w{w}")])
        assert res.exit_code == 0, res.output
        stats[w] = json.loads((tmp_path / f"w{w}" / "stats.json").read_text())
        assert stats[w]["sjd_window"] == w
    assert stats[1]["target_forwards"] != stats[8]["target_forwards"]
    assert np.array_equal(np.load(tmp_path / "w1" / "tokens.npy"), np.load(tmp_path / "w8" / "tokens.npy"))
    res = r.invoke(main, base + ["--sjd-window", "0", "--out", str(tmp_path / "w0")])
    assert res.exit_code != 0 and "sjd-window" in res.output


@pytest.mark.slow
def test_bench_runs_the_new_decoders_on_the_demo(tmp_path):
    """Issue 27's `lisa-trt bench --methods vanilla,sjd,mcsjd,sjd-pac,gsd,zipar` on the bundled demo
    model (one image per point: a smoke; bench/decoders.py measures the frontier)."""
    from lisa_trt.demo.registry import assets_present

    if not assets_present():
        pytest.skip("demo assets not present")
    res = CliRunner().invoke(main, ["bench", "--model", "demo", "--methods", "vanilla,sjd,mcsjd,sjd-pac,gsd,zipar",
                                    "--num-images", "1", "--json", str(tmp_path / "d.json")])
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "d.json").read_text())["results"]
    assert set(rep) == {"vanilla", "sjd", "mcsjd", "sjd-pac", "gsd", "zipar"}
    assert all(rep[m]["mean_tvd"] == 0.0 for m in ("sjd", "mcsjd", "sjd-pac")) and rep["gsd"]["mean_tvd"] > 0
    assert all(rep[m]["mal"] > 1.0 for m in ("sjd", "mcsjd", "sjd-pac", "gsd", "zipar")), rep
