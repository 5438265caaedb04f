import pytest

from lisa_trt.runtime.autotune import best_tree, expected_mal


def test_expected_mal_limits():
    assert expected_mal([1.0], 1, 3, 10) == pytest.approx(5.0)  # a perfect chain: root + 4 levels
    assert expected_mal([0.0], 4, 3, 20) == pytest.approx(1.0)
    assert expected_mal([1.0], 2, 5, 4) == pytest.approx(3.0)  # 3 drafted nodes: 2 + 1 levels fit
    # more siblings can only help
    assert expected_mal([0.4], 3, 3, 30) > expected_mal([0.4], 1, 3, 30)


def test_best_tree_follows_costs():
    accept = [0.6, 0.5, 0.4]
    flat = {1: 1.0, 8: 1.0, 16: 1.0, 64: 1.0}  # GPU-like: verification cost flat in tree size
    steep = {1: 1.0, 8: 6.0, 16: 12.0, 64: 48.0}  # CPU-like: linear
    big, _ = best_tree(flat, lambda n: 0.01, accept)
    small, table = best_tree(steep, lambda n: 0.01, accept)
    assert big["total_tokens"] > small["total_tokens"]
    assert all(r["speedup"] <= max(t["speedup"] for t in table) for r in table)
