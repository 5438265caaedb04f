"""Tree budgets from a cost model (EAGLE's total_token=-1 idea, driven by measured costs).

Expected speed of a tree (K children per node, D expansion rounds, M drafted nodes) relative to
vanilla decoding:

    speed(K, D, M) = MAL(K, D, M) * t_step(1) / (t_verify(M + 1) + t_draft(K, D))

t_verify(S) is the measured latency of one target forward over S new tokens (CFG batch),
t_draft(K, D) = (D + 1) drafter calls (D expansions of K nodes + one commit call), and MAL
comes from per-depth acceptance rates measured on the model (bench/ records them). The budget
with the highest predicted speed is the default for that backend.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

import torch

# Defaults when nothing was measured: EAGLE-2's GPU budget, and a small CPU budget (a CPU pays
# almost linearly for every verified token; bench/ort_cost_curve.json has the measured curve).
GPU_TREE = {"top_k": 10, "depth": 5, "total_tokens": 60}
CPU_TREE = {"top_k": 3, "depth": 3, "total_tokens": 10}


def default_tree_budgets(config, measured: Optional[dict] = None) -> dict:
    """Per-backend tree budgets recorded in an engine bundle's generation settings."""
    budgets = {"default": dict(CPU_TREE), "ort": dict(CPU_TREE), "torch": dict(CPU_TREE), "trt": dict(GPU_TREE)}
    if measured:
        budgets.update(measured)
    return budgets


def expected_mal(accept: Sequence[float], k: int, depth: int, total: int) -> float:
    """MAL of a K-ary tree of D + 1 drafted levels truncated to `total` - 1 nodes.

    accept[d]: probability that the best-ranked draft at depth d + 1 is accepted given its
    parent was; a node with K siblings is accepted with 1 - prod_j (1 - a_d * r^j), r = 0.5
    (lower-ranked siblings are accepted less often). Levels are kept while they fit in the
    node budget (K + K^2 ... capped by the beam width K per level, EAGLE-2 style).
    """
    nodes_left = total - 1
    mal, reach = 1.0, 1.0
    for d in range(depth + 1):
        width = min(k ** (d + 1), k * k if d else k, nodes_left)
        if width <= 0:
            break
        nodes_left -= width
        a = accept[min(d, len(accept) - 1)]
        sib = min(k, width)
        p_level = 1.0 - float(torch.prod(torch.tensor([1.0 - a * 0.5 ** j for j in range(sib)])))
        reach *= p_level
        mal += reach
    return mal


def measure_curve(step_fn: Callable[[int], None], sizes: Sequence[int], reps: int = 5) -> dict:
    """Median latency (s) of step_fn(S) for each S (after one warm-up call)."""
    out = {}
    for s in sizes:
        step_fn(s)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            step_fn(s)
            ts.append(time.perf_counter() - t0)
        out[int(s)] = sorted(ts)[len(ts) // 2]
    return out


def best_tree(verify_cost: dict, draft_cost: Callable[[int], float], accept: Sequence[float],
              candidates: Optional[Sequence[tuple]] = None) -> tuple[dict, list]:
    """Pick the (top_k, depth, total_tokens) with the best predicted speed-up.

    Args:
        verify_cost: {S: seconds} measured target forwards over S tokens (S = total_tokens).
        draft_cost: n_nodes -> seconds of one drafter call over n nodes.
        accept: per-depth acceptance rates (see expected_mal).
    Returns:
        (best budget dict, table of every candidate with its prediction).
    """
    sizes = sorted(verify_cost)
    t1 = verify_cost[sizes[0]]

    def cost(S):  # linear interpolation of the measured curve
        lo = max([s for s in sizes if s <= S], default=sizes[0])
        hi = min([s for s in sizes if s >= S], default=sizes[-1])
        if hi == lo:
            return verify_cost[lo]
        w = (S - lo) / (hi - lo)
        return verify_cost[lo] * (1 - w) + verify_cost[hi] * w

    candidates = candidates or [(k, d, m) for k in (1, 2, 3, 4, 6, 8, 10) for d in (1, 2, 3, 4, 5, 6)
                                for m in (4, 6, 8, 10, 12, 16, 24, 32, 48, 60) if m - 1 <= k + d * k * k]
    table = []
    for k, d, m in candidates:
        mal = expected_mal(accept, k, d, m)
        t = cost(m) + draft_cost(k) * d + draft_cost(1)
        table.append({"top_k": k, "depth": d, "total_tokens": m, "mal": mal, "step_s": t, "speedup": mal * t1 / t})
    best = max(table, key=lambda r: r["speedup"])
    return {k: best[k] for k in ("top_k", "depth", "total_tokens")}, table


def draft_cost_for_head(measured: Callable[[int], float], measured_cfg, cfg) -> Callable[[int], float]:
    """A drafter call cost for `cfg` from one measured on a drafter of `measured_cfg`.

    The drafter step scales with its FLOPs (models/draft_vocab.drafter_step_flops), whose head
    term is hidden x head_size: a reduced draft vocabulary (`--draft-vocab N`) shrinks it, a
    full 16,384-code head dominates it. The measured cost is rescaled per node count by the
    FLOP ratio, so best_tree() sees the cheaper (or dearer) drafter.
    """
    from ..models.draft_vocab import config_step_flops

    def cost(n: int) -> float:
        return measured(n) * config_step_flops(cfg, n) / config_step_flops(measured_cfg, n)

    return cost
