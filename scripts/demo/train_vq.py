"""Stage 2: train the demo VQ tokenizer (LlamaGen VQ architecture) on 64 px crops.

Loss = L1 + MSE reconstruction + codebook loss + 0.25 * commitment loss (LlamaGen's VQ losses
without the perceptual/GAN terms, which need downloaded networks). Codes unused for a window of
steps are restarted at random encoder outputs of the current batch (keeps codebook usage high).

    python scripts/demo/train_vq.py --out runs/demo/vq --steps 1200 --stop-at 800   # the shipped VQ
    python scripts/demo/train_vq.py --out runs/demo/vq --steps 1200 --stop-at 800 --resume   # after interruption
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

import common  # noqa: F401  (puts the repo on sys.path)
from common import JsonlLog, load_ckpt, lr_at, save_ckpt, set_lr, setup_torch, step_generator, truncate_log

from lisa_trt.models.target_config import VQConfig
from lisa_trt.demo.data import demo_images, random_hflip, to_float

DEMO_VQ = dict(codebook_size=1024, codebook_embed_dim=8, encoder_ch_mult=(1, 2, 2),
               decoder_ch_mult=(1, 2, 2), z_channels=64, ch=32, num_res_blocks=1)
BETA = 0.25


def build_vq(cfg: VQConfig, impl: str):
    """The project's VQModel when available (impl='auto'|'project'), else the official-layout fallback."""
    if impl in ("auto", "project"):
        try:
            from lisa_trt.families.llamagen.vq import VQModel
            return VQModel(cfg), "project"
        except ImportError:
            if impl == "project":
                raise
    from vq_ref import VQModel
    return VQModel(cfg), "fallback"


def latents(vq, x):
    """Normalised pre-quantisation latents (N, d) via the official module names."""
    z = vq.quant_conv(vq.encoder(x)).permute(0, 2, 3, 1)  # (B, h, w, d)
    return F.normalize(z.reshape(-1, z.shape[-1]), dim=-1)


@torch.no_grad()
def restart_dead(vq, opt, counts, x, gen) -> int:
    """Re-initialise codes with zero recent use at random latents of batch x. Returns #restarted."""
    dead = (counts == 0).nonzero().flatten()
    if dead.numel() == 0:
        return 0
    z = latents(vq, x)
    pick = torch.randint(0, z.shape[0], (dead.numel(),), generator=gen)
    new = F.normalize(z[pick] + 0.01 * torch.randn(dead.numel(), z.shape[1], generator=gen), dim=-1)
    w = vq.quantize.embedding.weight
    w[dead] = new
    st = opt.state.get(w, {})
    for k in ("exp_avg", "exp_avg_sq"):
        if k in st:
            st[k][dead] = 0
    return int(dead.numel())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("runs/demo/vq"))
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--per-class", type=int, default=1024)
    ap.add_argument("--ckpt-every", type=int, default=200)
    ap.add_argument("--restart-every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--impl", choices=["auto", "project", "fallback"], default="auto")
    ap.add_argument("--stop-at", type=int, default=0,
                    help="stop after this step (LR schedule still spans --steps); 0 = run to --steps")
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args()
    setup_torch(a.threads, a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    cfg = VQConfig(**DEMO_VQ)
    vq, impl = build_vq(cfg, a.impl)
    opt = torch.optim.AdamW(vq.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    images, _ = demo_images("train", a.per_class, seed=a.seed)  # uint8 (N, 3, 64, 64)
    log, ck = JsonlLog(a.out / "log.jsonl"), a.out / "ckpt.pt"
    step, V = 0, cfg.codebook_size
    counts = torch.zeros(V, dtype=torch.long)
    state = load_ckpt(ck) if a.resume else None
    if state is not None:
        vq.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, counts = state["step"], state["counts"]
        truncate_log(log.path, step)
    elif (a.out / "log.jsonl").exists():
        (a.out / "log.jsonl").unlink()
    (a.out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    log.write(event="start", step=step, impl=impl, params=sum(p.numel() for p in vq.parameters()),
              args={k: str(v) for k, v in vars(a).items()})
    vq.train()
    end = a.stop_at if 0 < a.stop_at < a.steps else a.steps
    while step < end:
        g = step_generator(a.seed, step)
        idx = torch.randint(0, images.shape[0], (a.batch,), generator=g)
        x = to_float(random_hflip(images[idx], g))
        set_lr(opt, lr_at(step, a.steps, a.lr, a.warmup))
        recon, cb, commit, codes = vq(x)[:4]
        l1, mse = (recon - x).abs().mean(), (recon - x).pow(2).mean()
        loss = l1 + mse + cb + BETA * commit
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vq.parameters(), 1.0)
        opt.step()
        counts += torch.bincount(codes.flatten(), minlength=V)
        step += 1
        restarted = 0
        if step % a.restart_every == 0:
            used = int((counts > 0).sum())
            if step <= 0.8 * a.steps:
                restarted = restart_dead(vq, opt, counts, x, g)
            counts.zero_()
            log.write(step=step, window_usage=used / V, restarted=restarted)
        if step % 20 == 0:
            log.write(step=step, loss=round(loss.item(), 5), l1=round(l1.item(), 5), mse=round(mse.item(), 5),
                      cb=round(cb.item(), 5), commit=round(commit.item(), 5), lr=opt.param_groups[0]["lr"])
        if step % a.ckpt_every == 0 or step == end:
            save_ckpt(ck, {"model": vq.state_dict(), "opt": opt.state_dict(), "step": step,
                           "counts": counts, "config": cfg.to_dict()})
    log.write(event="done", step=step)


if __name__ == "__main__":
    main()
