"""Run any registered method (speculative/methods.py) on one batch: the one dispatch under
runtime/runner.decode, the runner of Pipeline, `lisa-trt run`, `generate`, `bench` and serve, which
hands it the run plan's Method. A method name is accepted from library callers only (tests, the
bench/ scripts, the drafter evaluation of training): it is looked up here, once per call."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..config import SamplingConfig
from ..errors import InputError
from .methods import Method, SpecConfig


def check_artifacts(method: Method, drafter, tables, gasv=None) -> None:
    """Refuse a method (the resolved Method) whose drafter / tables are missing, naming the fix."""
    if not isinstance(method, Method):
        raise TypeError(f"check_artifacts takes the resolved Method, got {method!r}")
    name = method.name
    if method.needs_drafter and drafter is None:
        raise InputError(f"method {name!r} needs a drafter (--drafter, or export the bundle with one)")
    if method.needs_tables and tables is None and not (name == "gasv" and gasv is not None):
        raise InputError(f"method {name!r} needs calibration tables: pass --tables "
                         "(make them with `lisa-trt calibrate`)")


def run_method(method: Method, target, drafter, tables, cond, *, sampling: SamplingConfig,
               spec: SpecConfig, seed: int, sjd_window: Optional[int] = None, gasv=None, seeds=None, on_progress=None,
               layout=None, on_step=None):
    """One generation with `method` (the resolved Method: a name is refused; resolve it once where the run
    starts, speculative.methods.get_method) -> (tokens (B, N), DecodeStats).

    Every method runs the same way: its Decoder (`Method.decoder(target, drafter, tables, gasv,
    spec)`, speculative/session.py) opens the decode session (prefill, CFG rows, cache, generators)
    and decodes it. Tree methods read `spec`'s tree and rule parameters (with `spec.method` set
    to `method`); Jacobi-family methods `spec`'s Jacobi window (`sjd_window` setting,
    speculative/sjd.py); `sjd_window`, when given, overrides it (library callers; must be >= 1).
    seeds: optional one seed per row (instead of `seed`): every row draws from its own generator,
        so its tokens do not depend on the other rows (the serving path); refused by a decoder
        without per-row generators (`Decoder.row_seeds`: the Jacobi loops but ZipAR).
    on_progress: optional callback(tokens done over all rows) after each step (progress bars; one
        host read per step).
    on_step: optional per-step hook of every loop:
        `on_step(tokens (B, N), done (B,))` after each decode step, where `tokens[b, :done[b]]` are
        the tokens row b has committed so far (a prefix of its final tokens; the last call has the
        whole image). Both tensors are the loop's own: read or copy them in the call, never keep
        them or write to them. Costs one host sync per step when the hook reads them.
    layout: optional SequenceLayout of the request (models/family.py; Chameleon spans).
    gasv: the GASV engine (engines.graph.GraphGASV) of the methods that read GASV gates.
    """
    if not isinstance(method, Method):
        raise TypeError(f"run_method takes a registered Method, not {method!r}: resolve a name once, where the "
                        "run starts (speculative.methods.get_method(name)), and pass the object")
    m = method
    if m.greedy_sampling:
        sampling = dataclasses.replace(sampling, greedy=True)
    if sjd_window is not None:
        spec = spec.replace(sjd_window=sjd_window)  # the setting's own check (>= 1)
    dec = m.decoder(target, drafter, tables, gasv, spec)
    session = dec.open(cond, sampling=sampling, layout=layout, seed=None if seeds is not None else seed, seeds=seeds)
    return dec.decode(session, on_step=on_step, on_progress=on_progress)


__all__ = ["check_artifacts", "run_method"]
