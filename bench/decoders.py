"""The training-free decoders on the demo model: MAL per target forward and per-token TVD for
vanilla, sjd, mcsjd, sjd-pac, gsd and zipar (docs/spec/decoders.md), on the same classes and seeds.

    python bench/decoders.py --images 16                 # writes bench/decoders.json
    python bench/decoders.py --images 4 --out /tmp/d.json --gsd-group 1,14,25 --zipar-window 2,8

MAL = committed tokens per target forward (the prefill excluded, docs/spec/speculative.md),
pooled over all images; `mal_se` is the standard error over images; `mal_vs_sjd` = MAL / SJD's
MAL. Seconds are recorded too, but they are only meaningful on a quiet machine (`loaded` in the
output says whether the caller declared the machine busy).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from lisa_trt.demo.registry import demo_sampling, load_demo_target
from lisa_trt.io import write_json
from lisa_trt.speculative.methods import SpecConfig
from lisa_trt.speculative.run import run_method

ROOT = Path(__file__).resolve().parents[1]


def measure(target, label, method, spec, classes, seed, window):
    """One method over the images -> {mal, mal_se, mean_tvd, forwards_per_image, seconds_per_image}."""
    tokens = forwards = 0.0
    per_image, tvds, secs = [], [], []
    for i, c in enumerate(classes):
        t0 = time.perf_counter()
        _, st = run_method(method, target, None, None, torch.tensor([c]), sampling=demo_sampling(), spec=spec,
                           seed=seed + i, sjd_window=window)
        secs.append(time.perf_counter() - t0)
        com = torch.cat([x.float() for x in st.committed])
        tokens, forwards = tokens + float(com.sum()), forwards + com.numel()
        per_image.append(float(com.mean()))
        tvds.extend(float(t) for x in st.tvd for t in x.float())
    n = len(per_image)
    mean = sum(per_image) / n
    se = math.sqrt(sum((m - mean) ** 2 for m in per_image) / (n - 1) / n) if n > 1 else float("nan")
    return {"method": method, "mal": tokens / forwards, "mal_se": se, "mal_per_image": per_image,
            "mean_tvd": sum(tvds) / len(tvds) if tvds else 0.0,
            "target_forwards_per_image": forwards / n + 1, "seconds_per_image": sum(secs) / n}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", type=int, default=16, help="SJD window (all Jacobi decoders)")
    ap.add_argument("--methods", default="vanilla,sjd,mcsjd,sjd-pac")
    ap.add_argument("--gsd-group", default="14,25", help="GSD group sizes, one point each ('' for none)")
    ap.add_argument("--zipar-window", default="4,8", help="ZipAR windows, one point each ('' for none)")
    ap.add_argument("--loaded", action="store_true", help="record that the machine was busy (timings not quiet)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "decoders.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    target = load_demo_target()
    classes = [i % target.config.num_classes for i in range(a.images)]
    points = [(m, m, SpecConfig()) for m in a.methods.split(",") if m]
    points += [(f"gsd[group={g}]", "gsd", SpecConfig().replace(gsd_group=int(g)))
               for g in a.gsd_group.split(",") if g]
    points += [(f"zipar[window={w}]", "zipar", SpecConfig().replace(zipar_window=int(w)))
               for w in a.zipar_window.split(",") if w]
    results = {}
    for label, method, spec in points:
        results[label] = measure(target, label, method, spec, classes, a.seed, a.window)
        r = results[label]
        print(f"{label:16s} MAL {r['mal']:.3f} +- {r['mal_se']:.3f}  TVD {r['mean_tvd']:.4f}  "
              f"{r['seconds_per_image']:.2f} s/img", flush=True)
    if "sjd" in results:
        for r in results.values():
            r["mal_vs_sjd"] = r["mal"] / results["sjd"]["mal"]
    write_json(a.out, {"settings": {"images": a.images, "classes": classes, "seed": a.seed, "window": a.window,
                                    "sampling": vars(demo_sampling()), "torch_threads": 1, "loaded": a.loaded},
                       "results": results})
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
