"""Per-step host overhead of the runtime: everything outside the engine calls.

Times every ONNX Runtime session run (at the C binding, so IO binding and all Python count as
host work) while decoding demo images ONE AT A TIME (batch 1, CFG on: engine batch 2) through the
ORT bundle with the tree the bundle ships for "ort" (manifest generation.tree.ort), and reports
per method: engine calls per step (and per graph), engine / host ms per step, host share
(1 - engine time / total), and per image seconds.

`--compare REF` measures a second source tree in the same run: `git archive REF` of this
repository's lisa_trt/ is unpacked to a temporary directory and both trees are measured by
child processes in alternation (ref, new, ref, new, ...), so machine load hits both alike; the
report holds both, the ratios, and whether the tokens are identical (same seeds).

    taskset -c 0 python bench/host_overhead.py --engine-dir runs/demo/demo_run/engines \
        --images 4 --compare main --json bench/host_overhead.json
"""

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- one measurement

def _engine_timer():
    """Wrap the C-level ORT session run: {session id: [seconds, calls]} (all graphs)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    spent: dict = {}
    inner = C.InferenceSession.run_with_iobinding

    def timed(self, *args):
        t0 = time.perf_counter()
        try:
            return inner(self, *args)
        finally:
            s = spent.setdefault(id(self), [0.0, 0])
            s[0] += time.perf_counter() - t0
            s[1] += 1

    C.InferenceSession.run_with_iobinding = timed
    return spent


def _graph_names(pipe) -> dict:
    """{id(C session): graph name} over every runner of the pipeline's engines."""
    names = {}
    e = pipe._e
    for eng in (e.target, e.drafter, e.gasv, getattr(e, "vq", None)):
        for r in (getattr(eng, "runners", None) or {}).values():
            sess = getattr(getattr(r, "session", None), "_sess", None)
            if sess is not None:
                names[id(sess)] = r.name
    return names


def measure(engine_dir: str, images: int, methods: list) -> dict:
    """Decode `images` demo images one by one per method; engine vs host time per step."""
    import torch

    torch.set_num_threads(1)
    spent = _engine_timer()
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.speculative.methods import get_method

    pipe = Pipeline.from_dir(engine_dir, backend="ort", threads=1)
    names = _graph_names(pipe)
    tree = pipe.spec("gasv").tree
    out = {"tree": {"top_k": tree.top_k, "depth": tree.depth, "total_tokens": tree.total_tokens}}
    for method in methods:
        pipe.generate([0], seed=0, verify=method, decode=False)  # warm-up (allocations, first binds)
        per_image, tokens, steps_all = [], [], 0
        spent.clear()
        t_all = time.perf_counter()
        for c in range(images):
            t0 = time.perf_counter()
            res = pipe.generate([c], seed=c, verify=method, decode=False)
            sec = time.perf_counter() - t0
            st = res.stats[0]
            # AR: one step per token after the prefill's; tree methods: verification steps
            steps = res.tokens.shape[1] - 1 if get_method(method).kind == "ar" else int(st["steps"])
            steps_all += steps
            per_image.append({"class": c, "seed": c, "seconds": sec, "steps": steps, "mal": st.get("mal")})
            tokens.append(res.tokens.reshape(-1).tolist())
        total = time.perf_counter() - t_all
        eng = sum(s[0] for s in spent.values())
        calls = sum(s[1] for s in spent.values())
        by_graph = {}
        for sid, (sec, n) in spent.items():
            g = by_graph.setdefault(names.get(sid, "?"), {"calls": 0, "ms_per_step": 0.0})
            g["calls"] += n
            g["ms_per_step"] += 1e3 * sec / steps_all
        out[method] = {"total_s": total, "engine_s": eng, "engine_calls": calls, "steps": steps_all,
                       "engine_calls_per_step": calls / steps_all, "host_share": 1 - eng / total,
                       "host_ms_per_step": 1e3 * (total - eng) / steps_all,
                       "engine_ms_per_step": 1e3 * eng / steps_all,
                       "ms_per_step": 1e3 * total / steps_all,
                       "s_per_image": total / images, "graphs": by_graph, "per_image": per_image,
                       "tokens_sha1": hashlib.sha1(json.dumps(tokens).encode()).hexdigest()}
    return out


# ----------------------------------------------------------------------------- A/B driver

def _child(src: Path, a, methods) -> dict:
    from _refs import run_worker  # bench/_refs.py (this script's directory is on the path)

    return run_worker(__file__, src, ["--engine-dir", a.engine_dir, "--images", a.images, "--methods",
                                      ",".join(methods)])


def _median_run(runs: list, methods) -> dict:
    """Per method: the run with the median ms/step (so its fields stay consistent)."""
    out = {"tree": runs[0]["tree"]}
    for m in methods:
        ordered = sorted(runs, key=lambda r: r[m]["ms_per_step"])
        out[m] = dict(ordered[len(ordered) // 2][m], repeats_ms_per_step=[r[m]["ms_per_step"] for r in runs])
    return out


def _brief(d: dict) -> dict:
    keys = ("ms_per_step", "engine_ms_per_step", "host_ms_per_step", "host_share", "engine_calls_per_step",
            "s_per_image")
    return {k: round(d[k], 4) for k in keys}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine-dir", required=True)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--methods", default="vanilla,gasv")
    ap.add_argument("--compare", default=None, help="git ref of the 'before' tree (e.g. main)")
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs per tree with --compare")
    ap.add_argument("--note", default="", help="free text stored in the JSON (e.g. machine load)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    methods = [m for m in a.methods.split(",") if m]
    if a.worker:
        print(json.dumps(measure(a.engine_dir, a.images, methods)))
        return
    bundle_graphs = sorted(json.loads((Path(a.engine_dir) / "manifest.json").read_text())["graphs"])
    report = {"command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "bundle_graphs": bundle_graphs,
              "batch": 1, "cfg": True,
              "threads": 1, "images": a.images, "note": a.note,
              "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
              "loadavg_start": os.getloadavg()}
    if a.compare:
        from _refs import export_ref

        with tempfile.TemporaryDirectory() as tmp:
            commit = export_ref(a.compare, Path(tmp))
            before, after = [], []
            for _ in range(a.repeats):
                before.append(_child(Path(tmp), a, methods))
                after.append(_child(ROOT, a, methods))
        b, n = _median_run(before, methods), _median_run(after, methods)
        report.update(before={"ref": a.compare, "commit": commit, **b}, after=n)
        report["ratios"] = {m: {"ms_per_step": n[m]["ms_per_step"] / b[m]["ms_per_step"],
                                "host_ms_per_step": n[m]["host_ms_per_step"] / b[m]["host_ms_per_step"],
                                "same_tokens": n[m]["tokens_sha1"] == b[m]["tokens_sha1"]} for m in methods}
        for m in methods:
            print(m, "before", _brief(b[m]), "\n", m, "after ", _brief(n[m]), "\n", m, report["ratios"][m])
    else:
        r = measure(a.engine_dir, a.images, methods)
        report.update(r)
        for m in methods:
            print(m, _brief(r[m]))
    report["loadavg_end"] = os.getloadavg()
    if a.json:
        from lisa_trt.io import write_json

        write_json(a.json, report)


if __name__ == "__main__":
    main()
