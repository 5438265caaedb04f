"""`lisa-trt bench`: every method on the same prompts and seeds, in one process.

Speed-up = vanilla seconds per image / method seconds per image, measured in the same run
(spec/speculative.md metric conventions: batch 1, same batched CFG, VQ decode excluded).
Quality (class accuracy, FD-demo) comes from the demo scorer when the model has one.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Optional

import torch
from tqdm import tqdm

from .config import SamplingConfig
from .errors import InputError
from .io import write_json
from .speculative.autoregressive import generate
from .speculative.decode import DecodeStats, SpecConfig, SpeculativeDecoder
from .speculative.sjd import sjd_generate

ALL_METHODS = ("vanilla", "greedy", "exact", "lantern", "gasv", "sjd", "oracle")


def parse_methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in methods if m not in ALL_METHODS]
    if bad or not methods:
        raise InputError(f"unknown bench method(s) {bad}; valid: {', '.join(ALL_METHODS)}")
    return methods


def run_method(method: str, target, drafter, tables, cond, *, sampling: SamplingConfig,
               spec: SpecConfig, seed: int, sjd_window: int = 16, gasv=None):
    """One generation with `method` -> (tokens (B, N), DecodeStats)."""
    if method == "vanilla":
        t0 = time.perf_counter()
        toks = generate(target, cond, seed=seed, **dataclasses.asdict(sampling))
        st = DecodeStats(target_forwards=target.config.block_size)
        st.committed = [torch.ones(toks.shape[0] * (target.config.block_size - 1))]
        st.times = {"total": time.perf_counter() - t0}
        return toks, st
    if method == "sjd":
        return sjd_generate(target, cond, sampling=sampling, window=sjd_window, seed=seed)
    if method == "oracle":  # the target's own top-k at every node, exact verification (the ceiling)
        from .speculative.oracle import oracle_pair

        proxy, oracle = oracle_pair(target)
        spec = dataclasses.replace(spec, method="exact")
        return SpeculativeDecoder(proxy, oracle, tables).generate(cond, sampling=sampling, spec=spec, seed=seed)
    if drafter is None:
        raise InputError(f"method {method!r} needs a drafter (--drafter)")
    if method == "greedy":
        sampling = dataclasses.replace(sampling, greedy=True)
        spec = dataclasses.replace(spec, method="exact")
    else:
        spec = dataclasses.replace(spec, method=method)
    from .speculative.medusa import speculative_engines

    target, drafter = speculative_engines(target, drafter)  # Medusa heads run as a (proxy, drafter) pair
    return SpeculativeDecoder(target, drafter, tables, gasv=gasv).generate(cond, sampling=sampling, spec=spec, seed=seed)


def run_bench(target, drafter, tables, methods, classes, *, sampling: SamplingConfig,
              spec: SpecConfig, seed: int = 0, scorer_fn=None, decode_fn=None, sjd_window: int = 16,
              progress: bool = True, settings_extra: Optional[dict] = None, gasv=None) -> dict:
    """Run `methods` on one image per entry of `classes` (batch 1, seed + i for image i).

    Args:
        scorer_fn: optional (images uint8/float, labels) -> (class_acc, fd_demo).
        decode_fn: optional tokens -> images for the scorer.
    Returns:
        {"settings": {...}, "results": {method: {mal, seconds_per_image, speedup, mean_tvd,
        class_acc, fd_demo, drafter_efficiency (with "oracle" in methods), ...}}}
    """
    if "vanilla" not in methods:
        methods = ["vanilla"] + list(methods)
    cls = torch.as_tensor(classes).long()
    results, tokens = {}, {}
    # warm-up (allocations, thread pools), not timed
    for m in methods:
        run_method(m, target, drafter, tables, cls[:1], sampling=sampling, spec=spec, seed=seed,
                   sjd_window=sjd_window, gasv=gasv)
    for m in methods:
        secs, stats_all, toks = [], [], []
        for i in tqdm(range(len(cls)), desc=f"bench {m}", disable=not progress):
            t0 = time.perf_counter()
            tk, st = run_method(m, target, drafter, tables, cls[i: i + 1], sampling=sampling,
                                spec=spec, seed=seed + i, sjd_window=sjd_window, gasv=gasv)
            secs.append(time.perf_counter() - t0)
            stats_all.append(st)
            toks.append(tk)
        tokens[m] = torch.cat([t.cpu() for t in toks])
        committed = torch.cat([c.float().cpu() for s in stats_all for c in s.committed])
        tvds = [t.float().cpu() for s in stats_all for t in s.tvd]
        times = {}
        for s in stats_all:
            for k, v in s.times.items():
                times[k] = times.get(k, 0.0) + v / len(stats_all)
        results[m] = {
            "mal": float(committed.mean()) if m != "vanilla" else 1.0,
            "seconds_per_image": sum(secs) / len(secs),
            "mean_tvd": float(torch.cat(tvds).mean()) if tvds else 0.0,
            "target_forwards_per_image": sum(s.target_forwards for s in stats_all) / len(stats_all),
            "time_split": times,
        }
    base = results["vanilla"]["seconds_per_image"]
    for m, r in results.items():
        r["speedup"] = base / r["seconds_per_image"]
        if scorer_fn is not None and decode_fn is not None:
            acc, fd = scorer_fn(decode_fn(tokens[m]), cls)
            r["class_acc"], r["fd_demo"] = float(acc), float(fd)
    from .speculative.oracle import drafter_efficiency

    for m, e in drafter_efficiency(results).items():
        results[m]["drafter_efficiency"] = e  # MAL / oracle MAL (same tree budget and seeds)
    settings = {"num_images": len(cls), "seed": seed, "classes": cls.tolist(),
                "sampling": dataclasses.asdict(sampling), "spec": dataclasses.asdict(spec),
                "sjd_window": sjd_window, "torch_threads": torch.get_num_threads(),
                **(settings_extra or {})}
    return {"settings": settings, "results": results}


def save_bench(report: dict, json_path, plot_path=None) -> None:
    write_json(json_path, report)
    if plot_path:
        plot_speed_quality(report, plot_path)


def plot_speed_quality(report: dict, path) -> None:
    """Speed-up vs quality (FD-demo when scored, else mean TVD), one point per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .io import atomic_write

    res = report["results"]
    scored = all("fd_demo" in r for r in res.values())
    key, label = ("fd_demo", "FD-demo (lower is better)") if scored else ("mean_tvd", "mean TVD per step")
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for m, r in res.items():
        ax.scatter(r["speedup"], r[key], s=40)
        ax.annotate(f"{m}\nMAL {r['mal']:.2f}", (r["speedup"], r[key]), textcoords="offset points",
                    xytext=(5, 5), fontsize=8)
    ax.axvline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("speed-up vs vanilla (same run)")
    ax.set_ylabel(label)
    s = report["settings"]
    ax.set_title(f"{s.get('model', '')} {s.get('backend', 'torch')}: {s['num_images']} images", fontsize=9)
    fig.tight_layout()
    with atomic_write(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def dumps(report: dict) -> str:
    return json.dumps(report, indent=2)
