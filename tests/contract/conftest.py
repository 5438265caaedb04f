"""Contract tests: lisa-trt's TensorRT code checked by the vendors' own Python code.

NVIDIA's `tensorrt.plugin` package comes from the `tensorrt-cu12-bindings` wheels that `.ci/run`
downloads (never vendored) into `.cache/trt-bindings/<version>/`; Polygraphy is installed.
Locally the plugin contract tests skip with the command that fetches the wheels; with
LISA_CONTRACT_REQUIRED=1 (set by .ci/run) a missing wheel FAILS the test instead.
"""

import os

import pytest

from trt_core import VERSIONS, plugin_dir

FETCH = ("python scripts/fetch_trt_bindings.py  (pip download --no-deps tensorrt-cu12-bindings==<version>, "
         "unzipped into .cache/trt-bindings/<version>/; what .ci/run does)")


@pytest.fixture(params=VERSIONS)
def trt_bindings(request):
    """The version of an unpacked tensorrt-cu12-bindings wheel (skips / fails when absent)."""
    v = request.param
    if not (plugin_dir(v) / "_lib.py").is_file():
        msg = f"tensorrt-cu12-bindings {v} is not unpacked in .cache/trt-bindings; fetch it with {FETCH}"
        if os.environ.get("LISA_CONTRACT_REQUIRED") == "1":
            pytest.fail(msg + " (LISA_CONTRACT_REQUIRED=1: CI must run the contract tests)")
        pytest.skip(msg)
    return v
