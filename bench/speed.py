"""Issue 12 speed record: reference torch loop vs ONNX Runtime vanilla / LISA at fp32 / int8 / int4.

ONE run (one invocation), threads pinned to 1, every configuration in its own fresh worker
process (so its peak RSS is its own), rounds interleaved (config A, B, ... then A, B, ... again,
round r on images r*N .. (r+1)*N - 1) so slow phases of the shared machine hit every
configuration; figures are pooled over the rounds and ratios are taken inside the run.

1. Demo model (MEASURED): `--images` class-conditional images (CFG on, batch 1, seeds 0..N-1):
   torch vanilla fp32 (the reference PyTorch loop), ORT vanilla fp32/int8/int4, ORT LISA (GASV,
   the bundle's ORT tree) fp32/int8/int4. Seconds per image (tokens, VQ decode, end to end),
   speed-up vs the torch loop and vs ORT vanilla at the same precision, MAL, class accuracy (demo
   scorer; few images: noisy), peak RSS.
2. Random GPT-B-shaped target (PROJECTION): its graph costs are measured here (ORT fp32/int8/int4,
   torch fp32: one verify step of 1 and of M tokens, drafter calls, batch 2 = CFG, 128 committed
   tokens); the acceptance (MAL) and the per-step host time are BORROWED from the demo rows of the
   same run, so its seconds per image are a projection, labelled as such.

    python bench/speed.py --images 8 --rounds 2 --json bench/speed.json --plot bench/speed.png

Writes the JSON (with the machine load before/after), the PNG, and the never-slower choices
(runtime/autotune.choose_decoding) per precision into lisa_trt/assets/demo/decode_choice.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
PRECISIONS = ("fp32", "int8", "int4")
DEMO_CONFIGS = [("torch", "fp32", "vanilla")] + [("ort", p, "vanilla") for p in PRECISIONS] + \
               [("ort", p, "gasv") for p in PRECISIONS]
COMMITTED = 128


def peak_rss_mib() -> float:
    """Peak RSS of this process (VmHWM: unlike ru_maxrss it is not inherited from the parent across exec)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def pin_threads() -> None:
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)


# ----------------------------------------------------------------------------- workers

def worker_demo(a) -> dict:
    """One demo configuration: generate `images` images, time tokens and decode, score them."""
    import numpy as np
    import torch

    from lisa_trt.demo.registry import load_demo_scorer
    from lisa_trt.demo.scorer import score_images
    from lisa_trt.runtime.pipeline import Pipeline

    pin_threads()
    pipe = Pipeline.from_dir(a.engine_dir, backend=a.backend, threads=1)
    first = a.round * a.images  # round r: images r*N .. (r+1)*N - 1 (seeds and classes), same for every config
    prompts = [i % pipe.config.num_classes for i in range(first, first + a.images)]
    pipe.generate(prompts[:1], seed=10_000, verify=a.verify)  # warm-up: sessions, allocations
    t0 = time.perf_counter()
    res = pipe.generate(prompts, seed=first, verify=a.verify, decode=False)
    t_tok = (time.perf_counter() - t0) / a.images
    t0 = time.perf_counter()
    images = pipe.decode(res.tokens)
    t_dec = (time.perf_counter() - t0) / a.images
    imgs = torch.from_numpy(np.stack([np.asarray(im) for im in images])).permute(0, 3, 1, 2)
    acc, _ = score_images(imgs, torch.tensor(prompts), load_demo_scorer())
    steps = [s.get("steps", pipe.config.block_size) for s in res.stats]
    return {"tokens_seconds_per_image": t_tok, "decode_seconds_per_image": t_dec,
            "seconds_per_image": t_tok + t_dec, "mal": float(np.mean([s["mal"] for s in res.stats])),
            "steps_per_image": float(np.mean(steps)), "class_acc": float(acc),
            "correct": int(round(acc * a.images)), "images": a.images, "tree": dataclasses.asdict(pipe.spec(a.verify)) if a.verify != "vanilla"
            else None, "peak_rss_mib": peak_rss_mib()}


