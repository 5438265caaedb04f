"""Relaxed verification (LANTERN, GASV) over a codebook that sits inside a wider head.

A family whose head is wider than its VQ codebook (Chameleon / Lumina-mGPT: text + image
tokens) answers a `SubVocab` in its SequenceLayout (models/family.py): the K image-code token
ids. Calibration tables then cover the K codes; this module maps a tree's full-vocabulary logits
and tokens onto the sub-vocabulary (codes 0..K-1; K the token the layout forces at that position,
whatever it is: Lumina-mGPT's row end, or several distinct end tokens; anything else K + 1), runs the generic verification kernels of
verify.py there with the same settings the LlamaGen path reads (LANTERN k / delta / residual /
gamma; GASV v2 constants and per-run overrides), and maps the result back, position by position (index K -> the token forced there).

Nodes whose law is one-hot (a forced position) or that sit under one get no GASV candidates:
their parent's law is one-hot and GASV moves no mass there.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from ..errors import InputError
from . import verify as V

RELAXED = ("lantern", "gasv")  # the rules whose tables cover the codebook


def sub_logits(logits: torch.Tensor, vocab, forced: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary guided logits (..., V) -> code logits (..., K); forced rows get zeros (a
    placeholder support: callers overwrite those rows with the one-hot forced law)."""
    sub = logits[..., vocab.code_ids.to(logits.device)]
    return torch.where(forced[..., None], torch.zeros_like(sub), sub)


def extend(p: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    """(..., K) distribution over codes -> (..., K + 2); forced rows one-hot on index K."""
    ext = F.pad(p, (0, 2))
    one_hot = torch.zeros_like(ext)
    one_hot[..., -2] = 1.0
    return torch.where(forced[..., None], one_hot, ext)


class SubVocabVerifier:
    """verify(logits (B, N, V), tree, forced (B, N) long, ctx) -> VerifyResult in token ids.

    forced[b, n]: the token id the layout forces for node n's children (its law's position), -1
    where that position is sampled."""

    def __init__(self, vocab, vocab_size: int, tables, device):
        if tables is None:
            raise InputError("LANTERN / GASV verification needs image-code calibration tables "
                             "(make them with `lisa-trt calibrate` on this model)")
        if tables.vocab_size != vocab.K:
            raise InputError(f"the tables cover {tables.vocab_size} codes; this target has {vocab.K} image codes")
        self.vocab, self.tables = vocab, tables
        self.lut = vocab.lut(vocab_size, device)
        nb = tables.lantern_neighbors.long().to(device)
        self.nb = torch.cat([nb, torch.zeros(2, nb.shape[1], dtype=torch.long, device=device)])  # forced / other

    def __call__(self, method: str, logits, tree, forced_ids, ctx):
        if forced_ids is None:
            forced_ids = torch.full(tree.tokens.shape, -1, dtype=torch.long, device=tree.tokens.device)
        forced = forced_ids >= 0
        at_parent = torch.where(tree.parents >= 0, forced_ids.gather(1, tree.parents.clamp(min=0)), -1)
        sub_tree = dataclasses.replace(tree, tokens=self.vocab.to_sub(tree.tokens, at_parent, self.lut))
        sub = sub_logits(logits, self.vocab, forced)
        if method == "lantern":
            s = ctx.spec.lantern
            p, k = extend(torch.softmax(sub, -1), forced), min(s.k, self.nb.shape[1])
            dn = V.lantern_delta_eff(sub, s.delta, s.gamma) if s.gamma else None  # forced rows: one-hot anyway
            res = (V.verify_lantern_greedy(p, sub_tree, self.nb, k=k, delta=s.delta, delta_nodes=dn) if ctx.greedy
                   else V.verify_lantern(p, sub_tree, ctx.generator, self.nb, k=k, delta=s.delta,
                                         residual=s.residual, delta_nodes=dn))
        elif method == "gasv":
            cfg = ctx.gasv.config if ctx.gasv is not None else self.tables.config
            over = ctx.spec.gasv.overrides()
            if over:
                cfg = dataclasses.replace(cfg, **over)
            p, cand, gate, delta_eff = self._gasv(sub, sub_tree, forced, ctx.gasv, cfg)
            res = (V.verify_gasv_greedy(p, sub_tree, cand, gate, delta_eff) if ctx.greedy else
                   V.verify_gasv(p, sub_tree, ctx.generator, cand, gate, delta_eff))
        else:
            raise InputError(f"{method!r} has no sub-vocabulary rule; relaxed rules here: {', '.join(RELAXED)}")
        # committed column j is a child of path[:, j] (the drafts, then the bonus at path[:, accept_len])
        col = forced_ids.gather(1, res.path.clamp(min=0))
        tok = torch.where(res.tokens >= 0, self.vocab.from_sub(res.tokens, col), res.tokens)
        last = col.gather(1, res.accept_len[:, None])[:, 0]
        return dataclasses.replace(res, tokens=tok, bonus=self.vocab.from_sub(res.bonus, last))

    def _gasv(self, sub, sub_tree, forced, gasv, cfg):
        """GASV v2 quantities over the codes: p (B, N, K + 2); cand, gate (B, N, Kn); delta_eff."""
        from .gasv import gasv_gates

        K = self.vocab.K
        B, N, _ = sub.shape
        dev = sub.device
        tok = sub_tree.tokens.clamp(min=0)
        par = sub_tree.parents
        code = (tok < K) & (par >= 0) & ~forced.gather(1, par.clamp(min=0))
        offs = torch.arange(B, device=dev)[:, None] * N
        flat_tok = torch.where(code, tok, 0).reshape(-1)
        flat_par = torch.where(code, par + offs, -1).reshape(-1)
        logits = sub.reshape(B * N, K)
        if gasv is not None and cfg.scope == "neighbours":
            out = gasv(logits, flat_tok, flat_par, cfg)
        else:
            out = gasv_gates(logits, flat_tok, flat_par, self.tables, cfg)
        keep = code.reshape(-1, 1).to(out.gate.device)
        Kn = out.cand.shape[-1]
        cand = torch.where(keep, out.cand.long(), -1).reshape(B, N, Kn).to(dev)
        gate = torch.where(keep, out.gate.float(), 0.0).reshape(B, N, Kn).to(dev)
        p = extend(out.p.to(dev).reshape(B, N, K), forced)
        return p, cand, gate, out.delta_eff.to(dev).reshape(B, N)
