"""`lisa-trt random-checkpoint --grid HxW`: a target over a non-square token grid (issue 54 item 3),
written in lisa-trt's safetensors layout whose config records the grid; bad values are refused
before anything is written."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from lisa_trt.cli import main


@pytest.fixture
def runner():
    return CliRunner()


def test_grid_checkpoint_loads_with_its_grid_and_generates(runner, tmp_path):
    st = tmp_path / "tiny24.safetensors"
    r = runner.invoke(main, ["random-checkpoint", str(st), "--config", "tiny", "--grid", "2x4", "--seed", "3"])
    assert r.exit_code == 0, r.output
    assert json.loads(st.with_suffix(".json").read_text())["config"]["grid_shape"] == [2, 4]
    from lisa_trt.models.checkpoints import load_target

    cfg = load_target(str(st)).config
    assert cfg.grid_hw == (2, 4) and cfg.block_size == 8 and cfg.dim == 64  # tiny's shape, the grid's tokens
    out = tmp_path / "gen"
    r = runner.invoke(main, ["generate", "--model", str(st), "--classes", "1,2", "--top-k", "10", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert np.load(out / "tokens.npy").shape == (2, 8)


def test_grid_seed_decides_the_weights(runner, tmp_path):
    from lisa_trt.io import load_safetensors

    sds = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        p = tmp_path / f"{name}.safetensors"
        assert runner.invoke(main, ["random-checkpoint", str(p), "--config", "tiny", "--grid", "4x2",
                                    "--seed", str(seed)]).exit_code == 0
        sds[name] = load_safetensors(p)[0]["output.weight"]
    assert sds["a"].equal(sds["b"]) and not sds["a"].equal(sds["c"])


@pytest.mark.parametrize("out,args,message", [
    ("m.safetensors", ["--config", "tiny", "--grid", "2by4"], "HEIGHTxWIDTH in tokens"),
    ("m.safetensors", ["--config", "tiny", "--grid", "0x4"], "both positive"),
    ("m.safetensors", ["--config", "tiny", "--grid", "2x"], "e.g. 16x24"),
    ("m.pt", ["--config", "tiny", "--grid", "2x4"], "name it e.g. m.safetensors"),
    ("m.safetensors", ["--config", "VQ-16", "--grid", "2x4"], "VQ-16 is an image decoder"),
    ("m.safetensors", ["--config", "GPT-B", "--grid", "16x24", "--image-size", "384"], "pass one"),
])
def test_bad_grid_refused_before_any_work(runner, tmp_path, out, args, message):
    r = runner.invoke(main, ["random-checkpoint", str(tmp_path / out), *args])
    assert r.exit_code == 2 and message in r.output, r.output
    assert "Traceback" not in r.output and list(tmp_path.iterdir()) == []


def test_grid_checkpoint_follows_the_overwrite_rule(runner, tmp_path):
    st = tmp_path / "m.safetensors"
    args = ["random-checkpoint", str(st), "--config", "tiny", "--grid", "2x4"]
    assert runner.invoke(main, args).exit_code == 0
    before = st.read_bytes()
    r = runner.invoke(main, [*args[:-1], "4x2"])
    assert r.exit_code == 2 and "--overwrite" in r.output and st.read_bytes() == before
    assert runner.invoke(main, [*args[:-1], "4x2", "--overwrite"]).exit_code == 0
    assert json.loads(st.with_suffix(".json").read_text())["config"]["grid_shape"] == [4, 2]
