"""Stage 3: encode the demo crops into VQ tokens (16 x 16 per 64 px crop) and report VQ quality.

Writes <out>/tokens.pt {train_tokens (N, 256) int16, train_labels, heldout_tokens, heldout_labels}
and <out>/vq_report.json (held-out reconstruction error, codebook usage).

    python scripts/demo/encode_tokens.py --vq runs/demo/vq/ckpt.pt --out runs/demo/tokens
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import common  # noqa: F401
from common import load_ckpt, save_ckpt, setup_torch

from lisa_trt.models.target_config import VQConfig
from lisa_trt.demo.data import demo_images, to_float
from lisa_trt.io import write_json
from lisa_trt.families.llamagen.vq import VQModel


def load_vq_ckpt(path: Path) -> VQModel:
    """The project's VQModel from a train_vq.py checkpoint (strict)."""
    state = load_ckpt(path)
    vq = VQModel(VQConfig.from_dict(state["config"]))
    vq.load_state_dict(state["model"], strict=True)
    return vq.eval()


@torch.no_grad()
def encode_all(vq: VQModel, images: torch.Tensor, batch: int = 128) -> torch.Tensor:
    """uint8 (N, 3, 64, 64) -> tokens (N, 256) int16."""
    return torch.cat([vq.encode(to_float(images[i:i + batch])).to(torch.int16)
                      for i in range(0, images.shape[0], batch)])


@torch.no_grad()
def vq_report(vq: VQModel, images: torch.Tensor, train_tokens: torch.Tensor) -> dict:
    """Reconstruction error on held-out crops and codebook usage on the training tokens."""
    x = to_float(images)
    tok = encode_all(vq, images).long()
    g = vq.config.codebook_embed_dim
    side = int(tok.shape[1] ** 0.5)
    rec = torch.cat([vq.decode_code(tok[i:i + 128], (tok[i:i + 128].shape[0], g, side, side))
                     for i in range(0, tok.shape[0], 128)]).clamp(-1, 1)
    mse = (rec - x).pow(2).mean().item()
    V = vq.config.codebook_size
    counts = torch.bincount(train_tokens.long().flatten(), minlength=V).double()
    p = counts / counts.sum()
    ent = -(p[p > 0] * p[p > 0].log()).sum().item()
    return dict(heldout_l1=(rec - x).abs().mean().item(), heldout_mse=mse,
                heldout_psnr_db=10 * torch.log10(torch.tensor(4.0 / mse)).item(),
                codebook_size=V, codebook_used=int((counts > 0).sum()),
                codebook_usage=float((counts > 0).float().mean()), token_perplexity=float(torch.tensor(ent).exp()),
                n_heldout=int(images.shape[0]), n_train_tokens=int(train_tokens.shape[0]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vq", type=Path, default=Path("runs/demo/vq/ckpt.pt"))
    ap.add_argument("--out", type=Path, default=Path("runs/demo/tokens"))
    ap.add_argument("--per-class", type=int, default=2048)
    ap.add_argument("--heldout-per-class", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    setup_torch(a.threads, a.seed)
    vq = load_vq_ckpt(a.vq)
    # seed + 1: crops not used by VQ training (more distinct windows for the target)
    tr_img, tr_lab = demo_images("train", a.per_class, seed=a.seed + 1)
    ho_img, ho_lab = demo_images("heldout", a.heldout_per_class, seed=a.seed)
    tr_tok = encode_all(vq, tr_img)
    ho_tok = encode_all(vq, ho_img)
    save_ckpt(a.out / "tokens.pt", dict(train_tokens=tr_tok, train_labels=tr_lab, heldout_tokens=ho_tok,
                                        heldout_labels=ho_lab, vq=str(a.vq)))
    rep = vq_report(vq, ho_img, tr_tok)
    write_json(a.out / "vq_report.json", rep)
    print(rep)


if __name__ == "__main__":
    main()
