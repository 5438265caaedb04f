"""`lisa-trt train --arch ssd`: 2-D heads (models/head2d.py, train/ssd.py) on a non-square grid.

The index test pins what each head learns (the token below / below-right of the hidden state's
token, never across a row end); the training test that the loss falls; the resume test that a
killed run continues to the same heads; the refusals that bad input stops before any work."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from lisa_trt.errors import ConfigError, InputError
from lisa_trt.models.head2d import Head2DConfig, Heads2D, load_heads2d, parse_directions
from lisa_trt.testing import make_target
from lisa_trt.train import ssd as S
from lisa_trt.train.data import DataConfig
from lisa_trt.train.losses import LossConfig
from lisa_trt.train.trainer import TrainConfig

H, W = 4, 6  # a non-square grid (rows of 6 tokens)


@pytest.fixture(scope="module")
def grid_target():
    return make_target(block_size=H * W, grid_shape=(H, W), n_layer=2, std=0.3)


def _cfg(steps: int, **kw) -> TrainConfig:
    base = dict(batch_size=4, lr=3e-3, warmup_steps=0, log_every=1, checkpoint_every=2,
                data=DataConfig(num_samples=8, eval_samples=2, gen_batch=10, cfg_scale=2.0))
    return TrainConfig(steps=steps, **{**base, **kw})


def test_each_head_reads_the_hidden_of_its_token_and_is_taught_the_token_below():
    """16 x 24: teacher logits one-hot on their own index, hidden = its own index: head k's pair for
    token j is (hidden j + 1, teacher at j + dr * 24 + dc), never across a row end."""
    L, N, d = 24, 16 * 24, 4
    cfg = Head2DConfig(dim=d, vocab_size=N + 1, row_len=L, n_tokens=N, offsets=parse_directions("below,below-right"))
    heads = Heads2D(cfg)
    idx = torch.arange(N, dtype=torch.float)
    batch = SimpleNamespace(tokens=torch.arange(N)[None], logits=torch.eye(N, N + 1)[None],
                            hidden=idx[None, :, None].expand(1, N, d).clone())
    for (src, dst), (dr, dc) in zip(S.head_targets(heads, N), cfg.offsets):
        j = src - 1  # the token whose hidden state is read
        assert torch.equal(dst, j + dr * L + dc)
        assert bool((j % L + dc < L).all()) and bool((dst < N).all())
    below, diag = S.head_targets(heads, N)
    assert below[0].numel() == N - L and diag[0].numel() == (H_ := 15) * (L - 1), H_  # every pair in the image
    seen = []
    heads.head_logits = lambda h, k: torch.nn.functional.one_hot(h[..., 0].long(), N + 1).float()
    for k, t_l, s_l, tok in S.head_pairs(heads, batch):
        src_tok = s_l.argmax(-1) - 1  # the hidden read is token j's: index j + 1
        assert torch.equal(t_l.argmax(-1), src_tok + cfg.delta(k)) and torch.equal(tok, t_l.argmax(-1))
        seen.append(k)
    assert seen == [0, 1]


def test_forced_row_ends_carry_no_loss():
    """A layout that forces each row's last token: no head is taught a forced index."""
    from lisa_trt.train.trainer import TrainVocab

    L, N = 6, 24
    cfg = Head2DConfig(dim=2, vocab_size=8, row_len=L, n_tokens=N, offsets=((1, 0), (1, 1)))
    heads = Heads2D(cfg)
    trained = (torch.arange(N) % L) != L - 1
    batch = SimpleNamespace(tokens=torch.zeros(1, N, dtype=torch.long), logits=torch.zeros(1, N, 8),
                            hidden=torch.zeros(1, N, 2))
    pairs = S.head_pairs(heads, batch, TrainVocab(None, trained))
    full = S.head_pairs(heads, batch)
    for (k, t_l, _, _), (_, t_full, _, _) in zip(pairs, full):
        src, dst = S.head_targets(heads, N)[k]
        assert t_l.shape[0] == int(trained[dst].sum()) < t_full.shape[0]


