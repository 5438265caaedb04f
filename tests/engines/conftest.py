"""Shared fixtures of the engine tests: the tiny export artifacts and one full bundle made from them
(test modules that need a different bundle define their own `artifacts` / `bundle`, which win)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from export_artifacts import make_artifacts  # noqa: E402


@pytest.fixture(scope="module")
def artifacts():
    return make_artifacts()


@pytest.fixture(scope="module")
def bundle(artifacts, tmp_path_factory):
    """Every graph of the tiny artifacts (target, drafter, GASV, VQ), no validation or lint."""
    from lisa_trt.export import export_bundle

    a = artifacts
    out = tmp_path_factory.mktemp("engines") / "eng"
    export_bundle(a["target"], a["drafter"], a["tables"], a["vq"], out, max_tree=16, progress=False,
                       lint=False, validate=False)
    return out
