"""Stage 1: preview the demo data (rows = classes, columns = train crops) and print its summary.

    python scripts/demo/preview_data.py --out runs/demo/data_preview.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import common  # noqa: F401

from lisa_trt.demo.data import CLASS_NAMES, SCALE_RANGE, demo_images, load_photo
from lisa_trt.imaging import grid, save_png


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("runs/demo/data_preview.png"))
    ap.add_argument("--per-class", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for c, name in enumerate(CLASS_NAMES):
        print(f"class {c}: {name:22s} photo {load_photo(c).shape}")
    print(f"crop side: {SCALE_RANGE} of the photo's short side, resized to 64 px, random h-flip")
    x, _ = demo_images("train", a.per_class, seed=a.seed)
    save_png(grid(x.permute(0, 2, 3, 1).numpy(), nrow=a.per_class), a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
