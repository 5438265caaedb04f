"""Outputs complete or absent: stale staging cleaned, user files never deleted, resume hints."""

import json
import os
import subprocess
import sys
import time

import pytest

from lisa_trt.errors import InputError
from lisa_trt.export.staging import check_replaceable, clean_stale_staging, foreign_files, stale_staging


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_staging_of_dead_exports_is_removed(tmp_path):
    out = tmp_path / "eng"
    dead, live = _dead_pid(), os.getpid()
    stale = [tmp_path / f".eng.staging-{dead}-abcd1234", tmp_path / f"..eng.staging-{dead}-abcd1234.x1y2.partial"]
    running = tmp_path / f".eng.staging-{live}-00ff00ff"
    legacy_new = tmp_path / "..eng.staging-deadbeef.q.partial"
    legacy_old = tmp_path / "..eng.staging-cafebabe.q.partial"
    other = tmp_path / ".other.staging-1-abcd1234"
    for d in stale + [running, legacy_new, legacy_old, other]:
        d.mkdir()
        (d / "target.onnx").write_bytes(b"x" * 1000)
    old = time.time() - 7 * 3600
    os.utime(legacy_old, (old, old))
    assert set(stale_staging(out)) == set(stale + [legacy_old])
    removed = clean_stale_staging(out, echo=lambda m: None)
    assert set(removed) == set(stale + [legacy_old])
    assert running.is_dir() and legacy_new.is_dir() and other.is_dir()


def test_export_refuses_to_delete_user_files(tmp_path):
    out = tmp_path / "eng"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"files": {"tables": "tables.safetensors"},
                                                   "graphs": {"t": {"file": "t.onnx"}}}))
    (out / "t.onnx").write_bytes(b"x")
    (out / "tables.safetensors").write_bytes(b"x")
    (out / "target.plan").write_bytes(b"x")
    check_replaceable(out)  # only lisa-trt files: may be replaced
    (out / "my_notes.txt").write_text("mine")
    assert foreign_files(out) == ["my_notes.txt"]
    with pytest.raises(InputError, match="my_notes.txt"):
        check_replaceable(out)
    other = tmp_path / "plain"
    other.mkdir()
    (other / "a.txt").write_text("x")
    with pytest.raises(InputError, match="not a lisa-trt engine directory"):
        check_replaceable(other)


def test_export_bundle_checks_before_work(tmp_path, monkeypatch):
    from lisa_trt.export import export_bundle

    out = tmp_path / "eng"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    (out / "keep.txt").write_text("mine")
    called = []
    monkeypatch.setattr("lisa_trt.export.bundle.write_bundle", lambda *a, **k: called.append(1))
    with pytest.raises(InputError, match="keep.txt"):
        export_bundle(None, None, None, None, out, progress=False)
    assert not called and (out / "keep.txt").read_text() == "mine"  # refused before the writer ran


def test_resume_hint_and_eval_format(tmp_path):
    from lisa_trt.train.messages import format_eval, resume_hint

    h = resume_hint(tmp_path, 400, argv=["lisa-trt", "train", "--out", str(tmp_path)])
    assert "before the first checkpoint" in h and "lisa-trt train --out" in h
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest.json").write_text('{"step": 120, "file": "step_00000120.pt"}')
    h = resume_hint(tmp_path, 400, argv=["lisa-trt", "train", "--out", str(tmp_path)])
    assert "step 120 of 400" in h and "Resume from step 120" in h
    txt = format_eval({"mal_proxy": 1.534, "mal_top1": 1.61, "accept_s": [0.4, 0.2], "top1_s": [0.5, 0.3],
                       "depth": 2, "sequences": 16})
    assert "1.53 (sampled drafts)" in txt and "16 sequences" in txt and "{" not in txt
    assert "skipped" in format_eval({})
    txt = format_eval({"top1_h": [0.6, 0.3], "accept_h": [0.5, 0.25], "sequences": 3})  # Medusa heads
    assert "3 sequences, 2 Medusa heads" in txt and "0.50 0.25" in txt and "nan" not in txt
    assert "skipped" in format_eval({"top1_h": [], "accept_h": [], "sequences": 0})


def test_ctrl_c_in_train_prints_resume_hint(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from lisa_trt.cli import main
    from lisa_trt.demo.registry import assets_present

    if not assets_present():
        pytest.skip("bundled demo assets not built")

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("lisa_trt.train.trainer.train_drafter", interrupted)
    res = CliRunner().invoke(main, ["train", "--model", "demo", "--out", str(tmp_path / "run"), "--steps", "5"])
    assert res.exit_code == 130
    assert "training interrupted" in res.output and "same command" in res.output


def test_generate_defaults_to_the_backends_tuned_tree(tmp_path):
    """Without --tree-* options, generate uses the tree tuned for its backend (the small CPU tree
    on a CPU), not the 60-node GPU tree; explicit options still win."""
    import json

    import torch
    from click.testing import CliRunner

    from lisa_trt.cli import main
    from lisa_trt.demo.registry import assets_present
    from lisa_trt.runtime.autotune import CPU_TREE

    if not assets_present() or torch.cuda.is_available():
        pytest.skip("needs the bundled demo assets and a CPU-only machine")
    r = CliRunner().invoke(main, ["generate", "--model", "demo", "--classes", "1", "--verify", "exact",
                                  "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "a" / "stats.json").read_text())["tree"] == CPU_TREE
    r = CliRunner().invoke(main, ["generate", "--model", "demo", "--classes", "1", "--verify", "exact",
                                  "--tree-tokens", "6", "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "b" / "stats.json").read_text())["tree"]["total_tokens"] == 6
