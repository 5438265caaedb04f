"""SJD++-style draft reuse (arXiv 2512.07503): an option of the SJD family's Jacobi update.

SJD++ "reuses high-confidence draft tokens after each verification phase instead of resampling
them all". In lisa-trt's Jacobi loop (speculative/sjd.py) that is the chain window's `redraft`
seam: after a forward, every window slot whose previous draft x is still in the window is
either kept or redrawn. With the option on (`--sjd-reuse TAU`, flat name
`sjd_reuse_threshold`), a previous draft whose probability in this forward's law is high,
p_new(x) >= TAU, is kept; the others get the method's own update (SJD: a fresh draw from p_new;
MC-SJD: the maximal coupling, which keeps x with probability min(1, p_new(x) / p_old(x)) and
otherwise draws from norm(max(0, p_new - p_old))).

Lossless. A kept draft is no longer distributed as p_new, so the update also returns the law
each new draft was actually drawn from, and the next verification tests it against that law
(SJD's test min(1, p_now(y) / r(y)) and residual norm(max(0, p_now - r)) hold for ANY draft law
r, given the tokens before the slot). With keep probability kappa(z) for an old draft z ~ p_old
and fallback law g:

    r(z) = kappa(z) p_old(z) + (1 - sum_z' kappa(z') p_old(z')) g(z)

SJD: kappa = 1[p_new >= TAU], g = p_new; MC-SJD: kappa = max(1[p_new >= TAU], min(1, p_new /
p_old)), g = norm(max(0, p_new - p_old)) (TAU off: r = p_new, MC-SJD exactly). The threshold
rule and the law correction are lisa-trt's reading of the paper (docs/spec/decoders.md
"SJD++-style reuse": the choices). Not for SJD-PAC (its tree window has its own update) or
ZipAR (no drafts).

Declared here, read by the Jacobi loops of sjd, mcsjd, gsd and sjd-gasv through
`reuse_update(spec, coupled=...)`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..errors import InputError
from .methods import MethodOption, OptionGroup, SpecConfig, register_settings
from .verify import jacobi_residual, ratio_accept


@dataclass(frozen=True)
class SJDReuseSettings:
    """The reuse threshold (flat name sjd_reuse_threshold; CLI --sjd-reuse): keep a previous draft x
    when p_new(x) >= threshold; 0 = off (the method's own Jacobi update)."""

    threshold: float = 0.0

    def __post_init__(self):
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= float(t) <= 1.0:
            raise InputError(f"--sjd-reuse (sjd_reuse_threshold) must be a probability in [0, 1] (0 = off), got {t!r}")


def reuse_redraft(p_new: torch.Tensor, p_old: torch.Tensor, old: torch.Tensor, has_old: torch.Tensor,
                  generator: Optional[torch.Generator], *, threshold: float, coupled: bool):
    """The Jacobi update with high-confidence reuse -> (drafts (B, W), their laws (B, W, V)).

    Args:
        p_new: (B, W, V) this forward's laws at the next window's slots (what SJD redraws from).
        p_old, old: (B, W, V) the law each slot's previous draft was drawn from, and that draft (B, W).
        has_old: (B, W) False for fresh slots (no previous draft: a draw from p_new, law p_new).
        threshold: keep x when p_new(x) >= threshold (> 0).
        coupled: the fallback is MC-SJD's maximal coupling (else SJD's independent redraw).
    """
    B, W, V = p_new.shape
    pn, po = p_new.float(), p_old.float()
    x = old.long()[..., None]
    kappa = (pn >= threshold).float()  # (B, W, V): the keep probability of an old draft z
    if coupled:
        kappa = torch.maximum(kappa, ratio_accept(pn, po))
        fallback = jacobi_residual(pn, po)
        fallback = fallback / fallback.sum(-1, keepdim=True)
    else:
        fallback = pn
    kept_mass = (kappa * po).sum(-1, keepdim=True)
    law = kappa * po + (1.0 - kept_mass).clamp(min=0.0) * fallback
    law = law / law.sum(-1, keepdim=True)
    keep = torch.rand((B, W), generator=generator, device=pn.device) < kappa.gather(-1, x)[..., 0]
    draw = torch.multinomial(fallback.reshape(-1, V), 1, generator=generator).reshape(B, W)
    fresh = torch.multinomial(pn.reshape(-1, V), 1, generator=generator).reshape(B, W)
    drafts = torch.where(has_old, torch.where(keep, old, draw), fresh)
    return drafts, torch.where(has_old[..., None], law, pn)


def reuse_update(spec: Optional[SpecConfig], *, coupled: bool) -> Optional[Callable]:
    """The `redraft` with reuse a Jacobi loop passes to sjd_generate when spec's sjd_reuse_threshold
    is > 0 (`coupled`: the loop's own update is MC-SJD's coupling); None when the option is off (the
    loop's own update: `reuse_update(spec, coupled=True) or coupled_redraft`)."""
    t = float((spec or SpecConfig()).settings("sjd-reuse").threshold)
    return functools.partial(reuse_redraft, threshold=t, coupled=coupled) if t > 0 else None


register_settings(OptionGroup(
    "sjd-reuse", SJDReuseSettings, doc="SJD++-style reuse of high-confidence drafts in the Jacobi update",
    options=(MethodOption("--sjd-reuse", "sjd_reuse_threshold", float,
                          "SJD family (sjd, mcsjd, gsd, sjd-gasv): keep a previous Jacobi draft x whose probability "
                          "in the new law is >= this (SJD++-style reuse, lossless; 0 = off, the default)."),)))

__all__ = ["SJDReuseSettings", "reuse_redraft", "reuse_update"]
