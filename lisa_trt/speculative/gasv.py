"""Geometry-Aware Soft Verification (GASV) version 2, draft-anchored: the PyTorch reference.

Implements docs/spec/lisa.md "GASV, version 2", steps 1-4 (per-node gates); steps 5-7 (the sibling
scan with the residual, the closed-form law and greedy mode) live in verify.py (`GASVRule`,
`verify_gasv`, `verify_gasv_greedy`). This module is the ONE source of truth for the math: the
ONNX graph (export/onnx.py `GASVGraph`) calls `gasv_core`, and the Triton kernel and TensorRT
plugin reference path are tested against `gasv_gates`.

What is computed (per tree node n, verified at its parent par(n), with token d = tokens[n]):
- per row (as a parent): p = softmax(l), the uncertainty r_u, the modulated thresholds
  kappa_eff, log lambda_eff, delta_eff (step 2) and the cluster log-masses pi_c (step 4);
- per node: the candidates N(d) (K ids, -1 padded) and their gates g(v|d) against the parent's
  logits (step 4). The host verify then only touches K entries per drafted sibling.

Conventions (choices, documented here, in docs/gasv.md and pinned by tests):
- logits are the target's logits AFTER CFG combine, temperature and top-k/top-p (-inf outside
  the support); NaN, +inf and empty rows are refused (InputError).
- a candidate outside the support of p has gate 0; a drafted token outside the support gets no
  mass at all (every gate 0): GASV never commits a token the sampling filters removed.
- U = H(p) / log V with the full vocabulary size V.
- the root row (parent -1) has no gates (all 0).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from ..errors import InputError
from ..models.io_spec import GASV_PARAMS as PARAMS  # the graph input order (the I/O contract)
from .sampling import tvd  # noqa: F401 (re-exported; defined once in sampling.py)

NEG_INF = float("-inf")
GASV_VERSION = 2
SCOPES = ("neighbours", "cluster", "support")


@dataclass(frozen=True)
class GASVConfig:
    """GASV v2 knobs and constants (docs/spec/lisa.md defaults); stored in the tables' metadata.

    Directions: a larger kappa, a SMALLER lambda, a larger delta or more neighbours accept more
    (faster, more distortion). kappa = 0 and lambda = 1, or delta = 0, is exact speculative
    sampling. `lam` is the spec's lambda (a Python keyword); `theta_geo` is None until
    calibration sets it (8 / median_c beta_c). `scope` other than "neighbours" is an ablation
    (PyTorch reference only).
    """

    kappa: float = 1.0
    lam: float = 0.6
    delta: float = 1.0
    neighbours: int = 16
    scope: str = "neighbours"
    gamma_kappa: float = 1.0
    gamma_lambda: float = 1.0
    gamma_delta: float = 0.0
    theta_clu: float = 8.0
    theta_geo: Optional[float] = None
    eps: float = 1e-6

    def __post_init__(self):
        bad = []
        if not 0.0 < self.lam <= 1.0:
            bad.append(f"lambda must be in (0, 1] (1 switches the cluster branch off), got {self.lam}")
        if not self.kappa >= 0:
            bad.append(f"kappa must be >= 0 (0 switches the geometric branch off), got {self.kappa}")
        if not self.delta >= 0:
            bad.append(f"delta must be >= 0 (0 is exact sampling), got {self.delta}")
        if int(self.neighbours) != self.neighbours or self.neighbours < 1:
            bad.append(f"neighbours must be a positive integer, got {self.neighbours}")
        if self.scope not in SCOPES:
            bad.append(f"scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")
        for n in ("gamma_kappa", "gamma_lambda", "gamma_delta"):
            if not getattr(self, n) >= 0:
                bad.append(f"{n} must be >= 0, got {getattr(self, n)}")
        if not self.theta_clu > 0 or not self.eps > 0:
            bad.append(f"theta_clu and eps must be > 0, got {self.theta_clu}, {self.eps}")
        if self.theta_geo is not None and not (math.isfinite(self.theta_geo) and self.theta_geo > 0):
            bad.append(f"theta_geo must be a finite positive number, got {self.theta_geo}; "
                       "re-run `lisa-trt calibrate`")
        if bad:
            raise InputError("GASV " + "; ".join(bad))
        object.__setattr__(self, "neighbours", int(self.neighbours))

    @property
    def lossless(self) -> bool:
        """True when the knobs make GASV exact speculative sampling (no gate or no budget)."""
        return self.delta == 0 or (self.kappa == 0 and self.lam == 1.0)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GASVConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def params(self, device=None) -> torch.Tensor:
        """The `gasv_params` vector (PARAMS order) of the GASV graph and kernels, fp32."""
        if self.theta_geo is None:
            raise InputError("GASV theta_geo is not set; re-run `lisa-trt calibrate --model ...`")
        return torch.tensor([float(getattr(self, n)) for n in PARAMS], dtype=torch.float32, device=device)


class GASVGates(NamedTuple):
    """Per-row / per-node GASV quantities (rows = tree nodes, flattened over the batch).

    p (N, V) softmax of each row; delta_eff (N,) the mass budget when the row is a parent;
    cand (N, K) long candidates of each node's token (-1 padded); gate (N, K) fp32 their gates
    against the node's parent (0 on padding, off-support candidates and the root).
    """

    p: torch.Tensor
    delta_eff: torch.Tensor
    cand: torch.Tensor
    gate: torch.Tensor


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
    """Step 1: r_u = U * (2 - 2 m_norm) in [0, 1] per row; U = H(p) / log V,
    m_norm = sigmoid(l_(1) - l_(2)) (1 when the support has one token).

    Args:
        logits: (N, V) fp32 filtered logits.
    Returns:
        (N,)
    """
    V = logits.shape[-1]
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    ent = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)
    if V < 2:
        return torch.zeros_like(ent)
    top2 = torch.topk(logits, 2, dim=-1).values
    m_norm = torch.sigmoid(top2[:, 0] - top2[:, 1])                      # -inf runner-up -> 1
    return ent / math.log(V) * (2.0 - 2.0 * m_norm)


def modulate(r_u: torch.Tensor, prm: dict):
    """Step 2 (uncertainty relaxes): kappa_eff = kappa (1 + gamma_kappa r_u);
    log lambda_eff = (1 + gamma_lambda r_u) log lambda; delta_eff = min(1, delta (1 + gamma_delta r_u)).

    Args:
        r_u: (N,); prm: name -> float or 0-d tensor (PARAMS names).
    Returns:
        kappa_eff, log_lambda_eff, delta_eff: each (N,).
    """
    log_lam = torch.log(torch.as_tensor(prm["lam"], dtype=r_u.dtype, device=r_u.device))
    kappa_eff = prm["kappa"] * (1.0 + prm["gamma_kappa"] * r_u)
    log_lambda_eff = (1.0 + prm["gamma_lambda"] * r_u) * log_lam
    delta_eff = torch.clamp(prm["delta"] * (1.0 + prm["gamma_delta"] * r_u), max=1.0)
    return kappa_eff, log_lambda_eff, delta_eff


def cluster_logsumexp(logits: torch.Tensor, cluster: torch.Tensor, n_clusters: int) -> torch.Tensor:
    """pi_c = logsumexp_{u in cluster c} l_u: (N, V) -> (N, C), -inf for clusters without support."""
    N, V = logits.shape
    m = logits.max(-1, keepdim=True).values
    e = torch.exp(logits - m)
    sums = torch.zeros(N, n_clusters, dtype=logits.dtype, device=logits.device)
    sums = sums.index_add(1, cluster.long(), e)
    return torch.log(sums) + m


def gasv_core(logits: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, cand: torch.Tensor,
              w_tilde: torch.Tensor, n2: torch.Tensor, cluster: torch.Tensor, beta: torch.Tensor,
              prm: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Steps 1-4 on prepared tensors (traceable: the ONNX graph calls this very function).

    Args:
        logits: (N, V) fp32 filtered logits, one row per tree node.
        tokens: (N,) long node tokens d; parents: (N,) long row of each node's parent (-1: root).
        cand: (N, K) long candidates of each node's token (-1 padded, d itself excluded).
        w_tilde (V, H), n2 (V,), cluster (V,) long, beta (C,): the bound tables.
        prm: PARAMS name -> float or 0-d tensor.
    Returns:
        p (N, V), delta_eff (N,), gate (N, K).
    """
    p = torch.softmax(logits, dim=-1)
    r_u = uncertainty(logits)
    kappa_eff, log_lambda_eff, delta_eff = modulate(r_u, prm)
    pi = cluster_logsumexp(logits, cluster, beta.shape[0])               # (N, C)
    pi_gap = pi - pi.max(-1, keepdim=True).values                        # pi_c - max_c pi_c
    has_par = parents >= 0
    par = parents.clamp(min=0)
    d = tokens.clamp(min=0)
    cv = cand.clamp(min=0)
    l_d = logits[par, d]                                                 # (N,)
    l_v = logits[par[:, None], cv]                                       # (N, K)
    valid = (cand >= 0) & torch.isfinite(l_v) & (torch.isfinite(l_d) & has_par)[:, None]
    zero = torch.zeros_like(l_v)
    diff = torch.where(valid, l_d[:, None] - l_v, zero).abs()
    w_d = w_tilde[d]                                                     # (N, H)
    dot = torch.matmul(w_tilde[cv], w_d[:, :, None])[..., 0]             # (N, K) gathered GEMV
    d2 = torch.clamp(n2[d][:, None] + n2[cv] - 2.0 * dot, min=0.0)
    s = diff / (torch.sqrt(d2) + prm["eps"])
    c_d = cluster[d]
    g_geo = torch.relu(torch.tanh(prm["theta_geo"] / 2.0 * (
        (kappa_eff[par] * beta[c_d])[:, None] - s)))
    clu = torch.relu(torch.tanh(prm["theta_clu"] / 2.0 * (
        pi_gap[par, c_d] - log_lambda_eff[par])))                        # (N,)
    g_clu = torch.where(cluster[cv] == c_d[:, None], clu[:, None], zero)
    gate = torch.where(valid, torch.maximum(g_geo, g_clu), zero)
    return p, delta_eff, gate