def worker_costs(a) -> dict:
    """Graph costs of one model + backend: verify(1), verify(M), drafter(K), drafter(1) (ms, median)."""
    import torch

    from ort_cost_curve import build_target, drafter_curve, verify_curve

    pin_threads()
    tree = json.loads(a.tree)
    M, K = int(tree["total_tokens"]), int(tree["top_k"])
    if a.backend == "ort":
        from lisa_trt.engines.ort import load_ort_engines

        e = load_ort_engines(a.engine_dir, threads=1)
        target, drafter, max_len = e.target, e.drafter, e.manifest.max_cache_len
    else:
        from lisa_trt.models.drafter import Drafter

        target, _ = build_target(a.model)
        torch.manual_seed(1)
        drafter = Drafter.from_target(target).eval()
        max_len = None
    cfg = target.config
    cond = torch.tensor([1, cfg.num_classes])  # CFG pair
    v = verify_curve(target, cond, COMMITTED, 16, a.reps, sorted({1, M}))
    out = {"verify_ms": v, "peak_rss_mib_after_verify": peak_rss_mib()}
    if drafter is not None:
        d = drafter_curve(drafter, cfg.cls_token_num + COMMITTED, 2, max_len or (cfg.seq_len + 16), a.reps,
                          sorted({1, K}))
        out["drafter_ms"] = d
    out["peak_rss_mib"] = peak_rss_mib()
    return out


def run_worker(kind: str, **kw) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {kind} {kw} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- preparation

def demo_refs():
    from lisa_trt.artifacts import load_drafter_by_name, load_tables_by_name
    from lisa_trt.demo.registry import load_demo_target, load_demo_vq

    target = load_demo_target()
    tables = load_tables_by_name("demo", target)
    return dict(target=target, drafter=load_drafter_by_name("demo-lisa", target),
                tables=tables.bind(target.output.weight), vq=load_demo_vq())


def _cpu_name() -> str:
    try:
        return next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name"))
    except (OSError, StopIteration):
        return "?"


def _cpu_kind() -> str:
    """vnni | avx2 | other: the int8 MatMul path ONNX Runtime takes here (export/int8_isa.py)."""
    from lisa_trt.export.int8_isa import cpu_kind

    return cpu_kind()


def quantized_copies(src: Path, refs: dict, validate: bool = True) -> dict:
    """{precision: engine dir}: fp32 `src` plus int8 / int4 copies (export/quantize.py)."""
    from lisa_trt.export.quantize import quantize_bundle

    dirs, report = {"fp32": src}, {}
    for p in ("int8", "int4"):
        d = src.with_name(f"{src.name}-{p}")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        t0 = time.perf_counter()
        man = quantize_bundle(d, p, refs, validate=validate)
        report[p] = {"seconds": round(time.perf_counter() - t0, 1), "graphs": {
            n: {k: (g.validation or {}).get(k) for k in ("max_error", "max_abs_logit_diff", "top1_agreement")}
            for n, g in man.graphs.items() if g.quantization}}
        dirs[p] = d
    return dirs, report


