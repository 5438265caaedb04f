"""Geometry-Aware Soft Verification (GASV): the PyTorch reference.

Implements docs/spec/lisa.md "Geometry-Aware Soft Verification", steps 1-5, for N verification nodes
at once. Every other implementation (Triton kernel, TensorRT plugin, ONNX graph) is tested
against `gasv_gate`.

Conventions (choices, documented here and in the tests):
- `logits` are the target's logits AFTER CFG combine, temperature and top-k/top-p filtering:
  -inf outside the support. +inf and NaN are refused (InputError), as are rows with an empty
  support (every logit -inf).
- The gate is defined as 0 outside the support (p_raw is 0 there, so p_soft does not depend on
  it); both the dense and the top-k-support path, and the Triton kernel, use this convention.
- The argmax i is the FIRST index of the maximum logit (torch.argmax), in every path.
- U = H(p_raw) / log V uses the full vocabulary size V (not the support size).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from ..errors import InputError
from .sampling import tvd  # noqa: F401 (re-exported; defined once in sampling.py)

NEG_INF = float("-inf")


@dataclass(frozen=True)
class GASVConfig:
    """GASV constants (docs/spec/lisa.md defaults). Stored in the calibration tables' metadata.

    `lam` is the spec's lambda (a Python keyword); `theta_geo` is None until calibration sets
    it (8 / median_c beta_c).
    """

    kappa: float = 1.0
    lam: float = 0.4
    gamma_kappa: float = 1.0
    gamma_lambda: float = 1.0
    theta_clu: float = 8.0
    theta_geo: Optional[float] = None
    eps: float = 1e-6

    def __post_init__(self):
        if not self.lam > 0:
            raise InputError(f"GASV lambda must be > 0 (it enters as log lambda), got {self.lam}")
        if not self.kappa >= 0:
            raise InputError(f"GASV kappa must be >= 0, got {self.kappa}")
        if not self.eps > 0:
            raise InputError(f"GASV eps must be > 0, got {self.eps}")
        if self.theta_geo is not None and not (math.isfinite(self.theta_geo) and self.theta_geo > 0):
            raise InputError(f"GASV theta_geo must be a finite positive number, got {self.theta_geo}; "
                             "re-run `lisa-trt calibrate`")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GASVConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


class GASVOutput(NamedTuple):
    """gate (N, V), p_raw (N, V), p_soft (N, V); all fp32, zero outside the support."""

    gate: torch.Tensor
    p_raw: torch.Tensor
    p_soft: torch.Tensor


def check_logits(logits: torch.Tensor) -> None:
    """Refuse logits GASV cannot handle: wrong rank, NaN, +inf, or rows with empty support."""
    if logits.dim() != 2:
        raise InputError(f"GASV logits must be (N, V), got shape {tuple(logits.shape)}")
    if torch.isnan(logits).any():
        rows = torch.isnan(logits).any(-1).nonzero().flatten()[:8].tolist()
        raise InputError(f"GASV got NaN logits in rows {rows}; logits must be finite or -inf "
                         "(-inf marks tokens removed by top-k/top-p). Check the target's output "
                         "and the temperature (> 0).")
    if torch.isposinf(logits).any():
        raise InputError("GASV got +inf logits; only -inf (filtered tokens) is allowed. "
                         "Check the temperature (> 0) and the CFG scale.")
    empty = torch.isneginf(logits).all(-1)
    if empty.any():
        rows = empty.nonzero().flatten()[:8].tolist()
        raise InputError(f"GASV got rows {rows} whose every logit is -inf (empty support); "
                         "top-k/top-p must leave at least one token per node.")


def uncertainty(logits: torch.Tensor) -> torch.Tensor:
    """Step 1: r = U * (2 - 2 m_norm) in [0, 1] per row.

    U = H(p_raw) / log V, m_norm = sigmoid(l_(1) - l_(2)).

    Args:
        logits: (N, V) fp32 filtered logits.
    Returns:
        r: (N,)
    """
    V = logits.shape[-1]
    logp = torch.log_softmax(logits, dim=-1)                             # (N, V)
    p = logp.exp()
    ent = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)  # (N,)
    U = ent / math.log(V) if V > 1 else torch.zeros_like(ent)
    top2 = torch.topk(logits, min(2, V), dim=-1).values                  # (N, 2)
    gap = top2[:, 0] - top2[:, 1] if V > 1 else torch.full_like(ent, math.inf)
    m_norm = torch.sigmoid(gap)                                          # -inf second -> 1
    return U * (2.0 - 2.0 * m_norm)


def modulated_thresholds(r: torch.Tensor, cfg: GASVConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 2: kappa_eff = kappa (1 + gamma_kappa r); log lambda_eff = log lambda - gamma_lambda r.

    Returns (kappa_eff (N,), log_lambda_eff (N,)).
    """
    kappa_eff = cfg.kappa * (1.0 + cfg.gamma_kappa * r)
    log_lambda_eff = math.log(cfg.lam) - cfg.gamma_lambda * r
    return kappa_eff, log_lambda_eff


