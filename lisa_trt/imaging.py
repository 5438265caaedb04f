"""Images out: uint8 conversion, PNG writing (atomic) and grids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .io import atomic_write


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """Decoder output (B, 3, H, W) in about [-1, 1] -> uint8 (B, H, W, 3), LlamaGen's rounding."""
    return torch.clamp(127.5 * images.float() + 128.0, 0, 255).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


def save_png(image: np.ndarray, path) -> None:
    from PIL import Image

    with atomic_write(path) as tmp:
        Image.fromarray(image).save(tmp, format="PNG")


def grid(images, nrow: int, pad: int = 2, fill: int = 255) -> np.ndarray:
    """Tile uint8 images (list or (N, H, W, 3)) into rows of `nrow`."""
    images = list(images)
    h, w = images[0].shape[:2]
    ncol = nrow
    rows = (len(images) + ncol - 1) // ncol
    out = np.full((rows * (h + pad) + pad, ncol * (w + pad) + pad, 3), fill, dtype=np.uint8)
    for i, im in enumerate(images):
        r, c = divmod(i, ncol)
        out[pad + r * (h + pad): pad + r * (h + pad) + h, pad + c * (w + pad): pad + c * (w + pad) + w] = im
    return out


def save_images(images: np.ndarray, out_dir, prefix: str = "img") -> list[Path]:
    out_dir = Path(out_dir)
    paths = []
    for i, im in enumerate(images):
        p = out_dir / f"{prefix}_{i:04d}.png"
        save_png(im, p)
        paths.append(p)
    return paths
