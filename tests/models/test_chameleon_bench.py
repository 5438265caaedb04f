"""bench/chameleon_cost_curve.py runs its tiny preset on CPU in seconds (the 7B preset is GPU-only)."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cost_curve_tiny_preset(tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench.chameleon_cost_curve import main

    main([str(tmp_path / "c.json"), "--preset", "tiny", "--context", "50"])
    res = json.loads((tmp_path / "c.json").read_text())
    assert set(res["verify"]) == {"1", "4", "16"}
    for t in [res["prefill"], *res["verify"].values()]:  # timed as the tiny preset says: 2 reps, median of them
        assert t["reps"] == 2 and t["min_ms"] <= t["median_ms"], t