def cluster_logsumexp(logits: torch.Tensor, cluster: torch.Tensor, n_clusters: int) -> torch.Tensor:
    """Step 4: pi_c = logsumexp_{u in cluster c} l_u (segment reduction via scatter-add).

    Uses the row max as the shift (clusters whose mass underflows get -inf; their gate
    sigmoid(theta_clu * (pi_c - pi_i - log lambda)) is 0 in fp32 either way).

    Args:
        logits: (N, V) fp32, -inf outside the support.
        cluster: (V,) int cluster id per token.
        n_clusters: C.
    Returns:
        pi: (N, C), -inf for clusters without support.
    """
    N, V = logits.shape
    m = logits.max(-1, keepdim=True).values                              # (N, 1)
    e = torch.exp(logits - m)                                            # (N, V), 0 off-support
    sums = torch.zeros(N, n_clusters, dtype=logits.dtype, device=logits.device)
    sums.index_add_(1, cluster.long(), e)                                # (N, C)
    return torch.log(sums) + m


def _gate_on_candidates(l_cand, dot, n2_cand, l_i, n2_i, pi_cand, pi_i, beta_i, kappa_eff,
                        log_lambda_eff, theta_geo, cfg):
    """Steps 3 and 5 on a set of candidate tokens per row (shapes (N, K); per-row (N, 1))."""
    d2 = (n2_i + n2_cand - 2.0 * dot).clamp_min(0.0)
    s_geo = (l_i - l_cand) / (torch.sqrt(d2) + cfg.eps)                  # s_geo(i) == 0
    g_geo = torch.sigmoid(theta_geo * (kappa_eff * beta_i - s_geo))
    g_clu = torch.sigmoid(cfg.theta_clu * (pi_cand - pi_i - log_lambda_eff))
    gate = torch.maximum(g_geo, g_clu)
    return torch.where(torch.isneginf(l_cand), torch.zeros_like(gate), gate)


def _resolve_theta_geo(tables, cfg: GASVConfig) -> float:
    theta = cfg.theta_geo if cfg.theta_geo is not None else getattr(tables, "theta_geo", None)
    if theta is None:
        raise InputError("GASV theta_geo is not set: neither the config nor the tables carry it; "
                         "run `lisa-trt calibrate --model ...` to make tables")
    return float(theta)


