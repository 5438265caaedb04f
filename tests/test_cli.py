"""CLI smoke tests: help, convert, random checkpoints, generate, clear errors."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from lisa_trt.cli import main


@pytest.fixture
def runner():
    return CliRunner()


def test_help_lists_commands(runner):
    r = runner.invoke(main, ["--help"])
    assert r.exit_code == 0
    for cmd in ["convert", "generate", "random-checkpoint"]:
        assert cmd in r.output


def test_random_checkpoint_convert_generate(runner, tmp_path):
    pt, st = tmp_path / "tiny.pt", tmp_path / "tiny.safetensors"
    r = runner.invoke(main, ["random-checkpoint", str(pt), "--config", "tiny"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["convert", str(pt), str(st), "--config", "tiny"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "tiny.json").read_text())["config"]["dim"] == 64
    out = tmp_path / "out"
    r = runner.invoke(main, ["generate", "--model", str(st), "--classes", "1,2,3", "--cfg-scale", "2",
                             "--top-k", "10", "--out", str(out)])
    assert r.exit_code == 0, r.output
    toks = np.load(out / "tokens.npy")
    assert toks.shape == (3, 16) and toks.max() < 256


def test_generate_with_vq_writes_pngs(runner, tmp_path):
    pt, vq = tmp_path / "tiny.pt", tmp_path / "vq.pt"
    runner.invoke(main, ["random-checkpoint", str(pt), "--config", "tiny"])
    import torch

    from lisa_trt.models.target_config import vq_config
    from lisa_trt.families.llamagen.vq import VQModel

    cfg = vq_config("VQ-16", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32,
                    codebook_size=256)
    torch.save({"model": VQModel(cfg).state_dict()}, vq)
    from lisa_trt.models.checkpoints import load_vq, save_model

    save_model(load_vq(str(vq), cfg), cfg, tmp_path / "vq.safetensors")
    out = tmp_path / "o"
    r = runner.invoke(main, ["generate", "--model", str(pt), "--config", "tiny", "--classes", "0,1",
                             "--vq", str(tmp_path / "vq.safetensors"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.glob("*.png")) == ["img_0000.png", "img_0001.png"]


def test_clear_errors(runner, tmp_path):
    pt = tmp_path / "tiny.pt"
    runner.invoke(main, ["random-checkpoint", str(pt), "--config", "tiny"])
    r = runner.invoke(main, ["generate", "--model", str(pt), "--config", "tiny", "--classes", "3,99"])
    assert r.exit_code == 2 and "unknown class id 99" in r.output and "0..9" in r.output
    r = runner.invoke(main, ["generate", "--model", str(pt), "--config", "GPT-Z", "--classes", "1"])
    assert r.exit_code == 2 and "GPT-B" in r.output
    r = runner.invoke(main, ["generate", "--model", str(pt), "--config", "GPT-B", "--classes", "1"])
    assert r.exit_code == 2 and "missing keys" in r.output and "Traceback" not in r.output


def test_generate_runs_the_jacobi_decoders_and_passes_their_knobs(runner, tmp_path):
    """`--verify mcsjd` and `--verify gsd --gsd-group N` (a knob registered by gsd.py): the knob
    reaches the rule (group 1 is SJD token for token; a wide group changes the tokens)."""
    pt = tmp_path / "tiny.pt"
    assert runner.invoke(main, ["random-checkpoint", str(pt), "--config", "tiny"]).exit_code == 0
    toks = {}
    for name, extra in (("sjd", []), ("mcsjd", []), ("gsd1", ["--gsd-group", "1"]),
                        ("gsd64", ["--gsd-group", "64", "--gsd-prob-gap", "1"])):
        verify = name.rstrip("0123456789")
        r = runner.invoke(main, ["generate", "--model", str(pt), "--config", "tiny", "--classes", "1,2",
                                 "--cfg-scale", "2", "--verify", verify, "--seed", "4", *extra,
                                 "--out", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        toks[name] = np.load(tmp_path / name / "tokens.npy")
        toks[name + "_tvd"] = json.loads((tmp_path / name / "stats.json").read_text())["mean_tvd"]
        assert toks[name].shape == (2, 16)
    assert (toks["gsd1"] == toks["sjd"]).all() and toks["gsd1_tvd"] == pytest.approx(0.0, abs=1e-6)
    assert toks["sjd_tvd"] == 0.0 and toks["mcsjd_tvd"] == 0.0
    assert toks["gsd64_tvd"] > 1e-4  # the wide group moved the law: the knob reached the rule
