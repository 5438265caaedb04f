"""Run any registered method (speculative/methods.py) on one batch: the one dispatch that
Pipeline, `lisa-trt bench` and `lisa-trt generate` share."""

from __future__ import annotations

import dataclasses
import time
from typing import Optional, Union

import torch

from ..config import SamplingConfig
from ..errors import InputError
from .autoregressive import generate
from .decode import DecodeStats, SpeculativeDecoder
from .methods import Method, SpecConfig, get_method
from .proxy import CountingTarget


def _method(method: Union[str, Method]) -> Method:
    return method if isinstance(method, Method) else get_method(method)


def check_artifacts(method: Union[str, Method], drafter, tables, gasv=None) -> None:
    """Refuse a method whose drafter / tables are missing, naming the fix."""
    m = _method(method)
    method = m.name
    if m.needs_drafter and drafter is None:
        raise InputError(f"method {method!r} needs a drafter (--drafter, or export the bundle with one)")
    if m.needs_tables and tables is None and not (method == "gasv" and gasv is not None):
        raise InputError(f"method {method!r} needs calibration tables: pass --tables "
                         "(make them with `lisa-trt calibrate`)")


def run_method(method: Union[str, Method], target, drafter, tables, cond, *, sampling: SamplingConfig,
               spec: SpecConfig, seed: int, sjd_window: Optional[int] = None, gasv=None, seeds=None, on_progress=None,
               layout=None, on_step=None):
    """One generation with `method` (a Method, or its registered name) -> (tokens (B, N), DecodeStats).

    Tree methods use `spec`'s tree and rule parameters with `spec.method` set to `method`.
    Jacobi-family methods use `spec`'s Jacobi window (`sjd_window` setting, speculative/sjd.py);
    `sjd_window`, when given, overrides it (library callers; must be >= 1).
    seeds: optional one seed per row (instead of `seed`): every row draws from its own generator,
    so its tokens do not depend on the other rows (the serving path). Jacobi-family loops take it only
    when their Method says `row_seeds` (ZipAR).
    on_progress: optional callback(tokens done over all rows) for progress bars (AR and tree methods).
    on_step: optional per-step hook of every loop (AR, tree, every Jacobi-family loop):
        `on_step(tokens (B, N), done (B,))` after each decode step, where `tokens[b, :done[b]]` are
        the tokens row b has committed so far (a prefix of its final tokens; the last call has the
        whole image). Both tensors are the loop's own: read or copy them in the call, never keep
        them or write to them. Costs one host sync per step when the hook reads them.
    layout: optional SequenceLayout of the request (models/family.py; Chameleon spans), passed to
        the tree decoder and to every Jacobi-family loop (`loop(..., layout=layout)`); a Jacobi
        loop whose method needs tables also gets `tables=` and `gasv=` (the GASV engine).
    """
    m = _method(method)
    method = m.name
    if m.greedy_sampling:
        sampling = dataclasses.replace(sampling, greedy=True)
    if m.kind == "ar":
        t0 = time.perf_counter()
        cb = None
        if on_progress is not None:
            B = target.check_cond(cond)
            cb = lambda i: on_progress(i * B)  # noqa: E731
        counted = CountingTarget(target)
        toks = generate(counted, cond, seed=seed, seeds=seeds, on_token=cb, layout=layout, on_step=on_step,
                        **dataclasses.asdict(sampling))
        N = toks.shape[1]
        st = DecodeStats(target_forwards=counted.forwards)
        n = toks.shape[0] * (N - 1)
        st.committed, st.rows = [torch.ones(n)], [torch.arange(toks.shape[0]).repeat_interleave(N - 1)]
        st.times = {"total": time.perf_counter() - t0}
        return toks, st
    if m.kind == "sjd":
        if seeds is not None and not m.row_seeds:
            raise InputError(f"the {m.name} loop has no per-row generators; decode its rows one by one")
        loop = m.loop or get_method("sjd").loop
        if sjd_window is not None:
            spec = spec.replace(sjd_window=sjd_window)  # the setting's own check (>= 1)
        kw = {} if layout is None else {"layout": layout}
        if on_step is not None:
            kw["on_step"] = on_step
        if seeds is not None:  # a loop with per-row generators (Method.row_seeds)
            kw["seeds"] = seeds
        if m.needs_tables:  # a Jacobi loop with a table-driven rule (sjd-gasv) reads the tables / GASV engine
            kw.update(tables=tables, gasv=gasv)
        return loop(target, cond, sampling=sampling, window=spec.settings("sjd").window, seed=seed, spec=spec, **kw)
    if m.drafter_factory is not None:  # the method brings its own drafter (the oracle)
        target, drafter = m.drafter_factory(target)
    elif drafter is None:
        raise InputError(f"method {method!r} needs a drafter (--drafter)")
    else:
        from .medusa import speculative_engines

        target, drafter = speculative_engines(target, drafter)  # Medusa heads run as a (proxy, drafter) pair
    spec = dataclasses.replace(spec, method=method)
    return SpeculativeDecoder(target, drafter, tables, gasv=gasv).generate(cond, sampling=sampling, spec=spec,
                                                                           seed=None if seeds is not None else seed,
                                                                           seeds=seeds, on_progress=on_progress,
                                                                           layout=layout, method=m,
                                                                           on_step=on_step)


__all__ = ["check_artifacts", "run_method"]
