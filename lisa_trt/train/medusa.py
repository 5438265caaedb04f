"""Distil Medusa heads (models/medusa.py) with the plain (EAGLE-3 soft CE) or the LISA loss.

Data and target features are the EAGLE trainer's (train/data.py: self-distilled or token-file
sequences, `Batch.hidden[:, j]` = the final hidden whose logits predict tokens[:, j]). Head i on
hidden[:, j] predicts tokens[:, j + 1 + i]; its teacher is the target's teacher-forced
distribution there, logits[:, j + 1 + i]. The per-head losses are weighted decay^i (Medusa's
lambda_k schedule, 0.8 like the TTT steps) and come from train/losses.step_loss, so "lisa" has
every LISA term (selection, soft gate, truncated CE, KD) and "eagle3" is the plain soft CE.

Single process, AdamW + the trainer's warmup/cosine schedule, JSONL metrics, atomic artifact
write. No checkpoint/resume: a Medusa run on the demo takes minutes (use train/trainer.py's
EAGLE drafter for long runs).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..io import write_json
from ..models.medusa import MedusaHeads, save_medusa
from .data import OnlineFeatures, batch_indices, build_dataset
from .losses import agreement_stats, combine_ttt, estimate_radius, step_loss
from .trainer import TrainConfig, lr_factor


def medusa_loss(heads: MedusaHeads, batch, cfg: TrainConfig, *, codebook=None, radius=None, step: int = 0):
    """sum_i decay^i loss_i over the valid positions of each head, plus per-head top-1 agreement."""
    N, V = batch.tokens.shape[1], batch.logits.shape[-1]
    out = heads(batch.hidden)  # (B, N, k, V)
    losses, top1 = [], []
    for i in range(heads.config.n_heads):
        n = N - 1 - i  # positions j with j + 1 + i <= N - 1
        if n <= 0:
            break
        s_l = out[:, :n, i].reshape(-1, V)
        t_l = batch.logits[:, 1 + i: 1 + i + n].reshape(-1, V)
        loss, _ = step_loss(t_l, s_l, cfg.loss, codebook=codebook, radius=radius, step=step,
                            total_steps=cfg.steps)
        losses.append(loss)
        top1.append(float(agreement_stats(t_l, s_l.detach())["top1"].mean()))
    return combine_ttt(losses, cfg.loss.ttt_decay), {"loss_h": [float(x.detach()) for x in losses], "top1_h": top1}


@torch.no_grad()
def evaluate_heads(heads: MedusaHeads, features, n_rows: int, batch_size: int = 8) -> dict:
    """Held-out top-1 agreement and lossless acceptance sum_v min(p_t, p_s) per head."""
    heads.eval()
    top1, acc = {}, {}
    for lo in range(0, n_rows, batch_size):
        b = features.batch(torch.arange(lo, min(lo + batch_size, n_rows)))
        out = heads(b.hidden)
        N = b.tokens.shape[1]
        for i in range(heads.config.n_heads):
            n = N - 1 - i
            st = agreement_stats(b.logits[:, 1 + i: 1 + i + n], out[:, :n, i])
            top1.setdefault(i, []).append(st["top1"].flatten())
            acc.setdefault(i, []).append(st["accept"].flatten())
    heads.train()
    return {"top1_h": [float(torch.cat(top1[i]).mean()) for i in sorted(top1)],
            "accept_h": [float(torch.cat(acc[i]).mean()) for i in sorted(acc)], "sequences": n_rows}


def train_medusa(target, codebook: Optional[torch.Tensor], cfg: TrainConfig, out_dir, *, n_heads: int = 4,
                 progress: bool = True) -> dict:
    """Train Medusa heads for `target`; writes out_dir/medusa.safetensors (+ .json), metrics, eval.

    Args:
        target: lisa_trt Transformer (frozen).
        codebook: (V, d) VQ codebook, needed by the LISA selection (loss kind "lisa").
        cfg: TrainConfig (steps, batch_size, lr, warmup, loss, data, seed are used; ttt_steps,
            drafter_* and draft_vocab are EAGLE-drafter settings and ignored).
        n_heads: number of heads k.
    Returns:
        {"drafter": path, "eval": dict, "steps": int, "metrics": path}.
    """
    if cfg.loss.kind not in ("lisa", "eagle3"):
        raise ConfigError(f"Medusa heads train with the 'lisa' or 'eagle3' (plain) loss, not {cfg.loss.kind!r}")
    if cfg.loss.needs_codebook and codebook is None:
        raise ConfigError("the LISA loss needs the VQ codebook; pass --vq or use --loss eagle3")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target.eval()
    device = target.output.weight.device
    if codebook is not None:
        codebook = F.normalize(codebook.detach().float().to(device), dim=-1)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    train_set, eval_set = build_dataset(target, cfg.data, cfg.seed, out_dir / "data", progress=progress)
    features = OnlineFeatures(target, train_set)
    heads = MedusaHeads.from_target(target, n_heads=n_heads, target_name=cfg.target_name).train()
    radius = cfg.loss.radius
    if radius is None and cfg.loss.needs_codebook:
        b = features.batch(torch.arange(min(len(train_set), 32)))
        radius = estimate_radius(b.logits[:, 1:].reshape(-1, b.logits.shape[-1]).softmax(-1), codebook,
                                 cfg.loss.top_kc, cfg.loss.nbhd_size)
    opt = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(k, cfg))
    metrics = out_dir / "metrics.jsonl"
    metrics.write_text("")
    write_json(out_dir / "train_config.json", {**cfg.to_dict(), "arch": "medusa", "n_heads": n_heads})
    t0 = time.time()
    for step in range(cfg.steps):
        rows = batch_indices(step, len(train_set), cfg.batch_size, cfg.seed, 0, 1)
        loss, stats = medusa_loss(heads, features.batch(rows), cfg, codebook=codebook, radius=radius, step=step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(heads.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            with open(metrics, "a") as f:
                f.write(json.dumps({"step": step + 1, "loss": float(loss.detach()), "lr": sched.get_last_lr()[0],
                                    "seconds": round(time.time() - t0, 3), **stats}) + "\n")
    ev = evaluate_heads(heads, OnlineFeatures(target, eval_set), len(eval_set), cfg.batch_size)
    write_json(out_dir / "eval.json", ev)
    path = out_dir / "medusa.safetensors"
    save_medusa(heads.eval(), path)
    return {"drafter": str(path), "eval": ev, "steps": cfg.steps, "metrics": str(metrics), "radius": radius}
