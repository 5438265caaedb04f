"""The oracle drafter: the target's own distribution at every tree node (teacher forcing on the tree).

No trained drafter can propose better candidates than the target itself: at every node of the
draft tree the oracle returns the TARGET's logits given the committed prefix and the node's
ancestors, so the EAGLE-2 tree it grows holds the target's own top-k at each node. For a given
tree budget (top_k, depth, total_tokens) and verification rule its mean accepted length (MAL)
is the ceiling a drafter can reach; `lisa-trt bench --methods oracle` reports it and every
drafter's MAL as a fraction of it ("drafter efficiency").

It implements the DrafterEngine protocol of engines/base.py over any TargetEngine (torch,
ONNX Runtime, TensorRT): its "drafter cache" is a second target KV cache with the condition
prefix written in. The protocol does not pass the condition to the drafter, so the oracle is
used as a pair (`oracle_pair`): a thin target proxy records the condition of the last prefill
and the oracle prefills its own cache with it in `new_cache`. Timings of an oracle run are not
meaningful (each drafting level is a full target forward); only its MAL is.

Positions and slots match exactly: the decode loop gives the drafter entry of committed token
z_j position = slot = cls + j, the target's own position and slot of z_j, and tree nodes at
depth d below a root at position P get position P + d, as in verification.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import InputError
from .decode import tree_decoder
from .methods import Method, exact_rule, register_method
from .proxy import TargetProxy


class RecordingTarget(TargetProxy):
    """A TargetEngine proxy that remembers the condition of its last `prefill` (everything else
    is delegated unchanged to the wrapped engine)."""

    def __init__(self, target):
        super().__init__(target)
        self.last_cond = None

    def prefill(self, cond, cache, taps: bool = False):
        self.last_cond = cond
        return self.inner.prefill(cond, cache, taps=taps)


class OracleDrafter:
    """DrafterEngine whose logits at every node are the target's (see the module docstring).

    Args:
        target: the RecordingTarget the decode loop runs (its last prefill condition is the
            prefix of the oracle's cache).
    """

    keeps_prompt = True  # its cache is the target's, prompt included (the decode loop keeps it valid)

    def __init__(self, target: RecordingTarget):
        if not isinstance(target, RecordingTarget):
            raise InputError("OracleDrafter needs the RecordingTarget the decode loop uses; "
                             "build both with lisa_trt.speculative.oracle.oracle_pair(target)")
        self.target = target
        self.config = target.config

    def new_cache(self, batch: int, max_len: int, dtype=None):
        """A target KV cache of >= max_len slots with the condition prefix already written."""
        cond = self.target.last_cond
        if cond is None:
            raise InputError("the oracle drafter's cache is made after the target's prefill; "
                             "call target.prefill (the decode loop does) before drafter.new_cache")
        inner, P = self.target.inner, self.target.prompt_len(cond)
        # the target's own rule for a prompt and tokens; scratch slots on top when it gives fewer
        cache = inner.new_cache(batch, prompt_len=P, n_tokens=max(0, int(max_len) - P))
        if cache.max_len < max_len:
            # a target that sizes caches by its config alone (LlamaGen): the shortfall + its rounding (8)
            cache = inner.new_cache(batch, extra=int(max_len) - cache.max_len + 8, prompt_len=P,
                                    n_tokens=max(0, int(max_len) - P))
        if cache.max_len < max_len:
            raise InputError(f"the oracle needs a cache of {max_len} slots, the target gives {cache.max_len}")
        self.target.inner.prefill(cond, cache)
        return cache

    def project_taps(self, taps: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """The oracle reads no target features (it recomputes them); taps pass through."""
        return taps

    def forward(self, hidden_in, tokens, positions, slots, mask, cache):
        """(raw target logits (B, S, V), target hidden (B, S, H)) for tokens at positions/slots."""
        out = self.target.inner.forward_tokens(tokens, positions, slots, mask, cache, taps=False)
        hidden = out.hidden if getattr(out, "hidden", None) is not None else out.logits[..., :1]
        return out.logits, hidden


def oracle_pair(target):
    """(target proxy, oracle drafter) to pass to SpeculativeDecoder in place of (target, drafter)."""
    proxy = target if isinstance(target, RecordingTarget) else RecordingTarget(target)
    return proxy, OracleDrafter(proxy)


def drafter_efficiency(results: dict, oracle_key: str = "oracle") -> dict:
    """MAL of every drafter method as a fraction of the oracle's (same tree budget, same run).

    `results` maps method -> {"mal": ..., "uses_tree": bool} (the bench's rows: harness._measure records
    the point's Method.uses_tree); points without a drafter tree (vanilla and the Jacobi family: sjd,
    mcsjd, ...) and the oracle itself are skipped. Exact-family methods (greedy, exact) are compared with the exact
    oracle; relaxed ones (lantern, gasv) too, so their figure can exceed 1 (they accept more than
    any drafter can under exact verification).
    """
    if oracle_key not in results:
        return {}
    ref = float(results[oracle_key]["mal"])
    if ref <= 0:
        raise InputError(f"oracle MAL {ref} is not positive")
    return {m: float(r["mal"]) / ref for m, r in results.items() if m != oracle_key and r.get("uses_tree")}


register_method(Method("oracle", "tree", "exact verification of the target's own top-k at every tree node: "
                       "the best MAL any drafter can reach on the tree (a ceiling; its timings mean nothing)",
                       rule=exact_rule, drafter_factory=oracle_pair, decoder=tree_decoder))
