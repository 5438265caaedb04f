"""Held-out evaluation of a trained drafter by real tree decoding (`lisa-trt train --eval-images`)."""

from __future__ import annotations

import dataclasses

from ..config import SamplingConfig
from ..speculative.methods import SpecConfig


def decode_eval(target, drafter, cfg, n: int, request=None) -> dict:
    """Real MAL of the trained drafter: exact (lossless) tree speculation on held-out prompts
    (seeds disjoint from the self-distillation data).

    Args:
        target, drafter: the models; cfg: the TrainConfig (its data sampling settings and seed).
        n: number of held-out prompts (class ids 0..n-1 cycled, or t2i held-out captions).
        request: prompt-id families: the held-out prompts, encoded by the family's prompter with
            the CFG rows (models.family.Request, `n` of them); decoded over its layout.
    Returns:
        {"mal", "images", "sampling", "spec", "target_forwards"}.
    """
    from ..speculative.decode import EXACT  # the Method object itself: no look-up by name
    from ..speculative.run import run_method

    d = cfg.data
    s = SamplingConfig(cfg_scale=d.cfg_scale, temperature=d.temperature, top_k=d.top_k, top_p=d.top_p)
    spec = SpecConfig.make(EXACT.name, top_k=3, depth=3, total_tokens=10)
    if request is not None:  # a prompted family: its held-out Request, decoded over its layout
        cond, layout, images = request.cond, request.layout, request.batch
    else:
        from .data import kind_data

        cond, layout, images = kind_data(target.config).eval_conds(target, d, n), None, n  # class ids or captions
    # the tree decoder pairs Medusa heads with their target proxy (speculative/decode.tree_decoder)
    _, st = run_method(EXACT, target, drafter.eval(), None, cond, sampling=s, spec=spec,
                       seed=1_000_003 + cfg.seed, layout=layout)
    out = {"mal": st.mal, "images": images, "sampling": dataclasses.asdict(s), "spec": dataclasses.asdict(spec),
           "target_forwards": st.target_forwards}
    return out if request is None else {**out, "prompts": list(request.prompts)}


__all__ = ["decode_eval"]