def test_heads_train_and_the_loss_falls(grid_target, tmp_path):
    res = S.train_heads2d(grid_target, _cfg(12), tmp_path, progress=False)
    losses = [json.loads(ln)["loss"] for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 12 and sum(losses[-3:]) < sum(losses[:3]) - 0.1, losses
    heads = load_heads2d(res["drafter"], grid_target)
    assert heads.config.row_len == W and heads.config.n_tokens == H * W and heads.config.offsets == ((1, 0), (1, 1))
    out = heads(torch.zeros(2, 3, heads.config.dim))
    assert out.shape == (2, 3, 2, grid_target.config.vocab_size)
    ev = res["eval"]["heads"]
    assert set(ev) == {"below", "below-right"}
    for h in ev.values():
        assert 0 <= h["accept"] <= 1 and h["uniform_token_topk"] == 5 / grid_target.config.vocab_size


def test_a_killed_run_resumes_to_the_same_heads(grid_target, tmp_path, monkeypatch):
    whole = S.train_heads2d(grid_target, _cfg(4), tmp_path / "a", progress=False)
    inner = S._Run.step

    def die(self, step):
        if step == 3:
            raise KeyboardInterrupt
        return inner(self, step)

    monkeypatch.setattr(S._Run, "step", die)
    with pytest.raises(KeyboardInterrupt):
        S.train_heads2d(grid_target, _cfg(4), tmp_path / "b", progress=False)
    assert json.loads((tmp_path / "b" / "checkpoints" / "latest.json").read_text())["step"] == 2
    monkeypatch.setattr(S._Run, "step", inner)
    again = S.train_heads2d(grid_target, _cfg(4), tmp_path / "b", progress=False)
    a, b = load_heads2d(whole["drafter"], grid_target), load_heads2d(again["drafter"], grid_target)
    for (n, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.allclose(x, y, atol=1e-6), n
    steps = [json.loads(ln)["step"] for ln in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    with pytest.raises(ConfigError, match="other settings"):
        S.train_heads2d(grid_target, _cfg(4, lr=1e-2), tmp_path / "b", progress=False)


def test_bad_input_is_refused_before_any_work(grid_target, tmp_path):
    with pytest.raises(ConfigError, match="--loss eagle3"):
        S.train_heads2d(grid_target, _cfg(2, loss=LossConfig(kind="lisa")), tmp_path / "x", progress=False)
    with pytest.raises(ConfigError, match="unknown; give one or more of right, below, below-right"):
        parse_directions("below,up")
    no_grid = SimpleNamespace(n_tokens=10, forced=None, allowed=None)
    flat = SimpleNamespace(config=SimpleNamespace(grid_hw=None))
    with pytest.raises(InputError, match="no regular grid of rows"):
        S.grid_of(flat, no_grid)
    with pytest.raises(ConfigError, match="at least two rows"):
        Head2DConfig(dim=4, vocab_size=8, row_len=6, n_tokens=6)
    assert not (tmp_path / "x").exists()


def test_the_cli_routes_and_refuses(tmp_path):
    """`--arch ssd` options refused before the model loads; --ssd-directions only with --arch ssd."""
    from click.testing import CliRunner

    from lisa_trt.cli import main

    r = CliRunner().invoke(main, ["train", "--model", "demo", "--arch", "ssd", "--out", str(tmp_path / "o"),
                                  "--draft-vocab", "8"])
    assert r.exit_code != 0 and "--draft-vocab do(es) not apply to --arch ssd" in r.output, r.output
    r = CliRunner().invoke(main, ["train", "--model", "demo", "--out", str(tmp_path / "o"),
                                  "--ssd-directions", "below"])
    assert r.exit_code != 0 and "--ssd-directions applies to --arch ssd" in r.output, r.output
    r = CliRunner().invoke(main, ["train", "--model", "demo", "--arch", "ssd", "--out", str(tmp_path / "o"),
                                  "--ssd-directions", "up"])
    assert r.exit_code != 0 and "give one or more of right, below, below-right" in r.output, r.output
    assert not (tmp_path / "o").exists()
