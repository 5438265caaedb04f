"""Offline rollout profiling: target + VQ codebook -> GASV / LANTERN tables (docs/spec/lisa.md).

    whitening      invstd of output.weight, W~ = W * invstd, row norms of W~
    clusters       seeded k-means (k-means++ init, Lloyd) on the codebook (or on W~)
    LANTERN        K nearest codes of every code by L2 on the normalised codebook
    budgets        R rollouts of the target itself; at each position the SAMPLED token z and S
                   candidates v ~ p restricted to N(z) (its K_n codebook neighbours, the GASV v2
                   candidate set); beta_c = q-quantile of s(v|z) over positions whose z is in
                   cluster c (the statistic the runtime gates on), global quantile for clusters
                   with < 32 samples; theta_geo = 8 / median(beta)

Everything is deterministic for a given seed (private torch.Generators; the global RNG is
untouched).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..config import SamplingConfig
from ..errors import InputError
from ..models.family import family_of
from ..speculative.gasv import GASVConfig
from .tables import GASVTables, target_hash_of, whiten, whitening


def default_n_clusters(V: int) -> int:
    """round(2 * sqrt(V)) (256 for V = 16384), at most V."""
    return max(1, min(V, round(2 * math.sqrt(V))))


def _sq_dists(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Squared L2 distances (n, k) between rows of x (n, d) and c (k, d)."""
    return ((x * x).sum(1, keepdim=True) + (c * c).sum(1)[None] - 2 * x @ c.T).clamp_min(0)


