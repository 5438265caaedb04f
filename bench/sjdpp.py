"""SJD++-style reuse (`--sjd-reuse`, speculative/sjd_reuse.py) on the demo model: MAL per target
forward with vs without, on SJD and on MC-SJD, same classes and seeds (acceptance only).

    OMP_NUM_THREADS=1 nohup python bench/sjdpp.py --images 128 > runs/sjdpp.log 2>&1 &

The option did not help (bench/sjdpp.json, docs/spec/decoders.md "SJD++-style reuse") and was
removed after this run: run the script at commit 84f7ca4, the option's last commit (it stops with
that message elsewhere).

Two stages, both written to bench/sjdpp.json (rewritten after every batch; a stopped run resumes):

1. pilot: the threshold is chosen on a few images with seeds the measurement never uses
   (`--pilot-seed`, default 1000): every threshold of `--thresholds` on SJD and on MC-SJD, the
   one with the highest pooled MAL per base is kept;
2. measurement: per base, reuse off and on (the pilot's threshold) on `--images` images: image i
   has class i % 8, batch j (rows j*batch ..) seed `seed + j`, window 16: bench/decoders.py's
   images and seeds, so the "off" points reproduce its sjd / mcsjd rows.

MAL = committed tokens per target forward (prefill excluded), pooled over images; the on / off
ratio and its SE are paired over the same images (bench/decoders.py `ratio_se` on the forwards
per image: every image commits the same number of tokens). Rows are batched on a shared machine:
no speed figures.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from lisa_trt.speculative.methods import resolve_method

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from decoders import mean_se, ratio_se, row_stats  # noqa: E402  (bench/decoders.py: the frontier's statistics)

BASES = ("sjd", "mcsjd")


def decode_batch(target, sampling, method: str, threshold: float, classes, seed: int, window: int) -> dict:
    """One batch -> per-row committed tokens and forwards."""
    from lisa_trt.speculative.methods import SpecConfig
    from lisa_trt.speculative.run import run_method

    spec = SpecConfig.make(sjd_window=window, sjd_reuse_threshold=threshold)
    t0 = time.perf_counter()
    with torch.no_grad():
        toks, st = run_method(resolve_method(method), target, None, None, torch.as_tensor(classes), sampling=sampling, spec=spec,
                              seed=seed)
    tok, fwd, _ = row_stats(st, len(classes), "sjd", toks.shape[1] - 1)
    return {"tok": tok, "fwd": fwd, "seconds": round(time.perf_counter() - t0, 1)}


def summary(rows: dict) -> dict:
    tok, fwd = rows["tok"], rows["fwd"]
    mal, se = mean_se([t / f for t, f in zip(tok, fwd)])
    return {"images": len(tok), "mal": sum(tok) / sum(fwd), "mal_per_image_mean": mal, "mal_per_image_se": se}


def point(state: dict, key: str) -> dict:
    return state.setdefault("points", {}).setdefault(key, {"tok": [], "fwd": []})


def run_points(a, target, sampling, state, keys, n_images: int, seed0: int, save) -> None:
    """Bring every point of `keys` ((label, method, threshold)) to n_images, batch by batch."""
    ncls = target.config.num_classes
    for j in range(n_images // a.batch):
        for label, method, thr in keys:
            p = point(state, label)
            if len(p["tok"]) >= (j + 1) * a.batch:
                continue
            classes = [(j * a.batch + b) % ncls for b in range(a.batch)]
            got = decode_batch(target, sampling, method, thr, classes, seed0 + j, a.window)
            p["tok"] += got["tok"]
            p["fwd"] += got["fwd"]
            p.update(method=method, threshold=thr)
            print(f"[sjdpp] {label} batch {j}: MAL {sum(got['tok']) / sum(got['fwd']):.3f} ({got['seconds']} s)",
                  flush=True)
            save()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--thresholds", default="0.05,0.1,0.2,0.4")
    ap.add_argument("--pilot-images", type=int, default=16)
    ap.add_argument("--pilot-seed", type=int, default=1000)
    ap.add_argument("--out", default=str(ROOT / "bench" / "sjdpp.json"))
    a = ap.parse_args(argv)
    import json

    from lisa_trt.demo.registry import demo_sampling, load_demo_target
    from lisa_trt.io import write_json

    from lisa_trt.speculative.methods import FLAT_FIELDS

    if "sjd_reuse_threshold" not in FLAT_FIELDS:
        raise SystemExit("the --sjd-reuse option was removed after bench/sjdpp.json was measured (it did not help: "
                         "docs/spec/decoders.md); run this script at commit 84f7ca4")
    torch.set_num_threads(1)
    target, sampling = load_demo_target(), demo_sampling()
    out = Path(a.out)
    state = json.loads(out.read_text()) if out.is_file() else {}
    pilot = state.setdefault("pilot", {})
    main_state = state.setdefault("measurement", {})
    settings = {"model": "demo", "sampling": sampling.__dict__, "window": a.window, "batch": a.batch,
                "seed": a.seed, "classes": "image i: i % 8", "seeds": "batch j: seed + j",
                "pilot": {"images": a.pilot_images, "seed": a.pilot_seed, "thresholds": a.thresholds},
                "loaded": True, "note": "rows batched, machine shared: acceptance only, no speed claims",
                "command": " ".join(sys.argv)}
    old = state.get("settings")
    if old and any(old.get(k) != settings[k] for k in ("window", "batch", "seed", "sampling")):
        raise SystemExit(f"{out} was made with other settings ({old}); remove it or pass --out")
    state["settings"] = settings
    t_start = time.time()

    def save():
        state["elapsed_s"] = round(state.get("elapsed_s", 0.0) + time.time() - save.t, 1)
        save.t = time.time()
        write_json(out, state)

    save.t = t_start
    thresholds = [float(x) for x in a.thresholds.split(",")]
    keys = [(f"{b}", b, 0.0) for b in BASES] + [(f"{b}[reuse={t:g}]", b, t) for b in BASES for t in thresholds]
    run_points(a, target, sampling, pilot, keys, a.pilot_images, a.pilot_seed, save)
    chosen = {}
    for b in BASES:
        best = max(thresholds, key=lambda t: summary(pilot["points"][f"{b}[reuse={t:g}]"])["mal"])
        chosen[b] = best
    state["chosen_threshold"] = chosen
    keys = [(b, b, 0.0) for b in BASES] + [(f"{b}[reuse={chosen[b]:g}]", b, chosen[b]) for b in BASES]
    run_points(a, target, sampling, main_state, keys, a.images, a.seed, save)
    res = {}
    for label, p in main_state["points"].items():
        res[label] = summary(p)
    for b in BASES:
        on, off = main_state["points"][f"{b}[reuse={chosen[b]:g}]"], main_state["points"][b]
        r, se = ratio_se(off["fwd"], on["fwd"])  # = MAL_on / MAL_off, paired over the same images
        res[f"{b}[reuse={chosen[b]:g}]"].update(mal_ratio_vs_off=r, mal_ratio_se=se,
                                                 beyond_2se=abs(r - 1.0) > 2 * se)
    state["results"] = res
    state["pilot_results"] = {k: summary(p) for k, p in pilot["points"].items()}
    save()
    print(json.dumps({"chosen": chosen, "results": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
