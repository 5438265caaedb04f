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


def test_the_budget_a_gpu_run_picks_shrinks_when_the_gpus_peak_shrinks():
    """gpu_plan is the plan default_tree_budgets gets on a GPU run (runtime/context.tuned_tree): the same
    board with less dense compute turns verification compute-bound earlier, so the tree budget shrinks."""
    import dataclasses

    from lisa_trt.runtime.autotune import gpu_plan

    board = GPUS["rtx4090"]
    picked = []
    for scale in (1.0, 0.5, 0.25):
        g = dataclasses.replace(board, fp16_tflops=board.fp16_tflops * scale)
        plan = gpu_plan("Lumina-mGPT-7B", "trt", gpu=g)
        assert plan.peak_tflops == pytest.approx(board.fp16_tflops * scale) and plan.cfg
        picked.append(default_tree_budgets(None, plan=plan)["trt"]["total_tokens"])
    assert picked[0] == GPU_TREE["total_tokens"] > picked[1] > picked[2] >= 1, picked
    assert gpu_plan("Lumina-mGPT-7B", "ort", gpu=board) is None                  # a CPU backend: no GPU plan
    assert gpu_plan("no-such-model", "trt", gpu=board) is None                   # unplannable: the default stays


def test_gpu_plan_without_a_known_visible_gpu_is_none(monkeypatch):
    from lisa_trt.deploy import gpus
    from lisa_trt.runtime.autotune import gpu_plan

    monkeypatch.setattr(gpus, "visible_gpu", lambda: None)
    assert gpu_plan("Lumina-mGPT-7B", "trt") is None
    monkeypatch.setattr(gpus, "visible_gpu", lambda: GPUS["h100"])
    assert gpu_plan("Lumina-mGPT-7B", "trt").gpu == "h100"


@pytest.mark.parametrize("name,gib,key", [
    ("NVIDIA GeForce RTX 4090", 24, "rtx4090"), ("NVIDIA H100 80GB HBM3", 80, "h100"), ("NVIDIA H100 PCIe", 80, None),
    ("NVIDIA H200", 141, "h200"), ("NVIDIA A100-SXM4-80GB", 80, "a100-80"), ("NVIDIA A100-PCIE-40GB", 40, "a100-40"),
    ("NVIDIA A10", 24, "a10"), ("NVIDIA L4", 23, "l4"), ("Orin", 61, "orin-64"), ("NVIDIA GeForce RTX 3090", 24, None)])
def test_cuda_device_names_map_to_the_gpu_table(name, gib, key):
    from lisa_trt.deploy.gpus import GIB, gpu_from_cuda_name

    assert gpu_from_cuda_name(name, gib * GIB) == key
