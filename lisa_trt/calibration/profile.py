"""Offline rollout profiling: target + VQ codebook -> GASV / LANTERN tables (docs/spec/lisa.md).

One driver for every model family (models/family.py). The family answers what is rolled out
(the request's SequenceLayout: length, allowed ids, forced indices, and the sub-vocabulary when
the head is wider than the codebook) and the cache-free forward of teacher forcing
(`ModelFamily.teacher_forced_logits`); everything else is generic:

    codebook       the head rows and VQ rows of the K codes (`code_geometry`: LlamaGen and Janus
                   K = V, the head; Chameleon the K image-code tokens of `layout.sub_vocab`)
    whitening      invstd of those head rows, W~ = W * invstd, row norms of W~
    clusters       seeded k-means (k-means++ init, Lloyd) on the codebook (or on W~)
    LANTERN        K nearest codes of every code by L2 on the normalised codebook
    budgets        R rollouts of the target itself (speculative/autoregressive.generate with the
                   layout); at each SAMPLED index (forced ones excluded) the sampled code z and S
                   candidates v ~ p restricted to N(z) (its K_n codebook neighbours, the GASV v2
                   candidate set), p the decode loops' law (`rollout_law`); beta_c = q-quantile of
                   s(v|z) over positions whose z is in cluster c (the statistic the runtime gates
                   on), global quantile for clusters with < 32 samples; theta_geo = 8 / median(beta)

Everything is deterministic for a given seed (private torch.Generators; the global RNG is
untouched).
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch
import torch.nn.functional as F

from ..config import SamplingConfig
from ..errors import InputError
from ..models.family import SequenceLayout, SubVocab, family_of
from ..models.prompts import Prompts
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


def rollout_law(target, full_cond, tokens: torch.Tensor, sampling: SamplingConfig,
                layout: SequenceLayout) -> torch.Tensor:
    """Teacher-forced law (B, N, V) of rollout `tokens` (B, N): the logits the decode loops sample.

    The family's cache-free forward (`ModelFamily.teacher_forced_logits`) over the CFG batch
    `full_cond` (= autoregressive.cfg_batch), then the decode loop's own guide
    (speculative/decode.py: CFG combine, off after cfg_interval, the layout's restriction,
    temperature / top-k / top-p, one-hot laws at forced indices)."""
    from ..speculative.decode import Guide

    guide = Guide(sampling, layout)
    raw = family_of(target.config).teacher_forced_logits(target, full_cond, guide.dup(tokens))
    index = torch.arange(tokens.shape[1], device=raw.device)[None].expand(tokens.shape[0], -1)
    return guide(raw, index)


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


def code_geometry(target, vq_codebook: torch.Tensor, sub_vocab: Optional[SubVocab] = None):
    """The codebook the tables cover, inside the target's head.

    Returns (head rows (K, H) fp32, L2-normalised codebook rows (K, d) on the CPU, lut): without a
    sub-vocabulary the head is the codebook (K = V, lut None: LlamaGen, Janus); with one
    (Chameleon) the K code tokens' head rows and the VQ rows of their codes, and lut (V,) token
    id -> code index (SubVocab.lut: K + 1 for any non-code id; only sampled indices are looked up)."""
    W = target.output.weight.detach().float()
    V = W.shape[0]
    cb = vq_codebook.detach().float().cpu()
    if vq_codebook.dim() != 2:
        raise InputError(f"the VQ codebook must be a 2-D (n_codes, d) tensor, got {tuple(vq_codebook.shape)}")
    if sub_vocab is None:
        if cb.shape[0] != V:
            raise InputError(f"VQ codebook must be (V={V}, d) for this target, got {tuple(vq_codebook.shape)}")
        return W, F.normalize(cb, dim=1), None
    if int(sub_vocab.codes.max()) >= cb.shape[0]:
        raise InputError(f"the VQ codebook has {cb.shape[0]} rows; the vocabulary's image tokens use codes up "
                         f"to {int(sub_vocab.codes.max())}")
    rows = W[sub_vocab.code_ids.to(W.device)]
    return rows, F.normalize(cb[sub_vocab.codes], dim=1), sub_vocab.lut(V, W.device)


def rollout_drifts(target, cond, tokens: torch.Tensor, layout: SequenceLayout, lut: Optional[torch.Tensor],
                   sampling: SamplingConfig, w_tilde: torch.Tensor, cand: torch.Tensor, S: int,
                   generator: torch.Generator, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Drift samples s(v|z) (M, S) and sampled codes z (M,) of one rollout batch `tokens` (B, N).

    Every sampled (not forced) index counts; the law and the tokens are taken over the codebook
    (the sub-vocabulary's columns and code indices when the head is wider)."""
    from ..speculative.autoregressive import cfg_batch

    law = rollout_law(target, cfg_batch(target, cond, sampling.cfg_scale), tokens, sampling, layout)  # (B, N, V)
    forced = layout.forced_mask(law.device)
    if forced is not None:
        law, tokens = law[:, ~forced], tokens[:, ~forced.to(tokens.device)]
    if lut is not None:
        law, tokens = law[..., layout.sub_vocab.code_ids.to(law.device)], lut[tokens.to(lut.device)]
    return drift_samples(law.reshape(-1, law.shape[-1]), tokens.reshape(-1), w_tilde, cand, S, generator, eps)


