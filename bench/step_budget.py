"""What one steady-state decode step costs between the engine calls (issue 49, DESIGN 5b).

Counts, per steady-state step, on the ONNX Runtime backend (the TensorRT runner shares every
engine class and decode loop above the runner, so these are what a GPU run pays; TensorRT runs the
drafter as `--commit fused` does, through drafter_fused, the drafter's only engine that `lisa-trt
build` makes; `--commit project+step` is how it commits a bundle exported before drafter_fused, since
it builds no drafter_commit engine):

- host reads: Python reading a tensor's value, each a device sync on a GPU: `.item()`, `bool()`,
  `int()`, `float()` (aten._local_scalar_dense), `.tolist()`, `.numpy()`, `nonzero`,
  `masked_select`, `unique`, `repeat_interleave` without an output size, and boolean-mask
  indexing (`x[mask]`, `x[mask] = v`);
- glue ops: every ATen op outside the engine calls that is not a view (a kernel launch or an
  allocation on a GPU), with a per-op histogram;
- engine calls per graph, and the input-shape signatures each graph sees over the steady steps
  (a CUDA graph / TensorRT profile needs one);
- host ms and ms per step (a separate pass without the counter: wall time minus the time inside
  the engine calls, over every step of the decode).

A step is the work between two calls of the loop's `on_step` hook. Steady-state steps: not the
first (it holds the prefill), and every row still has at least `margin` tokens to go at its
start (the tail steps truncate the tree and retire rows).

`--compare REF` measures a second source tree in the same run: `git archive REF lisa_trt` is
unpacked to a temporary directory and both trees are measured by child processes of this script
(counts are deterministic; timings alternate ref, new, ref, new so machine load hits both alike).

    python bench/step_budget.py --engine-dir /tmp/eng --compare 6ba6000 --json bench/step_budget.json
    python bench/step_budget.py --engine-dir /tmp/eng --compare 6ba6000 --batch 2 --json bench/step_budget_batch2.json

`--batch B` decodes B prompts as one batch (a seed per row). Every op is counted on the pure-torch
path the decode runs here (no fused kernel is counted as one op). The engine dir is a demo export
(`lisa-trt demo`, or `lisa_trt.runtime.demo.ensure_demo_bundle(dir)`).

The counter (`StepBudget`) also serves the tests (tests/speculative/test_step_budget.py): it wraps
any engine object's methods, so torch-model engines count the same way.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
aten = torch.ops.aten

# ops whose result size depends on tensor values, or that hand a value to Python
_READ_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
             aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
             aten.repeat_interleave.Tensor}
_BOOL_INDEX_OPS = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}


def _bool_index(func, args) -> bool:
    if func not in _BOOL_INDEX_OPS or len(args) < 2:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ())


def _site() -> str:
    """file:line of the innermost lisa_trt frame (where a host read happens)."""
    for fr in reversed(traceback.extract_stack()[:-2]):
        if "lisa_trt" in fr.filename and "step_budget" not in fr.filename:
            return f"{fr.filename.split('lisa_trt')[-1].lstrip('/')}:{fr.lineno}"
    return "?"


def _shapes(args, kwargs) -> tuple:
    out = []
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(tuple(a.shape))
        elif isinstance(a, dict):
            out.extend((k, tuple(v.shape)) for k, v in sorted(a.items()) if isinstance(v, torch.Tensor))
    return tuple(out)


class _Mode(TorchDispatchMode):
    def __init__(self, budget):
        super().__init__()
        self.b = budget

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        b = self.b
        if not b.paused:
            if func in _READ_OPS or _bool_index(func, args):
                b.read(str(func.overloadpacket.__name__))
            if not func.is_view:
                b.cur["glue_ops"] += 1
                b.cur["ops"][func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


class StepBudget:
    """Counts host reads, glue ops, engine calls and input-shape signatures per decode step.

        b = StepBudget(count=True)
        b.watch(runner, ("run", "run_static"), runner.name)   # an engine call: not counted inside
        with b:
            loop(..., on_step=b.on_step)                       # one record per step
        b.summary(margin=tree_depth + 2, n_tokens=N)

    count=False: no dispatch mode (timing only): engine seconds are still measured.
    """

    def __init__(self, count: bool = True, sites: bool = False):
        self.count, self.sites = count, sites
        self.paused = 0
        self.steps: list = []
        self._patched: list = []
        self.engine_s = 0.0
        self._new()

    def _new(self, done=None):
        self.cur = {"host_reads": 0, "glue_ops": 0, "ops": collections.Counter(), "calls": collections.Counter(),
                    "shapes": collections.defaultdict(set), "read_sites": collections.Counter(), "done_before": done}

    def read(self, what: str) -> None:
        self.cur["host_reads"] += 1
        if self.sites:
            self.cur["read_sites"][f"{what} @ {_site()}"] += 1

    # -- engine calls --------------------------------------------------------------------------

    def watch(self, obj, methods, name: str) -> None:
        """Make obj.<method> an engine call named `name` (counted, timed, nothing counted inside)."""
        for m in methods:
            inner = getattr(obj, m, None)
            if inner is None or getattr(inner, "_step_budget", False):
                continue

            def call(*args, _inner=inner, **kwargs):
                if not self.paused:
                    self.cur["calls"][name] += 1
                    self.cur["shapes"][name].add(_shapes(args, kwargs))
                self.paused += 1
                t0 = time.perf_counter()
                try:
                    return _inner(*args, **kwargs)
                finally:
                    self.paused -= 1
                    if not self.paused:
                        self.engine_s += time.perf_counter() - t0

            call._step_budget = True
            had = m in vars(obj)
            self._patched.append((obj, m, vars(obj).get(m), had))
            setattr(obj, m, call)

    def unwatch(self) -> None:
        for obj, m, old, had in reversed(self._patched):
            if had:
                setattr(obj, m, old)
            else:
                delattr(obj, m)
        self._patched.clear()

    # -- steps ---------------------------------------------------------------------------------

    def on_step(self, tokens=None, done=None) -> None:
        """The loop's per-step hook: closes the current step (done: (B,) tokens committed after it)."""
        self.paused += 1
        try:
            d = None if done is None else [int(x) for x in torch.as_tensor(done).reshape(-1).tolist()]
        finally:
            self.paused -= 1
        self.steps.append(self.cur)
        self._new(d)

    def __enter__(self):
        self._mode = None
        self._orig = {}
        if self.count:
            for name in ("tolist", "numpy"):
                orig = getattr(torch.Tensor, name)
                self._orig[name] = orig

                def reader(t, *a, _orig=orig, _name=name, **k):
                    if not self.paused:
                        self.read(_name)
                    return _orig(t, *a, **k)

                setattr(torch.Tensor, name, reader)
            self._mode = _Mode(self)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        if self._mode is not None:
            self._mode.__exit__(*exc)
        for name, orig in self._orig.items():
            setattr(torch.Tensor, name, orig)
        return False

    def reset(self) -> None:
        self.steps, self.engine_s = [], 0.0
        self._new()

    def steady(self, margin: int, n_tokens: int) -> list:
        """The steady-state step records: index >= 1 and every row >= margin tokens from the end
        at the step's start (the previous record's done)."""
        out = []
        for i in range(1, len(self.steps)):
            prev = self.steps[i - 1]
            done = self.steps[i]["done_before"]
            if done is None or not done:
                continue
            if n_tokens - max(done) >= margin:
                out.append(self.steps[i])
        return out

    def summary(self, margin: int, n_tokens: int, steps=None) -> dict:
        """Per steady-state step: mean and max host reads / glue ops, engine calls per graph,
        input-shape signatures per graph, the commonest glue ops and host-read sites."""
        st = self.steady(margin, n_tokens) if steps is None else steps
        if not st:
            return {"steady_steps": 0}
        n = len(st)
        reads = [s["host_reads"] for s in st]
        glue = [s["glue_ops"] for s in st]
        calls = collections.Counter()
        shapes = collections.defaultdict(set)
        ops, sites = collections.Counter(), collections.Counter()
        for s in st:
            calls.update(s["calls"])
            ops.update(s["ops"])
            sites.update(s["read_sites"])
            for g, sh in s["shapes"].items():
                shapes[g] |= sh
        return {"steady_steps": n,
                "host_reads_per_step": sum(reads) / n, "host_reads_max": max(reads),
                "glue_ops_per_step": sum(glue) / n, "glue_ops_max": max(glue),
                "engine_calls_per_step": sum(calls.values()) / n,
                "calls_per_step": {g: c / n for g, c in sorted(calls.items())},
                "shape_signatures": {g: len(v) for g, v in sorted(shapes.items())},
                "top_glue_ops": {k: round(v / n, 2) for k, v in ops.most_common(12)},
                "host_read_sites": {k: round(v / n, 2) for k, v in sites.most_common(20)}}


