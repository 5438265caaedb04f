"""Quality harness for `lisa-trt bench`: numbers whose error bars are smaller than the
differences they report.

Per set of generated images (with intended class labels), in the demo scorer's feature space
(lisa_trt.demo.scorer, penultimate CNN features):
- class accuracy with its binomial standard error sqrt(acc (1 - acc) / n);
- KID-demo: the unbiased squared MMD (Binkowski et al. 2018) with the cubic polynomial kernel
  k(x, y) = (x.y / d + 1)^3, against (a) a cached reference set of REAL held-out crops and
  (b) a cached set of VANILLA samples (the target's own AR sampling, generated with seeds
  disjoint from the evaluated ones, so the two sets are independent). The estimate is the
  full-sample unbiased MMD^2; its standard error comes from S disjoint subsets
  (std of the subset estimates / sqrt(S): conservative for the full-sample estimate);
- FD-demo (Frechet distance of Gaussian fits, biased, no error bar; kept for continuity).

Sample size: KID and accuracy are refused below MIN_SAMPLES_HARD images and flagged
`underpowered` (with a warning) below MIN_SAMPLES (256): quality claims need >= 256 images per
point and a difference larger than 2 standard errors (`within_noise`).

KID-demo and FD-demo use a small domain-specific feature space: they are NOT KID / FID and are
not comparable with published numbers.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .errors import InputError

MIN_SAMPLES = 256  # below this a point is `underpowered` (no quality claims)
MIN_SAMPLES_HARD = 32  # below this the harness refuses
N_SUBSETS = 8


def poly_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cubic polynomial kernel (x.y / d + 1)^3 between rows of x (n, d) and y (m, d), float64."""
    return (x.double() @ y.double().T / x.shape[1] + 1.0) ** 3


def mmd2_unbiased(x: torch.Tensor, y: torch.Tensor) -> float:
    """Unbiased squared MMD with the cubic kernel (diagonal terms excluded); n, m >= 2."""
    n, m = x.shape[0], y.shape[0]
    if n < 2 or m < 2:
        raise InputError(f"the unbiased MMD needs >= 2 samples per set, got {n} and {m}")
    kxx, kyy, kxy = poly_kernel(x, x), poly_kernel(y, y), poly_kernel(x, y)
    sxx = (kxx.sum() - kxx.diagonal().sum()) / (n * (n - 1))
    syy = (kyy.sum() - kyy.diagonal().sum()) / (m * (m - 1))
    return float(sxx + syy - 2.0 * kxy.mean())


