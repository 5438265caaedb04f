"""Loading a plan holds no whole copy of it in process memory (issue 51): the plan file is mapped
(engines/trt_plans.map_plan) and hashed in slices, a 7B target's ~13 GB plan is not read into host
memory to check its sha256."""

import hashlib
import mmap
import os
import tracemalloc

import pytest

from lisa_trt.engines import trt_plans as P
from lisa_trt.errors import ArtifactMismatchError
from lisa_trt.models.io_spec import Graph


def _dir(tmp_path, n=48 << 20):
    plan, src = tmp_path / "vq_decode.plan", tmp_path / "vq_decode.onnx"
    plan.write_bytes(os.urandom(n))
    src.write_bytes(b"onnx")
    rec = {"graphs": {"vq_decode": {"plan": plan.name, "plan_sha256": hashlib.sha256(plan.read_bytes()).hexdigest(),
                                    "onnx": src.name, "onnx_sha256": P._sha256(src)}}}
    return plan, rec


def test_a_plan_is_hashed_from_its_mapping_not_read_whole(tmp_path):
    plan, rec = _dir(tmp_path)
    tracemalloc.start()
    data, g = P.load_plan(tmp_path, Graph.VQ_DECODE, check_env=False, record=rec)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert isinstance(data, mmap.mmap) and len(data) == plan.stat().st_size
    assert peak < (48 << 20) // 4, f"{peak} bytes allocated to load a {48 << 20}-byte plan"
    assert data[:16] == plan.read_bytes()[:16] and g["plan"] == plan.name
    with open(plan, "r+b") as f:  # a changed plan is still refused
        f.write(b"\0" * 8)
    with pytest.raises(ArtifactMismatchError, match="changed after the build"):
        P.load_plan(tmp_path, Graph.VQ_DECODE, check_env=False, record=rec)
