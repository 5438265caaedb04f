"""`lisa-trt demo --out DIR` on an existing directory: an empty one or an earlier demo's is used
(its export is the cache); one holding other files (a summary.json of the user's own) is refused
before any work, with nothing written."""

import json

import pytest
from click.testing import CliRunner

from lisa_trt.cli import main
from lisa_trt.cli.misc import check_demo_out


@pytest.mark.parametrize("files", [{"notes.txt": "mine"}, {"summary.json": '{"mine": 1}'},
                                   {"summary.json": "not json"}])
def test_demo_refuses_a_directory_of_other_files(tmp_path, monkeypatch, files):
    import lisa_trt.runtime.demo

    ran = []
    monkeypatch.setattr(lisa_trt.runtime.demo, "run_demo", lambda *a, **k: ran.append(a))  # the work, stood in
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    r = CliRunner().invoke(main, ["demo", "--out", str(tmp_path), "--num-images", "1"])
    assert r.exit_code == 2 and "holds files the demo did not write" in r.output, r.output
    assert ran == [] and sorted(p.name for p in tmp_path.iterdir()) == sorted(files)
    assert {name: (tmp_path / name).read_text() for name in files} == files


def test_an_earlier_demo_output_or_an_empty_directory_is_accepted(tmp_path):
    check_demo_out(tmp_path / "new")
    check_demo_out(tmp_path)
    (tmp_path / "engines").mkdir()
    (tmp_path / ".engines.staging-1-ab").mkdir()  # an interrupted export's leftover
    (tmp_path / "vanilla_vs_lisa.png").write_bytes(b"\x89PNG")
    (tmp_path / "summary.json").write_text(json.dumps({"verify": "gasv", "results": {}, "deploy": "..."}))
    check_demo_out(tmp_path)
