"""`lisa-trt bench`: every method on the same prompts and seeds, in one process.

Speed-up = vanilla seconds per image / method seconds per image, measured in the same run
(docs/spec/speculative.md metric conventions: batch 1, same batched CFG, VQ decode excluded).
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
from .speculative.methods import METHODS, SpecConfig, method_names
from .speculative.run import run_method

def parse_methods(text: str) -> list[str]:
    """"vanilla,gasv" -> ["vanilla", "gasv"], each a registered method (speculative/methods.py)."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise InputError(f"unknown bench method(s) {bad}; valid: {', '.join(method_names())}")
    return methods


def run_bench(target, drafter, tables, methods, classes, *, sampling: SamplingConfig,
              spec: SpecConfig, seed: int = 0, scorer_fn=None, decode_fn=None, sjd_window: int = 16,
              progress: bool = True, settings_extra: Optional[dict] = None, gasv=None) -> dict:
    """Run `methods` on one image per entry of `classes` (batch 1, seed + i for image i).
    For t2i targets `classes` is a (features (B, L, C), mask (B, L)) condition, one row per image.

    Args:
        scorer_fn: optional (images uint8/float, labels) -> (class_acc, fd_demo).
        decode_fn: optional tokens -> images for the scorer.
    Returns:
        {"settings": {...}, "results": {method: {mal, seconds_per_image, speedup, mean_tvd,
        class_acc, fd_demo, ...}}}
    """
    baseline = method_names("ar")[0]
    if baseline not in methods:
        methods = [baseline] + list(methods)
    from .text.prompts import cond_len, cond_rows

    t2i = isinstance(classes, tuple)
    cls = classes if t2i else torch.as_tensor(classes).long()
    results, tokens = {}, {}
    # warm-up (allocations, thread pools), not timed
    for m in methods:
        run_method(m, target, drafter, tables, cond_rows(cls, 0, 1), sampling=sampling, spec=spec, seed=seed,
                   sjd_window=sjd_window, gasv=gasv)
    for m in methods:
        secs, stats_all, toks = [], [], []
        for i in tqdm(range(cond_len(cls)), desc=f"bench {m}", disable=not progress):
            t0 = time.perf_counter()
            tk, st = run_method(m, target, drafter, tables, cond_rows(cls, i, i + 1), sampling=sampling,
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
            "mal": float(committed.mean()) if METHODS[m].kind != "ar" else 1.0,
            "seconds_per_image": sum(secs) / len(secs),
            "mean_tvd": float(torch.cat(tvds).mean()) if tvds else 0.0,
            "target_forwards_per_image": sum(s.target_forwards for s in stats_all) / len(stats_all),
            "time_split": times,
        }
    base = results[baseline]["seconds_per_image"]
    for m, r in results.items():
        r["speedup"] = base / r["seconds_per_image"]
        if scorer_fn is not None and decode_fn is not None and not t2i:
            acc, fd = scorer_fn(decode_fn(tokens[m]), cls)
            r["class_acc"], r["fd_demo"] = float(acc), float(fd)
    settings = {"num_images": cond_len(cls), "seed": seed, **({} if t2i else {"classes": cls.tolist()}),
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