# ----------------------------------------------------------------------------- the demo bundle (ORT)

def _watch_pipeline(budget: StepBudget, pipe) -> None:
    """Every runner of the pipeline's engines is an engine call (named by its graph)."""
    e = pipe._e
    for eng in (e.target, e.drafter, e.gasv):
        for r in (getattr(eng, "runners", None) or {}).values():
            budget.watch(r, ("run", "run_static"), r.name)


SHIPPED = json.loads((ROOT / "lisa_trt" / "assets" / "demo" / "tree_budgets.json").read_text())["ort"]
CASES = {  # name -> (method, tree overrides): the EAGLE-2 tree and the demo's shipped ORT tree
    "gasv-eagle2-10-5-60": ("gasv", {"top_k": 10, "depth": 5, "total_tokens": 60}),
    "exact-eagle2-10-5-60": ("exact", {"top_k": 10, "depth": 5, "total_tokens": 60}),
    "gasv-shipped": ("gasv", dict(SHIPPED)),
    "exact-shipped": ("exact", dict(SHIPPED)),
    "vanilla": ("vanilla", {}),
    "sjd": ("sjd", {}),
}


def _tree_args(tree: dict) -> dict:
    """A case's tree budget as Pipeline.generate's tree arguments (its top_k is the sampling one)."""
    names = {"top_k": "tree_top_k", "depth": "tree_depth", "total_tokens": "tree_tokens"}
    return {names[k]: v for k, v in tree.items()}


