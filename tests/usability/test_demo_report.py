"""The demo explains itself: labelled grid, quality with uncertainty, a speed line that says why."""

import math

import numpy as np
import pytest

from lisa_trt.runtime.demo_report import (format_quality, labelled_grid, quality_with_error, speed_explanation,
                                          wilson_interval)


def test_labelled_grid_layout():
    red = np.zeros((64, 64, 3), np.uint8)
    red[..., 0] = 255
    g = labelled_grid({"vanilla": [red, red, red], "LISA (gasv)": [red, red, red]}, ["a", "b", "c"], tile=128)
    assert g.dtype == np.uint8 and g.shape[0] >= 2 * 128 and g.shape[1] >= 3 * 128
    assert (g[..., 1] < 128).sum() > 0  # text drawn (black pixels in the margins)
    left_margin = g[:, :40]
    assert (left_margin.sum(-1) < 300).any(), "row labels missing"


def test_wilson_interval():
    lo, hi = wilson_interval(8, 8)
    assert 0.6 < lo < 0.7 and hi == 1.0
    lo, hi = wilson_interval(128, 256)
    assert abs(lo - 0.44) < 0.02 and abs(hi - 0.56) < 0.02


def test_speed_line_decomposes_and_explains():
    v = {"seconds_per_image": 1.0, "mal": 1.0}
    slow = {"seconds_per_image": 1.25, "mal": 1.5, "target_forwards": 256 / 1.5}
    lines = speed_explanation(v, slow, verify="gasv", backend="ort", threads=1, tree={"top_k": 2, "depth": 1,
                                                                                     "total_tokens": 4})
    text = "\n".join(lines)
    assert "0.80x" in text and "1.50 tokens accepted per step" in text and "1.88x" in text
    assert "why slower" in text and "ORT" in text and "1 CPU thread" in text and "depth 1" in text
    fast = {"seconds_per_image": 0.5, "mal": 2.5, "target_forwards": 256 / 2.5}
    assert "why faster" in "\n".join(speed_explanation(v, fast, verify="gasv", backend="trt", threads=2))


def test_quality_marks_small_samples():
    from lisa_trt.demo.registry import assets_present

    if not assets_present():
        pytest.skip("bundled demo assets not built")
    from lisa_trt.demo.data import demo_images

    imgs, labels = demo_images("heldout", 2, seed=0)
    q = quality_with_error(imgs, labels, n_boot=20)
    assert q["indicative"] and "indicative" in format_quality(q) and q["n"] == labels.shape[0]
    assert q["class_acc_ci95"][0] <= q["class_acc"] <= q["class_acc_ci95"][1]
    q1 = quality_with_error(imgs[:1], labels[:1])
    assert math.isnan(q1["fd_demo"]) and "FD-demo n/a" in format_quality(q1)
