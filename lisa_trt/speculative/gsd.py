"""GSD: Grouped Speculative Decoding (So, Shin, Kook, Park; ICCV 2025, arXiv 2508.07747),
relaxed (lossy); docs/spec/decoders.md.

SJD accepts a draft x only through its own probability ratio p_now(x) / p_prev(x). Image tokens
are redundant (many codes give nearly the same patch), so GSD tests a GROUP of plausible target
candidates instead: x is accepted with probability min(1, p_now(G_x) / p_prev(G_x)), where the
group G_x is chosen dynamically from the current target distribution: the `group` tokens whose
rank in p_now is nearest x's rank (x included), keeping only those whose probability is within
`prob_gap` of p_now(x). The first rejection is resampled from norm(max(0, p_now - p_prev)), as
in SJD. With group = 1 the rule is SJD's (lossless).

The rule changes the law of each committed token; `gsd_accept` reports, per slot, the total
variation distance between that law (in closed form, below) and p_now, which the loop averages
into DecodeStats.tvd like LANTERN's and GASV's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..errors import InputError
from .methods import Method, MethodOption, register_method
from .verify import jacobi_residual, ratio_accept, sjd_accept


@dataclass(frozen=True)
class GSDSettings:
    """GSD knobs (flat names gsd_group, gsd_prob_gap; CLI --gsd-group, --gsd-prob-gap)."""

    group: int = 14        # candidates per group, x included (1 = SJD)
    prob_gap: float = 0.15  # a candidate y joins only if |p_now(y) - p_now(x)| < prob_gap

    def __post_init__(self):
        if self.group < 1:
            raise InputError(f"GSD group must be >= 1, got {self.group}")
        if not self.prob_gap > 0:
            raise InputError(f"GSD prob_gap must be > 0, got {self.prob_gap}")


def group_acceptance(p_now: torch.Tensor, p_prev: torch.Tensor, group: int, prob_gap: float) -> torch.Tensor:
    """Acceptance probability of every candidate token under GSD's grouped test.

    Args:
        p_now, p_prev: (..., V) current and draft distributions of one slot.
    Returns:
        (..., V): a[y] = min(1, p_now(G_y) / p_prev(G_y)) (1 where both are 0 and p_now(y) > 0).
    """
    V = p_now.shape[-1]
    pn, pp = p_now.float(), p_prev.float()
    ps, order = pn.sort(-1, descending=True)                        # (..., V) by target rank
    qs = pp.gather(-1, order)
    g = min(int(group), 2 * V - 1)  # wider windows add nothing
    off = torch.arange(g, device=pn.device) - (g - 1) // 2           # ranks r - h .. r + g - 1 - h
    ranks = torch.arange(V, device=pn.device)[:, None] + off[None]   # (V, g)
    ok = (ranks >= 0) & (ranks < V)
    rc = ranks.clamp(0, V - 1)
    pw = ps[..., rc] * ok                                           # (..., V, g)
    qw = qs[..., rc] * ok
    near = (pw - ps[..., :, None]).abs() < prob_gap
    near = near | (off == 0)                                        # x itself always counts
    pg, qg = (pw * near).sum(-1), (qw * near).sum(-1)               # (..., V) by rank
    a_sorted = torch.where(qg > 0, ratio_accept(pg, qg), (ps > 0).float())
    return torch.empty_like(a_sorted).scatter_(-1, order, a_sorted)


def committed_law(p_now: torch.Tensor, p_prev: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Law of the token a slot commits when its draft ~ p_prev is accepted with a[draft], else
    resampled from norm(max(0, p_now - p_prev)) (p_now if empty): p_prev * a + (1 - beta) * r."""
    pn, pp = p_now.float(), p_prev.float()
    kept = pp * a
    resid = jacobi_residual(pn, pp)
    resid = resid / resid.sum(-1, keepdim=True)
    return kept + (1.0 - kept.sum(-1, keepdim=True)) * resid


def gsd_accept(p_now, p_prev, drafts, generator: Optional[torch.Generator], settings: GSDSettings = GSDSettings()):
    """The SJD loop's `accept` seam with GSD's grouped test -> (SJDResult, tvd (B, W))."""
    from .sampling import tvd

    pn = p_now.float() / p_now.float().sum(-1, keepdim=True)
    pp = p_prev.float() / p_prev.float().sum(-1, keepdim=True)
    a = group_acceptance(pn, pp, settings.group, settings.prob_gap)  # (B, W, V)
    ax = a.gather(-1, drafts.long()[..., None])[..., 0]
    res = sjd_accept(pn, pp, drafts, generator, accept_prob=ax)
    return res, tvd(pn, committed_law(pn, pp, a))


def gsd_decoder(target, drafter, tables, gasv, spec):
    """GSD's Decoder (Method.decoder): the one Jacobi loop with the grouped test (per-token TVD)."""
    from .sjd import chain_decoder

    s = spec.settings("gsd")
    return chain_decoder(target, "gsd", spec, accept=lambda pn, pp, d, g: gsd_accept(pn, pp, d, g, s))


register_method(Method(
    "gsd", "sjd", "GSD: SJD with grouped acceptance over a dynamic group of plausible target candidates "
    "(relaxed: reports TVD; no drafter)", settings=GSDSettings, decoder=gsd_decoder,
    options=(MethodOption("--gsd-group", "gsd_group", int, "GSD: candidates per group, the draft included "
                          "(1 = SJD, lossless)."),
             MethodOption("--gsd-prob-gap", "gsd_prob_gap", float, "GSD: a candidate joins the group only if its "
                          "target probability is within this of the draft's."))))

__all__ = ["GSDSettings", "committed_law", "group_acceptance", "gsd_accept", "gsd_decoder"]
