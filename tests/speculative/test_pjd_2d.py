"""LISA in two dimensions (speculative/twod.py): the drafter's drafts per active row verified in
one forward, GASV / exact per row; lossless where it holds (one active row)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.errors import InputError
from lisa_trt.models.drafter import Drafter
from lisa_trt.speculative.autoregressive import generate
from lisa_trt.speculative.methods import SpecConfig
from lisa_trt.speculative.run import run_method
from lisa_trt.speculative.twod import TwoDSettings
from lisa_trt.testing import make_cond, make_target
from lisa_trt.speculative.methods import get_method

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from export_artifacts import make_tables  # noqa: E402


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    t = make_target(std=0.3, block_size=64)  # an 8 x 8 grid
    torch.manual_seed(0)
    return t, Drafter.from_target(t).eval(), make_tables(t)


@pytest.mark.parametrize("kw", [dict(gasv_2d_rows=1), dict(gasv_2d_rows=3, gasv_2d_lag=8),
                                dict(gasv_2d_rows=1, gasv_2d_below="jacobi")])
def test_exact_2d_with_one_active_row_is_plain_greedy(models, kw):
    t, d, tab = models
    cond = make_cond(t, 2)
    ref = generate(t, cond, cfg_scale=2.0, greedy=True)
    toks, st = run_method(get_method("exact-2d"), t, d, None, cond, sampling=SamplingConfig(cfg_scale=2.0, greedy=True),
                          spec=SpecConfig.make(**kw), seed=0)
    assert torch.equal(toks, ref) and st.drafter_calls > 0


def test_gasv_2d_at_its_lossless_limit_is_exact_2d(models, check_mal):
    """GASV with delta 0 moves no mass: the same accept / reject decisions as exact, so with the
    same random numbers gasv-2d commits exact-2d's tokens; with its budget it moves mass (TVD > 0)."""
    t, d, tab = models
    cond = make_cond(t, 2)
    s = SamplingConfig(cfg_scale=2.0, top_k=0)
    ex, _ = run_method(get_method("exact-2d"), t, d, tab, cond, sampling=s, spec=SpecConfig.make(), seed=4)
    g0, st0 = run_method(get_method("gasv-2d"), t, d, tab, cond, sampling=s, spec=SpecConfig.make(gasv_delta=0.0), seed=4)
    assert torch.equal(ex, g0) and st0.mean_tvd < 1e-6
    g, st = run_method(get_method("gasv-2d"), t, d, tab, cond, sampling=s, spec=SpecConfig.make(gasv_delta=1.0), seed=4)
    assert bool((g >= 0).all()) and st.mean_tvd > 0
    check_mal(st.mal, st.target_forwards, 64, rows=2)
    assert st.settings["gasv_2d_rows"] == TwoDSettings().rows


def test_jacobi_below_the_leading_row(models, check_mal):
    """below="jacobi": the leading row takes the drafter and GASV, the rows below PJD's Jacobi drafts;
    the rows below commit tokens (rows run in parallel) and their context's TVD is measured."""
    t, d, tab = models
    cond = make_cond(t, 2)
    seen = []

    def step(tk, done):
        dec = (tk >= 0).view(tk.shape[0], 8, 8)
        seen.append(bool((~dec.all(2)[:, :-1] & dec.any(2)[:, 1:]).any()))

    s = SamplingConfig(cfg_scale=2.0, top_k=0)
    toks, st = run_method(get_method("gasv-2d"), t, d, tab, cond, sampling=s, on_step=step, seed=2,
                          spec=SpecConfig.make(gasv_2d_below="jacobi", gasv_2d_lag=1, gasv_delta=0.0))
    assert bool((toks >= 0).all()) and any(seen) and st.mean_tvd > 1e-3
    check_mal(st.mal, st.target_forwards, 64, rows=2)
    assert st.settings["gasv_2d_below"] == "jacobi"


def test_jacobi_gasv_below_moves_mass_only_on_the_rows_below(models):
    """below="jacobi-gasv": with no mass to move (delta 0) the tokens of below="jacobi"; with GASV's
    budget the rows below accept more (relaxed) and the reported TVD grows."""
    t, d, tab = models
    cond = make_cond(t, 2)
    s = SamplingConfig(cfg_scale=2.0, top_k=0)
    run = lambda below, delta: run_method(get_method("gasv-2d"), t, d, tab, cond, sampling=s, seed=2, spec=SpecConfig.make(  # noqa: E731
        gasv_2d_below=below, gasv_2d_lag=1, gasv_delta=delta))
    ref, st_ref = run("jacobi", 0.0)
    got, st = run("jacobi-gasv", 0.0)
    assert torch.equal(got, ref) and abs(st.mean_tvd - st_ref.mean_tvd) < 1e-6
    moved, st_m = run("jacobi-gasv", 1.0)
    jac, st_j = run("jacobi", 1.0)
    assert not torch.equal(moved, jac) and st_m.mean_tvd > st_j.mean_tvd


def test_bad_settings_are_refused():
    with pytest.raises(InputError, match="gasv_2d_rows"):
        TwoDSettings(rows=0)
    with pytest.raises(InputError, match="gasv_2d_below"):
        TwoDSettings(below="tree")
