"""Does a trained 2-D head (SSD's below head, `lisa-trt train --arch ssd`) add to PJD on the demo?

Offline: on held-out target samples (fresh seeds), each head's agreement with the target's argmax,
the lossless acceptance sum_v min(p_target, p_head) of a draft drawn from it, and how often the
sampled token is its top-1 / in its top-5, next to PJD's fresh-draft law (uniform over the ids),
for the trained head and for the untrained one (the target's own output layer, its warm start).

Online: pjd, pjd-ssd2d with the untrained head and pjd-ssd2d with the trained head on the same
classes (image i: class i % 8) and seeds (batch j: seed + j), demo sampling: target forwards per
image (with SE), pooled MAL, the paired forwards ratio against pjd (delta-method SE), mean TVD.

    python bench/ssd_head.py --images 32 --head bench/ssd_head/head2d.safetensors --out bench/ssd_head.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from lisa_trt.speculative.methods import resolve_method

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decoders import mean_se, ratio_se, row_stats  # noqa: E402  (bench/decoders.py: per-row stats, SEs)

POINTS = {"pjd": ("pjd", None), "pjd-ssd2d[untrained]": ("pjd-ssd2d", ""), "pjd-ssd2d[trained]": ("pjd-ssd2d", "HEAD")}


def offline(target, head_path: str, n: int, seed: int) -> dict:
    """Held-out accuracy of the trained and the untrained heads on n fresh target samples."""
    from lisa_trt.models.head2d import Heads2D, load_heads2d
    from lisa_trt.train.data import OnlineFeatures, self_distill_tokens
    from lisa_trt.train.ssd import evaluate_heads2d, grid_of

    ds = self_distill_tokens(target, n, cfg_scale=2.0, uncond_frac=0.0, seed=seed, batch_size=n, progress=False)
    trained = load_heads2d(head_path, target)
    L, N = grid_of(target, None)
    untrained = Heads2D.from_target(target, L, N, trained.config.offsets).eval()
    feats = OnlineFeatures(target, ds)
    return {"samples": n, "seed": seed, "trained": evaluate_heads2d(trained, feats, n, 8),
            "untrained": evaluate_heads2d(untrained, feats, n, 8)}


def online(target, sampling, label: str, head_path: str, images: int, batch: int, seed: int, rows: int) -> dict:
    """One point over `images` images: per-image forwards, pooled MAL, TVD."""
    from lisa_trt.speculative.methods import SpecConfig
    from lisa_trt.speculative.run import run_method

    method, head = POINTS[label]
    spec = SpecConfig.make(method=method).replace(pjd_rows=rows)
    if head is not None:
        spec = spec.replace(pjd_ssd2d_head=head_path if head == "HEAD" else head)
    toks, fwd, tvd, secs = [], [], [], 0.0
    for j in range(images // batch):
        cond = torch.arange(j * batch, (j + 1) * batch) % target.config.num_classes
        t0 = time.perf_counter()
        out, st = run_method(resolve_method(method), target, None, None, cond, sampling=sampling, spec=spec, seed=seed + j)
        secs += time.perf_counter() - t0
        tok, f, tv = row_stats(st, batch, "sjd", out.shape[1] - 1)
        toks += tok
        fwd += f
        tvd += tv
    m, se = mean_se(fwd)
    tv, tv_se = mean_se(tvd)
    return {"method": method, "head": head_path if head == "HEAD" else ("untrained" if head == "" else "off"),
            "images": len(fwd), "target_forwards_per_image": m, "target_forwards_per_image_se": se,
            "mal": sum(toks) / sum(fwd), "mean_tvd": tv, "mean_tvd_se": tv_se, "seconds": round(secs, 1),
            "raw": {"fwd": fwd}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--head", default="bench/ssd_head/head2d.safetensors")
    ap.add_argument("--offline-samples", type=int, default=16, help="0: skip the offline accuracy")
    ap.add_argument("--pjd-rows", type=int, default=4, help="PJD's lanes (rows in flight) for every point")
    ap.add_argument("--out", type=Path, default=Path("bench/ssd_head.json"))
    a = ap.parse_args(argv)
    if a.images % a.batch:
        raise SystemExit(f"--images {a.images} must be a multiple of --batch {a.batch}")
    if not Path(a.head).is_file():
        raise SystemExit(f"no head file {a.head}: train one with `lisa-trt train --model demo --arch ssd` "
                         "(docs/ssd_head.md)")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from lisa_trt.demo.registry import demo_sampling, load_demo_target

    target, sampling = load_demo_target(), demo_sampling()
    t0 = time.time()
    report = {"settings": {"model": "demo", "images": a.images, "batch": a.batch, "seed": a.seed,
                           "seeds": "batch j: seed + j", "classes": "image i: i % 8", "head": a.head,
                           "sampling": {k: getattr(sampling, k) for k in ("cfg_scale", "temperature", "top_k",
                                                                           "top_p", "greedy")},
                           "pjd": f"rows {a.pjd_rows}; window 8, lag 2, reuse 0.5 (defaults)", "torch_threads": torch.get_num_threads(),
                           "command": "python bench/ssd_head.py " + " ".join(argv if argv is not None else sys.argv[1:])},
              "offline": offline(target, a.head, a.offline_samples, 12345) if a.offline_samples else {}, "online": {}}
    for label in POINTS:
        report["online"][label] = online(target, sampling, label, a.head, a.images, a.batch, a.seed, a.pjd_rows)
        print(label, {k: v for k, v in report["online"][label].items() if k != "raw"}, flush=True)
    base = report["online"]["pjd"]["raw"]["fwd"]
    for label, r in report["online"].items():
        ratio, se = ratio_se(base, r["raw"]["fwd"])
        r["forwards_ratio_vs_pjd"], r["forwards_ratio_vs_pjd_se"] = ratio, se  # > 1: fewer forwards than pjd
    report["settings"]["elapsed_s"] = round(time.time() - t0, 1)
    tmp = a.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    tmp.replace(a.out)
    print(json.dumps(report["offline"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
