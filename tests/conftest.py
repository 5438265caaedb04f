import os

import pytest
import torch

# Tiny models: one thread is much faster than two on a shared 2-core machine (no oversubscription).
torch.set_num_threads(1)
# ... and the same for the thread policy that every entry point applies (lisa_trt/threads.py).
os.environ.setdefault("LISA_TRT_THREADS", "1")


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject addopts): one worker per available core, at most 4 (every test is
    single-threaded, and each worker holds its own tiny models and exported bundles in memory)."""
    avail = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(4, avail))


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture
def kill_training(monkeypatch):
    """kill_training(run, at=3): call run() (a train_drafter call) with the trainer killed right
    after step `at` (its update done, not yet checkpointed); the kill is then lifted, so the next
    train_drafter call on that directory resumes. Fails when run() was not killed."""
    from lisa_trt.train import trainer as T

    class Killed(Exception):
        pass

    def kill(run, at: int = 3):
        def stop(step):
            if step == at:
                raise Killed
        monkeypatch.setattr(T, "_after_step", stop)
        with pytest.raises(Killed):
            run()
        monkeypatch.setattr(T, "_after_step", lambda step: None)

    return kill


@pytest.fixture
def check_stats():
    """check_stats(stats, tokens, ar=False): the DecodeStats of a decode of `tokens` (B, N) add up.
    Every token after the first (drawn from the prefill's logits) is committed exactly once, a live
    row commits at least one token per step, and the target ran once per step plus the prefill (the
    AR loop, ar=True: once per token). Returns the MAL those counts give."""

    def check(stats, tokens, ar: bool = False) -> float:
        B, N = tokens.shape
        com = torch.cat([c.detach().cpu().long() for c in stats.committed])
        assert int(com.sum()) == B * (N - 1), (int(com.sum()), B, N)
        assert int(com.min()) >= 1, "a step committed nothing for a live row"
        assert stats.target_forwards == (N if ar else len(stats.committed) + 1), (stats.target_forwards,
                                                                                  len(stats.committed))
        assert stats.mal == pytest.approx(float(com.sum()) / com.numel())
        return stats.mal

    return check


@pytest.fixture(scope="session")
def check_mal():
    """check_mal(mal, forwards, n_tokens, rows=1): a reported MAL is the decode's own, given the
    target forwards it reports for a decode of `rows` rows of n_tokens tokens each. Every token
    after the first (the prefill's) is committed in one of forwards - 1 steps, by every live row
    of the step: (n - 1) / steps <= MAL <= rows (n - 1) / steps, equality for one row. (A vacuous
    `mal >= 1` holds for any decode; this fails when the MAL or the count is not the decode's.)
    Returns the steps."""

    def check(mal: float, forwards: int, n_tokens: int, rows: int = 1) -> int:
        steps = int(forwards) - 1
        assert steps >= 1, forwards
        lo, hi = (n_tokens - 1) / steps, rows * (n_tokens - 1) / steps
        assert lo - 1e-4 <= float(mal) <= hi + 1e-4, (mal, forwards, n_tokens, rows)
        return steps

    return check


@pytest.fixture(scope="session")
def check_run_stats(check_mal):
    """check_run_stats(st, n_tokens=None): the stats.json of `lisa-trt run` (one decode per prompt)
    is its decodes' own: the summary MAL is the images' mean, each image ran forwards = steps + 1
    and committed the same n - 1 tokens (MAL x steps; n_tokens when given). Returns n."""

    def check(st: dict, n_tokens=None) -> int:
        ims = st["images"]
        assert st["mal"] == pytest.approx(sum(i["mal"] for i in ims) / len(ims))
        assert all(i["forwards"] == i["steps"] + 1 for i in ims), ims
        committed = {round(i["mal"] * i["steps"], 3) for i in ims}
        assert len(committed) == 1, ims  # every image has the same tokens after the first
        n = int(committed.pop()) + 1
        assert n_tokens is None or n == n_tokens, (n, n_tokens)
        for i in ims:
            check_mal(i["mal"], i["forwards"], n)
        return n

    return check


@pytest.fixture(scope="session")
def parts():
    """(target, drafter, tables, vq): the tiny c2i models with calibrated tables that the runtime and
    serve tests build their Pipelines and bundles from (made once; no test changes them)."""
    from lisa_trt.calibration.profile import calibrate
    from lisa_trt.config import SamplingConfig
    from lisa_trt.families.llamagen.vq import VQModel
    from lisa_trt.models.drafter import Drafter
    from lisa_trt.models.target_config import vq_config
    from lisa_trt.testing import make_target

    torch.manual_seed(0)
    t = make_target(std=0.3)
    d = Drafter.from_target(t).eval()
    cfg = vq_config("VQ-16", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32, codebook_size=256)
    vq = VQModel(cfg).eval()
    tables = calibrate(t, vq.codebook().detach(), num_rollouts=4, sampling=SamplingConfig(cfg_scale=2.0),
                       progress=False)
    return t, d, tables, vq


@pytest.fixture(scope="session")
def bench():
    """bench/step_budget.py loaded as a module (its StepBudget counter: host reads, glue ops, engine
    calls per step), for the step-budget tests. A test file's own `bench` fixture overrides it."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "step_budget.py"
    spec = importlib.util.spec_from_file_location("step_budget_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
