"""Stage 6: write the shipped demo bundle lisa_trt/assets/demo/ from the training checkpoints.

fp16 safetensors (+ JSON sidecars with the configs) for target, VQ and scorer, and demo.json
with the class names and the demo's default sampling settings.

    python scripts/demo/export_assets.py --cfg-scale 3.0 --top-k 0
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import common  # noqa: F401
from common import load_ckpt

from lisa_trt.models.target_config import TargetConfig, VQConfig
from lisa_trt.demo.data import CLASS_NAMES, IMAGE_SIZE, SCALE_RANGE
from lisa_trt.demo.registry import DEMO_DIR
from lisa_trt.demo.scorer import DemoScorer, ScorerConfig
from lisa_trt.io import save_safetensors, write_json
from lisa_trt.models.checkpoints import save_model
from lisa_trt.families.llamagen.model import Transformer
from lisa_trt.families.llamagen.vq import VQModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=Path, default=Path("runs/demo"))
    ap.add_argument("--out", type=Path, default=DEMO_DIR)
    ap.add_argument("--cfg-scale", type=float, default=3.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    half = torch.float16

    st = load_ckpt(a.runs / "target" / "ckpt.pt")
    tcfg = TargetConfig.from_dict(st["config"])
    target = Transformer(tcfg)
    target.load_state_dict(st["model"], strict=True)
    save_model(target, tcfg, a.out / "target.safetensors", dtype=half,
               extra_meta={"train_steps": st["step"], "recipe": "scripts/demo/train_target.py"})

    sv = load_ckpt(a.runs / "vq" / "ckpt.pt")
    vcfg = VQConfig.from_dict(sv["config"])
    vq = VQModel(vcfg)
    vq.load_state_dict(sv["model"], strict=True)
    save_model(vq, vcfg, a.out / "vq.safetensors", dtype=half,
               extra_meta={"train_steps": sv["step"], "recipe": "scripts/demo/train_vq.py"})

    ss = load_ckpt(a.runs / "scorer" / "ckpt.pt")
    scfg = ScorerConfig(**ss["config"])
    scorer = DemoScorer(scfg)
    scorer.load_state_dict(ss["model"], strict=True)
    sd = {k: (v.to(half) if v.is_floating_point() else v) for k, v in scorer.state_dict().items()}
    meta = {"config": scfg.to_dict(), "schema": 1, "train_steps": ss["step"], "recipe": "scripts/demo/train_scorer.py"}
    save_safetensors(sd, a.out / "scorer.safetensors", meta)
    write_json(a.out / "scorer.json", meta)

    write_json(a.out / "demo.json", {
        "schema": 1,
        "class_names": list(CLASS_NAMES),
        "image_size": IMAGE_SIZE,
        "crop_scale_range": list(SCALE_RANGE),
        "sampling": {"cfg_scale": a.cfg_scale, "temperature": a.temperature, "top_k": a.top_k, "top_p": a.top_p},
        "source": "scikit-image sample photographs (skimage.data), one class per photograph",
    })
    total = sum(p.stat().st_size for p in a.out.iterdir() if p.is_file())
    print(f"wrote {a.out} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
