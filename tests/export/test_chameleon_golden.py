"""Token identity of Chameleon engine runs across refactors: a tiny fp32 bundle (trained drafter,
image-code tables, VQGAN), exported by `lisa-trt export` and decoded with every verification rule
through the generic Pipeline (one batch, one generator),
gives exactly the codes (and speculation statistics) recorded in data/chameleon_run_golden.json,
which were recorded before the Chameleon export and runners were folded into the generic layers."""

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("onnxruntime")

from chameleon_bundle import GOLDEN, export_cli, export_kwargs, golden_runs, make_chameleon_artifacts  # noqa: E402

pytestmark = pytest.mark.slow


def test_run_engine_tokens_match_the_recorded_golden(tmp_path):
    art = make_chameleon_artifacts(tmp_path / "art")
    export_cli(art["model_dir"], tmp_path / "eng", **export_kwargs(art))
    got = golden_runs(tmp_path / "eng", tmp_path / "runs")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key]["codes"] == want[key]["codes"], key
        assert got[key]["target_forwards"] == want[key]["target_forwards"], key
        assert got[key]["mal"] == pytest.approx(want[key]["mal"]), key
