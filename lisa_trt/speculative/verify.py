"""Tree verification rules (docs/spec/speculative.md "Verification rules", docs/spec/lisa.md GASV step 6).

Every rule is a pure function of the target's GUIDED, FILTERED distribution at every tree node,
p (B, N, V) (CFG combined, temperature, top-k/top-p; p[:, n] predicts node n's children), the
DraftTree, and a torch.Generator. Node n is verified against p at its PARENT.

Sampling rules walk the tree from the root, one depth level per iteration (vectorised over the
batch): at the current node the drafted children are tried in draft order against a working
distribution r (initially p at the node); an accepted child becomes the current node, otherwise
the bonus token is sampled from the final residual r and the walk stops. A leaf's bonus is
sampled from p at the leaf. All random numbers are drawn up front, in a fixed layout
(u_accept (B, D + 1, C), u_bonus (B,)), so rules that agree numerically give the same outputs for
the same generator state (LANTERN delta=0 == exact, GASV with zero gates or delta 0 == exact).

Per sibling x the rules are (r and q normalised):
- exact, deterministic drafts (EAGLE-2, q treated as one-hot): accept w.p. r(x); on rejection
  r(x) = 0. Output exactly distributed as p.
- exact, sampled drafts (SpecInfer / recursive rejection sampling): siblings were drawn from q
  without replacement in draft order; accept w.p. min(1, r(x)/q(x)); on rejection
  r <- norm(max(r - q, 0)), q <- q with x removed. Exactly p. Children with q(x) = 0 are skipped.
- lantern (LANTERN): neighbours N(x) (nearest first, first k used); c_j = r-mass of the first j
  neighbours; m = max j with c_j <= delta (lambda mode, delta > 1: c_j <= (delta - 1) r(x));
  accept w.p. min(1, r(x) + c_m); on rejection zero x and its m merged neighbours (clean) or
  x and its first k neighbours (residual="lantern_repo", the reference repo's over-pruning).
- gasv (GASV v2, spec/lisa.md step 5): the candidates N(x) with gates g(v|x) (gasv.py) lend
  mass m(v) = r(v) g(v|x) min(1, delta_eff / M), M = sum r g; accept w.p. min(1, r(x) + sum m);
  on rejection r <- r - m, r(x) = 0. Gates 0 (kappa 0 and lambda 1) or delta 0: exactly `exact`.
- LANTERN and GASV budgets may be uncertainty-modulated per parent (delta_eff, gasv.modulate).

Greedy rules score every node at once and take the longest accepted root->leaf path (first one on
ties, EAGLE's evaluate_posterior); bonus = argmax at the last accepted node.

Stats: `pos_tvd[b, i]` = TVD between the raw target distribution and the law of the token
committed at the i-th committed position of this step. For deterministic drafts (exact, lantern,
gasv) the law GIVEN the drafted siblings is computed in closed form (0 up to rounding for exact,
the moved mass for LANTERN and GASV with one draft (<= delta_eff), possibly more
with several siblings, each of which may move up to delta of the current residual). For sampled
drafts the law is p only marginally over the draws, so pos_tvd = TVD(p_ref, p) = 0. Greedy
rules report 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ..errors import InputError
from .sampling import tvd, uniform  # noqa: F401 (tvd re-exported; defined once in sampling.py)
from .tree import DraftTree


# ----------------------------------------------------------------------------- results

@dataclass(frozen=True)
class VerifyResult:
    """Outcome of verifying one tree per row.

    Attributes:
        path: (B, D + 1) long accepted node indices INCLUDING the root at column 0, -1 padded:
            path[b, :accept_len[b] + 1] are the nodes whose K/V are kept (cache.compact source).
        accept_len: (B,) long number of accepted DRAFT tokens (the root is not counted).
        bonus: (B,) long the token sampled at the last accepted node (next tree's root).
        tokens: (B, D + 1) long tokens committed this step: the accepted drafts then the bonus,
            -1 padded; accept_len + 1 of them per row.
        pos_tvd: (B, D + 1) fp32 distortion of each committed position (module docstring), 0 pad.
    """

    path: Tensor
    accept_len: Tensor
    bonus: Tensor
    tokens: Tensor
    pos_tvd: Tensor

    @property
    def n_committed(self) -> Tensor:
        """(B,) committed tokens this step (accepted drafts + bonus)."""
        return self.accept_len + 1

    @property
    def tvd(self) -> Tensor:
        """(B,) mean distortion over the committed positions of this step."""
        return self.pos_tvd.sum(1) / self.n_committed


@dataclass(frozen=True)
class SJDResult:
    """accept_len (B,) accepted window drafts; token (B,) resampled token at the first rejected
    slot, -1 when the whole window was accepted."""

    accept_len: Tensor
    token: Tensor


def _normalize(r: Tensor) -> Tensor:
    """Rows of non-negative values divided by their sum; all-zero rows stay zero (0 / 1e-30)."""
    return r / r.sum(-1, keepdim=True).clamp(min=1e-30)


def _sample(r: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF draw from unnormalised rows r (B, V) with uniforms u (B,) (fp64 CDF).
    Never returns a zero-mass token when the row has mass."""
    cdf = r.double().cumsum(-1)
    target = (u.double() * cdf[:, -1])[:, None]
    idx = torch.searchsorted(cdf, target, right=True)[:, 0].clamp(max=r.shape[-1] - 1)
    last_pos = torch.where(r > 0, torch.arange(r.shape[-1], device=r.device), -1).max(-1).values
    return torch.where(r.gather(1, idx[:, None])[:, 0] > 0, idx, last_pos.clamp(min=0))


def _zero1(r: Tensor, x: Tensor) -> Tensor:
    """r (B, V) >= 0 with token x (B,) (>= 0) of each row set to 0: `_zero(r, x[:, None])` in one op
    (r(x) * 0 == 0 for the non-negative, finite rows every rule passes)."""
    return r.scatter(1, x[:, None], 0.0)


def _zero(r: Tensor, idx: Tensor) -> Tensor:
    """r (B, V) with the tokens idx (B, k) set to 0 (negative idx ignored)."""
    V = r.shape[-1]
    keep = torch.ones(r.shape[0], V + 1, dtype=r.dtype, device=r.device)
    keep.scatter_(1, torch.where(idx >= 0, idx, V), 0.0)      # negatives land in column V
    return r * keep[:, :V]


# ----------------------------------------------------------------------------- sampling rules

@dataclass(frozen=True)
class ExactRule:
    """Deterministic drafts (q one-hot): accept w.p. r(x); on rejection r(x) = 0."""

    needs_q = False
    law_given_drafts = True

    def step(self, r: Tensor, x: Tensor, q: Optional[Tensor]):
        rn = _normalize(r)
        a = rn.gather(1, x[:, None])[:, 0]
        return a, _zero1(rn, x), q


@dataclass(frozen=True)
class SampledRule:
    """Sampled drafts: accept w.p. min(1, r(x)/q(x)); on rejection r <- norm(max(r - q, 0)),
    q <- q without x. A child with q(x) = 0 cannot have been drawn: it is skipped (a = 0, r kept).

    The output is distributed as p only marginally over the random drafts (not given them)."""

    needs_q = True
    law_given_drafts = False

    def step(self, r: Tensor, x: Tensor, q: Tensor):
        rn, qn = _normalize(r), _normalize(q)
        rx, qx = rn.gather(1, x[:, None])[:, 0], qn.gather(1, x[:, None])[:, 0]
        drawn = qx > 0
        a = torch.where(drawn, (rx / qx.clamp(min=1e-30)).clamp(max=1.0), 0.0)
        r_rej = torch.where(drawn[:, None], (rn - qn).clamp(min=0.0), rn)
        return a, r_rej, _zero1(qn, x)


@dataclass(frozen=True)
class LanternRule:
    """LANTERN relaxed acceptance (see module docstring); neighbors (V, K_nb) nearest first."""

    neighbors: Tensor
    k: int
    delta: float
    residual: str = "clean"
    delta_nodes: Optional[Tensor] = None  # (B, N) modulated budget per parent (lantern_gamma)
    needs_q = False
    law_given_drafts = True

    @property
    def per_node(self) -> bool:
        return self.delta_nodes is not None

    def prepare(self, nodes: Tensor, parent: Tensor):
        """Per level (siblings nodes (B, C), their parent (B,)): the parent's budget."""
        return self.delta_nodes[torch.arange(parent.shape[0], device=parent.device), parent]

    def step_slot(self, r: Tensor, x: Tensor, q: Optional[Tensor], ctx, j: int):
        return self.step(r, x, q, ctx)

    def step(self, r: Tensor, x: Tensor, q: Optional[Tensor], delta=None):
        rn = _normalize(r)
        nb, m, c_m = _lantern_merge(rn, x, self.neighbors, self.k, self.delta if delta is None else delta)
        a = (rn.gather(1, x[:, None])[:, 0] + c_m).clamp(max=1.0)
        if self.residual == "clean":
            drop = torch.where(torch.arange(nb.shape[1], device=nb.device) < m[:, None], nb, -1)
        else:  # "lantern_repo": x and its first k neighbours, merged or not
            drop = nb
        r_rej = _zero(rn, torch.cat([x[:, None], drop], 1))
        if self.residual != "clean":   # over-pruning can empty the row: fall back to clean
            clean = _zero(rn, torch.cat([x[:, None], torch.where(
                torch.arange(nb.shape[1], device=nb.device) < m[:, None], nb, -1)], 1))
            r_rej = torch.where(r_rej.sum(-1, keepdim=True) > 0, r_rej, clean)
        return a, r_rej, q


def _lantern_merge(rn: Tensor, x: Tensor, neighbors: Tensor, k: int, delta: float):
    """Merged neighbourhood of x under the normalised distribution rn (B, V).

    Returns:
        nb (B, k) long first k neighbours of x; m (B,) number merged; c_m (B,) their mass.
    """
    nb = neighbors[x, :k].long()                                            # (B, k)
    c = rn.gather(1, nb).cumsum(-1)                                         # (B, k) c_1..c_k
    if isinstance(delta, Tensor):   # per-row (modulated) budget, delta <= 1
        thr = delta.to(c.dtype)[:, None]
    elif delta > 1.0:   # lambda mode: bound relative to p(x)
        thr = (delta - 1.0) * rn.gather(1, x[:, None])                       # (B, 1)
    else:
        thr = torch.full_like(c[:, :1], float(delta))
    m = (c <= thr).long().sum(-1)                # c is nondecreasing: the test holds on a prefix
    c_m = torch.where(m > 0, c.gather(1, (m - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    return nb, m, c_m


def _check_lantern(neighbors: Tensor, k: int, delta: float, residual: str, V: int) -> None:
    if neighbors.dim() != 2 or neighbors.shape[0] != V:
        raise InputError(f"LANTERN neighbour table must be (V={V}, K) nearest first, got "
                         f"{tuple(neighbors.shape)}; build it with `lisa-trt calibrate`")
    if not 1 <= k <= neighbors.shape[1]:
        raise InputError(f"LANTERN k must be in 1..{neighbors.shape[1]} (neighbour table width), "
                         f"got {k}")
    if not delta >= 0:
        raise InputError(f"LANTERN delta must be >= 0 (delta > 1 selects lambda mode), got {delta}")
    if residual not in ("clean", "lantern_repo"):
        raise InputError(f"LANTERN residual must be 'clean' or 'lantern_repo', got {residual!r}")


def lantern_relaxed_distribution(p: Tensor, x: Tensor, neighbors: Tensor, *, k: int,
                                 delta: float) -> tuple[Tensor, Tensor]:
    """The distribution LANTERN's single-draft rule (clean residual) samples from.

    p'(x) = p(x) + c_m, p'(merged neighbours) = 0, unchanged elsewhere; TVD(p, p') = c_m <= delta
    (lambda mode: c_m <= (delta - 1) p(x)).

    Args:
        p: (B, V) probabilities; x: (B,) draft tokens; neighbors: (V, K_nb) nearest first.
    Returns:
        (p_relaxed (B, V), moved mass c_m (B,)).
    """
    _check_lantern(neighbors, k, delta, "clean", p.shape[-1])
    rn = _normalize(p.float())
    nb, m, c_m = _lantern_merge(rn, x, neighbors.to(p.device), k, delta)
    merged = torch.where(torch.arange(k, device=p.device) < m[:, None], nb, -1)
    out = _zero(rn, merged)
    return out.scatter_add(1, x[:, None], c_m[:, None]), c_m


@dataclass(frozen=True)
class GASVRule:
    """GASV v2 sibling step (spec/lisa.md step 5) on per-node gates from gasv.gasv_gates.

    cand, gate: (B, N, K) candidates of each node's token and their gates at its parent;
    delta_eff: (B, N) each node's budget as a parent.
    """

    cand: Tensor
    gate: Tensor
    delta_eff: Tensor
    needs_q = False
    law_given_drafts = True
    per_node = True

    def prepare(self, nodes: Tensor, parent: Tensor):
        """Per level (siblings nodes (B, C), their parent (B,)): the siblings' candidates (clamped)
        and gates (B, C, K), and the parent's budget (B,), gathered once for every sibling."""
        rows = torch.arange(nodes.shape[0], device=nodes.device)
        return (self.cand[rows[:, None], nodes].clamp(min=0), self.gate[rows[:, None], nodes],
                self.delta_eff[rows, parent])

    def step_slot(self, r: Tensor, x: Tensor, q: Optional[Tensor], ctx, j: int):
        from .gasv import moved_mass

        cand, gate, delta = ctx[0][:, j], ctx[1][:, j], ctx[2]                  # (B, K), (B, K), (B,)
        rn = _normalize(r)
        m = moved_mass(rn, cand, gate, delta)
        a = (rn.gather(1, x[:, None])[:, 0] + m.sum(-1)).clamp(max=1.0)
        r_rej = (rn.scatter_add(1, cand, -m)).clamp(min=0.0)
        return a, _zero1(r_rej, x), q


# ----------------------------------------------------------------------------- the tree walk

def _scan_siblings(r: Tensor, drafts: Tensor, u: Tensor, rule, q: Optional[Tensor],
                   nodes: Optional[Tensor] = None, parent: Optional[Tensor] = None, normalized: bool = False):
    """Try the drafted siblings (B, C) (-1 padded) in order against r (B, V).

    nodes (B, C) (the siblings' node ids) and parent (B,) are passed to per-node rules;
    normalized: r is already `_normalize`d (the caller's copy is reused).

    Returns:
        choice (B,) slot of the accepted sibling or -1; residual (B, V) after rejecting every
        sibling; out (B, V) the exact distribution of the token committed here.
    """
    B, V = r.shape
    C = drafts.shape[1]
    out = torch.zeros(B, V, device=r.device)
    reach = torch.ones(B, device=r.device)
    choice = torch.full((B,), -1, dtype=torch.long, device=r.device)
    if not normalized:
        r = _normalize(r)
    # Every sibling slot is scanned with its padding masked (no host read of which slots are real:
    # a padded slot changes nothing, a = 0 and r kept), so the step has the same ops every time.
    real = drafts >= 0                                                       # (B, C)
    realf = real.to(r.dtype)
    xs_all = drafts.clamp(min=0)
    slot = torch.arange(C, device=r.device)
    ctx = rule.prepare(nodes.clamp(min=0), parent) if getattr(rule, "per_node", False) else None
    for j in range(C):
        xs = xs_all[:, j]
        a, r_rej, q_rej = rule.step(r, xs, q) if ctx is None else rule.step_slot(r, xs, q, ctx, j)
        a = a * realf[:, j]                            # padding: a = 0 (so u < a never holds there)
        out.scatter_add_(1, xs[:, None], (reach * a)[:, None])
        reach = reach * (1.0 - a)
        choice = torch.where((choice < 0) & (u[:, j] < a), slot[j], choice)
        # The residual chain assumes every sibling so far was rejected: it is only used (for the
        # bonus and for `out`) when that is the case.
        r = torch.where(real[:, j, None], _normalize(r_rej), r)
        if q is not None:
            q = torch.where(real[:, j, None], q_rej, q)
    return choice, r, out + reach[:, None] * r


def verify_tree(p: Tensor, tree: DraftTree, generator: Optional[torch.Generator], rule, *,
                p_ref: Optional[Tensor] = None) -> VerifyResult:
    """Generic sampling verification (the engine of verify_exact / _sampled / lantern / gasv).

    Args:
        p: (B, N, V) target distribution at every node that the rule verifies against.
        tree: DraftTree (B rows, N nodes); tree.child_q is required by SampledRule.
        generator: torch.Generator on p's device (None = the global RNG).
        rule: ExactRule() | SampledRule() | LanternRule(...).
        p_ref: (B, N, V) raw target for the distortion stats (default p).
    Returns:
        VerifyResult.
    """
    B, N, V = _check_p(p, tree)
    if rule.needs_q and tree.child_q is None:
        raise InputError("the sampled-draft rule needs tree.child_q (the drafter distributions "
                         "the children were sampled from); build with build_static_tree(sample=True)")
    dev, D = p.device, tree.max_depth
    p_ref = p if p_ref is None else p_ref
    kids = tree.children()                                                  # (B, N, C)
    C = kids.shape[-1]
    u_acc = uniform((B, D + 1, max(C, 1)), generator, dev)
    u_bonus = uniform((B,), generator, dev)
    rows = torch.arange(B, device=dev)
    cur = torch.zeros(B, dtype=torch.long, device=dev)
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    path = torch.full((B, D + 1), -1, dtype=torch.long, device=dev)
    path[:, 0] = 0
    out_tok = torch.full((B, D + 1), -1, dtype=torch.long, device=dev)
    pos_tvd = torch.zeros(B, D + 1, device=dev)
    for level in range(D + 1):
        ch = kids[rows, cur]                                                # (B, C)
        drafts = torch.where(ch >= 0, tree.tokens.gather(1, ch.clamp(min=0)), -1)
        q = tree.child_q[rows, cur].float() if rule.needs_q else None
        pn = _normalize(p[rows, cur].float())  # the scan starts from it; the stats compare with it
        if level < D:
            choice, resid, dist = _scan_siblings(pn, drafts, u_acc[:, level], rule, q, ch, cur, normalized=True)
        else:  # a node at the deepest level has no children: nothing to scan (rows stopped earlier are masked)
            choice, resid, dist = torch.full_like(cur, -1), pn, pn
        law = dist if rule.law_given_drafts else pn
        ref = pn if p_ref is p else _normalize(p_ref[rows, cur].float())
        pos_tvd[:, level] = torch.where(alive, tvd(ref, law), 0.0)
        acc = alive & (choice >= 0)
        # every level runs (rows that stopped are masked), so no value is read back to decide the
        # loop; the residual where a row stops is kept for its bonus
        stop_resid = resid if level == 0 else torch.where((alive & ~acc)[:, None], resid, stop_resid)
        if level == D:
            break
        nxt = ch.gather(1, choice.clamp(min=0)[:, None])[:, 0] if C else cur
        acc_tok = drafts.gather(1, choice.clamp(min=0)[:, None])[:, 0] if C else cur
        out_tok[:, level] = torch.where(acc, acc_tok, -1)
        path[:, level + 1] = torch.where(acc, nxt, -1)
        cur = torch.where(acc, nxt, cur)
        alive = acc
    accept_len = (path >= 0).sum(1) - 1
    bonus = _sample(stop_resid, u_bonus)  # drawn once, from u_bonus (consumed up front), where each row stopped
    out_tok.scatter_(1, accept_len[:, None], bonus[:, None])
    return VerifyResult(path, accept_len, bonus, out_tok, pos_tvd)


def _check_p(p: Tensor, tree: DraftTree) -> tuple[int, int, int]:
    if p.dim() != 3 or tuple(p.shape[:2]) != tuple(tree.tokens.shape):
        raise InputError(f"target distributions must be (B, N, V) with (B, N) = "
                         f"{tuple(tree.tokens.shape)} (one per tree node), got {tuple(p.shape)}")
    return tuple(p.shape)


def verify_exact(p: Tensor, tree: DraftTree, generator: Optional[torch.Generator]) -> VerifyResult:
    """Lossless tree speculative sampling, deterministic (top-K) drafts (EAGLE-2).

    Args:
        p: (B, N, V) guided, filtered target probabilities at every node.
        tree: DraftTree; generator: torch.Generator.
    Returns:
        VerifyResult; committed tokens are distributed exactly as the target's own sampling.
    """
    return verify_tree(p, tree, generator, ExactRule())


def verify_exact_sampled(p: Tensor, tree: DraftTree,
                         generator: Optional[torch.Generator]) -> VerifyResult:
    """Lossless tree speculative sampling, sampled drafts (p/q rule, residual max(p - q, 0)).

    The children of every node must have been drawn without replacement from tree.child_q in
    node order (build_static_tree(sample=True)) and the tree shape must not depend on the draws.
    """
    return verify_tree(p, tree, generator, SampledRule())


def verify_lantern(p: Tensor, tree: DraftTree, generator: Optional[torch.Generator],
                   neighbors: Tensor, *, k: int = 1000, delta: float = 0.1,
                   residual: str = "clean", delta_nodes: Optional[Tensor] = None) -> VerifyResult:
    """LANTERN relaxed speculative sampling (deterministic drafts, q = 1).

    Args:
        p: (B, N, V) guided, filtered target probabilities.
        tree: DraftTree; generator: torch.Generator.
        neighbors: (V, K_nb) codebook neighbours by L2 distance, nearest first, self excluded.
        k: neighbours considered (<= K_nb); delta: TVD budget (> 1: lambda mode, bound
            (delta - 1) p(x)).
        residual: "clean" (zero x and the m merged neighbours: the output at a single-draft node
            is exactly the relaxed distribution; delta = 0 is exact) or "lantern_repo" (zero x
            and its first k neighbours as the reference code does: over-prunes, and is NOT exact
            at delta = 0).
        delta_nodes: (B, N) per-parent budget (modulated LANTERN, `lantern_delta_eff`), replacing
            delta; None = the constant delta.
    Returns:
        VerifyResult; pos_tvd = TVD(p, law of the committed token) per position.
    """
    _check_lantern(neighbors, k, delta, residual, p.shape[-1])
    if delta_nodes is not None:
        delta_nodes = _check_delta_nodes(delta_nodes, p, delta)
    rule = LanternRule(neighbors.to(p.device), int(k), float(delta), residual, delta_nodes)
    return verify_tree(p, tree, generator, rule)


def verify_gasv(p: Tensor, tree: DraftTree, generator: Optional[torch.Generator], cand: Tensor,
                gate: Tensor, delta_eff: Tensor) -> VerifyResult:
    """GASV v2 sampling (docs/spec/lisa.md steps 5-6): siblings in draft order, each lent the gated
    mass of its candidates from the residual, capped by the parent's delta_eff.

    Args:
        p: (B, N, V) guided, filtered target probabilities at every node (GASVGates.p).
        tree: DraftTree; generator: torch.Generator.
        cand, gate: (B, N, K) candidates of each node's token and their gates at its parent.
        delta_eff: (B, N) mass budget of each node as a parent.
    Returns:
        VerifyResult; pos_tvd = TVD(p, closed-form law of the committed token) per position.
        Zero gates or delta_eff 0 give verify_exact's outputs for the same generator state.
    """
    B, N, V = _check_p(p, tree)
    if cand.shape[:2] != (B, N) or gate.shape != cand.shape or delta_eff.shape != (B, N):
        raise InputError(f"GASV cand / gate must be (B, N, K) and delta_eff (B, N) for (B, N) = "
                         f"{(B, N)}; got {tuple(cand.shape)}, {tuple(gate.shape)}, {tuple(delta_eff.shape)}")
    dev = p.device
    rule = GASVRule(cand.to(dev).long(), gate.to(dev).float(), delta_eff.to(dev).float())
    return verify_tree(p, tree, generator, rule)


# ----------------------------------------------------------------------------- greedy rules

def _longest_path(tree: DraftTree, ok: Tensor) -> tuple[Tensor, Tensor]:
    """ok (B, N) per-node acceptance -> (path (B, D + 1) with root, accept_len (B,)).

    Longest accepted prefix over the retrieve paths; the first path wins ties."""
    paths = tree.retrieve                                                   # (B, P, D1)
    B, P, D1 = paths.shape
    okp = ok.gather(1, paths.clamp(min=0).reshape(B, -1)).reshape(B, P, D1) & (paths >= 0)
    run = okp[..., 1:].long().cumprod(-1).sum(-1)                           # (B, P)
    best = run.argmax(1)
    accept_len = run.gather(1, best[:, None])[:, 0]
    path = paths[torch.arange(B, device=paths.device), best]                # (B, D1)
    path = torch.where(torch.arange(D1, device=path.device) <= accept_len[:, None], path, -1)
    return path, accept_len


def _greedy_result(tree: DraftTree, ok: Tensor, bonus_scores: Tensor) -> VerifyResult:
    ok = ok & tree.valid
    ok[:, 0] = True
    path, accept_len = _longest_path(tree, ok)
    last = path.gather(1, accept_len[:, None])                              # (B, 1)
    bonus = bonus_scores.gather(1, last)[:, 0]
    toks = torch.where(path >= 0, tree.tokens.gather(1, path.clamp(min=0)), -1)
    toks = torch.cat([toks[:, 1:], torch.full_like(toks[:, :1], -1)], 1)    # drafts after root
    toks = toks.scatter(1, accept_len[:, None], bonus[:, None])
    return VerifyResult(path, accept_len, bonus, toks, torch.zeros(path.shape, device=path.device))


def _draft_tokens(tree: DraftTree) -> Tensor:
    """(B, N) node tokens with the root's replaced by 0 (root is never verified)."""
    return torch.where(tree.parents >= 0, tree.tokens, 0)


def verify_greedy(p: Tensor, tree: DraftTree) -> VerifyResult:
    """Greedy verification: the longest path whose tokens equal the target argmax at each parent;
    bonus = argmax at the last accepted node. Token-identical to greedy AR (argmax, first index on
    ties); pass LOGITS when the reference loop takes argmax over logits.

    Args:
        p: (B, N, V) target probabilities or logits (only the argmax is used).
        tree: DraftTree.
    """
    _check_p(p, tree)
    am = p.argmax(-1)                                                       # (B, N)
    ok = tree.tokens == am.gather(1, tree.parents.clamp(min=0))
    return _greedy_result(tree, ok, am)


def lantern_delta_eff(logits: Tensor, delta: float, gamma: float) -> Tensor:
    """Modulated LANTERN budget (spec/lisa.md step 2 with gamma_delta = gamma):
    min(1, delta (1 + gamma r_u)) per row of logits (..., V) -> (...); gamma 0 = constant delta."""
    from .gasv import uncertainty

    if not gamma >= 0 or not 0 <= delta <= 1:
        raise InputError(f"modulated LANTERN needs 0 <= delta <= 1 and lantern_gamma >= 0, got "
                         f"delta {delta}, gamma {gamma}")
    r = uncertainty(logits.reshape(-1, logits.shape[-1]).float()).reshape(logits.shape[:-1])
    return torch.clamp(delta * (1.0 + gamma * r), max=1.0)


def _check_delta_nodes(delta_nodes: Tensor, p: Tensor, delta: float) -> Tensor:
    if tuple(delta_nodes.shape) != tuple(p.shape[:2]):
        raise InputError(f"delta_nodes must be (B, N) = {tuple(p.shape[:2])}, got {tuple(delta_nodes.shape)}")
    if delta > 1.0:
        raise InputError("a per-node (modulated) LANTERN budget cannot be combined with lambda mode (delta > 1)")
    return delta_nodes.to(p.device).float()


def verify_lantern_greedy(p: Tensor, tree: DraftTree, neighbors: Tensor, *, k: int = 1000,
                          delta: float = 0.1, delta_nodes: Optional[Tensor] = None) -> VerifyResult:
    """LANTERN greedy: accept node x (merged set A = x + its m neighbours under p at the parent)
    iff p(A) >= max_{y not in A} p(y); longest accepted path; bonus = argmax p.

    Args:
        p: (B, N, V) target probabilities; neighbors, k, delta: as verify_lantern.
    """
    B, N, V = _check_p(p, tree)
    _check_lantern(neighbors, k, delta, "clean", V)
    rows = torch.arange(B, device=p.device)[:, None]
    pp = _normalize(p.float())[rows, tree.parents.clamp(min=0)].reshape(B * N, V)  # parent dist
    x = _draft_tokens(tree).reshape(-1)
    if delta_nodes is not None:
        delta = _check_delta_nodes(delta_nodes, p, delta)[rows, tree.parents.clamp(min=0)].reshape(-1)
    nb, m, c_m = _lantern_merge(pp, x, neighbors.to(p.device), k, delta)
    merged = torch.where(torch.arange(k, device=p.device) < m[:, None], nb, -1)
    first_nb = torch.where(merged >= 0, merged, x[:, None])   # padded entries point at x itself
    in_a = torch.zeros_like(pp, dtype=torch.bool).scatter(1, torch.cat([x[:, None], first_nb], 1),
                                                          True)
    outside = pp.masked_fill(in_a, float("-inf")).max(-1).values
    ok = (pp.gather(1, x[:, None])[:, 0] + c_m >= outside).reshape(B, N)
    return _greedy_result(tree, ok, p.argmax(-1))


def verify_gasv_greedy(p: Tensor, tree: DraftTree, cand: Tensor, gate: Tensor,
                       delta_eff: Tensor) -> VerifyResult:
    """Greedy GASV (docs/spec/lisa.md step 7): accept node d iff its single-sibling effective
    probability a = min(1, p(d) + sum m) at its parent is >= the largest effective probability
    p(v) - m(v) of any other token; longest accepted path; bonus = argmax p. With zero gates this
    is greedy decoding.

    Args:
        p: (B, N, V) target probabilities; cand, gate (B, N, K); delta_eff (B, N): as verify_gasv.
    """
    from .gasv import moved_mass

    B, N, V = _check_p(p, tree)
    K = cand.shape[-1]
    rows = torch.arange(B, device=p.device)[:, None]
    par = tree.parents.clamp(min=0)
    pp = _normalize(p.float())[rows, par].reshape(B * N, V)                # parent distribution
    x = _draft_tokens(tree).reshape(-1)
    c = cand.to(p.device).long().reshape(B * N, K)
    m = moved_mass(pp, c, gate.to(p.device).float().reshape(B * N, K),
                   delta_eff.to(p.device).float()[rows, par].reshape(-1))
    a = (pp.gather(1, x[:, None])[:, 0] + m.sum(-1)).clamp(max=1.0)
    eff = pp.scatter_add(1, c.clamp(min=0), -m).scatter(1, x[:, None], float("-inf"))
    ok = (a >= eff.max(-1).values).reshape(B, N)
    return _greedy_result(tree, ok, p.argmax(-1))


# ----------------------------------------------------------------------------- SJD

def ratio_accept(x_now: Tensor, x_prev: Tensor) -> Tensor:
    """min(1, x_now / x_prev) elementwise, with x / 0 = 1 for x > 0 and 0 / 0 = 0 (the SJD test)."""
    return torch.where(x_prev > 0, (x_now / x_prev.clamp(min=1e-30)).clamp(max=1.0), (x_now > 0).float())


def jacobi_residual(p_now: Tensor, p_prev: Tensor) -> Tensor:
    """max(0, p_now - p_prev) over the last axis (unnormalised), p_now where that is empty."""
    resid = (p_now - p_prev).clamp(min=0.0)
    return torch.where(resid.sum(-1, keepdim=True) > 0, resid, p_now)


def sjd_accept(p_now: Tensor, p_prev: Tensor, drafts: Tensor,
               generator: Optional[torch.Generator], accept_prob: Optional[Tensor] = None) -> SJDResult:
    """Speculative Jacobi Decoding acceptance over a window of W drafts.

    Draft x_j (sampled from p_prev[:, j] in the previous Jacobi iteration) is accepted with
    probability min(1, p_now(x_j) / p_prev(x_j)) (x/0 = 1 for x > 0, 0/0 = 0), left to right;
    the first rejected slot j is resampled from norm(max(0, p_now_j - p_prev_j)) (p_now_j if
    that is empty).

    Args:
        p_now: (B, W, V) current-iteration distributions at the window slots.
        p_prev: (B, W, V) previous-iteration distributions the drafts were drawn from.
        drafts: (B, W) long.
        generator: torch.Generator.
        accept_prob: optional (B, W) acceptance probabilities replacing min(1, p_now / p_prev)
            (a relaxed rule such as GSD's grouped test); rejection and residual are unchanged.
    Returns:
        SJDResult(accept_len (B,), token (B,), -1 when all W were accepted).
    """
    if p_now.shape != p_prev.shape or tuple(drafts.shape) != tuple(p_now.shape[:2]):
        raise InputError(f"sjd_accept needs p_now, p_prev (B, W, V) and drafts (B, W); got "
                         f"{tuple(p_now.shape)}, {tuple(p_prev.shape)}, {tuple(drafts.shape)}")
    B, W, V = p_now.shape
    u = torch.rand((B, W), generator=generator, device=p_now.device)
    u_res = torch.rand((B,), generator=generator, device=p_now.device)
    pn, pp = _normalize(p_now.float()), _normalize(p_prev.float())
    xn = pn.gather(2, drafts.long()[..., None])[..., 0]                    # (B, W)
    xp = pp.gather(2, drafts.long()[..., None])[..., 0]
    a = ratio_accept(xn, xp)
    if accept_prob is not None:
        a = accept_prob.to(a.device, a.dtype)
    accept_len = (u < a).long().cumprod(-1).sum(-1)                        # (B,)
    j = accept_len.clamp(max=W - 1)
    rows = torch.arange(B, device=p_now.device)
    resid = jacobi_residual(pn[rows, j], pp[rows, j])
    token = torch.where(accept_len < W, _sample(resid, u_res), -1)
    return SJDResult(accept_len, token)
