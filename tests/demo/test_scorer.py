"""Demo scorer: Frechet distance math, and the bundled scorer on held-out real crops."""

import numpy as np
import pytest
import torch

from lisa_trt.demo.data import NUM_CLASSES, demo_images
from lisa_trt.demo.registry import assets_present
from lisa_trt.demo.scorer import DemoScorer, classify_accuracy, frechet_distance, score_images
from lisa_trt.errors import InputError

needs_assets = pytest.mark.skipif(not assets_present(),
                                  reason="bundled demo assets not built yet (lisa_trt/assets/demo/; run scripts/demo/*)")


def test_frechet_distance_closed_forms():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(200, 4))
    mu, s = a.mean(0), np.cov(a, rowvar=False)
    assert abs(frechet_distance(mu, s, mu, s)) < 1e-6
    # equal covariances: FD = ||mu1 - mu2||^2
    assert frechet_distance(mu, s, mu + 2.0, s) == pytest.approx(4 * 4.0, rel=1e-6)
    # 1-D: (m1-m2)^2 + (sd1-sd2)^2
    fd = frechet_distance(np.zeros(1), np.eye(1) * 4.0, np.ones(1), np.eye(1) * 1.0)
    assert fd == pytest.approx(1.0 + 1.0, rel=1e-6)


def test_score_images_rejects_bad_shapes():
    scorer = DemoScorer()
    with pytest.raises(InputError):
        score_images(torch.zeros(2, 1, 64, 64), torch.zeros(2, dtype=torch.long), scorer)
    with pytest.raises(InputError):
        score_images(torch.zeros(2, 3, 64, 64), torch.zeros(3, dtype=torch.long), scorer)


@needs_assets
def test_bundled_scorer_classifies_heldout_real_crops():
    from lisa_trt.demo.registry import load_demo_scorer

    scorer = load_demo_scorer()
    x, y = demo_images("heldout", 16, seed=3)
    acc = classify_accuracy(scorer, x, y)
    assert acc >= 0.9, f"held-out real-crop accuracy {acc:.3f}"


@needs_assets
def test_fd_demo_separates_real_from_noise():
    from lisa_trt.demo.registry import load_demo_scorer

    scorer = load_demo_scorer()
    x, y = demo_images("heldout", 16, seed=4)
    acc_r, fd_r = score_images(x, y, scorer)
    noise = torch.rand(x.shape, generator=torch.Generator().manual_seed(0)) * 2 - 1
    acc_n, fd_n = score_images(noise, y, scorer)
    assert fd_n > 3 * fd_r and acc_n < acc_r
    assert acc_n <= 0.5 and y.shape[0] == 16 * NUM_CLASSES