# The GASV knobs a calibration stores, i.e. the knobs of every run that reads the tables without
# --kappa / --lambda / --delta: the fastest quality-neutral point of the README's frontier
# (bench/gasv_frontier.json: kappa 2, lambda 0.4, delta 0.3), the knobs the bundled demo tables
# carry. GASVConfig's own defaults are the spec's (docs/spec/lisa.md: kappa 1, lambda 0.6, no cap),
# which the frontier found not quality-neutral. The one source of `calibrate`'s and
# `lisa-trt calibrate`'s defaults.
CALIBRATION_GASV = GASVConfig(kappa=2.0, lam=0.4, delta=0.3)


@torch.no_grad()
def calibrate(target, vq_codebook: torch.Tensor, *, conds=None, layout: Optional[SequenceLayout] = None,
              num_rollouts: int = 64, samples_per_pos: int = 8, quantile: float = 0.5,
              n_clusters: Optional[int] = None, cluster_space: str = "codebook", lantern_k: int = 1000,
              seed: int = 0, sampling: SamplingConfig = SamplingConfig(), gasv: GASVConfig = CALIBRATION_GASV,
              batch_size: int = 8, min_cluster_samples: int = 32, kmeans_iters: int = 50,
              progress: bool = True, settings: Optional[dict] = None) -> GASVTables:
    """Make GASV + LANTERN tables for a target of any family by rollout profiling (docs/spec/lisa.md
    "Calibration").

    Rollouts run through the generic AR loop (speculative/autoregressive.generate) with `layout`;
    their teacher-forced law is the decode loops' (`rollout_law`); the tables cover the family's
    codebook (`code_geometry`: the head, or the layout's sub-vocabulary).

    Args:
        target: a torch target of any family (eval).
        vq_codebook: (n_codes, d) VQ codebook (L2-normalised here): (V, d) when the head is the
            codebook; with a sub-vocabulary, the rows its codes index (Chameleon's VQGAN).
        conds: rollout conditions, one row per rollout, sliced into batches of `batch_size`
            (prompt-id `Prompts` are re-left-padded per batch); default `num_rollouts` seeded
            random class ids (class-conditioned families only; t2i: (features, mask); Janus:
            prompt ids; Chameleon: the Prompts of lumina.span_request).
        layout: the SequenceLayout of every rollout (default: the family's whole image; Chameleon:
            span_request's, whose `sub_vocab` selects the K image codes).
        num_rollouts: images generated (R); ignored when conds is given.
        samples_per_pos: alternatives S per sampled position.
        quantile: q of the per-cluster drift quantile.
        n_clusters: C; default round(2 sqrt(K)).
        cluster_space: "codebook" (k-means on the normalised codebook) or "w_tilde".
        lantern_k: LANTERN neighbours per code (clamped to K - 1).
        seed: one seed for rollouts (one generator over all batches), alternative sampling and k-means.
        sampling: CFG scale / interval, temperature / top-k / top-p, greedy of the rollouts.
        gasv: GASV constants to store (default CALIBRATION_GASV: the quality-neutral knobs);
            `neighbours` (the candidates N(z), also the calibration's)
            is clamped to the neighbour table's width and theta_geo set to 8 / median(beta).
        batch_size: rollouts per target batch.
        min_cluster_samples: clusters with fewer samples use the global quantile.
        progress: a bar over the rollouts' tokens (on a terminal).
        settings: extra informational settings to record (e.g. the image size).
    Returns:
        GASVTables (vocab_size K) bound to the head rows of the codebook.
    """
    from ..speculative.autoregressive import layout_for

    layout = layout if layout is not None else layout_for(target)
    head, codebook, lut = code_geometry(target, vq_codebook, layout.sub_vocab)
    _check_settings(cluster_space, quantile, samples_per_pos, conds, num_rollouts)
    invstd, w_tilde, cluster, centroids = _fit_geometry(head, codebook, n_clusters, cluster_space, seed,
                                                        kmeans_iters)
    conds = conds if conds is not None else _random_classes(target, num_rollouts, seed, head.device)
    R = target.check_cond(conds)
    neighbors = lantern_neighbors(codebook, min(lantern_k, head.shape[0] - 1))
    n_cand = min(int(gasv.neighbours), int(neighbors.shape[1]))
    drifts_of = functools.partial(rollout_drifts, target, layout=layout, lut=lut, sampling=sampling, w_tilde=w_tilde,
                                  cand=neighbors[:, :n_cand].to(head.device), S=samples_per_pos, eps=gasv.eps,
                                  generator=torch.Generator(device=head.device).manual_seed(seed + 1))
    rollouts = _rollouts(target, conds, R, layout, sampling, batch_size, seed, progress)
    drift, drift_cluster = _collect_drifts(rollouts, drifts_of, cluster.to(head.device).long())
    beta, counts = cluster_budgets(drift, drift_cluster, len(centroids), quantile, min_cluster_samples)
    med = _median_budget(beta)
    info = dict(family=family_of(target.config).name, num_rollouts=R, samples_per_pos=samples_per_pos,
                quantile=quantile, statistic="s(v|z), v in N(z)", min_cluster_samples=min_cluster_samples,
                kmeans_iters=kmeans_iters, sampling=_sampling_dict(sampling), n_samples=int(counts.sum()),
                clusters_with_own_budget=int((counts >= min_cluster_samples).sum()), **(settings or {}))
    tables = GASVTables(invstd=invstd.cpu(), w_tilde_norm2=(w_tilde * w_tilde).sum(1).cpu(),
                        cluster=cluster, centroids=centroids, beta=beta, lantern_neighbors=neighbors,
                        config=GASVConfig(**{**gasv.to_dict(), "neighbours": n_cand, "theta_geo": 8.0 / med}),
                        target_hash=target_hash_of(target), vocab_size=head.shape[0], seed=seed,
                        cluster_space=cluster_space, settings=info)
    return tables.bind(head)


