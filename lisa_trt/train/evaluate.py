"""Held-out evaluation of a trained drafter by real tree decoding (`lisa-trt train --eval-images`)."""

from __future__ import annotations

import dataclasses


from ..config import SamplingConfig
from ..speculative.decode import SpeculativeDecoder
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
    d = cfg.data
    s = SamplingConfig(cfg_scale=d.cfg_scale, temperature=d.temperature, top_k=d.top_k, top_p=d.top_p)
    spec = SpecConfig.make("exact", top_k=3, depth=3, total_tokens=10)
    if request is not None:
        from ..speculative.run import run_method

        _, st = run_method("exact", target, drafter.eval(), None, request.cond, sampling=s, spec=spec,
                           seed=1_000_003 + cfg.seed, layout=request.layout)
        return {"mal": st.mal, "images": request.batch, "sampling": dataclasses.asdict(s),
                "spec": dataclasses.asdict(spec), "target_forwards": st.target_forwards,
                "prompts": list(request.prompts)}
    from .data import kind_data

    cond = kind_data(target.config).eval_conds(target, d, n)  # class ids 0..n-1 cycled, or held-out captions
    from ..speculative.medusa import speculative_engines

    _, st = SpeculativeDecoder(*speculative_engines(target, drafter.eval())).generate(
        cond, sampling=s, spec=spec, seed=1_000_003 + cfg.seed)
    return {"mal": st.mal, "images": n, "sampling": dataclasses.asdict(s), "spec": dataclasses.asdict(spec),
            "target_forwards": st.target_forwards}


__all__ = ["decode_eval"]