def prepare_gptb(work: Path) -> tuple[dict, dict]:
    import torch

    from lisa_trt.export import export_bundle
    from lisa_trt.models.drafter import Drafter
    from ort_cost_curve import build_target

    target, desc = build_target("GPT-B")
    torch.manual_seed(1)
    drafter = Drafter.from_target(target).eval()
    out = work / "gptb"
    t0 = time.perf_counter()
    from lisa_trt.export.manifest import read_manifest
    from lisa_trt.models.checkpoints import target_hash

    try:  # same seed -> same random model: an earlier export in --workdir is reused
        reuse = read_manifest(out, target_hash=target_hash(target)) is not None
    except Exception:  # noqa: BLE001 - absent or stale: export again
        reuse = False
    if not reuse:
        export_bundle(target, drafter, None, None, out, max_tree=16, lint=False, validate=False, progress=False)
    info = {"description": desc, "export_seconds": round(time.perf_counter() - t0, 1), "reused_export": reuse}
    dirs, q = quantized_copies(out, dict(target=target, drafter=drafter, tables=None, vq=None), validate=False)
    from lisa_trt.models.io_spec import Graph, export_dims
    from lisa_trt.export.manifest import read_manifest
    from lisa_trt.export.quantize import validate_quantized

    for p in ("int8", "int4"):
        man = read_manifest(dirs[p])
        dims = export_dims(target.config, max_cache_len=man.max_cache_len, drafter_cfg=drafter.config)
        rep = validate_quantized(Graph.TARGET_VERIFY, man.graph_path(Graph.TARGET_VERIFY), dict(target=target),
                                 dims, p)
        q[p]["target_verify_random_inputs"] = {k: rep.get(k) for k in ("max_error", "max_abs_logit_diff",
                                                                       "top1_agreement", "ok")}
    info["quantization"] = q
    return dirs, info


# ----------------------------------------------------------------------------- analysis

def pooled(rows: list) -> dict:
    """Per-config figures over the rounds (different images, interleaved with the other configs):
    mean seconds per image, pooled class accuracy, max peak RSS; per-round values kept."""
    n = len(rows)
    out = {k: sum(r[k] for r in rows) / n for k in ("tokens_seconds_per_image", "decode_seconds_per_image",
                                                  "seconds_per_image", "mal", "steps_per_image")}
    correct = sum(r["correct"] for r in rows)
    images = sum(r["images"] for r in rows)
    out.update(class_acc=correct / images, correct=correct, images=images, tree=rows[0]["tree"],
               class_acc_stderr=(correct / images * (1 - correct / images) / images) ** 0.5,
               rounds_seconds_per_image=[round(r["seconds_per_image"], 4) for r in rows],
               peak_rss_mib=max(r["peak_rss_mib"] for r in rows))
    return out


def key(cfg) -> str:
    return "/".join(cfg)


def projection(demo: dict, demo_costs: dict, gb_costs: dict, tree: dict) -> dict:
    """GPT-B seconds per image (tokens only) from its measured graph costs + the demo's MAL and host time."""
    N = 256
    M, K, D = tree["total_tokens"], tree["top_k"], tree["depth"]
    # min over the repetitions: on the loaded machine the median of a few-ms call is mostly queueing
    ms = lambda c, what, s: c[what]["min"][str(s)] / 1e3  # noqa: E731
    tq = demo["torch/fp32/vanilla"]
    host_torch = tq["tokens_seconds_per_image"] / N - ms(demo_costs["torch"], "verify_ms", 1)
    out = {"label": "PROJECTION: GPT-B graph costs measured in this run; MAL and host time per step borrowed "
                    "from the demo rows of this run (host = measured step time - min graph costs); tokens only (no VQ decode); the GASV graph is costed "
                    "at the demo's vocabulary (inside the borrowed host time)",
           "torch/fp32/vanilla": {"seconds_per_image": N * (ms(gb_costs["torch"], "verify_ms", 1) + host_torch),
                                  "peak_rss_mib": gb_costs["torch"]["peak_rss_mib"]}}
    for p in PRECISIONS:
        van, lisa = demo[f"ort/{p}/vanilla"], demo.get(f"ort/{p}/gasv")
        dc, gc = demo_costs[p], gb_costs[p]
        host_v = van["tokens_seconds_per_image"] / N - ms(dc, "verify_ms", 1)
        out[f"ort/{p}/vanilla"] = {"seconds_per_image": N * (ms(gc, "verify_ms", 1) + host_v),
                                   "peak_rss_mib": gc["peak_rss_mib"]}
        if lisa is None:
            continue
        steps = lisa["steps_per_image"]
        model_step = lambda c: ms(c, "verify_ms", M) + (D + 1) * ms(c, "drafter_ms", K)  # noqa: E731
        host_s = lisa["tokens_seconds_per_image"] / steps - model_step(dc)
        out[f"ort/{p}/gasv"] = {"seconds_per_image": steps * (model_step(gc) + host_s), "mal_borrowed": lisa["mal"],
                                "host_ms_per_step_borrowed": 1e3 * host_s, "peak_rss_mib": gc["peak_rss_mib"]}
    return out