def kmeans(x: torch.Tensor, k: int, *, seed: int = 0, iters: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic k-means (k-means++ init from a seeded generator, Lloyd iterations).

    An empty cluster is re-seeded with the point farthest from its centroid (taken from a
    cluster with more than one point, so every cluster ends non-empty).

    Args:
        x: (n, d) points.
        k: number of clusters (<= n).
    Returns:
        assign (n,) int32 in [0, k), centroids (k, d) fp32.
    """
    x = x.detach().float().cpu()
    n = x.shape[0]
    if not 1 <= k <= n:
        raise InputError(f"k-means needs 1 <= n_clusters <= {n} points, got {k}")
    g = torch.Generator().manual_seed(seed)
    cent = torch.empty(k, x.shape[1])
    cent[0] = x[torch.randint(n, (1,), generator=g)]
    d2 = _sq_dists(x, cent[:1])[:, 0]
    for j in range(1, k):                       # k-means++: sample proportional to D^2
        probs = d2 / d2.sum() if d2.sum() > 0 else torch.full_like(d2, 1.0 / n)
        cent[j] = x[torch.multinomial(probs, 1, generator=g)]
        d2 = torch.minimum(d2, _sq_dists(x, cent[j : j + 1])[:, 0])
    assign = torch.full((n,), -1, dtype=torch.long)
    for _ in range(iters):
        dist = _sq_dists(x, cent)                                        # (n, k)
        new = dist.argmin(1)
        counts = torch.bincount(new, minlength=k)
        own = dist.gather(1, new[:, None])[:, 0]                         # (n,) distance to own centroid
        for c in (counts == 0).nonzero().flatten().tolist():             # re-seed empty clusters
            far = int(torch.where(counts[new] > 1, own, -1.0).argmax())  # never empties another
            counts[new[far]] -= 1
            counts[c] += 1
            new[far] = c
        if torch.equal(new, assign):
            break
        assign = new
        sums = torch.zeros(k, x.shape[1]).index_add_(0, assign, x)
        cent = sums / torch.bincount(assign, minlength=k).clamp_min(1)[:, None].float()
    return assign.to(torch.int32), cent


def lantern_neighbors(codebook: torch.Tensor, k: int, *, chunk: int = 1024) -> torch.Tensor:
    """K nearest codes of every code by L2 on the L2-normalised codebook, nearest first, self excluded.

    Args:
        codebook: (V, d).
        k: neighbours per code (<= V - 1).
    Returns:
        (V, k) int16 if V <= 32767 else int32.
    """
    e = F.normalize(codebook.detach().float().cpu(), dim=1)
    V = e.shape[0]
    if not 0 <= k <= V - 1:
        raise InputError(f"lantern_k must be in 0..{V - 1} (vocabulary {V}), got {k}")
    dtype = torch.int16 if V <= 32767 else torch.int32
    out = torch.empty(V, k, dtype=dtype)
    for s in range(0, V, chunk):
        d = _sq_dists(e[s : s + chunk], e)                               # (c, V)
        rows = torch.arange(s, min(s + chunk, V))
        d[rows - s, rows] = math.inf                                     # self excluded
        out[s : s + chunk] = torch.topk(d, k, dim=1, largest=False, sorted=True).indices.to(dtype)
    return out


def guided_rollout_logits(target, cond, tokens: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Teacher-forced, CFG-combined, temperature/top-k/top-p filtered logits (B, N, V) of `tokens`."""
    from ..speculative.autoregressive import cfg_batch
    from ..speculative.sampling import guided_logits, process_logits

    cfg_on = sampling.cfg_scale > 1.0
    full = cfg_batch(target, cond, sampling.cfg_scale)
    raw = target.teacher_forced_logits(full, torch.cat([tokens, tokens]) if cfg_on else tokens)
    guided = guided_logits(raw, sampling.cfg_scale, True)
    return process_logits(guided, sampling.temperature, sampling.top_k, sampling.top_p)


def drift_samples(logits: torch.Tensor, tokens: torch.Tensor, w_tilde: torch.Tensor, neighbors: torch.Tensor,
                  S: int, generator: torch.Generator, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """s(v|z) for S candidates v ~ p restricted to N(z) at each position (spec/lisa.md Calibration).

    z is the token the rollout sampled at the position; N(z) its K_n codebook neighbours (the
    runtime's candidate set) inside the support of p. s(v|z) = |l_z - l_v| / ||W~_z - W~_v||: the
    statistic GASV v2 gates on.

    Args:
        logits: (M, V) filtered logits; tokens: (M,) sampled tokens z.
        w_tilde: (V, H) whitened head; neighbors: (V, K_n) candidate table (nearest first).
    Returns:
        s (M', S) drift values and z (M',) for the M' positions with any candidate mass.
    """
    z = tokens.long()
    nb = neighbors.to(logits.device).long()[z]                           # (M, K_n)
    p = torch.softmax(logits, -1).gather(1, nb)                          # p restricted to N(z)
    keep = (p.sum(-1) > 0) & torch.isfinite(logits.gather(1, z[:, None])[:, 0])
    z, p, nb, logits = z[keep], p[keep], nb[keep], logits[keep]
    if not len(z):
        return torch.empty(0, S), z
    v = nb.gather(1, torch.multinomial(p, S, replacement=True, generator=generator))  # (M', S)
    gap = (logits.gather(1, z[:, None]) - logits.gather(1, v)).abs()     # (M', S)
    dist = (w_tilde[z][:, None, :] - w_tilde[v]).norm(dim=-1)            # (M', S)
    return gap / (dist + eps), z


def cluster_budgets(s: torch.Tensor, c: torch.Tensor, C: int, q: float,
                    min_samples: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """beta_c = q-quantile of the drifts whose token z lies in cluster c (global if < min_samples).

    Args:
        s: (M,) drift samples; c: (M,) cluster of each sample's sampled token z.
    Returns:
        beta (C,) fp32, counts (C,) samples per cluster.
    """
    s, c = s.flatten().double(), c.flatten().long()
    if not len(s):
        raise InputError("calibration rollouts produced no candidate tokens (no position had mass on "
                         "the sampled token's codebook neighbours): calibrate with top_k > 1 / "
                         "temperature > 0, or more neighbours")
    glob = torch.quantile(s, q)
    counts = torch.bincount(c, minlength=C)
    beta = torch.full((C,), float(glob), dtype=torch.float64)
    order = torch.argsort(c, stable=True)
    s_sorted = s[order]
    ends = counts.cumsum(0)
    for k in (counts >= min_samples).nonzero().flatten().tolist():
        beta[k] = torch.quantile(s_sorted[ends[k] - counts[k] : ends[k]], q)
    return beta.float(), counts


@torch.no_grad()
def calibrate(target, vq_codebook: torch.Tensor, *, conds=None, num_rollouts: int = 64,
              samples_per_pos: int = 8, quantile: float = 0.5, n_clusters: Optional[int] = None,
              cluster_space: str = "codebook", lantern_k: int = 1000, seed: int = 0,
              sampling: SamplingConfig = SamplingConfig(), gasv: GASVConfig = GASVConfig(),
              batch_size: int = 8, min_cluster_samples: int = 32, kmeans_iters: int = 50,
              progress: bool = True) -> GASVTables:
    """Make GASV + LANTERN tables for `target` by rollout profiling (docs/spec/lisa.md "Calibration").

    Args:
        target: lisa_trt Transformer (eval).
        vq_codebook: (V, d) VQ codebook (L2-normalised here if it is not already).
        conds: rollout conditions; default `num_rollouts` seeded random class ids (c2i only;
            t2i needs (features, mask) given here).
        num_rollouts: images generated (R); ignored when conds is given.
        samples_per_pos: alternatives S per position.
        quantile: q of the per-cluster drift quantile.
        n_clusters: C; default round(2 sqrt(V)).
        cluster_space: "codebook" (k-means on the normalised codebook) or "w_tilde".
        lantern_k: LANTERN neighbours per code (clamped to V - 1).
        seed: one seed for rollouts, alternative sampling and k-means.
        sampling: CFG scale / temperature / top-k / top-p of the rollouts (deployment settings).
        gasv: GASV constants to store; theta_geo is replaced by 8 / median(beta).
        batch_size: rollouts per target batch.
        min_cluster_samples: clusters with fewer samples use the global quantile.
        progress: tqdm bar over rollout batches.
    Returns:
        GASVTables bound to the target's head.
    """
    from ..speculative.autoregressive import generate

    W = target.output.weight.detach().float()
    V = W.shape[0]
    if vq_codebook.dim() != 2 or vq_codebook.shape[0] != V:
        raise InputError(f"VQ codebook must be (V={V}, d) for this target, got {tuple(vq_codebook.shape)}")
    if cluster_space not in ("codebook", "w_tilde"):
        raise InputError(f"cluster_space must be 'codebook' or 'w_tilde', got {cluster_space!r}")
    if not 0.0 < quantile < 1.0 or samples_per_pos < 1:
        raise InputError("calibration needs 0 < quantile < 1 and samples_per_pos >= 1")
    if conds is None and (not isinstance(num_rollouts, int) or num_rollouts < 1):
        raise InputError(f"calibration needs num_rollouts >= 1 (--rollouts), got {num_rollouts!r}")
    codebook = F.normalize(vq_codebook.detach().float().cpu(), dim=1)
    invstd = whitening(W)
    w_tilde = whiten(W, invstd)                                          # (V, H)
    C = n_clusters or default_n_clusters(V)
    space = codebook if cluster_space == "codebook" else w_tilde.cpu()
    cluster, centroids = kmeans(space, C, seed=seed, iters=kmeans_iters)

    if conds is None:
        if not family_of(target.config).class_conditioned(target.config):
            raise InputError("t2i calibration needs caption conditions: pass conds=(features, mask) "
                             "(CLI: `lisa-trt calibrate --captions CAPTIONS.txt --encoder T5_DIR`)")
        g = torch.Generator().manual_seed(seed)
        conds = torch.randint(0, target.config.num_classes, (num_rollouts,), generator=g).to(W.device)
    R = target.check_cond(conds)
    gen = torch.Generator(device=W.device).manual_seed(seed)
    alt_gen = torch.Generator(device=W.device).manual_seed(seed + 1)
    cluster_dev = cluster.to(W.device).long()
    neighbors = lantern_neighbors(codebook, min(lantern_k, V - 1))
    if gasv.neighbours > neighbors.shape[1]:
        raise InputError(f"GASV neighbours {gasv.neighbours} exceeds lantern_k {neighbors.shape[1]}")
    cand = neighbors[:, : gasv.neighbours].to(W.device)
    all_s, all_c = [], []
    # Bar in rollouts, advanced token by token (one batch can be all the rollouts: no 0/1 bar).
    bar = tqdm(total=R, desc="calibrate rollouts", unit="rollout", disable=not progress,
               bar_format="{l_bar}{bar}| {n:.1f}/{total} [{elapsed}<{remaining}]")
    N = target.config.block_size
    for s in range(0, R, batch_size):
        cond = _slice_cond(conds, s, s + batch_size)
        nb = min(batch_size, R - s)
        tokens = generate(target, cond, cfg_scale=sampling.cfg_scale, temperature=sampling.temperature,
                          top_k=sampling.top_k, top_p=sampling.top_p, greedy=sampling.greedy,
                          cfg_interval=sampling.cfg_interval, generator=gen,
                          on_token=lambda _i, nb=nb: bar.update(0.9 * nb / N))
        logits = guided_rollout_logits(target, cond, tokens, sampling)  # (B, N, V)
        drift, z = drift_samples(logits.reshape(-1, V), tokens.reshape(-1), w_tilde, cand, samples_per_pos,
                                 alt_gen, gasv.eps)
        all_s.append(drift.cpu())
        all_c.append(cluster_dev[z][:, None].expand_as(drift).cpu())
        bar.n = s + nb  # the remaining 10 %: drift sampling of this batch
        bar.refresh()
    bar.close()
    beta, counts = cluster_budgets(torch.cat(all_s), torch.cat(all_c), C, quantile, min_cluster_samples)
    med = float(beta.median())
    if not (math.isfinite(med) and med > 0):
        raise InputError(f"calibration gave median drift budget {med}; GASV needs > 0 (are the "
                         "target's logits degenerate?)")
    settings = dict(num_rollouts=R, samples_per_pos=samples_per_pos, quantile=quantile, statistic="s(v|z), v in N(z)",
                    min_cluster_samples=min_cluster_samples, kmeans_iters=kmeans_iters,
                    sampling=dict(cfg_scale=sampling.cfg_scale, temperature=sampling.temperature,
                                  top_k=sampling.top_k, top_p=sampling.top_p, greedy=sampling.greedy,
                                  cfg_interval=sampling.cfg_interval),
                    n_samples=int(counts.sum()), clusters_with_own_budget=int((counts >= min_cluster_samples).sum()))
    tables = GASVTables(invstd=invstd.cpu(), w_tilde_norm2=(w_tilde * w_tilde).sum(1).cpu(),
                        cluster=cluster, centroids=centroids, beta=beta,
                        lantern_neighbors=neighbors,
                        config=GASVConfig(**{**gasv.to_dict(), "theta_geo": 8.0 / med}),
                        target_hash=target_hash_of(target), vocab_size=V, seed=seed,
                        cluster_space=cluster_space, settings=settings)
    return tables.bind(target.output.weight)


def _slice_cond(cond, a: int, b: int):
    if isinstance(cond, (tuple, list)):
        return tuple(c[a:b] for c in cond)
    return cond[a:b]