def _margin(pipe, method: str, tree: dict) -> int:
    from lisa_trt.speculative.methods import get_method

    m = get_method(method)
    if m.kind == "ar":
        return 1
    if m.kind == "tree":
        spec = pipe.spec(method, **tree)
        return spec.tree.depth + 2
    return 2 * int(pipe.spec(method).settings("sjd").window) + 1  # Jacobi windows: leave the tail out


COMMITS = ("fused", "project+step")  # how the drafter commits accepted tokens (--commit)


def measure(engine_dir: str, cases: list, images: int, time_images: int, commit: str = "fused",
            batch: int = 1) -> dict:
    """Counts (one pass under the counter) and timings (a separate pass without it) per case."""
    torch.set_num_threads(1)
    from lisa_trt.runtime.pipeline import Pipeline

    # commit "fused": drafter_fused (every drafter call, the commit's fc inside: one call; ORT's default
    # and TensorRT's one drafter engine), or a bundle exported before it: its drafter_commit graph;
    # "project+step": drafter_project then drafter_step, as such older bundles run on TensorRT (no
    # drafter_commit engine: deploy/build.py NOT_BUILT) until export.upgrade.add_graphs gives them
    # drafter_fused, one engine call more per step
    os.environ["LISA_TRT_ORT_FUSED_DRAFTER"] = "1" if commit == "fused" else "0"
    os.environ["LISA_TRT_ORT_FUSED_COMMIT"] = "1" if commit == "fused" else "0"
    pipe = Pipeline.from_dir(engine_dir, backend="ort", threads=1)
    out = {}
    for case in cases:
        try:
            out[case] = _measure_case(pipe, case, images, time_images, batch)
        except Exception as e:  # noqa: BLE001 (a case this tree cannot run is recorded, the others still run)
            out[case] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _generate(pipe, method: str, tree: dict, image: int, batch: int, on_step=None):
    """One decode call: `batch` prompts (classes image * batch ...) as one batch, row seeds."""
    prompts = [image * batch + i for i in range(batch)]
    return pipe.generate(prompts, seed=image, verify=method, decode=False, batch=batch > 1, on_step=on_step,
                         **_tree_args(tree))


