"""Stage 4: train the demo quality scorer (small CNN classifier) on real crops.

Augmentation: flips, brightness/contrast jitter, occasional blur and noise (so that the
smoother VQ-decoded images are judged by content, not by sharpness).

    python scripts/demo/train_scorer.py --out runs/demo/scorer --steps 600
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

import common  # noqa: F401
from common import JsonlLog, load_ckpt, lr_at, save_ckpt, set_lr, setup_torch, step_generator, truncate_log

from lisa_trt.demo.data import demo_images, random_hflip, to_float
from lisa_trt.demo.scorer import DemoScorer, ScorerConfig, classify_accuracy


def augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """x: float (B, 3, S, S) in [-1, 1] -> jittered, sometimes blurred and noised."""
    B = x.shape[0]
    scale = 1 + 0.2 * (torch.rand(B, 1, 1, 1, generator=g) - 0.5)
    shift = 0.1 * (torch.rand(B, 1, 1, 1, generator=g) - 0.5)
    x = x * scale + shift
    blur = torch.rand(B, generator=g) < 0.3
    if blur.any():
        k = torch.tensor([1.0, 2.0, 1.0])
        k = (k[:, None] * k[None, :] / 16).expand(3, 1, 3, 3)
        x[blur] = F.conv2d(F.pad(x[blur], (1, 1, 1, 1), mode="replicate"), k, groups=3)
    noise = torch.rand(B, 1, 1, 1, generator=g) < 0.3
    x = x + noise * 0.05 * torch.randn(x.shape, generator=g)
    return x.clamp(-1, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("runs/demo/scorer"))
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--per-class", type=int, default=512)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args()
    setup_torch(a.threads, a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    cfg = ScorerConfig()
    model = DemoScorer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.05)
    images, labels = demo_images("train", a.per_class, seed=a.seed)
    log, ck = JsonlLog(a.out / "log.jsonl"), a.out / "ckpt.pt"
    step = 0
    state = load_ckpt(ck) if a.resume else None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        truncate_log(log.path, step)
    elif log.path.exists():
        log.path.unlink()
    (a.out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    log.write(event="start", step=step, params=sum(p.numel() for p in model.parameters()))
    while step < a.steps:
        model.train()
        g = step_generator(a.seed, step)
        idx = torch.randint(0, images.shape[0], (a.batch,), generator=g)
        x = augment(to_float(random_hflip(images[idx], g)), g)
        set_lr(opt, lr_at(step, a.steps, a.lr, 50, 0.02))
        loss = F.cross_entropy(model(x), labels[idx], label_smoothing=0.05)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % 20 == 0:
            log.write(step=step, loss=round(loss.item(), 4))
        if step % a.ckpt_every == 0 or step == a.steps:
            save_ckpt(ck, {"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                           "config": cfg.to_dict()})
    held, held_y = demo_images("heldout", 128, seed=a.seed)
    acc = classify_accuracy(model, held, held_y)
    log.write(event="done", step=step, heldout_acc=acc, heldout_n=int(held.shape[0]))


if __name__ == "__main__":
    main()
