"""The README's Python code blocks run as written (each in a fresh interpreter, in a temp dir).

A block that opens the demo export (`lisa-trt-demo/engines`) first gets one made by
`ensure_demo_bundle`, which takes about a minute: that case is marked slow.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[str]:
    return BLOCK.findall(README.read_text())


def _params():
    out = []
    for i, code in enumerate(python_blocks()):
        marks = [pytest.mark.slow] if "lisa-trt-demo/engines" in code else []
        out.append(pytest.param(code, id=f"block{i}", marks=marks))
    return out


def test_readme_has_python_blocks():
    blocks = python_blocks()
    assert len(blocks) >= 2 and any("Pipeline" in b for b in blocks)


@pytest.mark.parametrize("code", _params())
def test_readme_block_runs(code, tmp_path):
    from lisa_trt.demo.registry import assets_present

    if not assets_present():
        pytest.skip("bundled demo assets not built")
    if "lisa-trt-demo/engines" in code:
        from lisa_trt.runtime.demo import ensure_demo_bundle

        ensure_demo_bundle(tmp_path / "lisa-trt-demo" / "engines", echo=lambda *_: None)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "LISA_TRT_THREADS": os.environ.get("LISA_TRT_THREADS", "1")}
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, f"README block failed:\n{code}\n--- stderr ---\n{p.stderr[-3000:]}"
