"""Tokens of every recorded decode path equal the pre-refactor tokens (tests/golden/cases.py)."""

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import cases  # noqa: E402  (tests/golden is on sys.path via rootdir conftest / this directory)

GOLDEN = json.loads((Path(__file__).parent / "tokens.json").read_text())


@pytest.fixture(scope="module")
def llamagen():
    return cases.llamagen_setup()


@pytest.fixture(scope="module")
def chameleon(tmp_path_factory):
    return cases.chameleon_setup(tmp_path_factory.mktemp("golden"))


@pytest.mark.parametrize("case", sorted(cases.LLAMAGEN))
def test_llamagen_tokens_unchanged(llamagen, case):
    assert cases.LLAMAGEN[case](llamagen).tolist() == GOLDEN["llamagen"][case]


@pytest.mark.parametrize("case", sorted(cases.CHAMELEON))
def test_chameleon_tokens_unchanged(chameleon, case):
    assert cases.CHAMELEON[case](chameleon).tolist() == GOLDEN["chameleon"][case]
