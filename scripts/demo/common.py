"""Shared helpers of the demo recipe scripts: seeds, LR schedule, JSONL logs, atomic checkpoints."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lisa_trt.io import atomic_write  # noqa: E402


def setup_torch(threads: int = 2, seed: int = 0) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(seed)


def step_generator(seed: int, step: int) -> torch.Generator:
    """A generator that depends only on (seed, step): resuming at any step replays the same batches."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def lr_at(step: int, total: int, base: float, warmup: int, final_frac: float = 0.1) -> float:
    """Linear warmup then cosine decay to final_frac * base."""
    if step < warmup:
        return base * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


class JsonlLog:
    """Append-only JSONL log (one dict per line, flushed each write)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()

    def write(self, **rec) -> None:
        rec.setdefault("wall_s", round(time.time() - self.t0, 1))
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(json.dumps(rec), flush=True)


def save_ckpt(path: Path, state: dict) -> None:
    """torch.save to a temp file then rename: a crash never leaves a half-written checkpoint."""
    with atomic_write(path) as tmp:
        torch.save(state, tmp)


def load_ckpt(path: Path) -> dict | None:
    path = Path(path)
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def truncate_log(path: Path, step: int) -> None:
    """Drop log lines with step > `step` (written after the checkpoint we resume from)."""
    path = Path(path)
    if not path.is_file():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= step]
    with atomic_write(path) as tmp:
        tmp.write_text("".join(ln + "\n" for ln in keep))


def env_info() -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "pid": os.getpid()}
