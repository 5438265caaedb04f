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
    assert v["images"] == s["images"] == 2 and v["mal"] == 1.0 and s["mean_tvd"] == 0.0
    assert s["mal"] == pytest.approx(sum(s["raw"]["tok"]) / sum(s["raw"]["fwd"]))
    # SJD beats the plain loop on the same images: fewer target forwards, MAL above a floor well
    # under the demo model's measured 2.40 (bench/decoders.json, 256 images)
    assert sum(s["raw"]["tok"]) == sum(v["raw"]["tok"]) and sum(s["raw"]["fwd"]) < sum(v["raw"]["fwd"])
    assert s["mal"] > 1.5, s["mal"]
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


def test_choose_remakes_the_never_slower_choice_from_timing_and_frontier(bench, tmp_path):
    """--choose: per backend the fastest lossless or frontier-neutral decoder beating vanilla; a
    relaxed tree rule timed on another tree than the frontier's gets no verdict; precisions no
    timing covers keep their earlier choice; a timing from a loaded machine is refused."""
    frontier = {"settings": {"tree": {"top_k": 3, "depth": 3, "total_tokens": 10}},
                "results": {"mcsjd": {"images": 256, "mean_tvd": 0.0},
                            "zipar[window=4]": {"images": 256, "mean_tvd": 0.03, "quality_neutral": True},
                            "gsd[group=25]": {"images": 256, "mean_tvd": 0.2, "quality_neutral": False},
                            "lisa-gasv": {"images": 256, "mean_tvd": 0.25, "quality_neutral": True}}}
    timing = {"quiet": True, "precision": "fp32", "results": {
        "ort": {"vanilla": {"tokens_seconds_per_image": 1.0}, "mcsjd": {"tokens_seconds_per_image": 1.5},
                "gasv": {"tokens_seconds_per_image": 0.5, "tree": {"top_k": 2, "depth": 1, "total_tokens": 4}},
                "gsd[group=25]": {"tokens_seconds_per_image": 0.4}},
        "torch": {"vanilla": {"tokens_seconds_per_image": 2.0}, "mcsjd": {"tokens_seconds_per_image": 1.6},
                  "zipar[window=4]": {"tokens_seconds_per_image": 1.0}}}}
    fpath, tpath, cpath = tmp_path / "f.json", tmp_path / "t.json", tmp_path / "c.json"
    fpath.write_text(json.dumps(frontier))
    tpath.write_text(json.dumps(timing))
    cpath.write_text(json.dumps({"choices": [{"backend": "ort", "precision": "int8", "method": "vanilla",
                                              "reason": "earlier"}], "source": "bench/speed.json"}))
    out = bench.main(["--out", str(fpath), "--choose", str(tpath), "--choice-out", str(cpath)])
    got = {(c["backend"], c["precision"]): c for c in json.loads(cpath.read_text())["choices"]}
    assert out["source"]["earlier"] == "bench/speed.json"
    assert got[("ort", "int8")]["reason"] == "earlier"  # not re-timed: kept
    assert got[("ort", "fp32")]["method"] == "vanilla"  # gasv: other tree, no verdict; gsd: not neutral
    assert "not quality-neutral" in got[("ort", "fp32")]["reason"]
    t = got[("torch", "fp32")]
    assert (t["method"], t["knobs"], t["lossless"]) == ("zipar", {"zipar_window": 4}, False)
    assert t["speedup"] == pytest.approx(2.0)
    timing["quiet"] = False
    tpath.write_text(json.dumps(timing))
    with pytest.raises(SystemExit, match="quiet"):
        bench.main(["--out", str(fpath), "--choose", str(tpath), "--choice-out", str(cpath)])


def test_two_d_labels_take_gasv_knobs(bench):
    """pjd-gasv-2d / gasv-2d read GASV's constants as gasv does (kappa, lambda, delta)."""
    assert bench.parse_point("pjd-gasv-2d[rows=8,delta=0.2]") == ("pjd-gasv-2d", {"pjd_gasv_2d_rows": 8,
                                                                                   "gasv_delta": 0.2})
    assert bench.parse_point("gasv-2d[below=jacobi-gasv]") == ("gasv-2d", {"gasv_2d_below": "jacobi-gasv"})


def test_merge_takes_a_parallel_runs_points_with_their_tokens(bench, tmp_path, monkeypatch):
    """--merge: the points of a run made beside this one (same settings) join this JSON and its token
    file; nothing is decoded (not even the merged point's missing images); other settings are refused."""
    class Fr:  # no model needed: the merged point is complete, so no batch is decoded
        def __init__(self, a):
            self.tree, self.ncls = {"top_k": 3, "depth": 3, "total_tokens": 10}, 8
            self.sampling = bench.dataclasses.make_dataclass("S", [])()  # asdict -> {}

        def artifacts(self):
            return None, type("T", (), {"config": type("C", (), {"to_dict": lambda self: {}})()})()

        def batch(self, label, j):
            raise AssertionError("merged points are not decoded again")

    monkeypatch.setattr(bench, "Frontier", Fr)
    run = lambda out, extra: bench.main(["--images", "4", "--per-round", "2", "--batch", "2", "--no-quality",  # noqa: E731
                                          "--out", str(out), "--plot", ""] + extra)
    main, side = tmp_path / "a.json", tmp_path / "b.json"
    raw = {"tok": [3.0, 3.0], "fwd": [1, 1], "tvd": [0.0, 0.0]}
    for path, lab in ((main, "vanilla"), (side, "pjd")):
        res = bench.summarize(lab, {**raw, "seconds": 1.0}, {})
        settings = {"model": "demo", "seed": 0, "batch": 2, "window": 16, "tree": Fr(None).tree, "drafter": "demo-lisa",
                    "sampling": {}}
        path.write_text(json.dumps({"settings": settings, "results": {lab: res}}))
        torch.save({lab: torch.zeros(2, 4, dtype=torch.int16)}, path.with_name(path.stem + ".tokens.pt"))
    rep = run(main, ["--merge", str(side)])
    assert set(rep["results"]) == {"vanilla", "pjd"} and rep["results"]["pjd"]["raw"]["fwd"] == [1, 1]
    assert set(torch.load(tmp_path / "a.tokens.pt")) == {"vanilla", "pjd"}
    bad = json.loads(side.read_text())
    bad["settings"]["seed"] = 5
    side.write_text(json.dumps(bad))
    with pytest.raises(SystemExit, match="seed"):
        run(main, ["--merge", str(side)])