def add_speedups(rows: dict) -> None:
    ref = rows["torch/fp32/vanilla"]["seconds_per_image"]
    for k, r in rows.items():
        if not isinstance(r, dict) or "seconds_per_image" not in r:
            continue
        r["speedup_vs_torch_fp32"] = ref / r["seconds_per_image"]
        be, p, m = k.split("/")
        van = rows.get(f"{be}/{p}/vanilla")
        if van is not None:
            r["speedup_vs_vanilla_same_precision"] = van["seconds_per_image"] / r["seconds_per_image"]


def choices(demo: dict, tree: dict) -> list:
    from lisa_trt.runtime.autotune import choose_decoding

    out = []
    for p in PRECISIONS:
        lisa = demo.get(f"ort/{p}/gasv")
        if lisa is None:
            continue
        s = demo[f"ort/{p}/vanilla"]["seconds_per_image"] / lisa["seconds_per_image"]
        out.append(choose_decoding(backend="ort", precision=p, measured=[{**tree, "speedup": s}]))
    return out


def plot(demo: dict, proj: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, rows, title in ((axes[0], demo, "demo model (measured)"),
                            (axes[1], proj, "random GPT-B shape (PROJECTION: demo acceptance)")):
        names = [k for k in rows if isinstance(rows[k], dict) and "seconds_per_image" in rows[k]]
        secs = [rows[k]["seconds_per_image"] for k in names]
        colors = ["gray" if k.startswith("torch") else ("tab:blue" if k.endswith("vanilla") else "tab:orange")
                  for k in names]
        bars = ax.bar(range(len(names)), secs, color=colors)
        for b, k in zip(bars, names):
            ax.annotate(f"{rows[k]['speedup_vs_torch_fp32']:.2f}x", (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(names)), [k.replace("/gasv", "/LISA") for k in names], rotation=30, ha="right",
                      fontsize=8)
        ax.set_ylabel("seconds per image")
        ax.set_title(title, fontsize=10)
    fig.suptitle("speed-up vs the reference PyTorch fp32 loop (1 thread, batch 1, CFG on; shared loaded CPU)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def gptb_part(a, report: dict, dirs: dict, demo: dict, tree: dict) -> dict:
    """Graph costs of the demo and of a random GPT-B (ORT fp32/int8/int4, torch) -> projected rows."""
    tj = json.dumps(tree)
    demo_costs = {p: run_worker("costs", engine_dir=dirs[p], backend="ort", tree=tj, reps=a.reps)
                  for p in PRECISIONS}
    demo_costs["torch"] = run_worker("costs", backend="torch", model="demo", tree=tj, reps=a.reps)
    gdirs, ginfo = prepare_gptb(Path(a.workdir))
    gb_costs = {p: run_worker("costs", engine_dir=gdirs[p], backend="ort", tree=tj, reps=a.reps)
                for p in PRECISIONS}
    gb_costs["torch"] = run_worker("costs", backend="torch", model="GPT-B", tree=tj, reps=a.reps)
    proj = projection(demo, demo_costs, gb_costs, tree)
    add_speedups(proj)
    report["gptb_projection"] = {**proj, "model": ginfo, "graph_costs_ms": gb_costs, "demo_graph_costs_ms": demo_costs}
    for k, r in proj.items():
        if isinstance(r, dict):
            print(f"GPT-B PROJECTION {k}: {r['seconds_per_image']:.2f} s/image, "
                  f"{r['speedup_vs_torch_fp32']:.2f}x torch", flush=True)
    return proj


# ----------------------------------------------------------------------------- main

def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=9, help="repetitions of each graph-cost timing")
    ap.add_argument("--json", default=str(ROOT / "bench" / "speed.json"))
    ap.add_argument("--plot", default=str(ROOT / "bench" / "speed.png"))
    ap.add_argument("--workdir", default="/tmp/lisa-speed")
    ap.add_argument("--no-gptb", action="store_true", help="skip the GPT-B projection")
    ap.add_argument("--no-assets", action="store_true", help="do not write lisa_trt/assets/demo/decode_choice.json")
    # worker arguments
    ap.add_argument("--worker", choices=["demo", "costs"], default=None)
    ap.add_argument("--engine-dir", default=None)
    ap.add_argument("--backend", default="ort")
    ap.add_argument("--verify", default="vanilla")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--tree", default="{}")
    ap.add_argument("--round", type=int, default=0)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps((worker_demo if a.worker == "demo" else worker_costs)(a)))
        return
    import onnxruntime
    import torch

    from lisa_trt.io import write_json
    from lisa_trt.runtime.demo import ensure_demo_bundle

    t_start = time.time()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    report = {"command": "python bench/speed.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "machine": {"logical_cpus": os.cpu_count(), "threads": 1, "torch": torch.__version__,
                          "cpu": _cpu_name(), "cpu_kind": _cpu_kind(),
                          "onnxruntime": onnxruntime.__version__, "load_average_at_start": list(os.getloadavg()),
                          "loaded": ("quiet: no other job ran (see the load averages)" if os.getloadavg()[0] < 1.5
                                     else "shared 2-core machine with other jobs running: absolute seconds are noisy, "
                                          "ratios inside this run much less")},
              "images": a.images, "rounds": a.rounds, "batch": 1, "cfg": True}
    refs = demo_refs()
    fp32 = ensure_demo_bundle(work / "demo", echo=print)
    dirs, qrep = quantized_copies(fp32, refs)
    report["demo_quantization"] = qrep
    from lisa_trt.export.manifest import read_manifest

    tree_ort = read_manifest(fp32).generation["tree"]["ort"]
    tree = {k: int(tree_ort[k]) for k in ("top_k", "depth", "total_tokens")}
    report["tree"] = tree
    rows = {key(c): [] for c in DEMO_CONFIGS}
    for r in range(a.rounds):
        for be, p, m in DEMO_CONFIGS:
            res = run_worker("demo", engine_dir=dirs[p], backend=be, verify=m, images=a.images, round=r)
            rows[key((be, p, m))].append(res)
            print(f"round {r} {be}/{p}/{m}: {res['seconds_per_image']:.3f} s/image, MAL {res['mal']:.2f}, "
                  f"acc {res['class_acc']:.2f}, RSS {res['peak_rss_mib']} MiB", flush=True)
    demo = {k: pooled(v) for k, v in rows.items()}
    add_speedups(demo)
    report["demo"] = demo
    ch = choices(demo, tree)
    report["never_slower"] = [c.to_dict() for c in ch]
    for c in ch:
        print(c.reason, flush=True)
    if not a.no_assets:
        write_json(ROOT / "lisa_trt" / "assets" / "demo" / "decode_choice.json",
                   {"source": "bench/speed.json", "choices": [c.to_dict() for c in ch]})
    write_json(a.json, report)  # the measured part is kept even if the projection fails
    proj = {}
    if not a.no_gptb:
        try:
            proj = gptb_part(a, report, dirs, demo, tree)
        except Exception as e:  # noqa: BLE001 - keep the measured demo rows, say what failed
            report["gptb_projection"] = {"error": f"{type(e).__name__}: {e}"[:2000]}
            print("GPT-B projection failed:", e, flush=True)
    report["machine"]["load_average_at_end"] = list(os.getloadavg())
    report["wall_seconds"] = round(time.time() - t_start, 1)
    write_json(a.json, report)
    if a.plot:
        plot(demo, {k: v for k, v in proj.items() if isinstance(v, dict)} if proj else demo, Path(a.plot))
    print("wrote", a.json, a.plot)


if __name__ == "__main__":
    main()
