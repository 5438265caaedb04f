"""Thread policy measurement: 1 vs 2 threads, quiet vs a busy neighbour, torch and ONNX Runtime.

    python bench/threads.py --engine-dir lisa-trt-demo/engines --json bench/threads.json

Each configuration runs in a fresh child process (OpenMP reads OMP_WAIT_POLICY when it is
loaded), generating one demo image with the vanilla AR loop:

* torch: `lisa_trt.generate` on the bundled demo target (eager PyTorch);
* ort: `Pipeline.from_dir(engine_dir, backend="ort", threads=N).generate([0], verify="vanilla")`.

"busy" starts one pure-Python spinning process (one core fully used by a neighbour) for the
duration of the child. "wait" is the OpenMP / ORT idle policy: "passive" is lisa-trt's policy
(OMP_WAIT_POLICY=PASSIVE, ORT allow_spinning=0), "spin" the libraries' defaults before it
(OMP_WAIT_POLICY unset, ORT allow_spinning=1). The machine's load average before and after each
run is recorded: on a shared machine every number carries the other users' load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPIN = "import time\nt=time.time()\nwhile time.time()-t<600: pass\n"


def _child(backend: str, threads: int, wait: str, engine_dir: str, repeats: int) -> dict:
    """Run inside the child process: time `repeats` one-image generations after a warm-up."""
    import torch

    torch.set_num_threads(threads)
    if backend == "torch":
        import lisa_trt
        import lisa_trt.demo  # noqa: F401  (registers the demo model)
        from lisa_trt.demo.registry import demo_sampling, load_demo_target

        target = load_demo_target()
        s = demo_sampling()
        cond = torch.tensor([0])

        def once():
            lisa_trt.generate(target, cond, seed=0, cfg_scale=s.cfg_scale, temperature=s.temperature,
                              top_k=s.top_k, top_p=s.top_p)
    else:
        from lisa_trt.engines import ort as ort_mod
        from lisa_trt.runtime.pipeline import Pipeline

        if wait == "spin":  # the libraries' default before the policy
            orig = ort_mod.session_options

            def spinning(threads=None, spin=False, profile=None):
                return orig(threads, True, profile)

            ort_mod.session_options = spinning
        pipe = Pipeline.from_dir(engine_dir, backend="ort", threads=threads)

        def once():
            pipe.generate([0], seed=0, verify="vanilla", decode=False)

    once()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    return {"seconds": times, "median_s": sorted(times)[len(times) // 2], "torch_threads": torch.get_num_threads()}


def run_one(backend, threads, wait, busy, engine_dir, repeats, timeout) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env.pop("OMP_WAIT_POLICY", None)
    if wait == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"  # "spin": unset (torch is imported before lisa_trt sets it)
    neighbour = subprocess.Popen([sys.executable, "-c", SPIN]) if busy else None
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    try:
        cmd = [sys.executable, __file__, "--child", json.dumps([backend, threads, wait, engine_dir, repeats])]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            rec = {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"rc {p.returncode}"}
        else:
            rec = json.loads(p.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        rec = {"error": f"timed out after {timeout} s", "median_s": None}
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    rec.update(backend=backend, threads=threads, wait=wait, busy_neighbour=busy,
               wall_s=time.perf_counter() - t0, loadavg_before=list(load0), loadavg_after=list(os.getloadavg()))
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine-dir", default=None, help="demo export for the ORT rows (lisa-trt demo makes one)")
    ap.add_argument("--json", default=str(ROOT / "bench" / "threads.json"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=240, help="per configuration (spin storms can take minutes)")
    ap.add_argument("--waits", default="passive,spin")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(_child(*json.loads(a.child))))
        return
    import platform

    backends = ["torch"] + (["ort"] if a.engine_dir else [])
    rows = []
    for backend in backends:
        for wait in a.waits.split(","):
            for busy in (False, True):
                for threads in (1, 2):
                    r = run_one(backend, threads, wait, busy, a.engine_dir, a.repeats, a.timeout)
                    rows.append(r)
                    print(f"{backend:5s} wait={wait:7s} busy={busy!s:5s} threads={threads}: "
                          f"{r.get('median_s') or float('nan'):.2f} s/image  load {r['loadavg_before'][0]:.2f}"
                          f"{'  ' + r['error'] if 'error' in r else ''}", flush=True)
    from lisa_trt.threads import describe

    out = {"what": "seconds per demo image (vanilla AR loop, median of repeats after a warm-up), 1 vs 2 threads, "
                   "quiet vs one busy neighbour process, passive vs spinning idle threads",
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "policy_view": describe()},
           "note": "the machine is shared with other users: loadavg_before/after say how busy it was; compare "
                   "rows measured under similar load", "rows": rows}
    Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