def _check_settings(cluster_space: str, quantile: float, samples_per_pos: int, conds, num_rollouts) -> None:
    if cluster_space not in ("codebook", "w_tilde"):
        raise InputError(f"cluster_space must be 'codebook' or 'w_tilde', got {cluster_space!r}")
    if not 0.0 < quantile < 1.0 or samples_per_pos < 1:
        raise InputError("calibration needs 0 < quantile < 1 and samples_per_pos >= 1")
    if conds is None and (not isinstance(num_rollouts, int) or num_rollouts < 1):
        raise InputError(f"calibration needs num_rollouts >= 1 (--rollouts), got {num_rollouts!r}")


def _fit_geometry(head: torch.Tensor, codebook: torch.Tensor, n_clusters: Optional[int], cluster_space: str,
                  seed: int, iters: int) -> tuple:
    """invstd and W~ (K, H) of the head rows, and the k-means clusters (assign, centroids) of the
    normalised codebook or of W~."""
    invstd = whitening(head)
    w_tilde = whiten(head, invstd)
    space = codebook if cluster_space == "codebook" else w_tilde.cpu()
    cluster, centroids = kmeans(space, n_clusters or default_n_clusters(head.shape[0]), seed=seed, iters=iters)
    return invstd, w_tilde, cluster, centroids