def _measure_case(pipe, case: str, images: int, time_images: int, batch: int = 1) -> dict:
    """One case: counts under the counter (`images` decodes of `batch` rows), then timings without it."""
    method, tree = CASES[case]
    _generate(pipe, method, tree, 0, batch)  # warm-up
    b = StepBudget(count=True, sites=True)
    _watch_pipeline(b, pipe)
    toks, summ, mals = [], [], []
    with b:
        for c in range(images):
            b.reset()
            res = _generate(pipe, method, tree, c, batch, on_step=lambda p: b.on_step(None, p.done))
            n_tok = res.tokens.shape[1]
            summ.append(b.summary(_margin(pipe, method, tree), n_tok))
            toks.append(res.tokens.reshape(-1).tolist())
            mals += [s.get("mal") for s in res.stats]
    b.unwatch()
    counts = _merge(summ)
    t = StepBudget(count=False)
    _watch_pipeline(t, pipe)
    secs, steps, eng = 0.0, 0, 0.0
    for c in range(time_images):
        t.reset()
        t0 = time.perf_counter()
        res = _generate(pipe, method, tree, c, batch, on_step=lambda p: t.on_step())
        secs += time.perf_counter() - t0
        steps += len(t.steps)
        eng += t.engine_s
    t.unwatch()
    timing = {"images": time_images, "steps": steps}
    if steps:
        timing.update(ms_per_step=1e3 * secs / steps, host_ms_per_step=1e3 * (secs - eng) / steps,
                      engine_ms_per_step=1e3 * eng / steps)
    return {"method": method, "tree": tree, **counts, "mal": sum(mals) / len(mals),
            "tokens_sha1": hashlib.sha1(json.dumps(toks).encode()).hexdigest(), "timing": timing}


def _merge(summ: list) -> dict:
    """Summaries of several decodes -> one, weighted by their steady steps."""
    summ = [s for s in summ if s.get("steady_steps")]
    if not summ:
        return {"steady_steps": 0}
    n = sum(s["steady_steps"] for s in summ)

    def avg(k):
        return sum(s[k] * s["steady_steps"] for s in summ) / n

    def avg_map(k):
        keys = set().union(*(s[k] for s in summ))
        return {g: round(sum(s[k].get(g, 0) * s["steady_steps"] for s in summ) / n, 3) for g in sorted(keys)}

    sig = collections.Counter()
    for s in summ:
        for g, v in s["shape_signatures"].items():
            sig[g] = max(sig[g], v)
    return {"steady_steps": n, "host_reads_per_step": avg("host_reads_per_step"),
            "host_reads_max": max(s["host_reads_max"] for s in summ),
            "glue_ops_per_step": avg("glue_ops_per_step"), "glue_ops_max": max(s["glue_ops_max"] for s in summ),
            "engine_calls_per_step": avg("engine_calls_per_step"), "calls_per_step": avg_map("calls_per_step"),
            "shape_signatures_max": dict(sig),
            "top_glue_ops": dict(sorted(avg_map("top_glue_ops").items(), key=lambda kv: -kv[1])[:12]),
            "host_read_sites": dict(sorted(avg_map("host_read_sites").items(), key=lambda kv: -kv[1])[:20])}


# ----------------------------------------------------------------------------- before / after driver

