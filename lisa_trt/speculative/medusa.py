"""Medusa heads through the speculative loop (DrafterEngine protocol).

`medusa_pair(target, heads)` returns (target proxy, drafter) to give SpeculativeDecoder in place
of (target, drafter); verification (exact / lantern / gasv / greedy) is unchanged.

- The proxy returns the target's final hidden state in the `taps` field, so the loop's usual
  "taps of the accepted path -> drafter commit" hands Medusa exactly what it reads.
- The drafter's hidden channel is (h, depth): a commit entry carries (h of its predecessor, -1)
  and gets depth 0, so the root's logits are head 0's (depth-1 candidates); a tree node
  consumes its parent's (h_root, d - 1) and returns head d's logits and (h_root, d). Drafted tokens are not read:
  Medusa heads see only the last committed hidden state.
- The tree: the loop's EAGLE-2 builder takes the top-k of head d at every depth-d node and keeps
  the `total_tokens` paths of highest joint head probability, i.e. a tree over the heads' top-k
  (the topology follows the heads' confidence instead of Medusa's fixed sparse tree).

`heads` is anything with `head_logits(hidden (B, S, H), depth (B, S)) -> logits (B, S, V)`:
`MedusaHeads` (torch) or `GraphMedusaHeads` (the heads' graph in an engine bundle, engines/medusa_graph.py).
"""

from __future__ import annotations


import torch

from ..errors import InputError
from .proxy import TargetProxy


class MedusaTarget(TargetProxy):
    """TargetEngine proxy whose outputs carry the final hidden state in `taps`."""

    @staticmethod
    def _swap(out):
        from ..models.layers import TargetOutput

        if out.hidden is None:
            raise InputError("Medusa heads need the target's final hidden state; this target engine returns none "
                             "(re-export the bundle with a current lisa-trt)")
        return TargetOutput(out.logits, out.hidden, out.hidden)

    def prefill(self, cond, cache, taps: bool = False):
        return self._swap(self.inner.prefill(cond, cache, taps=taps))

    def forward_tokens(self, tokens, positions, slots, mask, cache, taps: bool = False):
        return self._swap(self.inner.forward_tokens(tokens, positions, slots, mask, cache, taps=taps))


class _NoKV:  # a one-layer, one-head, width-4 KVCache config: the bookkeeping the loop reads
    kv_heads, head_dim, n_layer = 1, 4, 1


class MedusaDrafter:
    """DrafterEngine over Medusa heads (see the module docstring)."""

    def __init__(self, heads, dim: int):
        self.heads, self.dim = heads, int(dim)

    def new_cache(self, batch: int, max_len: int, dtype=None):
        from ..config import find_multiple
        from ..models.layers import KVCache

        return KVCache(_NoKV, batch, find_multiple(max_len, 8), torch.float32, self._device())

    def _device(self):
        dev = getattr(self.heads, "device", None)
        if dev is None and hasattr(self.heads, "parameters"):
            dev = next(self.heads.parameters()).device
        return dev or "cpu"

    def project_taps(self, taps: torch.Tensor) -> torch.Tensor:
        """Final hidden (B, S, H) -> (B, S, H + 1): (h, -1), the mark of a committed entry."""
        if taps.shape[-1] != self.dim:
            raise InputError(f"Medusa heads read a hidden state of width {self.dim}, got {taps.shape[-1]}")
        return torch.cat([taps.float(), torch.full((*taps.shape[:-1], 1), -1.0, device=taps.device)], dim=-1)

    def forward(self, hidden_in, tokens, positions, slots, mask, cache):
        """Depth = the input's depth channel + 1: committed entries (-1) -> 0 -> head 0 (the root's
        children); a node below a parent of depth d - 1 -> head d. Tokens are not read."""
        h, d_in = hidden_in[..., : self.dim], hidden_in[..., self.dim]
        depth = d_in.round().long() + 1
        logits = self.heads.head_logits(h, depth)
        return logits, torch.cat([h, depth[..., None].to(h.dtype)], dim=-1)


def medusa_pair(target, heads):
    """(target proxy, drafter) for SpeculativeDecoder; `heads`: MedusaHeads or GraphMedusaHeads."""
    proxy = target if isinstance(target, MedusaTarget) else MedusaTarget(target)
    return proxy, MedusaDrafter(heads, heads.config.dim)


def speculative_engines(target, drafter):
    """(target, drafter) for SpeculativeDecoder: Medusa heads are wrapped by medusa_pair, any
    other drafter passes through unchanged."""
    from ..models.medusa import MedusaHeads

    if isinstance(drafter, MedusaHeads) or getattr(drafter, "is_medusa", False):  # torch or ORT heads
        return medusa_pair(target, drafter)
    return target, drafter
