"""GASV / LANTERN tables over the image-code sub-vocabulary of a Chameleon-family target.

Lumina-mGPT samples image spans among K = 8,192 code tokens of a 65,536-token vocabulary, so the
soft-verification geometry lives on those K entries only: the codebook rows of the VQGAN (for
k-means clusters and LANTERN neighbours) and the target's head rows of the code tokens (for the
whitening and the drift budgets). Tables are the family-agnostic `GASVTables` with vocab_size K,
bound to the head's code rows; `CodeVocab` translates token ids <-> sub-vocabulary indices
(K = the forced row-end token, K + 1 = any other token, which never has probability mass).

The tables are GASV version 2 (docs/spec/lisa.md "Calibration"): the drift budgets beta_c are
quantiles of the draft-anchored statistic s(v|z) over the codebook neighbours N(z) of each code z
the rollouts sampled (calibration/profile.drift_samples, the LlamaGen calibration's own
function), the LANTERN neighbour table doubles as GASV's candidate table, and the metadata
records GASV version 2 (calibration/tables.py refuses version-1 files).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ..errors import InputError
from ..speculative.gasv import GASVConfig
from .profile import cluster_budgets, default_n_clusters, drift_samples, kmeans, lantern_neighbors
from .tables import GASVTables, target_hash_of, whiten, whitening


@dataclass(frozen=True)
class CodeVocab:
    """code_ids (K,) sorted token ids of the image codes; codes (K,) their VQ codebook rows."""

    code_ids: torch.Tensor
    codes: torch.Tensor
    newline: int

    @classmethod
    def for_target(cls, target, newline: int) -> "CodeVocab":
        from ..models.families.chameleon.model import image_vocab

        vm = image_vocab(target.config.vocabulary_map, target.config.vocab_size)
        ids = sorted(vm)
        return cls(torch.tensor(ids), torch.tensor([vm[i] for i in ids]), int(newline))

    @property
    def K(self) -> int:
        return int(self.code_ids.numel())

    def lut(self, vocab_size: int, device) -> torch.Tensor:
        """(V,) token id -> sub index (codes 0..K-1, row end K, anything else K + 1)."""
        t = torch.full((vocab_size,), self.K + 1, dtype=torch.long, device=device)
        t[self.code_ids.to(device)] = torch.arange(self.K, device=device)
        t[self.newline] = self.K
        return t

    def back(self, device) -> torch.Tensor:
        """(K + 2,) sub index -> token id (K + 1 maps to the row-end token: never committed)."""
        return torch.cat([self.code_ids.to(device), torch.tensor([self.newline, self.newline], device=device)])


def sub_logits(logits: torch.Tensor, vocab: CodeVocab, forced: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary guided logits (..., V) -> code logits (..., K); forced rows get zeros (a
    placeholder support: callers overwrite those rows with the one-hot row-end law)."""
    sub = logits[..., vocab.code_ids.to(logits.device)]
    return torch.where(forced[..., None], torch.zeros_like(sub), sub)


