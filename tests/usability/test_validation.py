"""Validate before work: bad settings, counts and output paths fail fast (< 5 s), clearly, writing nothing."""

import json
import os

import pytest
from click.testing import CliRunner

from lisa_trt.cli import main
from lisa_trt.errors import InputError
from lisa_trt.validation import (check_out_dir, check_positive, check_sampling, probe_writable_dir,
                                 probe_writable_file, sampling_problems)


def test_sampling_ranges():
    assert sampling_problems(cfg_scale=0.0, temperature=0.5, top_k=0, top_p=1.0, vocab_size=10) == []
    assert sampling_problems(top_k=10, vocab_size=10) == []
    bad = dict(cfg_scale=-1.0, temperature=0.0, top_k=11, top_p=1.5)
    msgs = sampling_problems(vocab_size=10, **bad)
    assert len(msgs) == 4 and "--cfg-scale" in msgs[0] and "vocabulary" in msgs[3]
    assert sampling_problems(top_p=0.0) and sampling_problems(temperature=-2) and sampling_problems(top_k=-1)
    assert sampling_problems(cfg_scale=float("nan"))
    with pytest.raises(InputError, match="nothing was generated"):
        check_sampling(temperature=0)


def test_counts():
    check_positive(1, "--n")
    check_positive(0, "--n", allow_zero=True)
    for v in (0, -3, 1.5, True):
        with pytest.raises(InputError, match="--n must be an integer"):
            check_positive(v, "--n")


def test_probes_create_nothing(tmp_path):
    target = tmp_path / "a" / "b"
    probe_writable_dir(target)
    probe_writable_file(target / "x.json")
    assert list(tmp_path.iterdir()) == []
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InputError, match="is a file"):
        probe_writable_dir(f / "sub")
    with pytest.raises(InputError, match="is a directory"):
        probe_writable_file(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes everywhere")
def test_readonly_dir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(InputError, match="not writable"):
            probe_writable_dir(ro / "out")
    finally:
        ro.chmod(0o700)


def test_out_dir_must_be_empty_unless_overwrite(tmp_path):
    check_out_dir(tmp_path / "new")
    (tmp_path / "old.png").write_bytes(b"x")
    with pytest.raises(InputError, match="--overwrite"):
        check_out_dir(tmp_path)
    check_out_dir(tmp_path, overwrite=True)


def _fails_fast(args, match, tmp_path, inp=None):
    """The command refuses `args` before any work: no model runs a forward pass (every torch module
    call raises here, which would end the command with exit 1, not the usage error's 2) and nothing
    is written."""
    import torch

    def no_work(self, *a, **k):
        raise AssertionError(f"{type(self).__name__} ran before the bad input was refused")

    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.Module, "__call__", no_work)
        res = CliRunner().invoke(main, args, input=inp)
    assert res.exit_code == 2, (res.output, res.exception)
    assert match in res.output, res.output
    assert "Traceback" not in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # wrote nothing
    return res


UNWRITABLE = "/proc/lisa-trt-cannot-write-here"


@pytest.mark.parametrize("args,match", [
    (["generate", "--model", "demo", "--classes", "0", "--cfg-scale", "-1"], "--cfg-scale"),
    (["generate", "--model", "demo", "--classes", "0", "--temperature", "0"], "--temperature"),
    (["generate", "--model", "demo", "--classes", "0", "--top-p", "1.5"], "--top-p"),
    (["generate", "--model", "demo", "--classes", "0", "--top-k", "5000"], "vocabulary"),
    (["generate", "--model", "demo", "--classes", "0", "--vq", "BAD"], "BAD"),
    (["generate", "--model", "demo", "--classes", "0", "--out", UNWRITABLE], "cannot write"),
    (["calibrate", "--model", "demo", "--rollouts", "0", "--out", "t.safetensors"], "--rollouts"),
    (["calibrate", "--model", "demo", "--out", UNWRITABLE + "/t.safetensors"], "cannot write"),
    (["train", "--model", "demo", "--out", UNWRITABLE], "cannot write"),
    (["train", "--model", "demo", "--out", "run", "--steps", "0"], "--steps"),
    (["bench", "--model", "demo", "--num-images", "0", "--json", "b.json"], "--num-images"),
    (["bench", "--model", "demo", "--num-images", "-3", "--json", "b.json"], "--num-images"),
    (["bench", "--model", "demo", "--json", UNWRITABLE + "/b.json"], "cannot write"),
    (["demo", "--num-images", "0"], "--num-images"),
    (["demo", "--out", UNWRITABLE], "cannot write"),
    (["export", "--model", "demo", "--out", UNWRITABLE], "cannot write"),
])
def test_cli_bad_input_fails_fast(tmp_path, monkeypatch, args, match):
    from lisa_trt.demo.registry import assets_present

    if not assets_present():
        pytest.skip("bundled demo assets not built")
    monkeypatch.chdir(tmp_path)
    if "--out" not in args and args[0] in ("generate",):
        args = args + ["--out", str(tmp_path / "o")]
    _fails_fast(args, match, tmp_path)


