"""Tree speculative decoding of Lumina-mGPT image spans (Chameleon family).

The loop of speculative/decode.py, specialised to the family's differences:
- per-row RoPE positions (left-padded prompts; the CFG unconditional half is the span alone,
  from position 0), so node positions are `cache.positions(slots)`, not the slots;
- row-end positions of the span are FORCED: every distribution there (the drafter's, when the
  tree grows through it, and the target's, when the tree is verified) is one-hot on the row-end
  token, so trees only ever hold that token at those depths (any other candidate has score
  -inf and is rejected) and verification commits it with probability 1;
- code positions are restricted to the image-code tokens after CFG, then temperature / top-k.
Verification: `greedy` (token-identical to lumina.generate_image_tokens(greedy=True)),
`exact` (lossless speculative sampling), and the relaxed rules `lantern` and `gasv` on the
image-code sub-vocabulary with tables from calibration/chameleon_tables.py (the row-end token is
one extra, forced entry of that sub-vocabulary).

GASV is version 2 (docs/spec/lisa.md), applied exactly as the LlamaGen path does
(speculative/methods.py `gasv_rule`): the tree's tokens (as sub-vocabulary indices) and parents
are flattened over the batch with per-row offsets, `gasv_gates` (or the exported GASV graph)
gives p, delta_eff and each node's candidates / gates at its parent over the K codes, and
`verify_gasv` / `verify_gasv_greedy` run on the sub-vocabulary (K codes + row end + other).
Nodes that are not a code drafted at a code position (the forced row end, anything under a
forced parent) get no candidates: their parent's law is one-hot and GASV moves no mass there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..config import SamplingConfig
from ..errors import InputError
from .lumina import LuminaImages, span_request, tokens_to_codes
from .decode import DecodeStats, SpeculativeDecoder
from .methods import GASVRuleConfig, SpecConfig
from .sampling import cfg_active


METHODS = ("greedy", "exact", "lantern", "gasv")


@dataclass(frozen=True)
class LuminaSpec:
    method: str = "greedy"  # greedy | exact | lantern | gasv (the last two need code tables)
    cfg_scale: float = 3.0
    temperature: float = 1.0
    top_k: int = 2000
    tree_top_k: int = 4
    depth: int = 4
    total_tokens: int = 16
    lantern_k: int = 1000
    lantern_delta: float = 0.1
    greedy: bool = False  # lantern / gasv: their greedy rules (verify_lantern_greedy / verify_gasv_greedy)
    gasv: GASVRuleConfig = GASVRuleConfig()  # per-run overrides of the tables' GASV v2 constants

    def __post_init__(self):
        if self.method not in METHODS:
            raise InputError(f"Chameleon-family speculation supports {', '.join(METHODS)} verification, "
                             f"not {self.method!r}")


@torch.no_grad()
def speculative_image_tokens(target, drafter, tokenizer, captions: Sequence[str], width: int, height: int,
                             spec=LuminaSpec(), seed: Optional[int] = None, tables=None,
                             gasv=None, seeds=None, sampling: Optional[SamplingConfig] = None
                             ) -> tuple[LuminaImages, DecodeStats]:
    """Generate one image span per caption with tree speculation: the generic SpeculativeDecoder
    over the family's span layout (models/families/chameleon/lumina.span_request).

    target / drafter: the torch models or their exported-graph runners (engines/chameleon_ort.py).
    tables: GASVTables (version 2) over the image codes (calibrate_chameleon), for lantern / gasv.
    gasv: optional GASV v2 engine over the codes (engines/chameleon_ort.OrtCodeGASV).
    spec: a LuminaSpec (this module's compact settings), or the generic SpecConfig with a
        SamplingConfig `sampling` (every method knob: LANTERN residual / gamma, GASV overrides...).
    seeds: one seed per caption: each row's tokens do not depend on the rest of the batch."""
    if isinstance(spec, SpecConfig):
        cfg = spec
        sampling = sampling or SamplingConfig(cfg_scale=3.0, top_k=2000)
    else:
        sampling = SamplingConfig(cfg_scale=spec.cfg_scale, temperature=spec.temperature, top_k=spec.top_k,
                                  greedy=spec.greedy or spec.method == "greedy")
        cfg = SpecConfig.make(spec.method, top_k=spec.tree_top_k, depth=spec.depth, total_tokens=spec.total_tokens,
                              lantern_k=spec.lantern_k, lantern_delta=spec.lantern_delta)
        cfg = dataclasses.replace(cfg, gasv=spec.gasv)
    prompts, layout, (h_lat, w_lat) = span_request(target, tokenizer, captions, width, height,
                                                   cfg_active(sampling.cfg_scale))
    out, stats = SpeculativeDecoder(target, drafter, tables, gasv).generate(
        prompts, sampling=sampling, spec=cfg, seed=seed, seeds=seeds, layout=layout)
    return LuminaImages(out, tokens_to_codes(target, out, h_lat, w_lat)), stats