def kid(x: torch.Tensor, y: torch.Tensor, n_subsets: int = N_SUBSETS, seed: int = 0) -> tuple[float, float]:
    """KID-demo: (unbiased MMD^2 of the full sets, standard error from disjoint subsets).

    Both sets are shuffled (seeded) and cut into `n_subsets` disjoint parts; part j of x is
    compared with part j of y. se = std(part estimates, ddof 1) / sqrt(n_subsets).

    Args:
        x: (n, d) features of the evaluated set; y: (m, d) features of the reference set.
    """
    if x.shape[1] != y.shape[1]:
        raise InputError(f"feature sizes differ: {x.shape[1]} vs {y.shape[1]}")
    n_subsets = max(2, min(n_subsets, x.shape[0] // 4, y.shape[0] // 4))
    if x.shape[0] < 8 or y.shape[0] < 8:
        raise InputError(f"KID needs >= 8 samples per set, got {x.shape[0]} and {y.shape[0]}")
    g = torch.Generator().manual_seed(seed)
    px, py = torch.randperm(x.shape[0], generator=g), torch.randperm(y.shape[0], generator=g)
    parts = [mmd2_unbiased(x[a], y[b]) for a, b in zip(px.chunk(n_subsets), py.chunk(n_subsets))]
    se = float(np.std(parts, ddof=1) / math.sqrt(len(parts)))
    return mmd2_unbiased(x, y), se


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """Class accuracy and its binomial standard error."""
    acc = float((logits.argmax(-1) == labels).float().mean())
    return acc, math.sqrt(max(acc * (1.0 - acc), 0.0) / max(len(labels), 1))


def check_sample_size(n: int, what: str = "quality") -> bool:
    """Refuse n < MIN_SAMPLES_HARD; warn and return True (underpowered) below MIN_SAMPLES."""
    if n < MIN_SAMPLES_HARD:
        raise InputError(f"{what} needs >= {MIN_SAMPLES_HARD} images (got {n}); use --num-images >= "
                         f"{MIN_SAMPLES} for claims")
    if n < MIN_SAMPLES:
        warnings.warn(f"{what} on {n} < {MIN_SAMPLES} images: error bars are wide, no quality claims "
                      "(marked underpowered)", stacklevel=2)
        return True
    return False


def within_noise(a: float, a_se: float, b: float, b_se: float, k: float = 2.0) -> bool:
    """True when |a - b| <= k * sqrt(a_se^2 + b_se^2) (a difference not established)."""
    return abs(a - b) <= k * math.sqrt(a_se ** 2 + b_se ** 2)


class QualityReference:
    """Cached reference features: real held-out crops and (optionally) vanilla samples.

    Args:
        scorer: DemoScorer.
        real_per_class: held-out real crops per class (seeded, deterministic).
        vanilla_fn: optional () -> uint8/float images (B, 3, H, W) of vanilla samples; called once,
            its features cached in memory and, with cache_dir, on disk under `vanilla_key`.
        cache_dir: directory for the on-disk cache (None: memory only).
        vanilla_key: identity of the vanilla set (model, sampling, classes, seeds ...).
    """

    def __init__(self, scorer, *, real_per_class: int = 128, vanilla_fn=None, cache_dir=None,
                 vanilla_key: Optional[dict] = None, seed: int = 0):
        self.scorer, self.real_per_class, self.seed = scorer, real_per_class, seed
        self.vanilla_fn, self.vanilla_key = vanilla_fn, vanilla_key or {}
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self._real = self._vanilla = None

    def _cached(self, name: str, key: dict, make):
        from .io import load_safetensors, save_safetensors

        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
        path = self.cache_dir / f"{name}_{digest}.safetensors" if self.cache_dir else None
        if path is not None and path.is_file():
            return load_safetensors(path)[0]["features"]
        feats = make()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_safetensors({"features": feats}, path, metadata={"key": key})
        return feats

    def scorer_key(self) -> str:
        from .io import tensor_hash

        return tensor_hash(self.scorer.head.weight)

    @property
    def real(self) -> torch.Tensor:
        """(M, F) features of the held-out real crops."""
        if self._real is None:
            from .demo.data import demo_images
            from .demo.scorer import extract

            key = {"set": "real-heldout", "per_class": self.real_per_class, "seed": self.seed,
                   "scorer": self.scorer_key()}

            def make():
                imgs, _ = demo_images("heldout", self.real_per_class, seed=self.seed,
                                      size=self.scorer.cfg.image_size)
                return extract(self.scorer, imgs)[0]
            self._real = self._cached("real", key, make)
        return self._real

    @property
    def vanilla(self) -> Optional[torch.Tensor]:
        """(M, F) features of the cached vanilla samples, or None without a vanilla_fn."""
        if self._vanilla is None and self.vanilla_fn is not None:
            from .demo.scorer import extract

            key = {"set": "vanilla", **self.vanilla_key, "scorer": self.scorer_key()}
            self._vanilla = self._cached("vanilla", key, lambda: extract(self.scorer, self.vanilla_fn())[0])
        return self._vanilla


def evaluate(images: torch.Tensor, labels: torch.Tensor, ref: QualityReference,
             n_subsets: int = N_SUBSETS) -> dict:
    """Quality of one set of generated images against `ref` (module docstring).

    Returns:
        {n, underpowered, class_acc, class_acc_se, kid_real, kid_real_se, [kid_vanilla,
         kid_vanilla_se], fd_demo}.
    """
    from .demo.scorer import extract, feature_stats, frechet_distance

    n = int(images.shape[0])
    under = check_sample_size(n)
    feats, logits = extract(ref.scorer, images)
    acc, acc_se = accuracy(logits, labels.long())
    out = {"n": n, "underpowered": under, "class_acc": acc, "class_acc_se": acc_se}
    out["kid_real"], out["kid_real_se"] = kid(feats, ref.real, n_subsets)
    if ref.vanilla is not None:
        out["kid_vanilla"], out["kid_vanilla_se"] = kid(feats, ref.vanilla, n_subsets)
    mu, sig = feature_stats(feats)
    mu_r, sig_r = feature_stats(ref.real)
    out["fd_demo"] = frechet_distance(mu, sig, mu_r, sig_r)
    return out


def quality_neutral(r: dict, vanilla: dict, k: float = 2.0) -> bool:
    """A point is quality-neutral when its class accuracy and KID-demo (vs real crops, and vs the
    cached vanilla samples when measured) are within k standard errors of vanilla's own."""
    ok = within_noise(r["class_acc"], r["class_acc_se"], vanilla["class_acc"], vanilla["class_acc_se"], k)
    ok &= within_noise(r["kid_real"], r["kid_real_se"], vanilla["kid_real"], vanilla["kid_real_se"], k)
    if "kid_vanilla" in r and "kid_vanilla" in vanilla:
        ok &= within_noise(r["kid_vanilla"], r["kid_vanilla_se"], vanilla["kid_vanilla"], vanilla["kid_vanilla_se"], k)
    return bool(ok)
