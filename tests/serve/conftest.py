"""Shared fixtures: a tiny in-memory pipeline (torch backend; no export, no server)."""

import pytest

from lisa_trt.runtime.pipeline import Pipeline

GEN = {"sampling": {"cfg_scale": 2.0, "top_k": 0}, "class_names": [f"c{i}" for i in range(10)],
       "tree": {"default": {"top_k": 3, "depth": 2, "total_tokens": 8}}}


@pytest.fixture(scope="session")
def pipe(parts):
    """The tiny models of tests/conftest.py's `parts` in one in-memory Pipeline."""
    t, d, tables, vq = parts
    return Pipeline.from_models(t, d, tables, vq, class_names=GEN["class_names"], generation=GEN)