def test_generate_refuses_non_empty_out(tmp_path):
    from lisa_trt.demo.registry import assets_present

    if not assets_present():
        pytest.skip("bundled demo assets not built")
    (tmp_path / "img_0000.png").write_bytes(b"old")
    _fails_fast(["generate", "--model", "demo", "--classes", "0", "--out", str(tmp_path)], "--overwrite", tmp_path)


def test_run_validates_before_loading(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"class": 0, "cfg": -2}) + "\n")
    from lisa_trt.runtime.prompts import parse_prompts

    with pytest.raises(InputError, match=r"p.jsonl:1: cfg must be a number >= 0"):
        parse_prompts(prompts, num_classes=8)
    eng = tmp_path / "eng"
    eng.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.png").write_bytes(b"x")
    res = CliRunner().invoke(main, ["run", str(eng), str(prompts), "--out", str(out)])
    assert res.exit_code == 2 and "--overwrite" in res.output
    res = CliRunner().invoke(main, ["run", str(eng), str(prompts), "--out", str(tmp_path / "o2"), "--top-p", "0"])
    assert res.exit_code == 2 and "--top-p" in res.output


def test_pipeline_generate_checks_sampling():
    import lisa_trt
    from lisa_trt.families.llamagen.model import Transformer

    import torch

    pipe = lisa_trt.Pipeline.from_models(Transformer(lisa_trt.target_config("tiny")).eval())

    def no_work(self, *a, **k):
        raise AssertionError(f"{type(self).__name__} ran before the bad sampling setting was refused")

    for kw, match in ((dict(cfg_scale=-1.0), "cfg"), (dict(temperature=0.0), "temperature"),
                      (dict(top_p=2.0), "top_p="), (dict(top_k=10_000), "vocabulary")):
        with pytest.MonkeyPatch.context() as mp, pytest.raises(InputError, match=match):
            mp.setattr(torch.nn.Module, "__call__", no_work)  # refused before any forward pass
            pipe.generate([0], verify="vanilla", **kw)


def test_fd_with_one_image_is_nan_not_a_crash():
    import math

    import torch

    from lisa_trt.demo.registry import assets_present, score_images
    from lisa_trt.demo.scorer import quality_label

    assert "not measured" in quality_label(1) and "indicative" in quality_label(8) and quality_label(64) == "64 images"
    if not assets_present():
        pytest.skip("bundled demo assets not built")
    with pytest.warns(UserWarning, match="at least 2 images"):
        acc, fd = score_images(torch.zeros(1, 3, 64, 64), torch.tensor([0]))
    assert math.isnan(fd) and 0.0 <= acc <= 1.0


def test_overwrite_clears_only_our_outputs(tmp_path):
    from lisa_trt.validation import clear_previous_outputs

    for name in ("img_0000.png", "img_0001_line3.png", "tokens.npy", "stats.json", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    removed = clear_previous_outputs(tmp_path)
    assert len(removed) == 4 and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_bench_with_one_image_reports_fd_na(tmp_path):
    from lisa_trt.demo.registry import assets_present

    if not assets_present():
        pytest.skip("bundled demo assets not built")
    res = CliRunner().invoke(main, ["bench", "--model", "demo", "--methods", "vanilla", "--num-images", "1",
                                    "--json", str(tmp_path / "b.json")])
    assert res.exit_code == 0, res.output
    assert "FD-demo n/a" in res.output and "indicative" in res.output
