"""The one runner of every entry point, and the one tokens-to-pixels path.

`decode(plan, engines, cond, ...)` runs the run plan's Method with its SamplingConfig and SpecConfig
(runtime/context.RunContext, resolved once) on a set of engines: `Pipeline.generate` (`lisa-trt
run`, serve, the OpenAI front end, the Python API), `lisa-trt generate` (in-memory models) and
`lisa-trt bench` all decode through it; nothing here looks a method, a sampling or a tree up again.
`pixels` / `images` turn VQ code grids into pixels through the family's decoder hooks, for the
Pipeline, the files `generate` writes and the bench's scorer.

Floors: runtime (imports speculative; Pipeline, harness and the commands import this module).
"""

from __future__ import annotations

import torch


def decode(plan, engines, cond, *, sampling=None, seed=None, seeds=None, layout=None, on_step=None,
           on_progress=None) -> tuple:
    """`plan.method` over `cond` on `engines` (anything with target / drafter / tables / gasv: a
    runtime/bundle.Bundle, or `Engines`) -> (tokens (B, N), DecodeStats).

    sampling / seed: a decode call's own (a prompt's CFG scale, a row's seed; default the plan's);
    seeds, layout, on_step, on_progress: speculative/run.run_method's."""
    from ..speculative.run import run_method

    return run_method(plan.method, engines.target, engines.drafter, engines.tables, cond,
                      sampling=plan.sampling if sampling is None else sampling, spec=plan.spec,
                      seed=plan.seed if seed is None else seed, seeds=seeds, gasv=engines.gasv, layout=layout,
                      on_step=on_step, on_progress=on_progress)


class Engines:
    """The engines of an in-memory run (`generate`, `bench`): target, drafter, tables, GASV engine."""

    def __init__(self, target, drafter=None, tables=None, gasv=None):
        self.target, self.drafter, self.tables, self.gasv = target, drafter, tables, gasv


def pixels(family, vq, codes) -> torch.Tensor:
    """VQ code grids (B, h, w) -> the family's decoded pixels (`codes_to_pixels`, no gradients)."""
    with torch.no_grad():
        return family.codes_to_pixels(vq, codes)


def images(family, vq, codes) -> list:
    """VQ code grids (B, h, w) -> uint8 (H, W, 3) arrays (the family's `to_uint8`)."""
    return list(family.to_uint8(pixels(family, vq, codes)))


__all__ = ["Engines", "decode", "images", "pixels"]