def _child(src: Path, a, cases) -> dict:
    from _refs import run_worker  # bench/_refs.py (this script's directory is on the path)

    return run_worker(__file__, src, ["--engine-dir", a.engine_dir, "--images", a.images, "--time-images",
                                      a.time_images, "--cases", ",".join(cases), "--commit", a.commit,
                                      "--batch", a.batch])


def _timed_median(runs: list, cases) -> dict:
    """The counts of the first run (deterministic) with the median timing of every run."""
    out = {}
    for c in cases:
        if "error" in runs[0][c]:
            out[c] = runs[0][c]
            continue
        t = sorted((r[c]["timing"] for r in runs), key=lambda x: x.get("ms_per_step", 0.0))
        out[c] = dict(runs[0][c], timing=dict(t[len(t) // 2], repeats_ms_per_step=[x.get("ms_per_step") for x in t]))
    return out


def _brief(d: dict) -> str:
    if "error" in d:
        return d["error"]
    t = dict({"host_ms_per_step": float("nan"), "ms_per_step": float("nan")}, **d["timing"])
    return (f"reads {d['host_reads_per_step']:.2f} (max {d['host_reads_max']}), glue {d['glue_ops_per_step']:.0f}, "
            f"calls {d['engine_calls_per_step']:.2f}, shapes {d['shape_signatures_max']}, "
            f"host {t['host_ms_per_step']:.2f} ms, step {t['ms_per_step']:.2f} ms, MAL {d['mal']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine-dir", required=True, help="the demo bundle (ORT graphs)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--images", type=int, default=1, help="images per case for the counts (deterministic)")
    ap.add_argument("--time-images", type=int, default=2, help="images per case for the timings")
    ap.add_argument("--batch", type=int, default=1, help="prompts per decode call (one batch, a seed per row)")
    ap.add_argument("--commit", choices=COMMITS, default="fused",
                    help="the drafter commit: one call (fused: drafter_fused, or an older bundle's drafter_commit), "
                         "or drafter_project + drafter_step (project+step: a bundle exported before drafter_fused, "
                         "on TensorRT)")
    ap.add_argument("--compare", default=None, help="git ref of the 'before' tree (e.g. 13a5dfe)")
    ap.add_argument("--repeats", type=int, default=1, help="alternating timing runs per tree with --compare")
    ap.add_argument("--note", default="", help="free text stored in the JSON (e.g. machine load)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    cases = [c for c in a.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; choose from {sorted(CASES)}")
    if a.worker:
        print(json.dumps(measure(a.engine_dir, cases, a.images, a.time_images, a.commit, a.batch)))
        return
    report = {"command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "backend": "ort",
              "commit": a.commit, "batch": a.batch, "cfg": True, "threads": 1, "images": a.images,
              "time_images": a.time_images, "note": a.note, "loadavg_start": os.getloadavg()}
    if a.compare:
        from _refs import export_ref

        with tempfile.TemporaryDirectory() as tmp:
            commit = export_ref(a.compare, Path(tmp))
            before, after = [], []
            for _ in range(a.repeats):
                before.append(_child(Path(tmp), a, cases))
                after.append(_child(ROOT, a, cases))
        b, n = _timed_median(before, cases), _timed_median(after, cases)
        report.update(before={"ref": a.compare, "commit": commit, **b}, after=n)
        report["same_tokens"] = {c: n[c].get("tokens_sha1") == b[c].get("tokens_sha1") for c in cases}
        for c in cases:
            print(f"{c}\n  before {_brief(b[c])}\n  after  {_brief(n[c])}\n  same tokens {report['same_tokens'][c]}")
    else:
        r = _child(ROOT, a, cases)
        report["after"] = r
        for c in cases:
            print(c, _brief(r[c]))
    report["loadavg_end"] = os.getloadavg()
    if a.json:
        sys.path.insert(0, str(ROOT))
        from lisa_trt.io import write_json

        write_json(a.json, report)


if __name__ == "__main__":
    main()
