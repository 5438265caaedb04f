"""bench/lisa_regimes.py: shards of one decode merge into the file an unsharded run writes, and the
drafter efficiency is paired on the images the oracle decoded."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def regimes():
    spec = importlib.util.spec_from_file_location("lisa_regimes", ROOT / "bench" / "lisa_regimes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _shard(path: Path, start: int, mal: dict, *, seed=0, features=None) -> str:
    """A decode shard as `decode --start` writes it: per-image lists per point."""
    n = len(next(iter(mal.values())))
    res = {lab: {"images": len(m), "mal": sum(m) / len(m), "mal_per_image": m,
                 "correct_per_image": [float(i % 2) for i in range(len(m))], "tvd_per_image": [0.1] * len(m),
                 "cpu_seconds_per_image_batched": 1.0} for lab, m in mal.items()}
    d = {"settings": {"regime": "t1.6-cfg1", "seed": seed, "batch": n, "tree": [3, 3, 10], "start": start,
                      "elapsed_s": 5.0},
         "target_entropy_U": {"per_image": [0.5 + start / 100 + i / 1000 for i in range(n)]}, "results": res}
    path.write_text(json.dumps(d))
    if features is not None:
        from lisa_trt.io import save_safetensors

        save_safetensors(features, path.with_suffix(".features.safetensors"))
    return str(path)


def test_merge_orders_shards_and_recomputes(regimes, tmp_path):
    a = _shard(tmp_path / "a.json", 0, {"oracle:exact": [2.0, 2.0], "eagle3:exact": [1.0, 1.5]})
    b = _shard(tmp_path / "b.json", 2, {"eagle3:exact": [1.25, 1.75]})
    out = tmp_path / "m.json"
    regimes.main(["merge", b, a, "--json", str(out)])  # given out of order
    m = json.loads(out.read_text())
    e = m["results"]["eagle3:exact"]
    assert e["mal_per_image"] == [1.0, 1.5, 1.25, 1.75]
    assert e["mal"] == pytest.approx(1.375)
    assert e["images"] == 4 and m["results"]["oracle:exact"]["images"] == 2
    assert m["settings"]["oracle_images"] == 2 and m["settings"]["images"] == 4
    assert m["target_entropy_U"]["per_image"][:3] == [0.5, 0.501, 0.52]
    # efficiency is paired on the oracle's two images, not the drafter's four
    s = regimes.summarize_regime(m, tmp_path)
    row = s["rows"]["eagle3:exact"]
    assert row["efficiency"] == pytest.approx(2.5 / 4.0)
    assert row["efficiency_images"] == 2


def test_merge_refuses_shards_of_different_runs(regimes, tmp_path):
    a = _shard(tmp_path / "a.json", 0, {"eagle3:exact": [1.0]})
    b = _shard(tmp_path / "b.json", 1, {"eagle3:exact": [1.0]}, seed=7)
    with pytest.raises(SystemExit, match="not shards of one run"):
        regimes.main(["merge", a, b, "--json", str(tmp_path / "m.json")])


def test_decode_refuses_a_start_off_the_rounds(regimes, tmp_path):
    with pytest.raises(SystemExit, match="multiple of --batch"):
        regimes.main(["decode", "--regime", "t1.6-cfg1", "--drafters", "eagle3", "--start", "5", "--batch", "4",
                      "--json", str(tmp_path / "x.json")])


def test_merge_quality_from_features(regimes, tmp_path):
    """FD / KID from the sidecars: a point whose features sit far from the exact samples gets the larger
    KID against them."""
    g = torch.Generator().manual_seed(0)
    near = torch.randn(16, 8, generator=g)
    far = torch.randn(16, 8, generator=g) + 3.0
    exact = torch.randn(16, 8, generator=g)
    a = _shard(tmp_path / "a.json", 0, {"eagle3:exact": [1.0] * 16, "eagle3:gasv": [2.0] * 16,
                                        "lisa:gasv": [2.0] * 16},
               features={"eagle3:exact": exact, "eagle3:gasv": near, "lisa:gasv": far})

    class Ref:  # the real crops: stand-ins with the features' width
        def __init__(self, scorer):
            self.real = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))

    import lisa_trt.demo.registry as reg
    import lisa_trt.quality as quality

    mp = pytest.MonkeyPatch()
    mp.setattr(quality, "QualityReference", Ref)
    mp.setattr(reg, "load_demo_scorer", lambda: None)
    try:
        regimes.main(["merge", a, "--json", str(tmp_path / "m.json")])
    finally:
        mp.undo()
    r = json.loads((tmp_path / "m.json").read_text())["results"]
    assert r["lisa:gasv"]["kid_lossless"] > r["eagle3:gasv"]["kid_lossless"] + 4 * r["lisa:gasv"]["kid_lossless_se"]
    assert r["lisa:gasv"]["fd_demo"] > r["eagle3:gasv"]["fd_demo"]
    assert (tmp_path / "m.features.safetensors").is_file()


def test_merge_joins_shards_of_other_drafters_on_the_same_rounds(regimes, tmp_path):
    """A later shard decoding other drafters on the same images adds its points; U is counted once."""
    a = _shard(tmp_path / "a.json", 0, {"oracle:exact": [2.0, 2.0], "eagle3:exact": [1.0, 1.5]})
    b = _shard(tmp_path / "b.json", 0, {"lisa-soft:exact": [1.25, 1.75]})
    regimes.main(["merge", a, b, "--json", str(tmp_path / "m.json")])
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["results"]["lisa-soft:exact"]["mal_per_image"] == [1.25, 1.75]
    assert len(m["target_entropy_U"]["per_image"]) == 2
    c = _shard(tmp_path / "c.json", 0, {"eagle3:exact": [1.0, 1.0]})
    with pytest.raises(SystemExit, match="decoded twice"):
        regimes.main(["merge", a, c, "--json", str(tmp_path / "m2.json")])


def _decoded(regimes, tmp_path, name, regime, mal):
    """A merged decode file of `regime` with the oracle and `mal` {label: per-image MAL}."""
    path = _shard(tmp_path / f"{name}.json", 0, {"oracle:exact": [2.0] * 4, **mal})
    d = json.loads(Path(path).read_text())
    d["settings"].update(regime=regime, images=4, sampling={})
    for r in d["results"].values():
        r.update(mal_se=0.01, class_acc=0.5, class_acc_se=0.1)
    Path(path).write_text(json.dumps(d))
    return path


def test_report_extends_a_recorded_report_by_new_regimes(regimes, tmp_path):
    """`report --previous` keeps the recorded regimes (their rows, views and training statistics),
    adds the new one, replaces a regime decoded again (keeping its view), and the loss x regime x
    rule table pairs every loss with the EAGLE-3 loss of its own regime."""
    g = regimes.GASV[0]
    old = _decoded(regimes, tmp_path, "old", "t1.6-cfg1", {"eagle3:exact": [1.0, 1.2, 1.0, 1.2],
                                                           "lisa-paper:exact": [0.9, 1.1, 0.9, 1.1]})
    first = tmp_path / "first.json"
    regimes.main(["report", old, "--runs", str(tmp_path), "--json", str(first)])
    rec = json.loads(first.read_text())
    rec["summary"]["t1.6-cfg1, matched"]["view"] = {"U": 0.7, "marker": 1}
    rec["summary"]["t1.6-cfg1, matched"]["drafters"] = {"eagle3": {"wall_s": 1.0}}  # its runs are gone
    first.write_text(json.dumps(rec))
    new = _decoded(regimes, tmp_path, "new", "t1.3-cfg2", {"eagle3:exact": [1.5] * 4, f"eagle3:{g}": [2.0] * 4,
                                                           "lisa-paper:exact": [1.6] * 4, f"lisa-paper:{g}": [1.9] * 4})
    out = tmp_path / "out.json"
    regimes.main(["report", new, "--runs", str(tmp_path), "--previous", str(first), "--json", str(out)])
    r = json.loads(out.read_text())
    assert set(r["summary"]) == {"t1.6-cfg1, matched", "t1.3-cfg2, matched"}
    kept = r["summary"]["t1.6-cfg1, matched"]
    assert kept["view"]["marker"] == 1 and kept["drafters"] == {"eagle3": {"wall_s": 1.0}}
    assert [d["settings"]["regime"] for d in r["decode_runs"]] == ["t1.6-cfg1", "t1.3-cfg2"]
    assert r["settings"]["previous_command"].startswith("python") and "extended_by" in r["settings"]
    row = r["summary"]["t1.3-cfg2, matched"]["rows"][f"lisa-paper:{g}"]["vs_eagle3"]
    assert row["diff"] == pytest.approx(-0.1)  # paired with t1.3-cfg2's EAGLE-3 loss, not t1.6-cfg1's
    table = regimes.matched_table(r["summary"])
    assert "| t1.3-cfg2 (" in table and "| t1.6-cfg1 (" in table and "-0.100" in table
    again = _decoded(regimes, tmp_path, "again", "t1.6-cfg1", {"eagle3:exact": [1.0] * 4,
                                                               "lisa-additive:exact": [1.05] * 4})
    regimes.main(["report", again, "--runs", str(tmp_path), "--previous", str(out), "--json", str(out)])
    r2 = json.loads(out.read_text())["summary"]["t1.6-cfg1, matched"]
    assert "lisa-additive:exact" in r2["rows"] and "lisa-paper:exact" not in r2["rows"]  # decoded again: replaced
    assert r2["view"]["marker"] == 1  # its view is kept


def test_a_decodes_selection_statistics_reach_the_summary_and_table(regimes, tmp_path):
    """A regime decoded without a `view` run still reports what LISA's selection marked: merge pools
    the shards' statistics by positions, summarize_regime keeps them, the table prints them."""
    def sel(nonzero, positions):
        paper = {"score_nonzero": nonzero, "selected": nonzero, "weight_share_unselected": 0.2, "positions": positions}
        return {"eagle3": {"alpha": 0.8, "lisa-paper": paper, "positions": positions}}

    paths = []
    for start, nonzero, positions in ((0, 0.1, 30), (2, 0.4, 10)):
        p = Path(_shard(tmp_path / f"s{start}.json", start,
                        {"eagle3:exact": [1.0, 1.5]} | ({"oracle:exact": [2.0, 2.0]} if start == 0 else {})))
        d = json.loads(p.read_text())
        d["lisa_selection"] = sel(nonzero, positions)
        p.write_text(json.dumps(d))
        paths.append(str(p))
    out = tmp_path / "m.json"
    regimes.main(["merge", *paths, "--json", str(out)])
    s = regimes.summarize_regime(json.loads(out.read_text()), tmp_path)
    paper = s["selection"]["eagle3"]["lisa-paper"]
    assert paper["score_nonzero"] == pytest.approx((0.1 * 30 + 0.4 * 10) / 40)
    assert paper["positions"] == 40
    row = next(line for line in regimes.markdown({"t1.6-cfg1, matched": s}).splitlines()
               if "| eagle3 |" in line and "| exact |" in line)
    assert "0.175 / 0.175" in row
    # a view of other drafters does not hide the decode's statistics of this one
    s["view"] = {"lisa_selection": {"lisa-paper": {"lisa-paper": {"score_nonzero": 0.5, "selected": 0.5}}}}
    row = next(line for line in regimes.markdown({"t1.6-cfg1, matched": s}).splitlines()
               if "| eagle3 |" in line and "| exact |" in line)
    assert "0.175 / 0.175" in row
