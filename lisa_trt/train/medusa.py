"""Distil Medusa heads (models/medusa.py) with the plain (EAGLE-3 soft CE) or the LISA loss.

Data and target features are the EAGLE trainer's (train/data.py: self-distilled or token-file
sequences, `Batch.hidden[:, j]` = the final hidden whose logits predict tokens[:, j]). Head i on
hidden[:, j] predicts tokens[:, j + 1 + i]; its teacher is the target's teacher-forced
distribution there, logits[:, j + 1 + i]. The per-head losses are weighted decay^i (Medusa's
lambda_k schedule, 0.8 like the TTT steps) and come from train/losses.step_loss, so "lisa" has
every LISA term (selection, soft gate, truncated CE, KD) and "eagle3" is the plain soft CE.

Every family trains through this one loop, as the EAGLE trainer does (train/trainer.py): a
prompted family's `request` is rolled out through the generic AR loop (train/requests.py), and
its layout's `TrainVocab` says what the heads learn: where the layout restricts sampling to
`allowed` ids (Chameleon: the image codes) the heads predict those ids only (MedusaHeads d2t) and
the losses compare the target renormalised over them; a head's entries that predict a forced
index (Lumina's row ends) carry no loss and no agreement.

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

from ..errors import ConfigError
from ..io import write_json
from ..models.medusa import MedusaHeads, save_medusa
from .data import OnlineFeatures, batch_indices, build_dataset
from .losses import agreement_stats, combine_ttt, step_loss
from .trainer import TrainConfig, TrainVocab, estimate_vocab_radius, lr_factor, vocab_codebook


def head_pairs(heads: MedusaHeads, batch, vocab: TrainVocab = TrainVocab()):
    """Per head i: (teacher, student) logits (M_i, N) over the heads' ids, on the entries j whose
    predicted index j + 1 + i is trained (not forced); a head with no such entry is skipped.

    Head i on hidden[:, j] predicts tokens[:, j + 1 + i]; its teacher is logits[:, j + 1 + i]."""
    N = batch.tokens.shape[1]
    out = heads.draft_logits(batch.hidden)  # (B, N, k, N_ids)
    (teacher,) = vocab.gather(batch.logits)  # over the allowed ids (= the heads' d2t) when the layout restricts
    pairs = []
    for i in range(heads.config.n_heads):
        n = N - 1 - i  # positions j with j + 1 + i <= N - 1
        if n <= 0:
            break
        s_l, t_l = out[:, :n, i], teacher[:, 1 + i: 1 + i + n]
        keep = None if vocab.trained is None else vocab.trained[1 + i: 1 + i + n].to(s_l.device)
        if keep is not None:
            s_l, t_l = s_l[:, keep], t_l[:, keep]
        if s_l.shape[1]:
            pairs.append((i, t_l.reshape(-1, t_l.shape[-1]), s_l.reshape(-1, s_l.shape[-1])))
    return pairs


def medusa_loss(heads: MedusaHeads, batch, cfg: TrainConfig, *, codebook=None, radius=None, step: int = 0,
                vocab: TrainVocab = TrainVocab()):
    """sum_i decay^i loss_i over the trained positions of each head, plus per-head top-1 agreement.

    codebook: one row per head id of the heads (their d2t rows), or None."""
    losses, top1 = [], []
    for _, t_l, s_l in head_pairs(heads, batch, vocab):
        loss, _ = step_loss(t_l, s_l, cfg.loss, codebook=codebook, radius=radius, step=step,
                            total_steps=cfg.steps)
        losses.append(loss)
        top1.append(float(agreement_stats(t_l, s_l.detach())["top1"].mean()))
    if not losses:
        raise ConfigError("no trained position in this batch: every token a Medusa head predicts is forced")
    return combine_ttt(losses, cfg.loss.ttt_decay), {"loss_h": [float(x.detach()) for x in losses], "top1_h": top1}


@torch.no_grad()
def evaluate_heads(heads: MedusaHeads, features, n_rows: int, batch_size: int = 8,
                   vocab: TrainVocab = TrainVocab()) -> dict:
    """Held-out top-1 agreement and lossless acceptance sum_v min(p_t, p_s) per head (over the
    layout's allowed ids, trained indices only)."""
    heads.eval()
    top1, acc = {}, {}
    for lo in range(0, n_rows, batch_size):
        b = features.batch(torch.arange(lo, min(lo + batch_size, n_rows)))
        for i, t_l, s_l in head_pairs(heads, b, vocab):
            st = agreement_stats(t_l, s_l)
            top1.setdefault(i, []).append(st["top1"].flatten())
            acc.setdefault(i, []).append(st["accept"].flatten())
    heads.train()
    return {"top1_h": [float(torch.cat(top1[i]).mean()) for i in sorted(top1)],
            "accept_h": [float(torch.cat(acc[i]).mean()) for i in sorted(acc)], "sequences": n_rows}


def train_medusa(target, codebook: Optional[torch.Tensor], cfg: TrainConfig, out_dir, *, n_heads: int = 4,
                 progress: bool = True, request=None) -> dict:
    """Train Medusa heads for `target`; writes out_dir/medusa.safetensors (+ .json), metrics, eval.

    Args:
        target: a target of any family (frozen).
        codebook: VQ codebook, needed by the LISA selection (loss kind "lisa"): (V, d) one row per
            head id, or, for a layout with a sub-vocabulary (Chameleon), the VQ's own (n_codes, d) rows.
        cfg: TrainConfig (steps, batch_size, lr, warmup, loss, data, seed are used; ttt_steps,
            drafter_* and draft_vocab are EAGLE-drafter settings and ignored).
        n_heads: number of heads k.
        request: prompt-id families: the prompts and layout to self-distil from (models.family.Request,
            as train_drafter takes it); None for class ids / captions (cfg.data).
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
    layout = None if request is None else request.layout
    vocab = TrainVocab.of(layout)
    if codebook is not None:  # one row per head id (a sub-vocabulary's codes scattered to their ids)
        codebook = vocab_codebook(codebook.to(device), target.output.out_features, layout)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    train_set, eval_set = build_dataset(target, cfg.data, cfg.seed, out_dir / "data", progress=progress,
                                        request=request)
    features = OnlineFeatures(target, train_set)
    heads = MedusaHeads.from_target(target, n_heads=n_heads, target_name=cfg.target_name, d2t=vocab.ids).train()
    radius = cfg.loss.radius
    if radius is None and cfg.loss.needs_codebook:
        radius = estimate_vocab_radius(features, len(train_set), cfg, codebook, vocab, heads.d2t)
    if codebook is not None and heads.d2t is not None:
        codebook = codebook.index_select(0, heads.d2t.to(device))  # the heads' rows
    opt = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(k, cfg))
    metrics = out_dir / "metrics.jsonl"
    metrics.write_text("")
    write_json(out_dir / "train_config.json", {**cfg.to_dict(), "arch": "medusa", "n_heads": n_heads})
    t0 = time.time()
    for step in range(cfg.steps):
        rows = batch_indices(step, len(train_set), cfg.batch_size, cfg.seed, 0, 1)
        loss, stats = medusa_loss(heads, features.batch(rows), cfg, codebook=codebook, radius=radius, step=step,
                                  vocab=vocab)
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
    ev = evaluate_heads(heads, OnlineFeatures(target, eval_set), len(eval_set), cfg.batch_size, vocab)
    write_json(out_dir / "eval.json", ev)
    path = out_dir / "medusa.safetensors"
    save_medusa(heads.eval(), path)
    return {"drafter": str(path), "eval": ev, "steps": cfg.steps, "metrics": str(metrics), "radius": radius}
