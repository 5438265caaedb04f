"""Demo data: crops are deterministic by seed, splits differ, shapes and labels are right."""

import numpy as np
import pytest
import torch

from lisa_trt.demo.data import (CLASS_NAMES, NUM_CLASSES, demo_images, load_photo, make_crops, random_hflip,
                                to_float, to_uint8)
from lisa_trt.errors import InputError


def test_at_least_eight_colour_photographs():
    assert NUM_CLASSES >= 8 and len(set(CLASS_NAMES)) == NUM_CLASSES
    for c in range(NUM_CLASSES):
        img = load_photo(c)
        assert img.dtype == np.uint8 and img.shape[2] == 3
        # colour, not grey replicated into three channels
        assert np.abs(img[..., 0].astype(int) - img[..., 2].astype(int)).mean() > 5


def test_crops_are_deterministic_by_seed():
    a = make_crops(3, 6, split="train", seed=7)
    b = make_crops(3, 6, split="train", seed=7)
    assert a.shape == (6, 64, 64, 3) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, make_crops(3, 6, split="train", seed=8))


def test_splits_use_independent_streams():
    tr = make_crops(0, 4, split="train", seed=0)
    ho = make_crops(0, 4, split="heldout", seed=0)
    assert not any(np.array_equal(t, h) for t in tr for h in ho)


def test_demo_images_layout():
    x, y = demo_images("heldout", 2, seed=0)
    assert x.shape == (2 * NUM_CLASSES, 3, 64, 64) and x.dtype == torch.uint8
    assert y.tolist() == [c for c in range(NUM_CLASSES) for _ in range(2)]
    x2, _ = demo_images("heldout", 2, seed=0)
    assert torch.equal(x, x2)


def test_float_roundtrip_and_flip():
    x, _ = demo_images("train", 1, seed=0)
    f = to_float(x)
    assert f.min() >= -1 and f.max() <= 1
    assert torch.equal(to_uint8(f), x)
    g = torch.Generator().manual_seed(0)
    flipped = random_hflip(x, g)
    for a, b in zip(x, flipped):
        assert torch.equal(a, b) or torch.equal(a.flip(-1), b)


def test_bad_inputs_are_clear_errors():
    with pytest.raises(InputError, match="allowed"):
        make_crops(NUM_CLASSES, 1)
    with pytest.raises(InputError, match="split"):
        make_crops(0, 1, split="test")
