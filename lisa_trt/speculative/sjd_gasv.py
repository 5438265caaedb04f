"""GASV inside Jacobi windows (`sjd-gasv`): SJD-family drafts verified with
GASV's relaxed rule; relaxed (reports TVD). docs/spec/decoders.md.

SJD accepts the draft x of a window slot (drawn from p_prev) with min(1, p_now(x) / p_prev(x)).
Here the target mass GASV would lend x first moves onto it: the GASV gates of x at the slot's
law p_now (gasv.gasv_gates, or the GASV engine; the calibrated constants and the per-run
--kappa / --lambda / --delta / --neighbours / --scope overrides of `gasv`) give the moved mass
M(x) = sum of gasv.moved_mass over x's candidates (<= delta_eff), and x is accepted with
min(1, p_now(x) / p_prev(x) + M(x)): the lent mass raises the acceptance probability by at
most M(x), as in the tree where the draft law is one-hot, so a slot's law moves by at most
GASV's budget (TV <= E M <= delta_eff). Rejection and the resampled token are SJD's
(norm(max(0, p_now - p_prev))); the Jacobi update is MC-SJD's coupling by default
(`--sjd-gasv-redraft sjd`: SJD's independent redraws). Gates 0 or delta 0: exactly MC-SJD (SJD)
token for token.

TVD: each committed slot reports (a'(x) - a(x)) (1 - R(x)), a' the relaxed and a SJD's acceptance
of the realised draft x, R the residual law: the TV distance between what the slot commits
under the relaxed and under SJD's rule GIVEN x. Averaged over the draft it bounds the TVD
between the slot's law and p_now from above (convexity; SJD's marginal law is p_now), so the
mean reported TVD is an unbiased estimate of an upper bound. (GSD's closed-form marginal law
would need the gates of every vocabulary token at every slot.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import torch

from ..errors import InputError
from .methods import Method, MethodOption, register_method
from .verify import jacobi_residual, ratio_accept, sjd_accept

REDRAFTS = ("sjd", "mcsjd")


@dataclass(frozen=True)
class SJDGASVSettings:
    """sjd-gasv knobs (flat name sjd_gasv_redraft; CLI --sjd-gasv-redraft). The GASV constants are
    `gasv`'s (the tables' config and the --kappa / --lambda / --delta ... overrides)."""

    redraft: str = "mcsjd"  # the Jacobi update: mcsjd (maximal coupling; measured best) | sjd (independent)

    def __post_init__(self):
        if self.redraft not in REDRAFTS:
            raise InputError(f"sjd-gasv redraft must be one of {', '.join(REDRAFTS)}, got {self.redraft!r}")


def gasv_config(spec, tables, engine=None):
    """The GASV constants of a run: the engine's or the tables' config with the spec's overrides."""
    if engine is None and tables is None:
        raise InputError("sjd-gasv verification needs calibration tables: pass --tables "
                         "(make them with `lisa-trt calibrate`)")
    cfg = engine.config if engine is not None else tables.config
    over = spec.gasv.overrides()
    return dataclasses.replace(cfg, **over) if over else cfg


