"""bench/decoders.py (issue 27's frontier): point labels, per-row statistics of batched Jacobi
loops, one tiny round of two methods, and the merge of a later --methods run into the same JSON."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("decoders_bench", ROOT / "bench" / "decoders.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_point_labels(bench):
    assert bench.split_points("vanilla,gsd[group=14,prob_gap=0.1];sjd") == ["vanilla", "gsd[group=14,prob_gap=0.1]",
                                                                            "sjd"]
    assert bench.parse_point("gsd[group=14,prob_gap=0.1]") == ("gsd", {"gsd_group": 14, "gsd_prob_gap": 0.1})
    assert bench.parse_point("sjd-pac[tree_width=2]") == ("sjd-pac", {"sjd_pac_tree_width": 2})
    assert bench.parse_point("lisa-gasv[kappa=1,lambda=0.6]") == ("gasv", {"gasv_kappa": 1, "gasv_lambda": 0.6})
    assert bench.parse_point("lisa-exact") == ("exact", {})


def test_jacobi_rows_reconstructed(bench):
    """The Jacobi loops record only the live rows, in order: row 1 finishes after one step."""
    class St:
        committed = [torch.tensor([2, 4]), torch.tensor([2])]
        tvd = [torch.tensor([0.1, 0.0]), torch.tensor([0.3])]
        rows = []
    tok, fwd, tvd = bench.row_stats(St(), 2, "sjd", 4)
    assert tok == [4, 4] and fwd == [2, 1] and tvd == pytest.approx([0.2, 0.0])
    St.committed = [torch.tensor([2, 3]), torch.tensor([2])]  # row 1 never reaches 4 tokens
    with pytest.raises(RuntimeError):
        bench.row_stats(St(), 2, "sjd", 4)


def test_ratio_se_paired(bench):
    r, se = bench.ratio_se([10.0, 12.0, 14.0], [5.0, 6.0, 7.0])
    assert r == pytest.approx(2.0) and se == pytest.approx(0.0, abs=1e-12)


@pytest.mark.slow  # about 20 s of CPU (demo model, two 2-image rounds of three methods)
def test_tiny_round_and_merge(bench, tmp_path):
    out, state = tmp_path / "d.json", tmp_path / "d.tokens.pt"
    common = ["--images", "2", "--per-round", "2", "--batch", "2", "--no-quality", "--out", str(out),
              "--state", str(state), "--plot", str(tmp_path / "d.png")]
    bench.main(common + ["--methods", "vanilla,sjd"])
    rep = json.loads(out.read_text())
    assert set(rep["results"]) == {"vanilla", "sjd"}
    assert rep["settings"]["loaded"] is True and rep["settings"]["batch"] == 2
    v, s = rep["results"]["vanilla"], rep["results"]["sjd"]
    assert v["images"] == s["images"] == 2 and v["mal"] == 1.0 and s["mal"] >= 1.0 and s["mean_tvd"] == 0.0
    assert s["mal"] == pytest.approx(sum(s["raw"]["tok"]) / sum(s["raw"]["fwd"]))
    assert (tmp_path / "d.png").is_file()
    # a later run adds a point and keeps the others (merged, not clobbered); nothing is redone
    bench.main(common + ["--methods", "zipar[window=4]"])
    rep2 = json.loads(out.read_text())
    assert set(rep2["results"]) == {"vanilla", "sjd", "zipar[window=4]"}
    assert rep2["results"]["sjd"]["raw"] == s["raw"]
    assert rep2["results"]["zipar[window=4]"]["images"] == 2
    assert torch.load(state)["zipar[window=4]"].shape == (2, 256)
    # other image-changing settings are refused
    with pytest.raises(SystemExit):
        bench.main(common[:-6] + ["--seed", "5", "--out", str(out), "--state", str(state), "--methods", "sjd"])
