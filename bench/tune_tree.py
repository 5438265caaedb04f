"""Choose the demo bundle's default tree budget per backend from the measured cost curve.

1. run LISA (GASV) with a generous tree on a few images to measure the per-depth acceptance
   (P(depth d accepted | depth d-1 accepted), from the committed-length histogram);
2. predict speed = MAL(tree) * t_verify(1) / step_time(tree) for every candidate tree with
   lisa_trt.runtime.autotune (t_verify and drafter costs from bench/ort_cost_curve.json, host
   overhead per step measured in step 1);
3. check the best predictions for real on the same images and keep the fastest measured one;
   write bench/tree_budget.json and lisa_trt/assets/demo/tree_budgets.json (read at export).

    python bench/tune_tree.py --engine-dir runs/demo/demo_run/engines --images 6
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from lisa_trt.io import write_json
from lisa_trt.runtime.autotune import best_tree
from lisa_trt.runtime.pipeline import Pipeline
from lisa_trt.speculative.methods import get_method

ROOT = Path(__file__).resolve().parents[1]


def acceptance(committed: list[int], depth_max: int) -> list[float]:
    """Per-depth conditional acceptance from committed lengths (accepted drafts + 1)."""
    acc = []
    for d in range(1, depth_max + 1):
        reach = sum(1 for c in committed if c - 1 >= d - 1)
        got = sum(1 for c in committed if c - 1 >= d)
        acc.append(got / reach if reach else 0.0)
    return acc


def run(pipe, prompts, tree, verify="gasv"):
    t0 = time.perf_counter()
    res = pipe.generate(prompts, seed=0, verify=verify, decode=False, **tree)
    secs = (time.perf_counter() - t0) / len(prompts)
    return res, secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine-dir", required=True)
    ap.add_argument("--backend", default="ort")
    ap.add_argument("--images", type=int, default=6)
    ap.add_argument("--curve", default=str(ROOT / "bench" / "ort_cost_curve.json"))
    ap.add_argument("--check", type=int, default=3, help="best predicted trees to measure for real")
    a = ap.parse_args()
    torch.set_num_threads(1)
    pipe = Pipeline.from_dir(a.engine_dir, backend=a.backend, threads=1)
    prompts = [i % pipe.config.num_classes for i in range(a.images)]
    run(pipe, prompts[:1], {}, "vanilla")
    _, t_vanilla = run(pipe, prompts, {}, "vanilla")
    probe = dict(tree_top_k=4, tree_depth=4, tree_tokens=24)
    res, t_probe = run(pipe, prompts, probe)
    committed, host = [], 0.0
    steps = 0
    for st in res.stats:
        steps += st["steps"]
        host += st["times"].get("accept", 0.0) + st["times"].get("host", 0.0)
    # per-step committed lengths are not kept in the stats dicts: rerun one image for the histogram
    from lisa_trt.speculative.decode import SpecConfig, SpeculativeDecoder

    e = pipe._e
    dec = SpeculativeDecoder(e.target, e.drafter, e.tables, gasv=e.gasv)
    for i, p in enumerate(prompts):
        _, st = dec.generate(torch.tensor([p]), sampling=pipe.sampling(), seed=i,
                             method=get_method("gasv"), spec=SpecConfig.make("gasv", top_k=4, depth=4, total_tokens=24))
        committed += [int(x) for c in st.committed for x in c.cpu()]
    acc = acceptance(committed, 5)
    curve = json.loads(Path(a.curve).read_text())["models"]["demo"]
    backend = "ort" if a.backend == "ort" else "torch"
    vc = {int(k): v / 1e3 for k, v in curve["verify_ms"][backend]["median"].items()}
    dc = {int(k): v / 1e3 for k, v in curve["drafter_ms"][backend]["median"].items()}
    host_step = host / max(steps, 1)

    def draft_cost(n):
        ks = sorted(dc)
        k = min([x for x in ks if x >= n], default=ks[-1])
        return dc[k]

    vc_host = {k: v + host_step for k, v in vc.items()}
    best, table = best_tree(vc_host, draft_cost, acc)
    table.sort(key=lambda r: -r["speedup"])
    checked = []
    for r in table[: a.check]:
        tree = dict(tree_top_k=r["top_k"], tree_depth=r["depth"], tree_tokens=r["total_tokens"])
        res, secs = run(pipe, prompts, tree)
        mal = sum(s["mal"] for s in res.stats) / len(res.stats)
        checked.append({**r, "measured_seconds_per_image": secs, "measured_speedup": t_vanilla / secs,
                        "measured_mal": mal})
        print(f"tree {tree}: predicted {r['speedup']:.2f}x (MAL {r['mal']:.2f}), measured {t_vanilla / secs:.2f}x "
              f"(MAL {mal:.2f})", flush=True)
    win = max(checked, key=lambda r: r["measured_speedup"])
    budget = {k: win[k] for k in ("top_k", "depth", "total_tokens")}
    report = {"backend": a.backend, "images": a.images, "vanilla_seconds_per_image": t_vanilla,
              "probe_tree": probe, "probe_seconds_per_image": t_probe, "acceptance_per_depth": acc,
              "host_seconds_per_step": host_step, "predicted_best": best, "checked": checked, "chosen": budget,
              "top_predictions": table[:10], "command": "python bench/tune_tree.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items())}
    write_json(ROOT / "bench" / "tree_budget.json", report)
    assets = ROOT / "lisa_trt" / "assets" / "demo" / "tree_budgets.json"
    old = json.loads(assets.read_text()) if assets.is_file() else {}
    write_json(assets, {**old, backend: budget})
    print("chosen", budget, "->", assets)


if __name__ == "__main__":
    main()
