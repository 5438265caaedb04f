"""Progress: calibrate's bar moves within a batch (never stuck at 0/1); Pipeline shows one step per image."""

import pytest
import torch
import torch.nn.functional as F

from lisa_trt.calibration.profile import calibrate
from lisa_trt.config import SamplingConfig
from lisa_trt.errors import InputError
from lisa_trt.speculative.methods import resolve_method

testing = pytest.importorskip("lisa_trt.testing")


class _Bar:
    """Records every position a progress bar is moved to (tqdm itself rate-limits its output)."""

    def __init__(self, total=None, **kw):
        self.total, self.n, self.seen = total, 0.0, []
        _Bar.last = self

    def update(self, k=1):
        self.n += k
        self.seen.append(self.n)

    def refresh(self):
        self.seen.append(self.n)

    def close(self):
        pass


def test_calibrate_bar_counts_whole_tokens_and_moves_within_a_batch(monkeypatch):
    """The rollouts' image tokens, whole numbers (no fractional counts), moved token by token inside
    the one batch (never stuck at 0/1), through progress.progress_bar (drawn only on a terminal)."""
    made = []
    monkeypatch.setattr("lisa_trt.progress.progress_bar",
                        lambda total, enabled, **kw: made.append(enabled) or _Bar(total=total))
    model = testing.make_target(seed=0)
    codebook = F.normalize(torch.randn(256, 8, generator=torch.Generator().manual_seed(1)), dim=1)
    calibrate(model, codebook, num_rollouts=3, batch_size=8, lantern_k=16, progress=True,
              sampling=SamplingConfig(cfg_scale=2.0, top_k=40))
    bar, N = _Bar.last, model.config.block_size
    assert made == [True] and bar.total == 3 * N and bar.seen[-1] == 3 * N
    assert all(float(n).is_integer() for n in bar.seen)
    inside = [n for n in bar.seen if 0 < n < 3 * N]
    assert len(inside) >= N // 2  # moves token by token inside the one batch
    assert inside == sorted(inside)


def test_calibrate_refuses_zero_rollouts():
    model = testing.make_target(seed=0)
    with pytest.raises(InputError, match="num_rollouts"):
        calibrate(model, torch.randn(256, 8), num_rollouts=0, progress=False)


def test_on_token_callback_counts_every_token():
    import lisa_trt

    model = testing.make_target(seed=0)
    seen = []
    lisa_trt.generate(model, torch.tensor([0]), seed=0, on_token=seen.append)
    assert seen == list(range(1, model.config.block_size + 1))


def test_pipeline_progress_one_step_per_image(capsys, monkeypatch):
    import lisa_trt

    monkeypatch.setattr("lisa_trt.progress.bars_wanted", lambda stream=None: True)  # as on a terminal

    pipe = lisa_trt.Pipeline.from_models(testing.make_target(seed=0))
    pipe.generate([0, 1], verify="vanilla", decode=False, progress=True)
    assert "2/2" in capsys.readouterr().err
    pipe.generate([0], verify="vanilla", decode=False)
    assert capsys.readouterr().err == ""  # off by default (library use)


def test_speculative_progress_callback_counts_to_the_whole_image():
    """run_method reports tokens done over all rows, for the AR loop and for tree speculation
    (what `lisa-trt generate`'s token bar shows)."""
    import torch

    from lisa_trt.config import SamplingConfig
    from lisa_trt.models.drafter import Drafter
    from lisa_trt.speculative.methods import SpecConfig
    from lisa_trt.speculative.run import run_method
    from lisa_trt.testing import make_cond, make_target

    m = make_target()
    d = Drafter.from_target(m).eval()
    cond = make_cond(m, batch=2)
    for method in ("vanilla", "exact"):
        seen = []
        run_method(resolve_method(method), m, d, None, cond, sampling=SamplingConfig(cfg_scale=2.0),
                   spec=SpecConfig.make(method if method != "vanilla" else "exact", top_k=2, depth=2, total_tokens=6),
                   seed=0, on_progress=seen.append)
        assert seen and seen == sorted(seen) and seen[-1] == 2 * m.config.block_size, (method, seen)