_CLUSTER_MEMBERS: dict = {}


def _cluster_members(cluster: torch.Tensor) -> torch.Tensor:
    """(C, S) long members of each cluster, -1 padded (cached per cluster tensor)."""
    key = (cluster.data_ptr(), cluster.numel(), str(cluster.device))
    hit = _CLUSTER_MEMBERS.get(key)
    if hit is not None and hit[0] is cluster:
        return hit[1]
    cl = cluster.long()
    C = int(cl.max()) + 1
    order = torch.argsort(cl, stable=True)
    counts = torch.bincount(cl, minlength=C)
    starts = counts.cumsum(0) - counts
    slot = torch.arange(cl.numel(), device=cl.device) - starts[cl[order]]
    table = torch.full((C, int(counts.max())), -1, dtype=torch.long, device=cl.device)
    table[cl[order], slot] = order
    _CLUSTER_MEMBERS[key] = (cluster, table)
    return table


def candidates(tokens: torch.Tensor, tables, cfg: GASVConfig) -> torch.Tensor:
    """Step 3: candidates N(d) of each token (N,) -> (N, K) long, -1 padded, d excluded.

    neighbours: the first K_n LANTERN codebook neighbours (nearest first); cluster: d's k-means
    cluster; support: every token. (The support restriction is applied by the gate.)
    """
    d = tokens.long().clamp(min=0)
    if cfg.scope == "neighbours":
        nb = tables.lantern_neighbors
        if cfg.neighbours > nb.shape[1]:
            raise InputError(f"GASV neighbours {cfg.neighbours} exceeds the tables' neighbour lists "
                             f"({nb.shape[1]}); re-run `lisa-trt calibrate --lantern-k ...`")
        return nb.to(d.device)[d, : cfg.neighbours].long()
    if cfg.scope == "cluster":
        cl = tables.cluster.to(d.device)
        c = _cluster_members(cl)[cl[d].long()]
    else:
        c = torch.arange(tables.vocab_size, device=d.device).expand(d.shape[0], -1)
    return torch.where(c == d[:, None], -1, c)


