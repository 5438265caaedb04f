"""The PTX the TensorRT plugin ships (trt_plugin.aot_kernel: PTX ISA 8.4, sm_89, the RTX 4090's), not
Triton's default version, assembled by ptxas (issue 51): it assembles for sm_89, and its registers
and spills are recorded in bench/shipped_ptx.json. Skips cleanly without ptxas or Triton's compiler."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

gt = pytest.importorskip("lisa_trt.engines.plugins.gasv_triton")
from lisa_trt.engines.plugins import trt_plugin as tp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _ptxas():
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        p = get_ptxas(89).path
        return p if os.path.exists(p) else None
    except Exception:
        return None


@pytest.mark.skipif(gt.interpreting(), reason="PTX compilation needs the real Triton compiler")
def test_the_shipped_ptx_assembles_for_sm_89_without_spills(tmp_path):
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("no ptxas on PATH nor in Triton (install the CUDA toolkit's ptxas)")
    k = tp.aot_kernel(V=16384, H=1280, C=256, KW=64, sm=89)
    version = re.search(r"^\.version (\d+)\.(\d+)", k.ptx, re.M)
    assert version and int(version.group(1)) * 10 + int(version.group(2)) == tp.PTX_VERSION == 84
    assert re.search(r"^\.target sm_89", k.ptx, re.M)
    src = tmp_path / "gasv.ptx"
    src.write_text(k.ptx)
    proc = subprocess.run([ptxas, "-v", "--gpu-name=sm_89", str(src), "-o", os.devnull],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    regs = re.search(r"Used (\d+) registers", proc.stderr)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", proc.stderr)
    assert regs and spills, proc.stderr
    ver = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    record = {"kernel": k.name, "ptx_version": "8.4", "gpu_name": "sm_89", "ptxas": ver,
              "registers": int(regs.group(1)), "spill_stores": int(spills.group(1)),
              "spill_loads": int(spills.group(2)), "block_x": k.block_x, "shared_mem": k.shared_mem}
    assert record["spill_stores"] == 0 and record["spill_loads"] == 0, record
    assert record["registers"] <= 255
    out = ROOT / "bench" / "shipped_ptx.json"
    if os.environ.get("LISA_RECORD_PTX") == "1":  # refresh the record: LISA_RECORD_PTX=1 pytest this file
        out.write_text(json.dumps(record, indent=1) + "\n")
    if out.is_file():
        rec = json.loads(out.read_text())
        assert rec["registers"] == record["registers"] or rec["ptxas"] != record["ptxas"], (rec, record)
