"""Recipe scripts: an interrupted target training resumed from its checkpoint equals a straight run."""

import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "demo"


def _run_train_target(monkeypatch, tokens, out, steps, resume=False):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import train_target

    argv = ["train_target.py", "--tokens", str(tokens), "--out", str(out), "--steps", "6", "--stop-at", str(steps),
            "--ckpt-every", "3", "--eval-every", "3", "--threads", "1", "--warmup", "2",
            "--config", '{"dim": 32, "n_layer": 2, "n_head": 2, "multiple_of": 32}']
    monkeypatch.setattr(sys, "argv", argv + (["--resume"] if resume else []))
    train_target.main()
    return torch.load(out / "ckpt.pt", weights_only=False)


def test_resume_is_exact(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(0)
    data = dict(train_tokens=torch.randint(0, 1024, (32, 256), generator=g, dtype=torch.int16),
                train_labels=torch.arange(8).repeat_interleave(4),
                heldout_tokens=torch.randint(0, 1024, (8, 256), generator=g, dtype=torch.int16),
                heldout_labels=torch.arange(8))
    tokens = tmp_path / "tokens.pt"
    torch.save(data, tokens)
    straight = _run_train_target(monkeypatch, tokens, tmp_path / "a", 6)
    first = _run_train_target(monkeypatch, tokens, tmp_path / "b", 3)
    assert first["step"] == 3
    resumed = _run_train_target(monkeypatch, tokens, tmp_path / "b", 6, resume=True)
    assert resumed["step"] == straight["step"] == 6
    for k, v in straight["model"].items():
        assert torch.equal(v, resumed["model"][k]), k
    log = (tmp_path / "b" / "log.jsonl").read_text().splitlines()
    assert sum('"event": "start"' in ln for ln in log) == 2  # one start line per launch, no duplicated steps
    steps = [int(ln.split('"step": ')[1].split(",")[0].rstrip("}")) for ln in log if '"loss"' in ln]
    assert steps == sorted(set(steps))