def gasv_gates(logits: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, tables,
               cfg: Optional[GASVConfig] = None, *, check_inputs: bool = True) -> GASVGates:
    """GASV v2 per-row / per-node quantities for N tree nodes (spec/lisa.md steps 1-4).

    Args:
        logits: (N, V) target logits after CFG, temperature, top-k/top-p (-inf off the support).
        tokens: (N,) node tokens; parents: (N,) parent ROW of each node (-1 for roots).
        tables: bound GASVTables (w_tilde, w_tilde_norm2, cluster, beta, lantern_neighbors).
        cfg: knobs; default the tables' config.
        check_inputs: refuse NaN / +inf / empty rows (host sync).
    Returns:
        GASVGates(p, delta_eff, cand, gate).
    """
    if check_inputs:
        check_logits(logits)
    logits = logits.float()
    cfg = cfg if cfg is not None else getattr(tables, "config", GASVConfig())
    if cfg.theta_geo is None:
        theta = getattr(tables, "theta_geo", None)
        if theta is None:
            raise InputError("GASV theta_geo is not set: neither the config nor the tables carry it; "
                             "run `lisa-trt calibrate --model ...` to make tables")
        cfg = dataclasses.replace(cfg, theta_geo=float(theta))
    w_tilde = getattr(tables, "w_tilde", None)
    if w_tilde is None:
        raise InputError("GASV tables are not bound to the target head (w_tilde missing); "
                         "call `tables = tables.bind(target.output.weight)`")
    N, V = logits.shape
    if w_tilde.shape[0] != V:
        raise InputError(f"GASV tables are for vocabulary {w_tilde.shape[0]}, logits have {V}")
    if tokens.shape != (N,) or parents.shape != (N,):
        raise InputError(f"GASV tokens and parents must be ({N},), got {tuple(tokens.shape)}, "
                         f"{tuple(parents.shape)}")
    dev = logits.device
    cand = candidates(tokens.to(dev), tables, cfg)
    prm = {n: float(getattr(cfg, n)) for n in PARAMS}
    p, delta_eff, gate = gasv_core(logits, tokens.to(dev).long(), parents.to(dev).long(), cand,
                                   w_tilde.to(dev, torch.float32), tables.w_tilde_norm2.to(dev, torch.float32),
                                   tables.cluster.to(dev).long(), tables.beta.to(dev, torch.float32), prm)
    return GASVGates(p, delta_eff, cand, gate)


def moved_mass(r: torch.Tensor, cand: torch.Tensor, gate: torch.Tensor, delta_eff: torch.Tensor) -> torch.Tensor:
    """Step 5: m(v) = r(v) g(v|d) min(1, delta_eff / M), M = sum_v r(v) g(v|d), over the candidates.

    Args:
        r: (B, V) normalised residual; cand, gate: (B, K); delta_eff: (B,).
    Returns:
        m (B, K) (0 on padding).
    """
    w = r.gather(1, cand.clamp(min=0)) * gate
    scale = (delta_eff / w.sum(-1).clamp(min=1e-30)).clamp(max=1.0)  # M = 0: every w is 0, so m is 0
    return w * scale[:, None]
