"""Stage 7: score the shipped demo model and draw the sample grid.

Generates `--per-class` images per class with lisa_trt.generate (vanilla AR sampling) at the
demo's default sampling settings (lisa_trt/assets/demo/demo.json) unless overridden, decodes
them with the demo VQ, and scores them with the demo scorer (class-consistency accuracy and
FD-demo vs held-out real crops). Reference rows: held-out real crops (scorer accuracy, FD-demo of
an independent real set) and VQ reconstructions of real crops. Writes bench/demo_quality.json and
docs/demo_samples.png (per class: generated samples | real crops).

    python scripts/demo/eval_demo.py
    python scripts/demo/eval_demo.py --sweep 1.0,2.0,3.0,4.0 --per-class 16   # choose the default CFG (runs/demo/cfg_sweep.json)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

import common  # noqa: F401
from common import setup_torch

import lisa_trt
from lisa_trt.demo.data import CLASS_NAMES, NUM_CLASSES, demo_images, to_float
from lisa_trt.demo.registry import demo_paths, demo_sampling, load_demo_scorer, load_demo_target, load_demo_vq
from lisa_trt.demo.scorer import classify_accuracy, extract, feature_stats, frechet_distance, score_images
from lisa_trt.imaging import grid, save_png, to_uint8
from lisa_trt.io import write_json
from lisa_trt.models.checkpoints import target_hash


@torch.no_grad()
def generate_images(target, vq, labels: torch.Tensor, sampling, seed: int, chunk: int = 64) -> torch.Tensor:
    """Vanilla sampling -> decoded float images (B, 3, 64, 64) in [-1, 1]."""
    g = target.config.grid_size
    out = []
    for i in range(0, labels.shape[0], chunk):
        toks = lisa_trt.generate(target, labels[i:i + chunk], cfg_scale=sampling.cfg_scale,
                                 temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                                 seed=seed + i)
        out.append(vq.decode_code(toks, (toks.shape[0], vq.config.codebook_embed_dim, g, g)).clamp(-1, 1))
    return torch.cat(out)


@torch.no_grad()
def reference_rows(vq, scorer, per_class: int) -> dict:
    """Scores of real held-out crops and of their VQ reconstructions (upper bounds for samples)."""
    real, y = demo_images("heldout", per_class, seed=1)  # an independent held-out draw
    acc_real = classify_accuracy(scorer, real, y)
    _, fd_real = score_images(real, y, scorer)
    g = 64 // vq.config.downsample
    rec = []
    for i in range(0, real.shape[0], 128):
        x = to_float(real[i:i + 128])
        t = vq.encode(x)
        rec.append(vq.decode_code(t, (t.shape[0], vq.config.codebook_embed_dim, g, g)).clamp(-1, 1))
    acc_rec, fd_rec = score_images(torch.cat(rec), y, scorer)
    return {"real_heldout": {"class_acc": acc_real, "fd_demo": fd_real, "n": int(y.shape[0])},
            "vq_reconstruction": {"class_acc": acc_rec, "fd_demo": fd_rec, "n": int(y.shape[0])}}


def sample_grid(gen: torch.Tensor, labels: torch.Tensor, n_gen: int, n_real: int, scale: int = 2) -> np.ndarray:
    """Rows = classes (name at the left): n_gen generated | gap | n_real real held-out crops."""
    from PIL import Image, ImageDraw

    real, _ = demo_images("heldout", n_real, seed=2)
    gen8 = to_uint8(gen)  # (B, H, W, 3)
    real8 = real.permute(0, 2, 3, 1).numpy()
    blank = np.full_like(real8[0], 255)
    tiles = []
    for c in range(NUM_CLASSES):
        g = [gen8[i] for i in (labels == c).nonzero().flatten()[:n_gen]]
        tiles += g + [blank] * (n_gen - len(g)) + [blank] + list(real8[c * n_real:(c + 1) * n_real])
    body = grid(tiles, nrow=n_gen + 1 + n_real, pad=2)
    body = body.repeat(scale, 0).repeat(scale, 1)
    left, top = 150, 24
    canvas = Image.new("RGB", (body.shape[1] + left, body.shape[0] + top), "white")
    canvas.paste(Image.fromarray(body), (left, top))
    draw = ImageDraw.Draw(canvas)
    cell = (real8.shape[1] + 2) * scale
    draw.text((left + 4, 6), f"generated (vanilla sampling, demo defaults)", fill="black")
    draw.text((left + (n_gen + 1) * cell + 4, 6), "real held-out crops", fill="black")
    for c, name in enumerate(CLASS_NAMES):
        draw.text((6, top + c * cell + cell // 2 - 6), f"{c} {name}", fill="black")
    return np.asarray(canvas)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-class", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cfg-scale", type=float, default=None)
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--sweep", type=str, default="", help="comma-separated cfg scales to score (no files written)")
    ap.add_argument("--out-json", type=Path, default=Path("bench/demo_quality.json"))
    ap.add_argument("--out-png", type=Path, default=Path("docs/demo_samples.png"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--runs", type=Path, default=Path("runs/demo"), help="recipe outputs (sweep, VQ report)")
    a = ap.parse_args()
    setup_torch(a.threads, a.seed)
    import dataclasses

    target, vq, scorer = load_demo_target(), load_demo_vq(), load_demo_scorer()
    base = demo_sampling()
    over = {k: v for k, v in dict(cfg_scale=a.cfg_scale, top_k=a.top_k, temperature=a.temperature).items()
            if v is not None}
    sampling = dataclasses.replace(base, **over)
    labels = torch.arange(NUM_CLASSES).repeat_interleave(a.per_class)
    if a.sweep:
        rows = []
        for s in (float(v) for v in a.sweep.split(",")):
            sm = dataclasses.replace(sampling, cfg_scale=s)
            t = time.time()
            acc, fd = score_images(generate_images(target, vq, labels, sm, a.seed), labels, scorer)
            rows.append({"cfg_scale": s, "top_k": sm.top_k, "temperature": sm.temperature, "class_acc": acc,
                         "fd_demo": fd, "n": int(labels.shape[0])})
            print(f"cfg {s:.2f} top_k {sm.top_k} T {sm.temperature}: class_acc {acc:.3f} FD-demo {fd:.2f} "
                  f"({time.time() - t:.0f}s)", flush=True)
        if not a.no_write:
            write_json(a.runs / "cfg_sweep.json", {"command": "python " + " ".join(sys.argv), "rows": rows})
        return
    t = time.time()
    gen = generate_images(target, vq, labels, sampling, a.seed)
    gen_s = time.time() - t
    acc, fd = score_images(gen, labels, scorer)
    with torch.no_grad():
        pred = extract(scorer, gen)[1].argmax(-1)
    per_class = {CLASS_NAMES[c]: float((pred[labels == c] == c).float().mean()) for c in range(NUM_CLASSES)}
    refs = reference_rows(vq, scorer, 128)
    report = {
        "command": "python " + " ".join(sys.argv),
        "model": "demo", "target_hash": target_hash(target),
        "target_params": sum(p.numel() for p in target.parameters()),
        "sampling": dataclasses.asdict(sampling), "seed": a.seed,
        "generated": {"class_acc": acc, "fd_demo": fd, "n": int(labels.shape[0]),
                      "per_class_acc": per_class, "seconds_total": round(gen_s, 1)},
        "references": refs,
        "fd_demo_note": "Frechet distance in the demo scorer's 64-d penultimate features vs held-out real "
                        "crops (128/class); NOT FID. Small-sample estimates are biased upward.",
        "assets": {k: str(p.relative_to(demo_paths()["target"].parents[3])) for k, p in demo_paths().items()},
    }
    for key, path in (("cfg_sweep", a.runs / "cfg_sweep.json"), ("vq", a.runs / "tokens" / "vq_report.json")):
        if path.is_file():  # recipe by-products, when this checkout ran the recipe
            report[key] = json.loads(path.read_text())
    print(f"class_acc {acc:.3f}  FD-demo {fd:.2f}  per class {per_class}")
    print(f"refs {refs}")
    if not a.no_write:
        write_json(a.out_json, report)
        save_png(sample_grid(gen, labels, 8, 4), a.out_png)
        print(f"wrote {a.out_json} and {a.out_png}")


if __name__ == "__main__":
    main()
