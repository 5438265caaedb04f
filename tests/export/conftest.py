"""Session fixtures: tiny artifacts and one exported fp32 bundle of every graph."""

import pytest

from export_artifacts import make_artifacts


@pytest.fixture(scope="session")
def artifacts():
    return make_artifacts()


@pytest.fixture(scope="session")
def bundle(artifacts, tmp_path_factory):
    """fp32 export of every graph of the tiny c2i model (validated; lint off to keep it fast)."""
    from lisa_trt.export import export_bundle

    out = tmp_path_factory.mktemp("engines") / "tiny"
    man = export_bundle(artifacts["target"], artifacts["drafter"], artifacts["tables"], artifacts["vq"], out,
                        max_tree=16, lint=False, progress=False)
    return man