def extend(p: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    """(..., K) distribution over codes -> (..., K + 2); forced rows one-hot on index K."""
    ext = F.pad(p, (0, 2))
    one_hot = torch.zeros_like(ext)
    one_hot[..., -2] = 1.0
    return torch.where(forced[..., None], one_hot, ext)


@torch.no_grad()
def calibrate_chameleon(target, tokenizer, vq_codebook: torch.Tensor, captions: Sequence[str], width: int,
                        height: int, *, cfg_scale: float = 3.0, temperature: float = 1.0, top_k: int = 2000,
                        samples_per_pos: int = 8, quantile: float = 0.5, n_clusters: Optional[int] = None,
                        lantern_k: int = 1000, seed: int = 0, gasv: GASVConfig = GASVConfig(),
                        batch_size: int = 8, min_cluster_samples: int = 32) -> GASVTables:
    """Rollout profiling (spec/lisa.md "Calibration") restricted to the image codes.

    Args:
        vq_codebook: (n_embed, d) Chameleon VQGAN codebook (quantize.embedding.weight).
        captions: rollout prompts (one image each) at `width` x `height`, sampled with the
            deployment settings (cfg_scale, temperature, top_k).
    Returns:
        GASVTables (GASV version 2) with vocab_size K (the code tokens), bound to the head's
        code rows. `gasv.neighbours` (the candidates N(z) per drafted code, also the
        calibration's) is clamped to the neighbour table's width min(lantern_k, K - 1) and
        recorded in the tables' config.
    """
    from ..speculative.lumina import LATENT_PER_GRID, generate_image_tokens, grids, row_end_mask

    vocab = CodeVocab.for_target(target, tokenizer.newline)
    if int(vocab.codes.max()) >= vq_codebook.shape[0]:
        raise InputError(f"the VQ codebook has {vq_codebook.shape[0]} rows; the vocabulary's image tokens "
                         f"use codes up to {int(vocab.codes.max())}")
    dev = target.lm_head.weight.device
    W = target.lm_head.weight.detach().float()[vocab.code_ids.to(dev)]      # (K, H)
    codebook = F.normalize(vq_codebook.detach().float().cpu()[vocab.codes], dim=1)
    K = vocab.K
    invstd = whitening(W)
    w_tilde = whiten(W, invstd)
    C = n_clusters or default_n_clusters(K)
    cluster, centroids = kmeans(codebook, C, seed=seed)
    neighbors = lantern_neighbors(codebook, min(lantern_k, K - 1))
    n_cand = min(gasv.neighbours, int(neighbors.shape[1]))
    cand = neighbors[:, :n_cand].to(dev)
    lut = vocab.lut(target.config.vocab_size, dev)
    hg, wg = grids(width, height)
    h_lat, w_lat = hg * LATENT_PER_GRID, wg * LATENT_PER_GRID
    codes_at = ~row_end_mask(h_lat, w_lat)
    alt = torch.Generator(device=dev).manual_seed(seed + 1)
    all_s, all_c = [], []
    for i in range(0, len(captions), batch_size):
        caps = list(captions[i: i + batch_size])
        span = generate_image_tokens(target, tokenizer, caps, width, height, cfg_scale=cfg_scale,
                                     temperature=temperature, top_k=top_k, seed=seed + i).tokens
        logits = _teacher_forced_guided(target, tokenizer, caps, width, height, span, cfg_scale, temperature, top_k)
        sub = logits[:, codes_at.to(dev)][..., vocab.code_ids.to(dev)].reshape(-1, K)
        z = lut[span[:, codes_at.to(span.device)].to(dev)].reshape(-1)      # the sampled codes
        drift, z = drift_samples(sub, z, w_tilde, cand, samples_per_pos, alt, gasv.eps)
        all_s.append(drift.cpu())
        all_c.append(cluster.long()[z.cpu()][:, None].expand_as(drift))
    beta, counts = cluster_budgets(torch.cat(all_s), torch.cat(all_c), C, quantile, min_cluster_samples)
    med = float(beta.median())
    if not med > 0:
        raise InputError(f"calibration gave median drift budget {med}; GASV needs > 0")
    settings = dict(family="chameleon", rollouts=len(captions), width=width, height=height, cfg_scale=cfg_scale,
                    temperature=temperature, top_k=top_k, samples_per_pos=samples_per_pos, quantile=quantile,
                    statistic="s(v|z), v in N(z)", min_cluster_samples=min_cluster_samples,
                    n_samples=int(counts.sum()), clusters_with_own_budget=int((counts >= min_cluster_samples).sum()))
    tables = GASVTables(invstd=invstd.cpu(), w_tilde_norm2=(w_tilde * w_tilde).sum(1).cpu(), cluster=cluster,
                        centroids=centroids, beta=beta,
                        lantern_neighbors=neighbors,
                        config=GASVConfig(**{**gasv.to_dict(), "neighbours": n_cand, "theta_geo": 8.0 / med}),
                        target_hash=target_hash_of(target), vocab_size=K, seed=seed, settings=settings)
    return tables.bind(target.lm_head.weight.detach()[vocab.code_ids.to(dev)])


def _teacher_forced_guided(target, tokenizer, caps, width, height, span, cfg_scale, temperature, top_k):
    """(B, L, V) guided, code-restricted, filtered logits predicting each span token."""
    from ..models.family import family_of
    from ..speculative.sampling import process_logits

    prefix = tokenizer.span_prefix(width, height)
    L = span.shape[1]

    def tf(head: list, b: int) -> torch.Tensor:  # cache-free forward of one row, span positions
        ids = torch.tensor([head + span[b, :-1].tolist()], device=span.device)
        return target.forward_full(ids).logits[0, -L:]

    x = torch.stack([tf(tokenizer.prompt_ids(c, width, height) + prefix, b) for b, c in enumerate(caps)])
    if cfg_scale != 1.0:
        unc = torch.stack([tf(prefix, b) for b in range(len(caps))])
        x = unc + cfg_scale * (x - unc)
    layout = family_of(target.config).free_layout(target, 1, image_tokens_only=True)
    return layout.law(x, None, lambda z: process_logits(z, temperature, top_k))


def load_chameleon_tables(path, target, newline: int) -> GASVTables:
    """Load tables written by `save_tables` for this target's image codes (hash checked), bound
    to the head's code rows."""
    from .tables import check_tables, load_tables

    vocab = CodeVocab.for_target(target, newline)
    tables = load_tables(path)
    check_tables(tables, target_hash_of(target), vocab.K)
    return tables.bind(target.lm_head.weight.detach()[vocab.code_ids.to(target.lm_head.weight.device)])
