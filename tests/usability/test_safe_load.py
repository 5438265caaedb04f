"""Refused pickles are explained in our words; torch's `weights_only=False` advice is never shown."""

import pytest
import torch

from lisa_trt.errors import CheckpointError
from lisa_trt.safe_load import safe_torch_load


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_refusal_in_our_words(tmp_path, capsys):
    p = tmp_path / "evil.pt"
    torch.save({"model": {"w": torch.zeros(1)}, "x": Evil()}, p)
    with pytest.raises(CheckpointError) as ei:
        safe_torch_load(p)
    msg = str(ei.value)
    assert "refusing to load" in msg and "print" in msg
    assert "weights_only" not in msg and "add_safe_globals" not in msg
    assert "pwned" not in capsys.readouterr().out


def test_garbage_and_truncated(tmp_path):
    g = tmp_path / "g.pt"
    g.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable") as ei:
        safe_torch_load(g)
    assert "weights_only" not in str(ei.value)
    ok = tmp_path / "ok.pt"
    torch.save({"w": torch.ones(3)}, ok)
    assert torch.equal(safe_torch_load(ok)["w"], torch.ones(3))
    (tmp_path / "t.pt").write_bytes(ok.read_bytes()[:40])
    with pytest.raises(CheckpointError, match="not a readable"):
        safe_torch_load(tmp_path / "t.pt")


def test_training_checkpoint_refusal_says_how_to_restart(tmp_path):
    from lisa_trt.train.trainer import load_latest_checkpoint

    d = tmp_path / "checkpoints"
    d.mkdir()
    torch.save({"x": Evil()}, d / "step_00000001.pt")
    (d / "latest.json").write_text('{"step": 1, "file": "step_00000001.pt"}')
    with pytest.raises(CheckpointError, match="start the run over") as ei:
        load_latest_checkpoint(tmp_path)
    assert "weights_only" not in str(ei.value)
