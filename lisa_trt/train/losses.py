"""Drafter distillation losses: LISA (docs/spec/lisa.md, "Locality-informed distillation"), plus the
plain EAGLE-3 loss and the EAGLE-1/LANTERN loss as baselines.

Every function is pure: tensors in, tensors out. Positions are rows: logits are (M, V) for the
M valid positions of one TTT step (the trainer drops positions past the end of the sequence),
so "the batch" of the quantile selection is those M rows.

LISA, per position with target logits l_t and draft logits l_s (p = softmax):
  1. centroid   c = normalize(sum_k p~_k E[i_k]) over the top-K_c target tokens (renormalised)
  2. N = {v : 1 - <c, E_v> <= r};  alpha = sum_{v in N} p_t(v);  a = [argmax p_s in N]
  3. s = alpha (1 - a);  selected = s > quantile_q_sel(s),  q_sel: 0.9 -> 0.5 linearly
  4. g_align = exp(-KL(p~_t^K || p~_s^K)), K = topK(p_t) U topK(p_s), renormalised on K
  5. w = w_base unselected;  w_veto (1 + beta_sel (1 - g_align)) selected;  w_veto: 0 -> 1 over
     the first 10 % of steps
  6. loss = lambda_CE mean(w L_CE) + lambda_KD mean(w tau^2 KL_K),  L_CE over the top-p nucleus
TTT steps are weighted 0.8^s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ..errors import ConfigError

LOSS_KINDS = ("lisa", "eagle3", "eagle1")
MISMATCH_SCORES = ("top1", "mass")
THRESHOLDS = ("quantile", "mean")
GATES = ("paper", "additive")


@dataclass(frozen=True)
class LossConfig:
    """Loss selection and constants (docs/spec/lisa.md defaults). Every LISA term is switchable.

    kind: "lisa" (the terms below), "eagle3" (sum_s 0.8^s soft CE) or "eagle1" (SmoothL1
    feature regression + eagle1_ce_weight * soft CE, step 0 only unless ttt_steps > 1).
    With kind="lisa" and selection/truncated_ce/kd all off, the loss equals the EAGLE-3 loss.
    """

    kind: str = "lisa"
    ttt_decay: float = 0.8
    # LISA switches
    selection: bool = True  # locality selection + weights (off: w = 1 everywhere)
    soft_gate: bool = True  # g_align in the selected weight (off: g_align = 1)
    veto: bool = True  # scheduled veto ramp (off: w_veto = 1)
    truncated_ce: bool = True  # CE over the target nucleus (off: full soft CE)
    kd: bool = True  # KL over the joint top-K
    # LISA constants
    top_kc: int = 16
    radius: Optional[float] = None  # None: estimated on the first batch so that median |N| = nbhd_size
    nbhd_size: int = 32
    q_sel_start: float = 0.9
    q_sel_end: float = 0.5
    joint_top_k: int = 64
    veto_warmup: float = 0.1  # fraction of all steps
    w_base: float = 0.1
    beta_sel: float = 2.0
    nucleus_p: float = 0.9
    tau_s: float = 1.0
    lambda_ce: float = 1.0
    lambda_kd: float = 1.0
    # extensions of the paper (docs/spec/lisa.md "Extensions"); the defaults are the paper's form
    mismatch: str = "top1"  # "top1": a = [argmax p_s in N]; "mass": a = p_s(N), the drafter's mass in N
    threshold: str = "quantile"  # "quantile": the annealed q_sel; "mean": scores above the batch's mean score
    gate: str = "paper"  # "paper": w_base / w_veto (1 + beta (1 - g)); "additive": 1 + [sel] w_veto beta (1 - g)
    # EAGLE-1 / LANTERN baseline
    eagle1_ce_weight: float = 0.1

    def __post_init__(self):
        if self.kind not in LOSS_KINDS:
            raise ConfigError(f"unknown loss kind {self.kind!r}; valid: {', '.join(LOSS_KINDS)}")
        if not (0.0 <= self.q_sel_end <= 1.0 and 0.0 <= self.q_sel_start <= 1.0):
            raise ConfigError("q_sel_start / q_sel_end must lie in [0, 1]")
        if not 0.0 < self.nucleus_p <= 1.0:
            raise ConfigError(f"nucleus_p must lie in (0, 1], got {self.nucleus_p}")
        if self.tau_s <= 0:
            raise ConfigError(f"tau_s must be > 0, got {self.tau_s}")
        for name, value, valid in (("mismatch", self.mismatch, MISMATCH_SCORES),
                                   ("threshold", self.threshold, THRESHOLDS), ("gate", self.gate, GATES)):
            if value not in valid:
                raise ConfigError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")

    @property
    def needs_codebook(self) -> bool:
        return self.kind == "lisa" and self.selection

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LossConfig":
        return cls(**d)


# loss recipe name (`lisa-trt train --loss NAME`) -> LossConfig fields; "lisa" and "lisa-paper" are the
# spec's form of the paper, the lisa-* others its extensions (docs/spec/lisa.md "Extensions")
LOSS_RECIPES = {
    "lisa": {},
    "lisa-paper": {},
    "lisa-soft": {"mismatch": "mass"},
    "lisa-mean": {"threshold": "mean"},
    "lisa-additive": {"gate": "additive"},
    "lisa-ext": {"mismatch": "mass", "threshold": "mean", "gate": "additive"},
    "eagle3": {"kind": "eagle3"},
    "eagle1": {"kind": "eagle1"},
}


def loss_recipe(name: str, **over) -> LossConfig:
    """The LossConfig of a recipe name (LOSS_RECIPES), with `over` fields on top (e.g. switches off)."""
    if name not in LOSS_RECIPES:
        raise ConfigError(f"unknown loss {name!r}; valid: {', '.join(LOSS_RECIPES)}")
    return LossConfig(**{"kind": "lisa", **LOSS_RECIPES[name], **over})


# ----------------------------------------------------------------------------- schedules

def q_sel_schedule(step: int, total_steps: int, start: float = 0.9, end: float = 0.5) -> float:
    """Selection quantile annealed linearly from `start` (step 0) to `end` (last step)."""
    frac = min(max(step / max(total_steps - 1, 1), 0.0), 1.0)
    return start + (end - start) * frac


def veto_schedule(step: int, total_steps: int, warmup: float = 0.1) -> float:
    """w_veto ramps linearly from 0 (step 0) to 1 at warmup * total_steps, then stays 1."""
    ramp = warmup * total_steps
    if ramp <= 0:
        return 1.0
    return min(step / ramp, 1.0)


# ----------------------------------------------------------------------------- geometry

def target_centroid(p_t: torch.Tensor, codebook: torch.Tensor, k: int = 16) -> torch.Tensor:
    """Probability-weighted centroid of the top-k target tokens in codebook space.

    Args:
        p_t: (M, V) target probabilities.
        codebook: (V, d) L2-normalised codebook E.
        k: K_c, number of top target tokens (probabilities renormalised over them).
    Returns:
        (M, d) L2-normalised centroids c.
    """
    top_p, top_i = p_t.topk(min(k, p_t.shape[-1]), dim=-1)  # (M, k)
    w = top_p / top_p.sum(-1, keepdim=True).clamp_min(1e-30)
    c = torch.einsum("mk,mkd->md", w, codebook[top_i].to(w.dtype))
    return F.normalize(c, dim=-1)


def cosine_distance(c: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """1 - <c, E_v> for every code: (M, d), (V, d) -> (M, V)."""
    return 1.0 - c @ codebook.to(c.dtype).T


def locality_score(p_t: torch.Tensor, s_logits: torch.Tensor, codebook: torch.Tensor, radius: float,
                   k: int = 16, mismatch: str = "top1") -> dict:
    """LISA locality-mismatch score s = alpha (1 - a) (docs/spec/lisa.md steps 1-3).

    Args:
        p_t: (M, V) target probabilities; s_logits: (M, V) draft logits.
        codebook: (V, d) L2-normalised; radius: cosine radius r; k: K_c.
        mismatch: "top1" (the paper: a = [argmax p_s in N]) or "mass" (extension: a = p_s(N), the
            drafter's probability mass inside N, so s varies continuously instead of being 0 or alpha).
    Returns:
        dict with score (M,), alpha (M,) target mass in N, in_nbhd (M,) float [argmax p_s in N],
        size (M,) |N|.
    """
    dist = cosine_distance(target_centroid(p_t, codebook, k), codebook)  # (M, V)
    nbhd = dist <= radius
    alpha = (p_t * nbhd).sum(-1)
    top1_in = nbhd.gather(-1, s_logits.argmax(-1, keepdim=True)).squeeze(-1).to(p_t.dtype)
    a = top1_in if mismatch == "top1" else (s_logits.float().softmax(-1) * nbhd).sum(-1).to(p_t.dtype)
    return {"score": alpha * (1 - a), "alpha": alpha, "in_nbhd": top1_in, "size": nbhd.sum(-1)}


def estimate_radius(p_t: torch.Tensor, codebook: torch.Tensor, k: int = 16, size: int = 32) -> float:
    """Radius r such that the median neighbourhood size |N| over the positions is `size`.

    |N(r)| >= size exactly when r >= d_(size) (the size-th smallest centroid distance), so r is
    the median of d_(size) over positions.
    """
    dist = cosine_distance(target_centroid(p_t, codebook, k), codebook)  # (M, V)
    kth = dist.kthvalue(min(size, dist.shape[-1]), dim=-1).values  # (M,)
    return float(kth.median())


def select_positions(score: torch.Tensor, q: float, threshold: str = "quantile") -> torch.Tensor:
    """Selection mask (M,) -> (M,) bool: score strictly above the q-quantile of the batch's scores
    ("quantile", the paper), or above the batch's mean score ("mean", extension: the selected
    fraction follows the scores' spread instead of a schedule; q is then unused)."""
    if score.numel() == 0:
        return torch.zeros_like(score, dtype=torch.bool)
    thr = torch.quantile(score.float(), q) if threshold == "quantile" else score.float().mean()
    return score > thr


# ----------------------------------------------------------------------------- divergences

def joint_topk_kl(t_logits: torch.Tensor, s_logits: torch.Tensor, k: int = 64, tau: float = 1.0) -> torch.Tensor:
    """KL(p~_t^K || p~_s^K) over K = topK(p_t) U topK(p_s), both renormalised on K.

    Args:
        t_logits, s_logits: (M, V). k: K. tau: temperature applied to both before renormalising.
    Returns:
        (M,) KL, differentiable w.r.t. s_logits.
    """
    k = min(k, t_logits.shape[-1])
    it = t_logits.topk(k, dim=-1).indices  # (M, k)
    is_ = s_logits.detach().topk(k, dim=-1).indices
    dup = (is_[:, :, None] == it[:, None, :]).any(-1)  # (M, k): already in topK(p_t)
    idx = torch.cat([it, is_], dim=-1)  # (M, 2k)
    keep = torch.cat([torch.ones_like(dup), ~dup], dim=-1)
    neg = torch.finfo(torch.float32).min
    lt = torch.where(keep, t_logits.float().gather(-1, idx) / tau, neg).log_softmax(-1)
    ls = torch.where(keep, s_logits.float().gather(-1, idx) / tau, neg).log_softmax(-1)
    return torch.where(keep, lt.exp() * (lt - ls), 0.0).sum(-1)


def soft_ce(t_logits: torch.Tensor, s_logits: torch.Tensor) -> torch.Tensor:
    """CE(target soft dist, draft): -sum_v p_t(v) log p_s(v), (M, V) x2 -> (M,)."""
    return -(t_logits.float().softmax(-1) * s_logits.float().log_softmax(-1)).sum(-1)


def kl_to_target(t_logits: torch.Tensor, s_logits: torch.Tensor) -> torch.Tensor:
    """KL(p_t || p_s) = soft CE - H(p_t): (M, V) x2 -> (M,) (the soft CE without its floor)."""
    lt, ls = t_logits.float().log_softmax(-1), s_logits.float().log_softmax(-1)
    return (lt.exp() * (lt - ls)).nan_to_num(0.0).sum(-1)


def nucleus_ce(t_logits: torch.Tensor, s_logits: torch.Tensor, top_p: float = 0.9) -> torch.Tensor:
    """Truncated CE over the target nucleus S_t (top-p, first token always kept):
    -sum_{v in S_t} p~_t(v) log p_s(v) with p~_t renormalised on S_t. (M, V) x2 -> (M,)."""
    p_sorted, order = t_logits.float().softmax(-1).sort(-1, descending=True)
    keep = (p_sorted.cumsum(-1) - p_sorted) < top_p
    keep[:, 0] = True
    p_keep = p_sorted * keep
    p_keep = p_keep / p_keep.sum(-1, keepdim=True)
    logq = s_logits.float().log_softmax(-1).gather(-1, order)
    return -(p_keep * logq).sum(-1)


# ----------------------------------------------------------------------------- losses per step

def lisa_weights(score: torch.Tensor, g_align: torch.Tensor, step: int, total_steps: int,
                 cfg: LossConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Position weights (docs/spec/lisa.md step 5). Returns (w (M,), selected (M,) bool), no grad."""
    if not cfg.selection:
        return torch.ones_like(score), torch.zeros_like(score, dtype=torch.bool)
    q = q_sel_schedule(step, total_steps, cfg.q_sel_start, cfg.q_sel_end)
    sel = select_positions(score, q, cfg.threshold)
    w_veto = veto_schedule(step, total_steps, cfg.veto_warmup) if cfg.veto else 1.0
    g = g_align if cfg.soft_gate else torch.ones_like(g_align)
    if cfg.gate == "paper":
        w = torch.where(sel, w_veto * (1 + cfg.beta_sel * (1 - g)), torch.full_like(score, cfg.w_base))
    else:  # additive: every position keeps weight 1 (no ramp or selection can zero it); selected gain up to beta
        w = 1 + sel.to(score.dtype) * w_veto * cfg.beta_sel * (1 - g)
    # spec v2: divided by the batch mean, so LISA redistributes supervision instead of shrinking it
    w = w / w.mean().clamp_min(1e-12)
    return w.detach(), sel


def lisa_loss(t_logits: torch.Tensor, s_logits: torch.Tensor, codebook: Optional[torch.Tensor],
              radius: Optional[float], step: int, total_steps: int, cfg: LossConfig) -> tuple[torch.Tensor, dict]:
    """LISA loss of one TTT step over M positions.

    Args:
        t_logits: (M, V) target logits (no grad); s_logits: (M, V) draft logits.
        codebook: (V, d) L2-normalised VQ codebook (needed when cfg.selection).
        radius: neighbourhood radius r. step / total_steps: optimiser progress (schedules).
    Returns:
        (scalar loss, stats dict of detached scalars: ce, kd, sel_frac, g_align, alpha, in_nbhd).
    """
    t_logits = t_logits.detach().float()
    M = t_logits.shape[0]
    stats = {}
    kl_1 = joint_topk_kl(t_logits, s_logits, cfg.joint_top_k, 1.0)  # (M,)
    g_align = torch.exp(-kl_1.detach())
    if cfg.selection:
        if codebook is None or radius is None:
            raise ConfigError("the LISA selection needs the VQ codebook and a neighbourhood radius")
        loc = locality_score(t_logits.softmax(-1), s_logits.detach(), codebook, radius, cfg.top_kc, cfg.mismatch)
        score = loc["score"]
        stats.update(alpha=loc["alpha"].mean(), in_nbhd=loc["in_nbhd"].mean(), nbhd_size=loc["size"].float().mean())
    else:
        score = torch.zeros(M, device=t_logits.device)
    w, sel = lisa_weights(score, g_align, step, total_steps, cfg)
    ce = nucleus_ce(t_logits, s_logits, cfg.nucleus_p) if cfg.truncated_ce else soft_ce(t_logits, s_logits)
    loss = cfg.lambda_ce * (w * ce).sum() / max(M, 1)
    if cfg.kd:
        kd = kl_1 if cfg.tau_s == 1.0 else joint_topk_kl(t_logits, s_logits, cfg.joint_top_k, cfg.tau_s)
        kd = cfg.tau_s ** 2 * kd
        loss = loss + cfg.lambda_kd * (w * kd).sum() / max(M, 1)
        stats["kd"] = kd.detach().mean()
    stats.update(ce=ce.detach().mean(), sel_frac=sel.float().mean(), g_align=g_align.mean(), w_mean=w.mean())
    return loss, stats


def eagle3_loss(t_logits: torch.Tensor, s_logits: torch.Tensor) -> torch.Tensor:
    """Plain EAGLE-3 step loss: mean over positions of CE(target soft dist, draft)."""
    return soft_ce(t_logits.detach(), s_logits).mean()


def eagle1_loss(pred_hidden: torch.Tensor, target_hidden: torch.Tensor, t_logits: torch.Tensor,
                s_logits: torch.Tensor, ce_weight: float = 0.1) -> torch.Tensor:
    """EAGLE-1/LANTERN loss: SmoothL1(feature) + ce_weight * CE(target soft dist, draft).

    Args:
        pred_hidden, target_hidden: (M, H) drafter feature and the target feature it regresses.
        t_logits, s_logits: (M, V).
    """
    reg = F.smooth_l1_loss(pred_hidden.float(), target_hidden.detach().float())
    return reg + ce_weight * eagle3_loss(t_logits, s_logits)


def ttt_weights(n_steps: int, decay: float = 0.8) -> list[float]:
    """EAGLE-3 training-time-test step weights decay^s, s = 0..n_steps-1."""
    return [decay ** s for s in range(n_steps)]


def combine_ttt(step_losses: Sequence[torch.Tensor], decay: float = 0.8) -> torch.Tensor:
    """sum_s decay^s * L_s."""
    return sum(w * l for w, l in zip(ttt_weights(len(step_losses), decay), step_losses))


def step_loss(t_logits: torch.Tensor, s_logits: torch.Tensor, cfg: LossConfig, *, codebook=None, radius=None,
              step: int = 0, total_steps: int = 1, pred_hidden=None, target_hidden=None) -> tuple[torch.Tensor, dict]:
    """The configured loss of one TTT step over M positions -> (scalar, stats)."""
    if cfg.kind == "lisa":
        return lisa_loss(t_logits, s_logits, codebook, radius, step, total_steps, cfg)
    if cfg.kind == "eagle3":
        loss = eagle3_loss(t_logits, s_logits)
        return loss, {"ce": loss.detach()}
    if pred_hidden is None or target_hidden is None:
        raise ConfigError("the eagle1 loss needs the drafter's hidden and the target's hidden state")
    loss = eagle1_loss(pred_hidden, target_hidden, t_logits, s_logits, cfg.eagle1_ce_weight)
    return loss, {"ce": eagle3_loss(t_logits, s_logits).detach()}


# ----------------------------------------------------------------------------- acceptance proxies

def agreement_stats(t_logits: torch.Tensor, s_logits: torch.Tensor) -> dict:
    """Per-position acceptance proxies: top1 agreement and 1 - TVD (lossless accept prob).

    Returns dict of (M,) tensors: top1 (float 0/1), top3 (target argmax among the draft's top 3),
    accept (sum_v min(p_t, p_s)).
    """
    pt, ps = t_logits.float().softmax(-1), s_logits.float().softmax(-1)
    t1 = t_logits.argmax(-1)
    k = min(3, s_logits.shape[-1])
    return {"top1": (t1 == s_logits.argmax(-1)).float(),
            "top3": (s_logits.topk(k, -1).indices == t1[..., None]).any(-1).float(),
            "accept": torch.minimum(pt, ps).sum(-1)}


def mal_proxy(accept: torch.Tensor) -> torch.Tensor:
    """Expected accepted length of a draft chain: 1 + sum_d prod_{s<d} accept_s.

    Args:
        accept: (S, M) per-step acceptance probabilities along the chain for M start positions.
    Returns:
        (M,) expected committed tokens per target forward (bonus token included).
    """
    return 1.0 + accept.cumprod(0).sum(0)
