"""Quality scorer of the demo model: a small CNN classifier trained on the demo's real crops.

Two numbers score a set of generated images with intended class labels:
- class-consistency accuracy: fraction the classifier assigns to the intended class;
- FD-demo: Frechet distance between Gaussians fitted to the classifier's penultimate features
  of the generated images and of held-out real crops. It is FID's formula in a small,
  domain-specific feature space; it is NOT FID and is not comparable with FID numbers.
"""

from __future__ import annotations

import warnings

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import InputError
from .data import IMAGE_SIZE, NUM_CLASSES, demo_images, to_float


@dataclass(frozen=True)
class ScorerConfig:
    num_classes: int = NUM_CLASSES
    width: int = 16
    feature_dim: int = 64
    image_size: int = IMAGE_SIZE

    def to_dict(self) -> dict:
        return dict(num_classes=self.num_classes, width=self.width, feature_dim=self.feature_dim,
                    image_size=self.image_size)


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1), nn.BatchNorm2d(cout), nn.SiLU(),
                         nn.Conv2d(cout, cout, 3, 2, 1), nn.BatchNorm2d(cout), nn.SiLU())


class DemoScorer(nn.Module):
    """CNN: 4 stride-2 stages (64 -> 4 px), global average pool, feature MLP, linear head."""

    def __init__(self, cfg: ScorerConfig = ScorerConfig()):
        super().__init__()
        self.cfg = cfg
        w = cfg.width
        self.stages = nn.Sequential(_block(3, w), _block(w, 2 * w), _block(2 * w, 4 * w), _block(4 * w, 4 * w))
        self.feat = nn.Linear(4 * w, cfg.feature_dim)
        self.head = nn.Linear(cfg.feature_dim, cfg.num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features. x: float (B, 3, S, S) in [-1, 1] -> (B, feature_dim)."""
        h = self.stages(x).mean(dim=(2, 3))  # (B, 4w)
        return F.silu(self.feat(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits (B, num_classes)."""
        return self.head(self.features(x))


def _as_float(images: torch.Tensor, size: int) -> torch.Tensor:
    if images.ndim != 4 or images.shape[1] != 3:
        raise InputError(f"images must be (B, 3, H, W), got {tuple(images.shape)}; "
                         "pass uint8 or float in [-1, 1]")
    x = to_float(images) if images.dtype == torch.uint8 else images.float()
    if x.shape[-1] != size or x.shape[-2] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x


@torch.no_grad()
def extract(scorer: DemoScorer, images: torch.Tensor, batch: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the scorer. Returns (features (B, F) float64, logits (B, C) float32)."""
    scorer.eval()
    feats, logits = [], []
    for i in range(0, images.shape[0], batch):
        x = _as_float(images[i:i + batch], scorer.cfg.image_size)
        f = scorer.features(x)
        feats.append(f.double())
        logits.append(scorer.head(f))
    return torch.cat(feats), torch.cat(logits)


def frechet_distance(mu1: np.ndarray, s1: np.ndarray, mu2: np.ndarray, s2: np.ndarray) -> float:
    """||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^(1/2)) (Heusel et al. 2017, eq. 6).

    Tr((S1 S2)^(1/2)) is computed as the sum of square roots of the eigenvalues of the symmetric
    PSD matrix S1^(1/2) S2 S1^(1/2) (same spectrum as S1 S2), which is stable without scipy.
    """
    w, q = np.linalg.eigh(s1)
    r1 = (q * np.sqrt(np.clip(w, 0, None))) @ q.T  # S1^(1/2)
    ev = np.linalg.eigvalsh(r1 @ s2 @ r1)
    d = mu1 - mu2
    return float(d @ d + np.trace(s1) + np.trace(s2) - 2 * np.sqrt(np.clip(ev, 0, None)).sum())


def feature_stats(feats: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(mean (F,), covariance (F, F)) of features (N, F)."""
    f = feats.double().numpy()
    return f.mean(0), np.cov(f, rowvar=False)


_REF_CACHE: dict = {}

MIN_FD_IMAGES = 2        # fewer: no covariance, FD undefined
INDICATIVE_BELOW = 64    # fewer: FD-demo is biased upwards and noisy (bench/ uses >= 64)


def quality_label(n: int) -> str:
    """How much an FD-demo / class accuracy from `n` images can be trusted, in words."""
    if n < MIN_FD_IMAGES:
        return f"FD not measured ({n} image; needs >= {MIN_FD_IMAGES})"
    if n < INDICATIVE_BELOW:
        return f"indicative ({n} images; FD is biased upwards below {INDICATIVE_BELOW})"
    return f"{n} images"


def reference_stats(scorer: DemoScorer, per_class: int = 128, seed: int = 0):
    """Feature stats of held-out real crops (cached per scorer object)."""
    key = (id(scorer), per_class, seed)
    if key not in _REF_CACHE:
        images, _ = demo_images("heldout", per_class, seed=seed, size=scorer.cfg.image_size)
        _REF_CACHE[key] = feature_stats(extract(scorer, images)[0])
    return _REF_CACHE[key]


def score_images(images: torch.Tensor, labels: torch.Tensor, scorer: DemoScorer | None = None,
                 ref_per_class: int = 128) -> tuple[float, float]:
    """Score images against their intended classes.

    Args:
        images: (B, 3, H, W) uint8, or float in [-1, 1]; resized to the scorer's size if needed.
        labels: (B,) intended class ids.
        scorer: a DemoScorer (the bundled one: lisa_trt.demo.registry.load_demo_scorer()).
        ref_per_class: held-out real crops per class for the reference statistics.
    Returns:
        (class_acc in [0, 1], fd_demo); fd_demo is NaN (with a warning) below MIN_FD_IMAGES
        images, and is only indicative below INDICATIVE_BELOW (see `quality_label`).
    """
    if scorer is None:
        raise InputError("score_images needs a scorer: pass lisa_trt.demo.registry.load_demo_scorer() "
                         "(or call lisa_trt.demo.registry.score_images, which does)")
    if labels.shape != (images.shape[0],):
        raise InputError(f"labels must be ({images.shape[0]},), got {tuple(labels.shape)}")
    if images.shape[0] < 1:
        raise InputError("no images to score")
    feats, logits = extract(scorer, images)
    acc = (logits.argmax(-1) == labels).float().mean().item()
    if images.shape[0] < MIN_FD_IMAGES:  # a covariance needs >= 2 samples; report "not measured"
        warnings.warn(f"FD-demo needs at least {MIN_FD_IMAGES} images, got {images.shape[0]}; reported as NaN",
                      stacklevel=2)
        return acc, float("nan")
    mu, sig = feature_stats(feats)
    mu_r, sig_r = reference_stats(scorer, ref_per_class)
    return acc, frechet_distance(mu, sig, mu_r, sig_r)


@torch.no_grad()
def classify_accuracy(scorer: DemoScorer, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy of the scorer on (images, labels)."""
    return (extract(scorer, images)[1].argmax(-1) == labels).float().mean().item()
