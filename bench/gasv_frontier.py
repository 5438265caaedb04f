"""GASV v2 frontier on the demo model (issue 10): MAL against quality with standard errors.

    OMP_NUM_THREADS=1 nohup python bench/gasv_frontier.py --json bench/gasv_frontier.json \
        --plot bench/gasv_frontier.png --rounds 8 --per-round 32 > runs/frontier.log 2>&1 &

Points (same prompts = classes cycled, same seeds for every point): vanilla, exact, LANTERN at
several deltas, modulated LANTERN (lantern_gamma), GASV v2 (neighbours scope over a small
kappa / lambda / delta grid, and the cluster scope). Images are generated in ROUNDS: each round
adds `per_round` new images (new seeds) to every point, and the JSON / PNG are rewritten after
every round, so whenever the run is stopped every point has the same number of images.

Generation is BATCHED (rows of one batch share nothing but the batch; MAL and TVD are per-row
statistics), so this script measures acceptance and quality, not wall-clock speed. Quality
uses lisa_trt.quality (class accuracy +- SE, KID-demo vs real held-out crops and vs an
independent set of vanilla samples +- SE, FD-demo). Quality claims need >= 256 images per point.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import torch

from lisa_trt.artifacts import load_drafter_by_name, load_tables_by_name
from lisa_trt.harness import plot_pareto
from lisa_trt.demo.registry import demo_sampling, load_demo_scorer, load_demo_target, load_demo_vq
from lisa_trt.io import write_json
from lisa_trt.quality import QualityReference, evaluate, quality_neutral
from lisa_trt.speculative.autoregressive import generate
from lisa_trt.speculative.decode import SpecConfig, SpeculativeDecoder  # noqa: F401
from lisa_trt.speculative.oracle import oracle_pair
from lisa_trt.speculative.sjd import sjd_generate
from lisa_trt.speculative.methods import get_method

POINTS = [  # (label, method, SpecConfig overrides); the most informative first
    ("vanilla", "vanilla", {}),
    ("exact", "exact", {}),
    ("lantern[delta=0.2]", "lantern", {"lantern_delta": 0.2}),
    ("gasv[kappa=1,lambda=0.6]", "gasv", {"gasv_kappa": 1.0, "gasv_lambda": 0.6}),
    ("lantern[delta=0.3]", "lantern", {"lantern_delta": 0.3}),
    ("gasv[kappa=0.5,lambda=0.8]", "gasv", {"gasv_kappa": 0.5, "gasv_lambda": 0.8}),
    ("lantern[delta=0.1]", "lantern", {"lantern_delta": 0.1}),
    ("lantern[delta=0.2,gamma=1]", "lantern", {"lantern_delta": 0.2, "lantern_gamma": 1.0}),
    ("gasv[kappa=2,lambda=0.4]", "gasv", {"gasv_kappa": 2.0, "gasv_lambda": 0.4}),
    ("gasv[kappa=1,lambda=0.6,delta=0.2]", "gasv", {"gasv_kappa": 1.0, "gasv_lambda": 0.6, "gasv_delta": 0.2}),
    ("gasv-cluster[kappa=1,lambda=0.6]", "gasv", {"gasv_kappa": 1.0, "gasv_lambda": 0.6, "gasv_scope": "cluster"}),
    ("lantern[delta=0.4]", "lantern", {"lantern_delta": 0.4}),
    ("sjd", "sjd", {}),
    ("lantern[delta=0.05]", "lantern", {"lantern_delta": 0.05}),
    ("gasv[kappa=2,lambda=0.4,delta=0.3]", "gasv", {"gasv_kappa": 2.0, "gasv_lambda": 0.4, "gasv_delta": 0.3}),
    ("gasv-cluster[kappa=0.5,lambda=0.8]", "gasv", {"gasv_kappa": 0.5, "gasv_lambda": 0.8, "gasv_scope": "cluster"}),
    ("gasv-support[kappa=0.5,lambda=0.8]", "gasv", {"gasv_kappa": 0.5, "gasv_lambda": 0.8, "gasv_scope": "support"}),
    ("oracle", "oracle", {}),  # the target's own top-k at every node, exact: the drafter ceiling (issue 11)
]

# a GASV label without delta means no mass cap (delta 1), whatever the tables' default is
POINTS = [(lab, m, dict(o, gasv_delta=o.get("gasv_delta", 1.0)) if m == "gasv" else o) for lab, m, o in POINTS]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--per-round", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--drafter", default="demo-lisa")
    ap.add_argument("--tree", default="3,3,10", help="top_k,depth,total_tokens")
    ap.add_argument("--vanilla-ref", type=int, default=256, help="independent vanilla samples for KID-vs-vanilla")
    ap.add_argument("--points", default=None, help="'|'-separated labels (default: all)")
    ap.add_argument("--cache", default="runs/quality_cache")
    ap.add_argument("--json", required=True)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--label-prefix", default="", help="prefix for this run's labels (e.g. 'eagle3:')")
    ap.add_argument("--merge", action="store_true",
                    help="add this run's points to the existing --json (same settings; vanilla must match)")
    ap.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                    help="only merge frontier files made with --merge from the same stored file into --json "
                         "(parallel runs on several cores), redraw --plot, and stop")
    a = ap.parse_args(argv)
    if a.combine:
        return _combine(a.combine, a.json, a.plot)
    torch.set_num_threads(1)
    target, vq, scorer = load_demo_target(), load_demo_vq(), load_demo_scorer()
    tables = load_tables_by_name("demo", target)
    drafter = load_drafter_by_name(a.drafter, target)
    sampling = demo_sampling()
    k, d, n = (int(x) for x in a.tree.split(","))
    base = SpecConfig.make(top_k=k, depth=d, total_tokens=n)
    points = [p for p in POINTS if a.points is None or p[0] in a.points.split("|")]
    if not points or points[0][0] != "vanilla":
        raise SystemExit("--points must start with vanilla and name points of POINTS")
    ncls, g = target.config.num_classes, target.config.grid_size

    def decode(tokens):
        with torch.no_grad():
            return vq.decode_code(tokens, (tokens.shape[0], vq.config.codebook_embed_dim, g, g)).clamp(-1, 1)

    def vanilla_ref():
        cond = torch.arange(a.vanilla_ref) % ncls
        return decode(torch.cat([generate(target, cond[i: i + 64], seed=a.seed + 7_000_003 + i,
                                          **dataclasses.asdict(sampling)) for i in range(0, a.vanilla_ref, 64)]))

    ref = QualityReference(scorer, vanilla_fn=vanilla_ref, cache_dir=a.cache,
                           vanilla_key={"n": a.vanilla_ref, "seed": a.seed + 7_000_003, "classes": "cycled",
                                        "sampling": dataclasses.asdict(sampling), "model": "demo"})
    if a.merge:  # refuse before hours of work, not after the first round
        import json
        from pathlib import Path

        bad = [p[0] for p in points if p[1] == "gasv" and not {"gasv_kappa", "gasv_lambda", "gasv_delta"} <= set(p[2])
               and tables.config.delta != 1.0]
        if bad:
            raise SystemExit(f"--merge: GASV points {bad} must set kappa, lambda and delta explicitly")
        _check_mergeable(json.loads(Path(a.json).read_text())["settings"],
                         {"model": "demo", "tree": a.tree, "seed": a.seed, "vanilla_ref": a.vanilla_ref,
                          "sampling": dataclasses.asdict(sampling), "tables_gasv": tables.config.to_dict()}, a.json)
    acc = {p[0]: {"tokens": [], "committed": [], "tvd": [], "img_mal": [], "seconds": 0.0} for p in points}
    dec = SpeculativeDecoder(target, drafter, tables)
    oracle_dec = SpeculativeDecoder(*oracle_pair(target), tables) if any(p[1] == "oracle" for p in points) else None
    t_start = time.time()
    for r in range(a.rounds):
        for label, method, over in points:
            st_acc = acc[label]
            for b0 in range(0, a.per_round, a.batch):
                i0 = r * a.per_round + b0
                cond = torch.arange(i0, i0 + min(a.batch, a.per_round - b0)) % ncls
                seed = a.seed + 1000 * r + b0
                t0 = time.perf_counter()
                if method == "vanilla":
                    toks = generate(target, cond, seed=seed, **dataclasses.asdict(sampling))
                elif method == "sjd":  # no drafter: Jacobi iterations over a window of the target alone
                    toks, st = sjd_generate(target, cond, sampling=sampling, seed=seed)
                    st_acc["committed"] += [c.float().cpu() for c in st.committed]
                else:
                    spec = base.replace(method=method, **over)
                    toks, st = (oracle_dec if method == "oracle" else dec).generate(cond, sampling=sampling, method=get_method(spec.method), spec=spec,
                                                                                    seed=seed)
                    st_acc["committed"] += [c.float().cpu() for c in st.committed]
                    st_acc["tvd"] += [t.float().cpu() for t in st.tvd]
                    st_acc["img_mal"] += [st.row(b)["mal"] for b in range(len(cond))]
                st_acc["seconds"] += time.perf_counter() - t0
                st_acc["tokens"].append(toks.cpu())
        results = {}
        for label, method, over in points:
            s = acc[label]
            toks = torch.cat(s["tokens"])
            labels = torch.arange(toks.shape[0]) % ncls       # the cond of image i is i % ncls
            res = {"method": method if "-" not in label.split("[")[0] else label.split("[")[0], "knobs": over,
                   "images": int(toks.shape[0]),
                   "mal": float(torch.cat(s["committed"]).mean()) if s["committed"] else 1.0,
                   "mean_tvd": float(torch.cat(s["tvd"]).mean()) if s["tvd"] else 0.0,
                   # standard error of the MAL over images (each image's own MAL; images are independent)
                   "mal_se": float(torch.tensor(s["img_mal"]).std() / len(s["img_mal"]) ** 0.5) if len(s["img_mal"]) > 1
                   else None,
                   "mal_per_image": [round(x, 4) for x in s["img_mal"]],  # for paired drafter comparisons
                   "cpu_seconds_per_image_batched": s["seconds"] / toks.shape[0]}
            res.update(evaluate(decode(toks), labels, ref))
            results[label] = res
        for res in results.values():
            res["quality_neutral"] = None if res["underpowered"] else quality_neutral(res, results["vanilla"])
        report = {"settings": {"model": "demo", "drafter": a.drafter, "tree": a.tree, "num_images": (r + 1) * a.per_round,
                               "rounds_done": r + 1, "batch": a.batch, "seed": a.seed, "vanilla_ref": a.vanilla_ref,
                               "sampling": dataclasses.asdict(sampling), "tables_gasv": tables.config.to_dict(),
                               "elapsed_s": round(time.time() - t_start, 1), "torch_threads": 1,
                               "command": " ".join([sys.executable.rsplit("/", 1)[-1]] + sys.argv)},
                  "results": results}
        if a.merge:
            report = _merge(a, report)
        write_json(a.json, _efficiency(report))
        if a.plot:
            plot_pareto(report, a.plot)
        print(f"round {r + 1}: {(r + 1) * a.per_round} images per point, {time.time() - t_start:.0f} s", flush=True)


def _check_mergeable(old: dict, new: dict, path) -> None:
    """Same model, tree, seeds, sampling and calibration statistics. The tables' DEFAULT knobs
    (kappa, lambda, delta) may differ (the demo tables ship the frontier's pick): merged GASV
    points set kappa and lambda explicitly (and delta, unless the tables' default is 1 = no cap)."""
    keys = ("model", "tree", "seed", "sampling", "vanilla_ref")
    diff = [k for k in keys if old.get(k) != new.get(k)]
    strip = lambda t: {k: v for k, v in (t or {}).items() if k not in ("kappa", "lam", "delta")}  # noqa: E731
    if strip(old.get("tables_gasv")) != strip(new.get("tables_gasv")):
        diff.append("tables_gasv")
    if diff:
        raise SystemExit(f"--merge: settings {diff} differ from {path}; run with the same ones")


def _combine(paths, out, plot) -> None:
    """Union of the points of several merged frontier files (the first one's settings and vanilla)."""
    import json
    from pathlib import Path

    reports = [json.loads(Path(p).read_text()) for p in paths]
    base = reports[0]
    for p, rep in zip(paths[1:], reports[1:]):
        _check_mergeable(base["settings"], rep["settings"], p)
        for label, res in rep["results"].items():
            if label not in base["results"]:
                base["results"][label] = res
        runs = base["settings"].setdefault("merged_runs", [])
        runs += [r for r in rep["settings"].get("merged_runs", []) if r not in runs]
    base["settings"]["combined_from"] = [str(p) for p in paths]
    write_json(out, _efficiency(base))
    if plot:
        plot_pareto(base, plot)


def _efficiency(report: dict) -> dict:
    """Every drafter point's MAL as a fraction of the oracle's ("drafter efficiency"; same prompts,
    seeds and tree), when the file holds an oracle point."""
    res = report["results"]
    if "oracle" in res:
        for label, r in res.items():
            if r["method"] not in ("vanilla", "sjd", "oracle"):
                r["drafter_efficiency"] = r["mal"] / res["oracle"]["mal"]
    return report


def _merge(a, report: dict) -> dict:
    """This run's points added to the existing frontier file. The vanilla point is regenerated
    with the same prompts and seeds; it must reproduce the stored one (same class accuracy) once
    both have the same number of images, else the runs are not comparable and we stop."""
    import json
    from pathlib import Path

    old = json.loads(Path(a.json).read_text())
    _check_mergeable(old["settings"], report["settings"], a.json)
    van, ov = report["results"]["vanilla"], old["results"].get("vanilla")
    if ov and ov["images"] == van["images"] and abs(ov["class_acc"] - van["class_acc"]) > 1e-9:
        raise SystemExit("--merge: vanilla does not reproduce the stored run (different seeds or code)")
    runs = [r for r in old["settings"].get("merged_runs", []) if r.get("command") != report["settings"]["command"]]
    merged = dict(old["results"])
    for label, res in report["results"].items():
        if label != "vanilla":
            res = dict(res, drafter=report["settings"]["drafter"])
            if a.label_prefix:  # another drafter: its own curve in the plot
                res["method"] = a.label_prefix + res["method"]
            merged[a.label_prefix + label] = res
    return {"settings": dict(old["settings"], merged_runs=runs + [report["settings"]]), "results": merged}


if __name__ == "__main__":
    main()
