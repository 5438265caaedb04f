"""The step budget (issue 49, DESIGN 5b) for the decoders that keep several image rows in flight
(speculative/pjd.py, speculative/twod.py): at most one host read per steady-state step (the end
test) and one input-shape signature per graph, counted by bench/step_budget.py's counter on the
tiny torch models at batch 2 with CFG."""

import sys
from pathlib import Path

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.models.drafter import Drafter
from lisa_trt.speculative.methods import SpecConfig, resolve_method
from lisa_trt.speculative.run import run_method
from lisa_trt.testing import make_cond, make_target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from export_artifacts import make_tables  # noqa: E402

# method, knobs, drafter forwards per step with their shape signatures (the re-write and the chain)
CASES = {
    "pjd": ("pjd", dict(pjd_rows=3, pjd_window=3, pjd_lag=1), None),
    "pjd-gasv-2d": ("pjd-gasv-2d", dict(pjd_gasv_2d_rows=3, pjd_gasv_2d_window=3, pjd_gasv_2d_lag=1), None),
    "gasv-2d": ("gasv-2d", dict(gasv_2d_rows=3, gasv_2d_window=3, gasv_2d_lag=1), 3),
    "gasv-2d-jacobi-gasv": ("gasv-2d", dict(gasv_2d_rows=3, gasv_2d_window=3, gasv_2d_lag=1,
                                            gasv_2d_below="jacobi-gasv"), 3),
}


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    t = make_target(std=0.3, block_size=64)  # an 8 x 8 grid
    return t, Drafter.from_target(t).eval(), make_tables(t)


@pytest.mark.parametrize("case", sorted(CASES))
def test_steady_2d_step_reads_one_host_value_with_one_shape_per_graph(bench, models, case):
    method, knobs, drafter_calls = CASES[case]
    t, d, tables = models
    b = bench.StepBudget(count=True, sites=True)
    for m in ("prefill", "forward_tokens"):
        b.watch(t, (m,), f"target.{m}")
    for m in ("forward", "project_taps"):
        b.watch(d, (m,), f"drafter.{m}")
    try:
        with b:
            toks, st = run_method(resolve_method(method), t, d, tables, make_cond(t, batch=2), sampling=SamplingConfig(cfg_scale=2.0),
                                  spec=SpecConfig.make(method, **knobs), seed=3, on_step=b.on_step)
    finally:
        b.unwatch()
    s = b.summary(margin=8, n_tokens=toks.shape[1])
    assert s["steady_steps"] >= 3, s
    assert s["host_reads_max"] <= 1, s["host_read_sites"]
    sig, calls = s["shape_signatures"], s["calls_per_step"]
    assert sig["target.forward_tokens"] == 1 and calls["target.forward_tokens"] == 1, (sig, calls)
    if drafter_calls is None:
        assert not any(g.startswith("drafter") for g in calls), calls
    else:  # one re-write of every lane's newest entries, then the chain: two shapes
        assert calls["drafter.forward"] == drafter_calls and sig["drafter.forward"] == 2, (sig, calls)
        assert sig["drafter.project_taps"] == 1
