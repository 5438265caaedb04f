"""MC-SJD: speculative Jacobi decoding with maximally coupled drafts (arXiv 2510.24211, v2
"Speculative Coupled Decoding"; docs/spec/decoders.md).

SJD re-draws every unaccepted slot independently from its new distribution after each Jacobi
iteration, so a draft that was about to be accepted is often replaced by another token even
when its distribution barely moved. MC-SJD draws the new draft from a MAXIMAL COUPLING of the
previous and the new distribution of the same image position: the previous draft x (drawn from
p_old) is kept with probability min(1, p_new(x) / p_old(x)), otherwise the new draft is drawn
from norm(max(0, p_new - p_old)). Marginally the new draft is still distributed as p_new (what
SJD's acceptance test assumes, so the output stays exactly the target's distribution), and it
equals the previous one with the largest possible probability, 1 - TV(p_old, p_new).

Only the Jacobi update differs from SJD: this file plugs `coupled_redraft` into the SJD loop's
`redraft` seam (speculative/sjd.py) and registers the method.
"""

from __future__ import annotations

from typing import Optional

import torch

from .methods import Method, register_method
from .verify import jacobi_residual, ratio_accept


def maximal_coupling(p_new: torch.Tensor, p_old: torch.Tensor, old: torch.Tensor,
                     generator: Optional[torch.Generator]) -> torch.Tensor:
    """Draw y ~ p_new coupled maximally with x = `old` ~ p_old (per row, independent rows).

    Keep x with probability min(1, p_new(x) / p_old(x)); otherwise draw from
    norm(max(0, p_new - p_old)) (p_new itself if that is empty). Then y ~ p_new and
    P(y = x) = 1 - TV(p_old, p_new), the maximum over couplings.

    Args:
        p_new, p_old: (..., V) distributions (rows sum to 1).
        old: (...) long, drawn from p_old.
        generator: torch.Generator or None.
    Returns:
        (...) long.
    """
    V = p_new.shape[-1]
    pn, po = p_new.reshape(-1, V).float(), p_old.reshape(-1, V).float()
    x = old.reshape(-1, 1).long()
    keep_p = ratio_accept(pn.gather(1, x)[:, 0], po.gather(1, x)[:, 0])
    u = torch.rand(keep_p.shape, generator=generator, device=pn.device)
    y = torch.multinomial(jacobi_residual(pn, po), 1, generator=generator)[:, 0]
    return torch.where(u < keep_p, x[:, 0], y).reshape(old.shape)


def coupled_redraft(p_new, p_old, old, has_old, generator):
    """The SJD loop's Jacobi update (sjd.py `redraft`) with maximally coupled drafts; fresh
    slots (no previous draft) are drawn independently from p_new, as in SJD."""
    B, W, V = p_new.shape
    coupled = maximal_coupling(p_new, p_old, old, generator)
    fresh = torch.multinomial(p_new.reshape(-1, V), 1, generator=generator).reshape(B, W)
    return torch.where(has_old, coupled, fresh)


def mcsjd_decoder(target, drafter, tables, gasv, spec):
    """MC-SJD's Decoder (Method.decoder): the one Jacobi loop with coupled drafts."""
    from .sjd import chain_decoder

    return chain_decoder(target, "mcsjd", spec, redraft=coupled_redraft)


register_method(Method("mcsjd", "sjd", "MC-SJD: speculative Jacobi decoding with maximally coupled drafts "
                       "across iterations (lossless, no drafter)", decoder=mcsjd_decoder))

__all__ = ["coupled_redraft", "maximal_coupling", "mcsjd_decoder"]
