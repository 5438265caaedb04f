"""Issue 52: `lisa-trt calibrate` stores the quality-neutral knobs the README's frontier names
(the bundled tables' kappa 2, lambda 0.4, delta 0.3), from one source (CALIBRATION_GASV)."""

import inspect
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from lisa_trt.calibration import profile
from lisa_trt.calibration.profile import CALIBRATION_GASV

README = Path(__file__).resolve().parents[2] / "README.md"


class Stop(Exception):
    pass


def _bundled_knobs():
    from lisa_trt.calibration.tables import load_tables
    from lisa_trt.models.artifact_sets import bundled_file

    path = bundled_file("demo", "tables")
    if path is None or not path.is_file():
        pytest.skip("the bundled demo assets are absent")
    c = load_tables(path).config
    return c.kappa, c.lam, c.delta


def test_the_defaults_are_the_bundled_tables_knobs():
    assert (CALIBRATION_GASV.kappa, CALIBRATION_GASV.lam, CALIBRATION_GASV.delta) == _bundled_knobs()
    assert inspect.signature(profile.calibrate).parameters["gasv"].default is CALIBRATION_GASV


def test_the_readme_frontier_marks_them_the_shipped_quality_neutral_point():
    rows = [ln for ln in README.read_text().splitlines() if "shipped default" in ln and ln.startswith("|")]
    assert len(rows) == 1, rows
    k, lam, d = (float(x) for x in re.search(r"κ ([\d.]+), λ ([\d.]+), δ ([\d.]+)", rows[0]).groups())
    assert (k, lam, d) == (CALIBRATION_GASV.kappa, CALIBRATION_GASV.lam, CALIBRATION_GASV.delta)
    assert rows[0].rstrip(" |").split("|")[-1].strip().lstrip("*").startswith("yes"), rows[0]


def _stored(monkeypatch, tmp_path, *args):
    from lisa_trt.cli import main

    seen = {}

    def run(target, codebook, **kw):
        seen.update(kw["gasv"].to_dict())
        raise Stop()

    monkeypatch.setattr(profile, "calibrate", run)
    r = CliRunner().invoke(main, ["calibrate", "--model", "demo", "--vq", "demo", "--out",
                                  str(tmp_path / "t.safetensors"), *args])
    assert isinstance(r.exception, Stop), r.output
    return seen


def test_the_cli_stores_them_unless_given(monkeypatch, tmp_path):
    got = _stored(monkeypatch, tmp_path)
    assert (got["kappa"], got["lam"], got["delta"]) == _bundled_knobs()
    got = _stored(monkeypatch, tmp_path, "--kappa", "0.5", "--delta", "1")
    assert (got["kappa"], got["lam"], got["delta"]) == (0.5, CALIBRATION_GASV.lam, 1.0)
