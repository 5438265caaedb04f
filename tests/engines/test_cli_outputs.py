"""Issue 52: machine-readable output of plan / build, and one spelling of precision on export and plan."""

import json

import pytest
from click.testing import CliRunner

from lisa_trt.cli import main


def test_plan_json_dash_writes_stdout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["plan", "GPT-B", "--gpu", "h100", "--json", "-"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)  # stdout is the JSON alone; the table went to stderr
    assert plan["fits"] is True and "GPT-B" in r.stderr
    assert not (tmp_path / "-").exists()


def test_plan_json_file_still_written(tmp_path):
    r = CliRunner().invoke(main, ["plan", "GPT-B", "--gpu", "h100", "--json", str(tmp_path / "p.json")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "p.json").read_text())["fits"] is True and "wrote" in r.stdout


def test_build_verdict_of_a_real_build():
    from lisa_trt.deploy.build import build_verdict

    rec = {"tensorrt_version": "10.9", "graphs": {"target_verify": {"profiles": [{}, {}], "build_seconds": 61.2},
                                                  "gasv": {"profiles": [{}], "build_seconds": 3.0}}}
    line = build_verdict(rec, "eng")
    assert line.startswith("built 2 engine(s) in eng with TensorRT 10.9 in 64 s") and "\n" not in line


@pytest.fixture
def export_args(monkeypatch):
    from lisa_trt.runtime.commands import export as E

    seen = {}

    def entry(rc, **kw):
        seen.update(fp16=kw["fp16"], quantize=kw["quantize"])

    monkeypatch.setattr(E, "export", entry)
    return seen


@pytest.mark.parametrize("args,want", [(["--precision", "fp16"], (True, "none")), (["--fp16"], (True, "none")),
                                       (["--precision", "int8"], (False, "int8")),
                                       (["--quantize", "int4"], (False, "int4")),
                                       (["--precision", "fp32"], (False, "none")), ([], (False, "none")),
                                       (["--precision", "fp16", "--fp16"], (True, "none"))])
def test_export_takes_plans_precision_spelling(tmp_path, export_args, args, want):
    r = CliRunner().invoke(main, ["export", "--model", "demo", "--out", str(tmp_path / "e"), *args])
    assert r.exit_code == 0, r.output
    assert (export_args["fp16"], export_args["quantize"]) == want


def test_export_refuses_contradicting_precisions(tmp_path, export_args):
    r = CliRunner().invoke(main, ["export", "--model", "demo", "--out", str(tmp_path / "e"), "--precision", "fp32",
                                  "--fp16"])
    assert r.exit_code == 2 and "contradicts --fp16" in r.output and not export_args


def test_export_refuses_a_precision_it_does_not_write(tmp_path, export_args):
    r = CliRunner().invoke(main, ["export", "--model", "demo", "--out", str(tmp_path / "e"), "--precision", "fp8"])
    assert r.exit_code == 2 and "an export writes fp32, fp16, int8, int4" in r.output and "quantize-trt" in r.output
    assert not export_args


def test_every_export_precision_is_a_plan_precision():
    from lisa_trt.cli.export import EXPORT_PRECISIONS
    from lisa_trt.deploy.memory_plan import PRECISIONS

    assert set(EXPORT_PRECISIONS) <= set(PRECISIONS)