def _rollouts(target, conds, R: int, layout: SequenceLayout, sampling: SamplingConfig, batch_size: int, seed: int,
              progress: bool):
    """Yields (cond, tokens) per batch of the R rollouts, drawn from one generator seeded `seed`.

    The bar counts the rollouts' image tokens (whole numbers, advanced token by token: one batch can
    be all the rollouts, so a bar of rollouts would jump 0 -> R); drawn only on a terminal
    (progress.progress_bar)."""
    from ..progress import progress_bar
    from ..speculative.autoregressive import generate

    gen = torch.Generator(device=target.output.weight.device).manual_seed(seed)
    N = layout.n_tokens
    bar = progress_bar(R * N, progress, unit="token", desc=f"calibrate {R} rollouts")
    for s in range(0, R, batch_size):
        cond = _slice_cond(conds, s, s + batch_size)
        nb = min(batch_size, R - s)
        yield cond, generate(target, cond, layout=layout, cfg_scale=sampling.cfg_scale,
                             temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                             greedy=sampling.greedy, cfg_interval=sampling.cfg_interval, generator=gen,
                             on_token=lambda _i, nb=nb: bar.update(nb))
    bar.close()


def _collect_drifts(rollouts, drifts_of, cluster: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drift samples (M, S) of every rollout batch (`drifts_of(cond, tokens)` -> (s, z)) and the
    cluster (`cluster`: code -> cluster, on z's device) of each sample's code z (M, S), on the CPU."""
    all_s, all_c = [], []
    for cond, tokens in rollouts:
        drift, z = drifts_of(cond, tokens)
        all_s.append(drift.cpu())
        all_c.append(cluster[z][:, None].expand_as(drift).cpu())
    return torch.cat(all_s), torch.cat(all_c)


def _median_budget(beta: torch.Tensor) -> float:
    """median(beta), refused unless finite and > 0 (theta_geo = 8 / median)."""
    med = float(beta.median())
    if not (math.isfinite(med) and med > 0):
        raise InputError(f"calibration gave median drift budget {med}; GASV needs > 0 (are the "
                         "target's logits degenerate?)")
    return med


def _random_classes(target, n: int, seed: int, device) -> torch.Tensor:
    """Rollout conditions drawn at random (class ids); InputError naming what to pass for targets
    whose conditions cannot be drawn (captions, text prompts)."""
    g = torch.Generator().manual_seed(seed)
    return family_of(target.config).conditioning(target.config).random(n, g).to(device)


def _sampling_dict(s: SamplingConfig) -> dict:
    return dict(cfg_scale=s.cfg_scale, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, greedy=s.greedy,
                cfg_interval=s.cfg_interval)


def _slice_cond(cond, a: int, b: int):
    """Rollouts a..b-1 of a condition (tensors, tuples of tensors, Prompts with their CFG rows)."""
    if isinstance(cond, Prompts):
        ids, valid = cond.ids[a:b], cond.valid[a:b]
        pad = int((~valid).all(0).long().cumprod(0).sum())  # columns that are padding in every row
        uncond = None if cond.uncond is None else _slice_cond(cond.uncond, a, b)
        return Prompts(ids[:, pad:], valid[:, pad:], uncond)
    if isinstance(cond, (tuple, list)):
        return tuple(c[a:b] for c in cond)
    return cond[a:b]
