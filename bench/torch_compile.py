"""torch.compile on the torch backend (issue 12 item 4): eager models vs the graph wrappers with
the per-step graphs compiled by Inductor, vs ONNX Runtime, on one engine bundle, in ONE run.

Per backend: one warm-up image per method (compilation happens there and is reported apart),
then --images images one at a time (batch 1, CFG on), vanilla and LISA at the bundle's tree.
On a GPU, `--compile cuda-graphs` adds CUDA-graph capture (bench/gpu_check.py times it there).

    python bench/torch_compile.py --engine-dir lisa-trt-demo/engines --images 4 --json bench/torch_compile.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine-dir", default="lisa-trt-demo/engines")
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--methods", default="vanilla,gasv")
    ap.add_argument("--compile", default="default")
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from lisa_trt.io import write_json
    from lisa_trt.runtime.pipeline import Pipeline

    configs = [("torch-eager", dict(backend="torch")),
               (f"torch-compile[{a.compile}]", dict(backend="torch", compile=a.compile)),
               ("ort", dict(backend="ort"))]
    load0 = os.getloadavg()
    rows = {}
    for name, opts in configs:
        pipe = Pipeline.from_dir(a.engine_dir, threads=1, **opts)
        for method in a.methods.split(","):
            t0 = time.perf_counter()
            pipe.generate([0], seed=10_000, verify=method, decode=False)  # warm-up (compilation)
            warm = time.perf_counter() - t0
            t0 = time.perf_counter()
            mal = []
            for i in range(a.images):
                res = pipe.generate([i % 8], seed=i, verify=method, decode=False)
                mal.append(res.stats[0].get("mal", 1.0))
            sec = (time.perf_counter() - t0) / a.images
            rows[f"{name}/{method}"] = {"seconds_per_image": round(sec, 4), "warmup_seconds": round(warm, 2),
                                        "mal": round(sum(mal) / len(mal), 4)}
            print(name, method, rows[f"{name}/{method}"], flush=True)
        pipe.close()
    for key, r in rows.items():
        base = rows[f"torch-eager/{key.split('/')[1]}"]["seconds_per_image"]
        r["speedup_vs_torch_eager"] = round(base / r["seconds_per_image"], 3)
    write_json(a.json, {"command": " ".join(["python"] + sys.argv), "images": a.images, "batch": 1, "cfg": True,
                        "threads": 1, "loadavg_start": load0, "loadavg_end": os.getloadavg(),
                        "note": "one run, ratios within it; the machine was shared with background jobs "
                                "(see loadavg), so absolute seconds are inflated",
                        "results": rows})


if __name__ == "__main__":
    main()