def gasv_gate(logits: torch.Tensor, tables, cfg: Optional[GASVConfig] = None, *,
              support_k: Optional[int] = None, force_gate_one: bool = False,
              check_inputs: bool = True) -> GASVOutput:
    """GASV gate and soft target distribution for N verification nodes (docs/spec/lisa.md 1-5).

    Args:
        logits: (N, V) fp32 target logits after CFG combine, temperature and top-k/top-p
            filtering (-inf outside the support).
        tables: GASVTables (or any object with w_tilde (V, H), w_tilde_norm2 (V,), cluster (V,),
            beta (C,), theta_geo, n_clusters) bound to the target's head (`tables.bind(W)`).
        cfg: GASV constants; default the tables' own config.
        support_k: None -> dense path over the whole vocabulary. An int K -> top-K-support path:
            only the K largest logits per row are kept (the others are treated as -inf, in
            p_raw too), and the GEMV runs over the K gathered rows of W~. Equal to the dense
            path when every row has at most K finite logits (top-k filtering with k <= K).
        force_gate_one: gate := 1 on the support, so p_soft == p_raw exactly (tests: GASV then
            reduces to lossless speculative sampling).
        check_inputs: refuse NaN / +inf / empty-support rows with InputError (host syncs; turn
            off in hot loops whose logits are known good).
    Returns:
        GASVOutput(gate (N, V), p_raw (N, V), p_soft (N, V)), fp32, zero outside the support.
    """
    if check_inputs:
        check_logits(logits)
    logits = logits.float()
    N, V = logits.shape
    idx = None
    if support_k is not None and support_k < V:
        idx = torch.topk(logits, support_k, dim=-1).indices              # (N, K)
        logits = torch.full_like(logits, NEG_INF).scatter_(1, idx, logits.gather(1, idx))
    p_raw = torch.softmax(logits, dim=-1)                                # (N, V)
    if force_gate_one:
        gate = (~torch.isneginf(logits)).float()
        return GASVOutput(gate, p_raw, p_raw.clone())
    cfg = cfg if cfg is not None else getattr(tables, "config", GASVConfig())
    theta_geo = _resolve_theta_geo(tables, cfg)
    w_tilde = getattr(tables, "w_tilde", None)
    if w_tilde is None:
        raise InputError("GASV tables are not bound to the target head (w_tilde missing); "
                         "call `tables = tables.bind(target.output.weight)`")
    if w_tilde.shape[0] != V:
        raise InputError(f"GASV tables are for vocabulary {w_tilde.shape[0]}, logits have {V}")
    dev = logits.device
    w_tilde = w_tilde.to(dev, torch.float32)
    n2 = tables.w_tilde_norm2.to(dev, torch.float32)                     # (V,)
    cluster = tables.cluster.to(dev).long()                              # (V,)
    beta = tables.beta.to(dev, torch.float32)                            # (C,)

    r = uncertainty(logits)                                              # (N,)
    kappa_eff, log_lambda_eff = modulated_thresholds(r, cfg)
    i = logits.argmax(-1)                                                # (N,)
    l_i = logits.gather(1, i[:, None])                                   # (N, 1)
    pi = cluster_logsumexp(logits, cluster, beta.shape[0])               # (N, C)
    c_i = cluster[i]                                                     # (N,)
    pi_i = pi.gather(1, c_i[:, None])                                    # (N, 1)
    w_i = w_tilde[i]                                                     # (N, H)
    row = dict(l_i=l_i, n2_i=n2[i][:, None], pi_i=pi_i, beta_i=beta[c_i][:, None],
               kappa_eff=kappa_eff[:, None], log_lambda_eff=log_lambda_eff[:, None],
               theta_geo=theta_geo, cfg=cfg)

    if idx is None:
        dot = w_i @ w_tilde.T                                            # (N, V) GEMV per row
        gate = _gate_on_candidates(logits, dot, n2[None, :], pi_cand=pi[:, cluster], **row)
    else:
        l_c = logits.gather(1, idx)                                      # (N, K)
        dot = torch.bmm(w_tilde[idx], w_i[:, :, None])[..., 0]           # (N, K) gathered GEMV
        g_c = _gate_on_candidates(l_c, dot, n2[idx], pi_cand=pi.gather(1, cluster[idx]), **row)
        gate = torch.zeros_like(logits).scatter_(1, idx, g_c)

    w = p_raw * gate
    p_soft = w / w.sum(-1, keepdim=True)       # > 0: the argmax has s_geo 0 and gate > 0
    return GASVOutput(gate, p_raw, p_soft)
