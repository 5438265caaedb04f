"""Demo data: deterministic crops of the sample photographs that ship inside scikit-image.

One class per photograph (no downloads). A crop takes a random square window whose side is a
random fraction of the photo's short side, resizes it to `size` px (bicubic) and optionally
flips it horizontally. Everything is a pure function of (class, split, seed, index count), so
the same call always returns the same bytes.

Train and held-out crops come from disjoint random streams of the same photographs: the
held-out set measures generalisation to new windows and scales, not to new photographs
(there is one photograph per class).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..errors import InputError

# (class name, skimage.data loader). All are colour photographs bundled with scikit-image.
_PHOTOS = (
    ("astronaut", "astronaut"),
    ("coffee", "coffee"),
    ("cat", "chelsea"),
    ("rocket", "rocket"),
    ("motorcycle", "stereo_motorcycle"),
    ("hubble", "hubble_deep_field"),
    ("immunohistochemistry", "immunohistochemistry"),
    ("retina", "retina"),
)

CLASS_NAMES: tuple[str, ...] = tuple(name for name, _ in _PHOTOS)
NUM_CLASSES = len(CLASS_NAMES)
IMAGE_SIZE = 64
SCALE_RANGE = (0.2, 0.55)  # crop side as a fraction of the photo's short side
SPLITS = ("train", "heldout")


@functools.lru_cache(maxsize=None)
def load_photo(class_id: int) -> np.ndarray:
    """The source photograph of a class as uint8 (H, W, 3)."""
    import skimage.data

    _check_class(class_id)
    img = getattr(skimage.data, _PHOTOS[class_id][1])()
    if isinstance(img, tuple):  # stereo_motorcycle -> (left, right, disparity)
        img = img[0]
    img = np.ascontiguousarray(img[..., :3])
    assert img.dtype == np.uint8 and img.ndim == 3, (class_id, img.shape, img.dtype)
    return img


def _check_class(class_id: int) -> None:
    if not 0 <= class_id < NUM_CLASSES:
        raise InputError(f"class id {class_id} is out of range; allowed 0..{NUM_CLASSES - 1} "
                         f"({', '.join(CLASS_NAMES)})")


def _rng(class_id: int, split: str, seed: int) -> np.random.Generator:
    if split not in SPLITS:
        raise InputError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    return np.random.default_rng([seed, SPLITS.index(split), class_id])


def make_crops(class_id: int, n: int, *, split: str = "train", seed: int = 0,
               size: int = IMAGE_SIZE, flip: bool = True) -> np.ndarray:
    """Deterministic random crops of one photograph.

    Args:
        class_id: index into CLASS_NAMES.
        n: number of crops.
        split: "train" or "heldout" (independent random streams).
        seed: base seed.
        size: output side in pixels.
        flip: flip each crop horizontally with probability 1/2.
    Returns:
        uint8 array (n, size, size, 3).
    """
    from PIL import Image

    photo = Image.fromarray(load_photo(class_id))
    W, H = photo.size
    short = min(H, W)
    rng = _rng(class_id, split, seed)
    frac = rng.uniform(*SCALE_RANGE, size=n)
    ux, uy, flips = rng.random(n), rng.random(n), rng.random(n) < 0.5
    out = np.empty((n, size, size, 3), dtype=np.uint8)
    for i in range(n):
        side = max(size // 2, int(round(frac[i] * short)))
        x0, y0 = int(ux[i] * (W - side + 1)), int(uy[i] * (H - side + 1))
        crop = photo.crop((x0, y0, x0 + side, y0 + side)).resize((size, size), Image.BICUBIC)
        arr = np.asarray(crop)
        out[i] = arr[:, ::-1] if (flip and flips[i]) else arr
    return out


def demo_images(split: str = "train", per_class: int = 256, *, seed: int = 0,
                size: int = IMAGE_SIZE, flip: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Crops of every class, class-major order.

    Returns:
        images: uint8 (N, 3, size, size), N = NUM_CLASSES * per_class.
        labels: int64 (N,).
    """
    imgs = [make_crops(c, per_class, split=split, seed=seed, size=size, flip=flip)
            for c in range(NUM_CLASSES)]
    images = torch.from_numpy(np.concatenate(imgs)).permute(0, 3, 1, 2).contiguous()  # (N, 3, S, S)
    labels = torch.arange(NUM_CLASSES).repeat_interleave(per_class)
    return images, labels


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> float32 in [-1, 1]."""
    return images.float().div(127.5).sub(1.0)


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """float (B, 3, H, W) in about [-1, 1] -> uint8, LlamaGen's clamp(127.5 x + 128, 0, 255)."""
    return torch.clamp(127.5 * images.float() + 128.0, 0, 255).to(torch.uint8)


def random_hflip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Flip each image of a (B, C, H, W) batch horizontally with probability 1/2."""
    mask = torch.rand(images.shape[0], generator=generator) < 0.5
    out = images.clone()
    out[mask] = out[mask].flip(-1)
    return out
