"""Issue 52: every command that writes an artifact refuses an existing one without --overwrite
(io.refuse_existing, the one rule), before any work: no model is resolved or loaded."""

import json

import pytest
from click.testing import CliRunner

from lisa_trt.cli import main
from lisa_trt.errors import InputError
from lisa_trt.io import refuse_existing


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a command gets as far as resolving its model / engine directory."""
    from lisa_trt.runtime import context

    def resolve(*a, **kw):
        raise AssertionError("the command started work before refusing the existing artifact")

    monkeypatch.setattr(context, "resolve", resolve)


class Started(Exception):
    pass


@pytest.fixture
def started(monkeypatch):
    """resolve() raises Started: the command got past its overwrite check."""
    from lisa_trt.runtime import context

    def resolve(*a, **kw):
        raise Started()

    monkeypatch.setattr(context, "resolve", resolve)


def _refused(r, path):
    assert r.exit_code == 2, r.output
    assert str(path) in r.output and "--overwrite" in r.output and "nothing was done" in r.output
    assert "Traceback" not in r.output


def test_the_rule(tmp_path):
    refuse_existing(tmp_path / "new", overwrite=False)  # missing: fine
    (tmp_path / "empty").mkdir()
    refuse_existing(tmp_path / "empty", overwrite=False)  # an empty folder holds nothing to lose
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="--overwrite"):
        refuse_existing(tmp_path / "f", overwrite=False)
    refuse_existing(tmp_path / "f", overwrite=True)
    with pytest.raises(InputError, match="holds engines"):
        refuse_existing(tmp_path / "empty", overwrite=False, exists=lambda p: True, what="holds engines")


def test_export_refuses_an_existing_out_before_loading_anything(tmp_path, no_work):
    out = tmp_path / "eng"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    # the model does not even exist: the overwrite refusal comes first
    r = CliRunner().invoke(main, ["export", "--model", str(tmp_path / "missing.safetensors"), "--out", str(out)])
    _refused(r, out)
    assert (out / "manifest.json").read_text() == "{}"


def test_export_with_overwrite_goes_on(tmp_path, started):
    out = tmp_path / "eng"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    r = CliRunner().invoke(main, ["export", "--model", "demo", "--out", str(out), "--overwrite"])
    assert isinstance(r.exception, Started), r.output
    r = CliRunner().invoke(main, ["export", "--model", "demo", "--out", str(tmp_path / "new")])
    assert isinstance(r.exception, Started), r.output


def test_calibrate_refuses_an_existing_tables_file(tmp_path, no_work):
    out = tmp_path / "tables.safetensors"
    out.write_bytes(b"old")
    r = CliRunner().invoke(main, ["calibrate", "--model", "demo", "--vq", "demo", "--out", str(out)])
    _refused(r, out)
    assert out.read_bytes() == b"old"


def test_calibrate_with_overwrite_goes_on(tmp_path, started):
    out = tmp_path / "tables.safetensors"
    out.write_bytes(b"old")
    r = CliRunner().invoke(main, ["calibrate", "--model", "demo", "--vq", "demo", "--out", str(out), "--overwrite"])
    assert isinstance(r.exception, Started), r.output


def _bundle(tmp_path, built: bool):
    d = tmp_path / ("built" if built else "fresh")
    d.mkdir()
    man = {"format": "x"}
    if built:
        man["engines"] = {"graphs": {"target_verify": {"plan": "target_verify.plan"}}}
    (d / "manifest.json").write_text(json.dumps(man))
    return d


def test_build_refuses_built_engines_before_any_work(tmp_path, no_work):
    d = _bundle(tmp_path, built=True)
    r = CliRunner().invoke(main, ["build", str(d)])
    _refused(r, d)
    assert "built TensorRT engines" in r.output


def test_build_goes_on_when_nothing_is_built_with_overwrite_or_dry_run(tmp_path, started):
    for args in (["build", str(_bundle(tmp_path, built=False))],
                 ["build", str(_bundle(tmp_path, built=True)), "--overwrite"],
                 ["build", str(tmp_path / "built"), "--dry-run"]):  # a dry run writes nothing
        r = CliRunner().invoke(main, args)
        assert isinstance(r.exception, Started), (args, r.output)


def test_quantize_trt_refuses_an_existing_out(tmp_path, monkeypatch):
    from lisa_trt.runtime.commands import export as E

    monkeypatch.setattr(E, "quantize_trt", lambda *a, **kw: pytest.fail("started"))
    src, out = _bundle(tmp_path, built=False), tmp_path / "q"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    _refused(CliRunner().invoke(main, ["quantize-trt", str(src), "--mode", "int8", "--out", str(out)]), out)


def test_random_checkpoint_and_convert_refuse_an_existing_file(tmp_path, monkeypatch):
    from lisa_trt.runtime.commands import checkpoints as C

    out = tmp_path / "t.pt"
    r = CliRunner().invoke(main, ["random-checkpoint", str(out), "--config", "tiny"])
    assert r.exit_code == 0, r.output
    before = out.read_bytes()
    _refused(CliRunner().invoke(main, ["random-checkpoint", str(out), "--config", "tiny", "--seed", "1"]), out)
    assert out.read_bytes() == before
    r = CliRunner().invoke(main, ["random-checkpoint", str(out), "--config", "tiny", "--seed", "1", "--overwrite"])
    assert r.exit_code == 0, r.output
    assert out.read_bytes() != before
    monkeypatch.setattr(C, "convert", lambda *a, **kw: pytest.fail("started"))
    dst = tmp_path / "t.safetensors"
    dst.write_bytes(b"old")
    _refused(CliRunner().invoke(main, ["convert", str(out), str(dst), "--config", "tiny"]), dst)


def test_triton_repo_refuses_an_existing_repository(tmp_path, monkeypatch):
    """triton-repo replaced a repository it had written before without a word: now refused, before
    anything is written, unless --overwrite."""
    from lisa_trt.serve import repo as R

    written = []
    monkeypatch.setattr(R, "write_triton_repo", lambda eng, dst, **kw: written.append(dst) or dst)
    eng, dst = tmp_path / "eng", tmp_path / "repo"
    eng.mkdir()
    (dst / "lisa").mkdir(parents=True)
    (dst / "lisa" / "config.pbtxt").write_text('name: "lisa"')
    _refused(CliRunner().invoke(main, ["triton-repo", str(eng), str(dst)]), dst)
    assert written == []
    r = CliRunner().invoke(main, ["triton-repo", str(eng), str(dst), "--overwrite"])
    assert r.exit_code == 0, r.output
    assert [str(p) for p in written] == [str(dst)]


def test_encode_captions_refuses_an_existing_file_before_the_encoder_loads(tmp_path, monkeypatch):
    from lisa_trt.models import captions as C

    loads = []

    def encoder(*a, **kw):
        loads.append(1)
        raise Started()

    monkeypatch.setattr(C, "caption_encoder", encoder)
    (tmp_path / "c.txt").write_text("a red car\n")
    out = tmp_path / "f.safetensors"
    out.write_bytes(b"old")
    args = ["encode-captions", str(tmp_path / "c.txt"), "--encoder", str(tmp_path), "--out", str(out)]
    _refused(CliRunner().invoke(main, args), out)
    assert out.read_bytes() == b"old" and loads == []
    r = CliRunner().invoke(main, [*args, "--overwrite"])
    assert isinstance(r.exception, Started) and loads == [1]  # past the rule: the encoder was asked for
