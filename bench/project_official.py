"""PROJECTION (not a measurement): speed-up of LISA through ORT on random official-shaped GPT-B / GPT-L
on this CPU, from their measured cost curves (bench/ort_cost_curve.json) and the demo model's
measured acceptance and host overhead (bench/demo_ort_bench.json, bench/tree_budget.json).

    speed-up = MAL * t_token / (t_verify(S) + (D + 1) * t_drafter(K) + host)

with t_token = t_verify(1) + host_vanilla. Writes bench/cpu_projection.json.

    python bench/project_official.py
"""

import json
from pathlib import Path

B = Path(__file__).resolve().parent


def interp(curve, s):
    xs = sorted(int(k) for k in curve)
    lo = max([x for x in xs if x <= s], default=xs[0])
    hi = min([x for x in xs if x >= s], default=xs[-1])
    if lo == hi:
        return curve[str(lo)]
    w = (s - lo) / (hi - lo)
    return curve[str(lo)] * (1 - w) + curve[str(hi)] * w


def main():
    curve = json.loads((B / "ort_cost_curve.json").read_text())["models"]
    tune = json.loads((B / "tree_budget.json").read_text())
    bench = json.loads((B / "demo_ort_bench.json").read_text())
    tree = tune["chosen"]
    host = tune["host_seconds_per_step"] * 1e3
    demo_v = bench["results"]["vanilla"]["seconds_per_image"] * 1e3 / 256
    host_vanilla = max(demo_v - curve["demo"]["verify_ms"]["ort"]["median"]["1"], 0.0)
    out = {"label": "PROJECTION from measured curves, not a measured speed-up", "tree": tree,
           "host_ms_per_step": host, "host_ms_per_vanilla_token": host_vanilla, "models": {}}
    for method in ("exact", "gasv"):
        mal = bench["results"][method]["mal"]
        for name in ("demo", "GPT-B", "GPT-L"):
            v = curve[name]["verify_ms"]["ort"]["median"]
            d = curve[name]["drafter_ms"]["ort"]["median"]
            t_tok = v["1"] + host_vanilla
            step = interp(v, tree["total_tokens"]) + (tree["depth"] + 1) * interp(d, tree["top_k"]) + host
            out["models"].setdefault(name, {})[method] = {
                "mal_demo_measured": mal, "ms_per_vanilla_token": t_tok, "ms_per_spec_step": step,
                "projected_speedup": mal * t_tok / step}
    sjd = bench["results"]["sjd"]["mal"]
    for name in ("demo", "GPT-B", "GPT-L"):
        v = curve[name]["verify_ms"]["ort"]["median"]
        t_tok = v["1"] + host_vanilla
        step = interp(v, 17) + host
        out["models"][name]["sjd"] = {"mal_demo_measured": sjd, "ms_per_spec_step": step,
                                      "projected_speedup": sjd * t_tok / step}
    (B / "cpu_projection.json").write_text(json.dumps(out, indent=2) + "\n")
    for name, r in out["models"].items():
        print(name, {m: round(x["projected_speedup"], 2) for m, x in r.items()})


if __name__ == "__main__":
    main()
