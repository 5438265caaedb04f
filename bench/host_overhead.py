"""Per-step host overhead of the runtime: everything outside the engine calls.

Wraps every ONNX Runtime call (GraphRunner.run) with a timer and decodes a few demo images with
LISA (GASV) through the ORT bundle; host share = 1 - engine time / total time.

    python bench/host_overhead.py --engine-dir runs/demo/demo_run/engines --json bench/host_overhead.json
"""

import argparse
import time

import torch

from lisa_trt.engines import ort
from lisa_trt.io import write_json
from lisa_trt.runtime.pipeline import Pipeline


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine-dir", required=True)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    spent = {"engine": 0.0, "calls": 0}
    inner = ort.GraphRunner.run

    def timed(self, inputs, outputs):
        t0 = time.perf_counter()
        inner(self, inputs, outputs)
        spent["engine"] += time.perf_counter() - t0
        spent["calls"] += 1

    ort.GraphRunner.run = timed
    pipe = Pipeline.from_dir(a.engine_dir, backend="ort", threads=1)
    report = {"command": f"python bench/host_overhead.py --engine-dir {a.engine_dir} --images {a.images}"}
    for verify in ("vanilla", "gasv"):
        pipe.generate([0], seed=0, verify=verify, decode=False)
        spent.update(engine=0.0, calls=0)
        t0 = time.perf_counter()
        res = pipe.generate(list(range(a.images)), seed=0, verify=verify, decode=False)
        total = time.perf_counter() - t0
        steps = sum(s.get("steps", 255) for s in res.stats)
        report[verify] = {"total_s": total, "engine_s": spent["engine"], "engine_calls": spent["calls"],
                          "host_share": 1 - spent["engine"] / total, "steps": steps,
                          "host_ms_per_step": 1e3 * (total - spent["engine"]) / steps,
                          "engine_ms_per_step": 1e3 * spent["engine"] / steps}
        print(verify, {k: round(v, 4) if isinstance(v, float) else v for k, v in report[verify].items()})
    write_json(a.json, report)


if __name__ == "__main__":
    main()
