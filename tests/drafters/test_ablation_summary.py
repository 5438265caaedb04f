"""bench/lisa_ablation.py: paired drafter comparisons and drafter efficiency from frontier files."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("lisa_ablation", ROOT / "bench" / "lisa_ablation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _point(per_image, method):
    return {"method": method, "images": len(per_image), "mal": sum(per_image) / len(per_image), "mal_se": 0.01,
            "mal_per_image": per_image, "class_acc": 0.9, "class_acc_se": 0.02, "mean_tvd": 0.0}


def test_paired_difference_is_exact_on_a_constant_shift():
    m = _load()
    a = [1.2, 1.5, 1.9, 1.4]
    p = m.paired([x + 0.1 for x in a], a)
    assert p["diff"] == pytest.approx(0.1) and p["se"] == pytest.approx(0.0, abs=1e-12) and p["images"] == 4
    # different lengths pair on the common (first) images only: image i has the same prompt and seed
    q = m.paired([1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 9.0, 9.0])
    assert q["images"] == 3 and q["diff"] == pytest.approx(1.0)
    assert q["se"] == pytest.approx(math.sqrt(1.0 / 3)) and not q["beyond_2se"]  # sd 1 over 3 images
    with pytest.raises(SystemExit, match="per-image"):
        m.paired([1.0], [1.0])


def test_summary_efficiency_and_refs(tmp_path):
    m = _load()
    base = [1.5, 1.6, 1.4, 1.7, 1.5, 1.6, 1.3, 1.8]
    res = {"vanilla": _point([1.0] * 8, "vanilla"), "oracle": _point([x + 0.5 for x in base], "oracle"),
           "eagle3:exact": _point(base, "eagle3:exact"),
           "lisa:exact": _point([x - 0.1 for x in base], "lisa:exact"),
           "lisa-no-kd:exact": _point([x - 0.1 + 0.02 * (i % 2) for i, x in enumerate(base[:4])], "lisa-no-kd:exact")}
    rows = m.summarize({"results": res}, ["eagle3", "lisa"])
    e = rows["eagle3:exact"]
    assert e["drafter_efficiency"] == pytest.approx(res["eagle3:exact"]["mal"] / res["oracle"]["mal"])
    assert "efficiency_on" not in e and "per-image" in rows["lisa-no-kd:exact"]["efficiency_on"]
    assert "vs_eagle3" not in e and e["vs_lisa"]["diff"] == pytest.approx(0.1) and e["vs_lisa"]["beyond_2se"]
    nk = rows["lisa-no-kd:exact"]
    assert nk["vs_lisa"]["images"] == 4 and nk["vs_lisa"]["diff"] == pytest.approx(0.01)
    nk_mals = res["lisa-no-kd:exact"]["mal_per_image"]
    assert nk["drafter_efficiency"] == pytest.approx(sum(nk_mals) / (sum(base[:4]) + 0.5 * 4))  # oracle on ITS 4 images
    # the efficiency's SE, paired over images (delta method): by hand, and zero for an exact proportion
    r = sum(base) / sum(x + 0.5 for x in base)
    z = [(x - r * (x + 0.5)) / (sum(base) / 8 + 0.5) for x in base]
    mz = sum(z) / 8
    assert e["drafter_efficiency_se"] == pytest.approx(math.sqrt(sum((v - mz) ** 2 for v in z) / 7 / 8))
    assert m.ratio_se([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]) == pytest.approx(0.0, abs=1e-12)
    md = m.markdown(rows, {"results": res}, ["eagle3", "lisa"])
    assert "| lisa | exact | 8 |" in md and "-0.100 +- 0.000 *" in md
    # combine + plot end to end through the CLI entry point
    f = tmp_path / "a.json"
    f.write_text(json.dumps({"settings": {"model": "demo", "tree": "3,3,10", "seed": 0, "sampling": {},
                                          "vanilla_ref": 128, "tables_gasv": {}}, "results": res}))
    out = tmp_path / "abl.json"
    m.main(["--combine", str(f), "--json", str(out), "--plot", str(tmp_path / "abl.png")])
    rep = json.loads(out.read_text())
    assert rep["summary"]["lisa:exact"]["vs_eagle3"]["diff"] == pytest.approx(-0.1)
    assert (tmp_path / "abl.png").stat().st_size > 1000
