"""bench/gpu_check.py's first-GPU-run checklist (docs/tensorrt.md), its pure parts on fake inputs: the
engine inspector's layer list read for fused attention, a step against the plan's floor, device memory
against the plan, token parity; and the CUDA-graph section skipping with its reason where no GPU is.

The inspector reports below are written in the layout IEngineInspector.get_engine_information(
LayerInformationFormat.JSON) returns ({"Layers": [...], "Bindings": [...]}; with DETAILED profiling
verbosity each layer a dict with Name, LayerType, TacticName; without it, names only)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check_pure", ROOT / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


FUSED = {"Layers": [
    {"Name": "/layers.0/attention/wqkv/MatMul", "LayerType": "gemm", "TacticName": "sm89_xmma_gemm"},
    {"Name": "{ForeignNode[/layers.0/attention/Mul.../layers.0/attention/MatMul_1]}", "LayerType": "Myelin",
     "TacticName": "_gemm_mha_v2"},
    {"Name": "/layers.0/attention/wo/MatMul", "LayerType": "gemm", "TacticName": "sm89_xmma_gemm"}],
    "Bindings": ["input_ids", "logits"]}
UNFUSED = {"Layers": [
    {"Name": "/layers.0/attention/MatMul", "LayerType": "MatrixMultiply", "TacticName": "sm89_xmma_gemm"},
    {"Name": "/layers.0/attention/Softmax", "LayerType": "SoftMax", "TacticName": "softmax_kernel"},
    {"Name": "/layers.0/attention/MatMul_1", "LayerType": "MatrixMultiply", "TacticName": "sm89_xmma_gemm"}],
    "Bindings": ["input_ids", "logits"]}


def test_the_inspector_report_says_whether_attention_fused(gc):
    fused = gc.attention_fusion(json.dumps(FUSED), attentions=1)   # the JSON string the inspector returns
    assert fused["fused"] is True and fused["n_standalone_softmax"] == 0 and len(fused["fused_layers"]) == 1
    unfused = gc.attention_fusion(UNFUSED, attentions=1)
    assert unfused["fused"] is False and unfused["standalone_softmax"] == ["/layers.0/attention/Softmax"]
    # a Myelin region somewhere does not excuse a standalone softmax left beside it
    both = {"Layers": FUSED["Layers"] + UNFUSED["Layers"][1:2]}
    assert gc.attention_fusion(both, attentions=2)["fused"] is False
    names_only = {"Layers": [layer["Name"] for layer in UNFUSED["Layers"]]}  # built without DETAILED
    assert gc.attention_fusion(names_only, attentions=1)["fused"] is None
    assert gc.attention_fusion({"Layers": UNFUSED["Layers"][:1]}, attentions=0)["fused"] is True  # none to fuse
    with pytest.raises(ValueError, match="Layers"):
        gc.inspector_layers({"Bindings": []})


def test_step_against_the_floor_and_memory_against_the_plan(gc):
    r = gc.floor_check(20.0, {"target": 16.0, "drafter": 1.0})
    assert r["ratio"] == 1.25 and r["floor_ms"] == 16.0 and not r["below_floor"]
    assert gc.floor_check(10.0, {"target": 16.0})["below_floor"]          # faster than the floor: the plan is off
    none = gc.floor_check(5.0, {})
    assert none["ratio"] is None and "no floor" in none["reason"]
    m = gc.memory_check(3 * 2 ** 30, 4 * 2 ** 30)
    assert m["within"] and m["ratio"] == 0.75 and m["plan_gib"] == 4.0
    assert not gc.memory_check(5 * 2 ** 30, 4 * 2 ** 30)["within"]


def test_token_parity(gc):
    a = torch.tensor([[1, 2, 3, 4]])
    assert gc.token_parity(a, a.clone()) == {"identical": True, "agreement": 1.0}
    r = gc.token_parity(a, torch.tensor([[1, 2, 0, 4]]))
    assert not r["identical"] and r["agreement"] == 0.75
    assert gc.token_parity(a, a[:, :2])["identical"] is False


def test_cuda_graph_and_tensorrt_sections_skip_with_their_reason_without_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the sections run")
    out = tmp_path / "gc.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), str(out), "--cpu-smoke",
                        "--sections", "cuda_graph,tensorrt"], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    sections = json.loads(out.read_text())["sections"]
    assert sections["cuda_graph"]["status"] == "skipped" and "no CUDA" in sections["cuda_graph"]["skipped"]
    trt = sections["tensorrt"]
    assert trt["status"] == "skipped" and trt["available"] is False and trt["skipped"]
