"""The plan's floor per engine call is max(bytes / bandwidth, FLOPs / peak) (issue 51), shown in the
text and the JSON, with dense tensor-core peaks in the GPU table; the GPU tree budget stops where
verification turns compute-bound."""

import pytest

from lisa_trt.deploy.gpus import GPUS
from lisa_trt.deploy.memory_plan import make_plan
from lisa_trt.runtime.autotune import GPU_TREE, default_tree_budgets


def _plan(**kw):
    args = dict(gpu="rtx4090", precision="fp16", batch=1, tree=60, image_size=768, cfg=True, search=False)
    args.update(kw)
    return make_plan("Lumina-mGPT-7B", **args)


def test_the_gpu_table_has_dense_peaks():
    g = GPUS["rtx4090"]
    assert (g.fp16_tflops, g.fp8_tflops, g.int8_tops) == (165.2, 330.3, 660.6)   # Ada whitepaper, dense
    assert g.peak_tflops("fp16") == 165.2 and g.peak_tflops("int8") == 660.6 and g.peak_tflops("fp8") == 330.3
    assert GPUS["a100-80"].peak_tflops("fp8") == GPUS["a100-80"].fp16_tflops      # no fp8 tensor cores


def test_the_floor_is_the_larger_of_bandwidth_and_compute():
    p = _plan()
    d = p.to_dict()
    flops = p.step_flops["target"]
    assert 1.5e12 < flops < 2.0e12                      # issue 51: ~1.7 TFLOP for tree 60 with CFG
    assert d["compute_floor_ms"]["target"] == pytest.approx(1e3 * flops / 165.2e12, abs=1e-3)
    assert d["floor_ms"]["target"] == max(d["compute_floor_ms"]["target"], d["bandwidth_floor_ms"]["target"])
    assert "compute floor per step" in p.table() and "floor per step = max of both" in p.table()
    big = _plan(batch=2)                                # batch 2: compute overtakes the bandwidth floor
    assert big.compute_floor_ms["target"] > big.bandwidth_floor_ms["target"]
    assert big.floor_ms["target"] == big.compute_floor_ms["target"] and "compute-bound" in big.table()


def test_the_gpu_tree_budget_stops_where_verification_turns_compute_bound():
    p, big = _plan(), _plan(batch=2)
    assert big.compute_bound_tree < 60 < p.compute_bound_tree
    assert default_tree_budgets(None, plan=p)["trt"] == GPU_TREE
    capped = default_tree_budgets(None, plan=big)["trt"]
    assert capped["total_tokens"] == big.compute_bound_tree < GPU_TREE["total_tokens"]
    at_knee = _plan(batch=2, tree=capped["total_tokens"])
    assert at_knee.compute_floor_ms["target"] <= at_knee.bandwidth_floor_ms["target"] * 1.02