def moved_onto_drafts(p_now: torch.Tensor, drafts: torch.Tensor, tables, cfg, engine=None,
                      sub_vocab=None) -> torch.Tensor:
    """M(x) (B, W): the GASV mass each slot's law lends its draft (gasv_gates + moved_mass, the
    slot's own law as the parent). sub_vocab: gates over the image codes (Chameleon). Slots with
    a one-hot law (a forced token such as a row end), a draft off the support or (sub_vocab) a
    non-code draft get 0."""
    from ..validation import debug_checks
    from .gasv import gasv_gates, moved_mass

    B, W, V = p_now.shape
    logits = torch.log(p_now.float())
    tok = drafts.long()
    ok = p_now.float().max(-1).values < 1.0
    if sub_vocab is not None:
        lut = sub_vocab.lut(V, p_now.device)
        logits = logits[..., sub_vocab.code_ids.to(p_now.device)]
        tok = lut[tok]
        ok = ok & (tok < sub_vocab.K)
    ok = ok & torch.isfinite(logits).any(-1) & torch.isfinite(logits.gather(-1, tok.clamp(
        max=logits.shape[-1] - 1)[..., None])[..., 0])
    flat = torch.where(ok[..., None], logits, torch.zeros_like(logits)).reshape(B * W, -1)
    par = torch.where(ok.reshape(-1), torch.arange(B * W, device=p_now.device), -1)
    t = torch.where(ok, tok, 0).reshape(-1)
    if engine is not None and cfg.scope == "neighbours":
        out = engine(flat, t, par, cfg)
    else:
        out = gasv_gates(flat, t, par, tables, cfg, check_inputs=debug_checks())  # no host read in the step
    m = moved_mass(out.p.float(), out.cand.long(), out.gate.float(), out.delta_eff.float())
    return torch.where(ok, m.sum(-1).reshape(B, W).to(p_now.device), 0.0)


def gasv_jacobi_accept(p_now, p_prev, drafts, generator, moved) -> tuple:
    """The SJD loop's `accept` seam with GASV's relaxed acceptance -> (SJDResult, tvd (B, W)).

    moved: `moved(p_now (B, W, V), drafts (B, W)) -> M (B, W)` (moved_onto_drafts bound to the run)."""
    pn = p_now.float() / p_now.float().sum(-1, keepdim=True)
    pp = p_prev.float() / p_prev.float().sum(-1, keepdim=True)
    x = drafts.long()[..., None]
    px, qx = pn.gather(-1, x)[..., 0], pp.gather(-1, x)[..., 0]
    a_sjd = ratio_accept(px, qx)
    a = (a_sjd + moved(pn, drafts)).clamp(max=1.0)
    res = sjd_accept(pn, pp, drafts, generator, accept_prob=a)
    resid = jacobi_residual(pn, pp)
    rx = (resid / resid.sum(-1, keepdim=True)).gather(-1, x)[..., 0]
    return res, (a - a_sjd) * (1.0 - rx)


def sjd_gasv_decoder(target, drafter, tables, gasv, spec):
    """sjd-gasv's Decoder (Method.decoder): the one Jacobi loop with GASV's acceptance (per-token
    TVD), over the image codes of the session's layout (sub_vocab) where it has them."""
    from .mcsjd import coupled_redraft
    from .sjd import ChainWindow, JacobiDecoder

    s = spec.settings("sjd-gasv")
    cfg = gasv_config(spec, tables, gasv)
    window = spec.settings("sjd").window

    def shape(session):
        sub_vocab = session.layout.sub_vocab

        def accept(pn, pp, drafts, gen):
            return gasv_jacobi_accept(pn, pp, drafts, gen, lambda p, d: moved_onto_drafts(
                p, d, tables, cfg, gasv, sub_vocab))

        return ChainWindow(coupled_redraft if s.redraft == "mcsjd" else None, accept)

    return JacobiDecoder(target, "sjd-gasv", window, shape, ChainWindow().scratch(window))


register_method(Method(
    "sjd-gasv", "sjd", "GASV's relaxed acceptance inside SJD windows: a Jacobi draft is lent the gated "
    "neighbour mass of its slot's law (relaxed: reports TVD; no drafter, GASV tables)", needs_tables=True,
    settings=SJDGASVSettings, decoder=sjd_gasv_decoder,
    options=(MethodOption("--sjd-gasv-redraft", "sjd_gasv_redraft", str, "sjd-gasv: the Jacobi update, mcsjd "
                          "(MC-SJD's coupling, default) or sjd (independent redraws)."),)))

__all__ = ["SJDGASVSettings", "gasv_config", "gasv_jacobi_accept", "moved_onto_drafts", "sjd_gasv_decoder"]
