"""Stage 5: train the demo class-conditional target (LlamaGen GPT, lisa_trt.models.llamagen).

Next-token cross-entropy on the VQ tokens with class dropout 0.1 (label -> null class
num_classes, LlamaGen's CFG training), AdamW, linear warmup + cosine, grad clip 1.0.
Batches depend only on (seed, step), so --resume replays the exact same run.

    python scripts/demo/train_target.py --tokens runs/demo/tokens/tokens.pt --out runs/demo/target --steps 1500
    python scripts/demo/train_target.py ... --resume    # after interruption
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

import common  # noqa: F401
from common import JsonlLog, load_ckpt, lr_at, save_ckpt, set_lr, setup_torch, step_generator, truncate_log

from lisa_trt.models.target_config import TargetConfig
from lisa_trt.families.llamagen.model import Transformer

# The shipped demo target shape (see bench/demo_sizes.json for the size choice).
DEMO_TARGET = dict(dim=256, n_layer=8, n_head=8, vocab_size=1024, block_size=256, num_classes=8,
                   cls_token_num=1, model_type="c2i")
CLASS_DROPOUT = 0.1


def batch_at(tokens, labels, step: int, seed: int, batch: int, num_classes: int):
    """(cond (B,), tokens (B, 256)) for a training step; labels dropped to null w.p. 0.1."""
    g = step_generator(seed, step)
    idx = torch.randint(0, tokens.shape[0], (batch,), generator=g)
    cond = labels[idx].clone()
    cond[torch.rand(batch, generator=g) < CLASS_DROPOUT] = num_classes
    return cond, tokens[idx].long()


def ce_loss(model: Transformer, cond, toks) -> torch.Tensor:
    logits = model.forward_train(cond, toks).logits  # (B, N, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), toks.reshape(-1))


@torch.no_grad()
def heldout_loss(model: Transformer, data: dict, n: int = 64) -> float:
    model.eval()
    step = max(1, data["heldout_tokens"].shape[0] // n)
    toks = data["heldout_tokens"][::step][:n].long()
    cond = data["heldout_labels"][::step][:n]
    loss = ce_loss(model, cond, toks).item()
    model.train()
    return loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=Path, default=Path("runs/demo/tokens/tokens.pt"))
    ap.add_argument("--out", type=Path, default=Path("runs/demo/target"))
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--config", type=str, default="", help="JSON overrides of DEMO_TARGET")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--stop-at", type=int, default=0,
                    help="stop after this step (LR schedule still spans --steps); 0 = run to --steps")
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args()
    setup_torch(a.threads, a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    data = torch.load(a.tokens, map_location="cpu", weights_only=False)
    ck, log = a.out / "ckpt.pt", JsonlLog(a.out / "log.jsonl")
    state = load_ckpt(ck) if a.resume else None
    if state is not None:
        cfg = TargetConfig.from_dict(state["config"])
    else:
        cfg = TargetConfig(**{**DEMO_TARGET, **(json.loads(a.config) if a.config else {})})
    torch.manual_seed(a.seed)
    model = Transformer(cfg)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95))
    step = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        truncate_log(log.path, step)
    elif log.path.exists():
        log.path.unlink()
    (a.out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    log.write(event="start", step=step, params=sum(p.numel() for p in model.parameters()),
              args={k: str(v) for k, v in vars(a).items()})
    model.train()
    tokens, labels = data["train_tokens"], data["train_labels"]
    end = a.stop_at if 0 < a.stop_at < a.steps else a.steps
    while step < end:
        cond, toks = batch_at(tokens, labels, step, a.seed, a.batch, cfg.num_classes)
        set_lr(opt, lr_at(step, a.steps, a.lr, a.warmup))
        loss = ce_loss(model, cond, toks)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 5 == 0:
            log.write(step=step, loss=round(loss.item(), 4), grad_norm=round(gn.item(), 3),
                      lr=round(opt.param_groups[0]["lr"], 7))
        if step % a.eval_every == 0 or step == end:
            log.write(step=step, heldout_loss=round(heldout_loss(model, data), 4))
        if step % a.ckpt_every == 0 or step == end:
            save_ckpt(ck, {"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                           "config": cfg.to_dict()})
    log.write(event="done", step=step)


if __name__ == "__main__":
    main()
