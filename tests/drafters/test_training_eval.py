"""Periodic held-out eval during drafter training (issue 11 item 2) and the curve plot."""

import json
import subprocess
import sys

import torch
import torch.nn.functional as F

from lisa_trt.testing import make_target
from lisa_trt.train import DataConfig, TrainConfig, train_drafter

torch.set_num_threads(1)


def test_eval_every_logs_heldout_records_and_plots(tmp_path):
    t = make_target(seed=0)
    cb = F.normalize(torch.randn(256, 8, generator=torch.Generator().manual_seed(7)), dim=-1)
    calls = []

    def eval_fn(drafter, step):
        calls.append((step, drafter.training))
        return {"decode_mal": 1.0 + step / 10}

    cfg = TrainConfig(steps=2, batch_size=4, ttt_steps=2, warmup_steps=1, checkpoint_every=2, log_every=1,
                      eval_every=1, data=DataConfig(num_samples=8, eval_samples=2, gen_batch=8, cfg_scale=2.0))
    train_drafter(t, cb, cfg, tmp_path, progress=False, eval_fn=eval_fn)
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    ev = [r for r in recs if "eval" in r]
    assert [r["step"] for r in ev] == [1, 2] and [c[0] for c in calls] == [1, 2]
    assert not any(c[1] for c in calls)  # eval_fn sees the drafter in eval mode
    for r in ev:
        assert len(r["eval"]["top3_s"]) == 2 and r["eval"]["top3_s"][0] >= r["eval"]["top1_s"][0]
        assert r["eval"]["decode_mal"] == 1.0 + r["step"] / 10
    out = tmp_path / "curve.png"
    subprocess.run([sys.executable, "bench/plot_training.py", str(tmp_path), "--out", str(out)], check=True)
    assert out.stat().st_size > 1000


def test_loss_off_switches():
    import pytest

    from lisa_trt.cli import _loss_switches
    from lisa_trt.errors import InputError
    from lisa_trt.train.losses import LossConfig

    assert _loss_switches("") == {}
    sw = _loss_switches("selection, kd")
    assert sw == {"selection": False, "kd": False}
    assert not LossConfig(kind="lisa", **sw).needs_codebook
    with pytest.raises(InputError, match="loss-off"):
        _loss_switches("gate")
    assert _loss_switches("kd", "lisa-additive") == {"kd": False}
    assert _loss_switches("", "eagle3") == {}
    with pytest.raises(InputError, match="--loss eagle3 has none"):  # the default loss has no LISA terms
        _loss_switches("kd", "eagle3")
