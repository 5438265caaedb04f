"""Quality harness: the KID estimator is unbiased and has power; error bars; sample-size rules."""

import math
import warnings

import numpy as np
import pytest
import torch

from lisa_trt.errors import InputError
from lisa_trt.quality import (MIN_SAMPLES, accuracy, check_sample_size, kid, mmd2_unbiased, poly_kernel,
                              quality_neutral, within_noise)


def _gauss(n, d=16, shift=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) + shift


def test_poly_kernel_and_mmd_by_hand():
    x, y = _gauss(5, 3, seed=1), _gauss(4, 3, seed=2)
    k = poly_kernel(x, y)
    assert torch.allclose(k[1, 2], (x[1] @ y[2] / 3 + 1) ** 3)
    kxx, kyy, kxy = poly_kernel(x, x), poly_kernel(y, y), poly_kernel(x, y)
    want = sum(kxx[i, j] for i in range(5) for j in range(5) if i != j) / 20 \
        + sum(kyy[i, j] for i in range(4) for j in range(4) if i != j) / 12 - 2 * kxy.mean()
    assert mmd2_unbiased(x, y) == pytest.approx(float(want))


def test_kid_is_unbiased_on_one_distribution():
    """Mean over repeats ~ 0 (within 3 standard errors of the mean), and not biased upward as
    the plug-in (biased) estimator would be."""
    vals = np.array([mmd2_unbiased(_gauss(64, seed=2 * r), _gauss(64, seed=2 * r + 1)) for r in range(60)])
    sem = vals.std(ddof=1) / math.sqrt(len(vals))
    assert abs(vals.mean()) < 3 * sem
    assert (vals < 0).any()                       # an unbiased estimator goes negative sometimes


def test_kid_detects_a_planted_shift_and_its_error_bar_covers_the_null():
    est, se = kid(_gauss(256, shift=0.3, seed=3), _gauss(512, seed=4))
    assert est > 4 * se > 0
    est0, se0 = kid(_gauss(256, seed=5), _gauss(512, seed=6))
    assert abs(est0) < 3 * se0
    assert est > est0


def test_accuracy_standard_error():
    logits = torch.eye(3)[torch.tensor([0, 1, 2, 0])]
    acc, se = accuracy(logits, torch.tensor([0, 1, 1, 1]))
    assert acc == 0.5 and se == pytest.approx(math.sqrt(0.25 / 4))


def test_sample_size_rules():
    with pytest.raises(InputError, match=str(MIN_SAMPLES)):
        check_sample_size(16)
    with pytest.warns(UserWarning, match="underpowered"):
        assert check_sample_size(64) is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_sample_size(MIN_SAMPLES) is False


def test_quality_neutral_uses_two_standard_errors():
    v = dict(class_acc=0.90, class_acc_se=0.02, kid_real=0.010, kid_real_se=0.002, kid_vanilla=0.0,
             kid_vanilla_se=0.001)
    near = dict(class_acc=0.87, class_acc_se=0.02, kid_real=0.013, kid_real_se=0.002, kid_vanilla=0.002,
                kid_vanilla_se=0.001)
    far = dict(near, class_acc=0.80)
    assert quality_neutral(near, v) and not quality_neutral(far, v)
    assert not quality_neutral(dict(near, kid_vanilla=0.01), v)
    assert within_noise(1.0, 0.1, 1.2, 0.1) and not within_noise(1.0, 0.1, 1.4, 0.1)
