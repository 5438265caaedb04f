"""Issue 5 ablation on the demo model, in ONE process (ratios from one run):

    {EAGLE-3 drafter, LISA drafter} x {exact, lantern, gasv} (+ vanilla, sjd): MAL, speed-up
    (torch backend), mean TVD, class accuracy, FD-demo; and a GASV kappa/lambda sweep with the
    LISA drafter drawn as a speed-vs-quality plot.

    python bench/lisa_ablation.py --num-images 32 --json bench/lisa_ablation.json --plot bench/gasv_sweep.png

Every method sees the same prompts (classes cycled) and the same seeds (seed + i for image i).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import torch

from lisa_trt.artifacts import load_drafter_by_name, load_tables_by_name
from lisa_trt.bench import run_method
from lisa_trt.demo.registry import demo_sampling, load_demo_scorer, load_demo_target, load_demo_vq
from lisa_trt.demo.scorer import score_images
from lisa_trt.io import write_json
from lisa_trt.speculative.decode import SpecConfig


def run_all(label, method, target, drafter, tables, classes, sampling, spec, seed):
    toks, mal, tvd, secs = [], [], [], []
    for i, c in enumerate(classes):
        t0 = time.perf_counter()
        tk, st = run_method(method, target, drafter, tables, torch.tensor([c]), sampling=sampling, spec=spec,
                            seed=seed + i)
        secs.append(time.perf_counter() - t0)
        toks.append(tk.cpu())
        mal += [float(x) for c_ in st.committed for x in c_.float().cpu()]
        tvd += [float(x) for t_ in st.tvd for x in t_.float().cpu()]
    return {"label": label, "method": method, "tokens": torch.cat(toks), "seconds_per_image": sum(secs) / len(secs),
            "mal": sum(mal) / len(mal) if method != "vanilla" else 1.0, "mean_tvd": sum(tvd) / len(tvd) if tvd else 0.0}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-images", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tree-top-k", type=int, default=3)
    ap.add_argument("--tree-depth", type=int, default=3)
    ap.add_argument("--tree-tokens", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sweep", default="0.6:0.4,0.8:0.4,1.0:0.4,1.0:0.6,1.1:0.4,1.3:0.3,1.5:0.2")
    ap.add_argument("--drafters", default="eagle3=demo-eagle3,lisa=demo-lisa",
                    help="label=drafter (path or bundled name), comma-separated; e.g. the issue 11 ablation "
                         "eagle3=runs/e3/drafter.safetensors,lisa=runs/lisa/...,lisa-no-kd=runs/nokd/...")
    ap.add_argument("--methods", default="exact,lantern,gasv", help="verification rules per drafter")
    ap.add_argument("--oracle", action="store_true", help="also the oracle drafter (exact): the MAL ceiling")
    ap.add_argument("--no-sweep", action="store_true", help="skip the GASV kappa/lambda sweep")
    ap.add_argument("--json", required=True)
    ap.add_argument("--plot", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    target, vq, scorer = load_demo_target(), load_demo_vq(), load_demo_scorer()
    tables = load_tables_by_name("demo", target)
    pairs = [kv.split("=", 1) for kv in a.drafters.split(",") if kv.strip()]
    drafters = {k.strip(): load_drafter_by_name(v.strip(), target) for k, v in pairs}
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    sampling = demo_sampling()
    spec = SpecConfig.make(top_k=a.tree_top_k, depth=a.tree_depth, total_tokens=a.tree_tokens)
    ncls = target.config.num_classes
    classes = [i % ncls for i in range(a.num_images)]
    g = target.config.grid_size

    def quality(tokens):
        with torch.no_grad():
            imgs = vq.decode_code(tokens, (tokens.shape[0], vq.config.codebook_embed_dim, g, g)).clamp(-1, 1)
        acc, fd = score_images(imgs, torch.tensor(classes), scorer)
        return float(acc), float(fd)

    runs = [("vanilla", "vanilla", None, spec)]
    runs += [(f"{d}/{m}", m, d, spec) for d in drafters for m in methods]
    runs += [("sjd", "sjd", None, spec)] + ([("oracle", "oracle", None, spec)] if a.oracle else [])
    sweep = [] if a.no_sweep or "lisa" not in drafters else [
        tuple(float(x) for x in kv.split(":")) for kv in a.sweep.split(",") if kv]
    runs += [(f"lisa/gasv k{k} l{l}", "gasv", "lisa", dataclasses.replace(spec, gasv_kappa=k, gasv_lambda=l))
             for k, l in sweep]
    # warm-up
    run_method("vanilla", target, None, None, torch.tensor([0]), sampling=sampling, spec=spec, seed=0)
    results = {}
    for label, method, dname, sp in runs:
        r = run_all(label, method, target, drafters.get(dname), tables, classes, sampling, sp, a.seed)
        r["class_acc"], r["fd_demo"] = quality(r.pop("tokens"))
        r["drafter"] = dname
        if sp.gasv_kappa is not None:
            r["kappa"], r["lambda"] = sp.gasv_kappa, sp.gasv_lambda
        results[label] = r
        print(f"{label:24s} MAL {r['mal']:.3f}  {r['seconds_per_image']:.3f} s/img  TVD {r['mean_tvd']:.4f}  "
              f"acc {r['class_acc']:.3f}  FD {r['fd_demo']:.2f}", flush=True)
    if "oracle" in results:  # drafter efficiency: MAL / oracle MAL (same prompts, seeds, tree)
        for r in results.values():
            if r.get("drafter"):
                r["drafter_efficiency"] = r["mal"] / results["oracle"]["mal"]
    base = results["vanilla"]["seconds_per_image"]
    for r in results.values():
        r["speedup"] = base / r["seconds_per_image"]
    report = {"settings": {"num_images": a.num_images, "seed": a.seed, "classes": classes,
                           "sampling": dataclasses.asdict(sampling), "spec": dataclasses.asdict(spec),
                           "tables_gasv": tables.config.to_dict(), "torch_threads": a.threads, "backend": "torch",
                           "command": "python " + " ".join(sys.argv)},
              "results": results}
    write_json(a.json, report)
    if a.plot:
        plot(report, a.plot)


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lisa_trt.io import atomic_write

    res = report["results"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, lab in ((axes[0], "mean_tvd", "mean TVD(p_raw, law) per step"), (axes[1], "fd_demo", "FD-demo")):
        sw = [r for r in res.values() if "kappa" in r]
        ax.plot([r["mal"] for r in sw], [r[key] for r in sw], "o-", color="C2", label="LISA GASV sweep")
        for r in sw:
            ax.annotate(f"k{r['kappa']} l{r['lambda']}", (r["mal"], r[key]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        for name, r in res.items():
            if "kappa" in r:
                continue
            ax.scatter(r["mal"], r[key], marker="s", s=30)
            ax.annotate(name, (r["mal"], r[key]), fontsize=7, xytext=(3, -9), textcoords="offset points")
        ax.set_xlabel("mean accepted length (MAL)")
        ax.set_ylabel(lab)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"demo model, {report['settings']['num_images']} images, torch backend", fontsize=9)
    fig.tight_layout()
    with atomic_write(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
