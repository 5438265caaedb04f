"""Run any registered method (speculative/methods.py) on one batch: the one dispatch that
Pipeline, `lisa-trt bench` and `lisa-trt generate` share."""

from __future__ import annotations

import dataclasses
import time

import torch

from ..config import SamplingConfig
from ..errors import InputError
from .autoregressive import generate
from .decode import DecodeStats, SpeculativeDecoder
from .methods import SpecConfig, get_method
from .sjd import sjd_generate


def check_artifacts(method: str, drafter, tables, gasv=None) -> None:
    """Refuse a method whose drafter / tables are missing, naming the fix."""
    m = get_method(method)
    if m.needs_drafter and drafter is None:
        raise InputError(f"method {method!r} needs a drafter (--drafter, or export the bundle with one)")
    if m.needs_tables and tables is None and not (method == "gasv" and gasv is not None):
        raise InputError(f"method {method!r} needs calibration tables: pass --tables "
                         "(make them with `lisa-trt calibrate`)")


def run_method(method: str, target, drafter, tables, cond, *, sampling: SamplingConfig,
               spec: SpecConfig, seed: int, sjd_window: int = 16, gasv=None):
    """One generation with `method` -> (tokens (B, N), DecodeStats).

    Tree methods use `spec`'s tree and rule parameters with `spec.method` set to `method`.
    """
    m = get_method(method)
    if m.greedy_sampling:
        sampling = dataclasses.replace(sampling, greedy=True)
    if m.kind == "ar":
        t0 = time.perf_counter()
        toks = generate(target, cond, seed=seed, **dataclasses.asdict(sampling))
        st = DecodeStats(target_forwards=target.config.block_size)
        st.committed = [torch.ones(toks.shape[0] * (target.config.block_size - 1))]
        st.times = {"total": time.perf_counter() - t0}
        return toks, st
    if m.kind == "sjd":
        return sjd_generate(target, cond, sampling=sampling, window=sjd_window, seed=seed)
    if drafter is None:
        raise InputError(f"method {method!r} needs a drafter (--drafter)")
    spec = dataclasses.replace(spec, method=method)
    return SpeculativeDecoder(target, drafter, tables, gasv=gasv).generate(cond, sampling=sampling, spec=spec, seed=seed)


__all__ = ["check_artifacts", "run_method"]
