"""Tree verification rules (docs/spec/speculative.md "Verification rules", docs/spec/lisa.md GASV step 6).

Every rule is a pure function of the target's GUIDED, FILTERED distribution at every tree node,
p (B, N, V) (CFG combined, temperature, top-k/top-p; p[:, n] predicts node n's children), the
DraftTree, and a torch.Generator. Node n is verified against p at its PARENT.

Sampling rules scan the drafted children of EVERY node at once, each node as a parent (tensors
over (B, N), the tree's fixed node budget; only the sibling index is a loop, and only in the
rules where a rejection changes what the next sibling sees): at a node the children are tried in
draft order against a working distribution r (initially p at the node); the first accepted child
is the node's choice, otherwise the bonus token is sampled from the final residual r. The
accepted path is then read off the choices (a node is on it when it and each of its ancestors was
its parent's choice) and a leaf's bonus is sampled from p at the leaf: the law of a sequential
walk from the root, with no walk. All random numbers are drawn up front, in a fixed layout
(u_accept (B, D + 1, C): a node at depth d reads row d; u_bonus (B,)), so rules that agree
numerically give the same outputs for the same generator state (LANTERN delta=0 == exact, GASV
with zero gates or delta 0 == exact). Exact rules have a closed form over the siblings (no loop).

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
gasv) the law GIVEN the drafted siblings is computed in closed form (0 for exact: the law is p,
the moved mass for LANTERN and GASV with one draft (<= delta_eff), possibly more
with several siblings, each of which may move up to delta of the current residual). For sampled
drafts the law is p only marginally over the draws, so pos_tvd = TVD(p_ref, p) = 0. Greedy
rules report 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
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
    Never returns a zero-mass token when the row has mass: a zero entry leaves the CDF flat, so
    only the past-the-end index (u rounding up to the total) can land on one; it becomes the last
    token with mass (token 0 for an empty row)."""
    cdf = r.double().cumsum(-1)
    idx = torch.searchsorted(cdf, (u.double() * cdf[:, -1])[:, None], right=True)[:, 0]
    return torch.minimum(idx, (r > 0).cumsum(-1).argmax(-1))


def _zero(r: Tensor, idx: Tensor) -> Tensor:
    """r (B, V) with the tokens idx (B, k) set to 0 (negative idx ignored)."""
    V = r.shape[-1]
    keep = torch.ones(r.shape[0], V + 1, dtype=r.dtype, device=r.device)
    keep.scatter_(1, torch.where(idx >= 0, idx, V), 0.0)      # negatives land in column V
    return r * keep[:, :V]


# ----------------------------------------------------------------------------- sampling rules
#
# A rule's `scan(pn, x, kids, q)` runs the sibling scan at EVERY node of the tree at once, each node
# as a parent (vectorised over (B, N); the sibling index j < C is a loop only where the rule is
# sequential). pn (B, N, V): the normalised p at every node; x (B, N, C): its drafted children's
# tokens in draft order, -1 padded (after the real ones); kids (B, N, C): their node ids (padding
# 0, marked by x < 0); q (B, N, V): the normalised drafter distributions (SampledRule) or None.
# It returns
#   a (B, N, C): the probability that child j is accepted once the children before it were
#       rejected (0 on padding);
#   resid (B, N, V'): the residual once every child was rejected, unnormalised (V' >= V, the
#       columns past V zero): a bonus at the node is drawn from it;
#   law (B, N, V'): the law of the token committed at the node given its drafts, or None where
#       that law is p (exact rules; sampled drafts, marginally over the draws).
# Padding reads and writes a dump column V (`_dumped`), where r is 0, so a padded slot changes
# nothing.

def _dumped(pn: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """(pn with a zero dump column V (B, N, V + 1), x with its padding sent to V)."""
    V = pn.shape[-1]
    return F.pad(pn, (0, 1)), x.masked_fill(x < 0, V)


def _draft_mass(pn: Tensor, x: Tensor) -> Tensor:
    """p at the drafted siblings x (B, N, C), 0 on padding and on a token repeated from an earlier
    sibling (its mass was already removed when that sibling was rejected)."""
    slots = torch.arange(x.shape[-1], device=x.device)
    repeat = ((x[..., :, None] == x[..., None, :]) & (slots[:, None] > slots[None, :])).any(-1)
    return torch.where(repeat | (x < 0), 0.0, pn.gather(2, x.clamp(min=0)))


@dataclass(frozen=True)
class ExactRule:
    """Deterministic drafts (q one-hot): accept w.p. r(x); on rejection r(x) = 0. In closed form
    over the siblings: a_j = p(x_j) / (the mass outside x_<j), the residual is p without the
    drafts, and the committed token's law is p."""

    needs_q = False
    law_given_drafts = True

    def scan(self, pn: Tensor, x: Tensor, kids: Tensor, q: Optional[Tensor]):
        px = _draft_mass(pn, x)                                              # (B, N, C)
        resid = pn.scatter_add(2, x.clamp(min=0), -px)                       # the drafts' entries: 0
        after = px.flip(-1).cumsum(-1).flip(-1)                              # mass of x_j, x_j+1, ...
        left = resid.sum(-1, keepdim=True) + after                           # mass outside x_<j
        return px / left.clamp(min=1e-30), resid, None


@dataclass(frozen=True)
class SampledRule:
    """Sampled drafts: accept w.p. min(1, r(x)/q(x)); on rejection r <- norm(max(r - q, 0)),
    q <- q without x. A child with q(x) = 0 cannot have been drawn: it is skipped (a = 0, r kept).

    The output is distributed as p only marginally over the random drafts (not given them)."""

    needs_q = True
    law_given_drafts = False

    def scan(self, pn: Tensor, x: Tensor, kids: Tensor, q: Tensor):
        r, xd = _dumped(pn, x)
        qq = F.pad(q, (0, 1))
        acc = []
        for j in range(x.shape[-1]):   # sequential: r and q change with every rejection
            xj = xd[:, :, j, None]
            zr, zq = r.sum(-1, keepdim=True).clamp(min=1e-30), qq.sum(-1, keepdim=True).clamp(min=1e-30)
            rx, qx = r.gather(2, xj) / zr, qq.gather(2, xj) / zq            # (B, N, 1) normalised
            drawn = qx > 0
            acc.append(torch.where(drawn, (rx / qx.clamp(min=1e-30)).clamp(max=1.0), 0.0))
            r = torch.where(drawn, (r / zr - qq / zq).clamp(min=0.0), r)
            qq = qq.scatter(2, xj, 0.0)
        return torch.cat(acc, -1), r, None


@dataclass(frozen=True)
class LanternRule:
    """LANTERN relaxed acceptance (see module docstring); neighbors (V, K_nb) nearest first
    (distinct, self excluded: what `lisa-trt calibrate` makes)."""

    neighbors: Tensor
    k: int
    delta: float
    residual: str = "clean"
    delta_nodes: Optional[Tensor] = None  # (B, N) modulated budget per parent (lantern_gamma)
    needs_q = False
    law_given_drafts = True

    def scan(self, pn: Tensor, x: Tensor, kids: Tensor, q: Optional[Tensor]):
        r, xd = _dumped(pn, x)
        V = pn.shape[-1]
        nb = torch.where(x[..., None] >= 0, self.neighbors[:, : self.k][x.clamp(min=0)], V)  # (B, N, C, k)
        idx = torch.cat([xd[..., None], nb], -1)                             # the sibling, its neighbours
        z = pn.sum(-1)
        nums, zs = [], []
        for j in range(x.shape[-1]):   # sequential: each rejection zeroes mass the next ones see
            ij = idx[:, :, j]
            vals = r.gather(2, ij)                                           # r(x), r(neighbours)
            c = vals[..., 1:].cumsum(-1)                                     # c_1..c_k (unnormalised)
            merged = c <= self._threshold(vals[..., 0], z)[..., None]      # a prefix: c is nondecreasing
            nums.append(vals[..., 0] + (c * merged).amax(-1))                # r(x) + c_m
            zs.append(z)
            r = self._reject(r, ij, merged, vals[..., 1:])
            z = r.sum(-1)
        a = (torch.stack(nums, -1) / torch.stack(zs, -1).clamp(min=1e-30)).clamp(max=1.0)
        return a, r, _sibling_law(r, z, a, xd)

    def _threshold(self, rx: Tensor, z: Tensor) -> Tensor:
        """The merge bound on the unnormalised neighbour mass: delta z (per parent when
        modulated), or (delta - 1) r(x) in lambda mode (delta > 1)."""
        if self.delta_nodes is not None:
            return self.delta_nodes * z
        return (self.delta - 1.0) * rx if self.delta > 1.0 else self.delta * z

    def _reject(self, r: Tensor, ij: Tensor, merged: Tensor, nb_mass: Tensor) -> Tensor:
        """r with x (ij[..., 0]) and its merged neighbours zeroed (clean), or x and all its first k
        neighbours (lantern_repo) unless that empties the row (then clean)."""
        over = None
        if self.residual != "clean":
            over = r.scatter(2, ij, 0.0)
        r.scatter_(2, ij[..., 1:], torch.where(merged, 0.0, nb_mass))
        r.scatter_(2, ij[..., :1], 0.0)
        if over is None:
            return r
        return torch.where(over.sum(-1, keepdim=True) > 0, over, r)


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

    cand, gate: (B, N, K) candidates of each node's token and their gates at its parent (what
    gasv_gates makes: distinct candidates, -1 padded, the token itself excluded; gates in [0, 1],
    so a lent mass never exceeds the residual it comes from); delta_eff: (B, N) each node's
    budget as a parent.
    """

    cand: Tensor
    gate: Tensor
    delta_eff: Tensor
    needs_q = False
    law_given_drafts = True

    def scan(self, pn: Tensor, x: Tensor, kids: Tensor, q: Optional[Tensor]):
        B, N, C = x.shape
        K = self.cand.shape[-1]
        r, xd = _dumped(pn, x)
        flat = kids.reshape(B, N * C, 1).expand(B, N * C, K)
        cand, gate = self.cand.gather(1, flat).view(B, N, C, K), self.gate.gather(1, flat).view(B, N, C, K)
        idx = torch.cat([xd[..., None], cand], -1)                           # the sibling, its candidates
        idx = idx.masked_fill((idx < 0) | (x < 0)[..., None], pn.shape[-1])
        # per sibling j a contiguous (B N, 1 + K, 1) block, column 0 (the sibling itself) 0
        gate = F.pad(gate, (1, 0)).permute(2, 0, 1, 3).reshape(C, B * N, K + 1, 1)
        # the update of r at idx is vals * (gate s - e0): the candidates lose m, the sibling all of r(x)
        e0, floor = _gasv_consts(K, pn.device)
        neg_delta = -self.delta_eff
        z = pn.sum(-1)
        own, ms, ss, zs = [], [], [], []
        for j in range(C):   # sequential: each sibling lends from the residual the earlier ones left
            ij, gj = idx[:, :, j], gate[j]
            vals = r.gather(2, ij)                                           # r(x), r(candidates)
            m = torch.bmm(vals.view(B * N, 1, K + 1), gj).view(B, N)        # M = sum r g (unnormalised)
            s = torch.fmax(neg_delta * z / m, floor)    # -min(1, delta z / M); M = 0 (0 / 0 too): -1, moves 0
            own.append(vals[..., 0])
            ms.append(m)
            ss.append(s)
            zs.append(z)
            r.scatter_add_(2, ij, vals * torch.addcmul(e0, gj.view(B, N, K + 1), s[..., None]))  # r - m, r(x) = 0
            z = r.sum(-1)
        # r(x) + the moved mass of every sibling at once (elementwise: no sibling depends on it)
        nums = torch.addcmul(torch.stack(own, -1), torch.stack(ms, -1), torch.stack(ss, -1), value=-1.0)
        a = (nums / torch.stack(zs, -1).clamp(min=1e-30)).clamp(max=1.0)
        return a, r, _sibling_law(r, z, a, xd)


_GASV_CONSTS: dict = {}


def _gasv_consts(K: int, dev) -> tuple[Tensor, Tensor]:
    """(e0 (K + 1,): -1 then K zeros, floor: -1.0) of GASVRule.scan, made once per (K, device)
    (a traced call makes them in its graph: no tensor of a trace is kept)."""
    if torch.compiler.is_compiling():
        return -F.pad(torch.ones(1, device=dev), (0, K)), torch.full((), -1.0, device=dev)
    c = _GASV_CONSTS.get((K, dev))
    if c is None:
        c = _GASV_CONSTS[(K, dev)] = (-F.pad(torch.ones(1, device=dev), (0, K)), torch.full((), -1.0, device=dev))
    return c


def _sibling_law(resid: Tensor, z: Tensor, a: Tensor, xd: Tensor) -> Tensor:
    """(B, N, V') law of the token committed at every node given its drafts xd (B, N, C) (padding
    in the dump column): child j w.p. reach_j a_j, reach_j = prod_{i<j} (1 - a_i), else a draw from
    the final residual (unnormalised, its mass z (B, N))."""
    reach = torch.cumprod(1.0 - a, -1)                                       # after sibling j
    before = F.pad(reach[..., :-1], (1, 0), value=1.0)
    law = resid * (reach[..., -1] / z.clamp(min=1e-30))[..., None]
    return law.scatter_add(2, xd, before * a)


# ----------------------------------------------------------------------------- the tree walk

def _walk(tree: DraftTree, choice: Tensor, D: int) -> tuple[Tensor, Tensor, Tensor]:
    """The accepted path of every row from the choices at every node, without a walk.

    choice (B, N): the sibling index of the child accepted at each node (>= its number of
    children: none). A node is on the path when it and each of its ancestors below the root was
    the child accepted at its parent (`DraftTree.child_ranks`: -1 for the root and invalid nodes).
    Returns:
        buf (B, D + 2): the path's nodes by depth, root first, then -1 (path = buf[:, :D + 1]);
        accept_len (B,); last (B,) the deepest accepted node.
    """
    B, N = choice.shape
    picked = choice.gather(1, tree.parents.clamp(min=0)) == tree.child_ranks()
    on_path = (tree.ancestors[..., 1:] <= picked[:, None, 1:]).all(-1)      # (B, N)
    accept_len = on_path.sum(1) - 1
    buf = torch.full((B, D + 2), -1, dtype=torch.long, device=choice.device)
    nodes = torch.where(on_path, torch.arange(N, device=choice.device), -1)
    buf.scatter_(1, torch.where(on_path, tree.depths, D + 1), nodes)        # off the path: column D + 1
    return buf, accept_len, buf.gather(1, accept_len[:, None])[:, 0]


def verify_tree(p: Tensor, tree: DraftTree, generator: Optional[torch.Generator], rule, *,
                p_ref: Optional[Tensor] = None) -> VerifyResult:
    """Generic sampling verification (the engine of verify_exact / _sampled / lantern / gasv):
    the rule's scan at every node at once, the accepted path from the choices, one bonus draw.

    Args:
        p: (B, N, V) target distribution at every node that the rule verifies against.
        tree: DraftTree (B rows, N nodes); tree.child_q is required by SampledRule.
        generator: torch.Generator on p's device (None = the global RNG).
        rule: ExactRule() | SampledRule() | LanternRule(...) | GASVRule(...).
        p_ref: (B, N, V) raw target for the distortion stats (default p).
    Returns:
        VerifyResult.
    """
    B, N, V = _check_p(p, tree)
    if rule.needs_q and tree.child_q is None:
        raise InputError("the sampled-draft rule needs tree.child_q (the drafter distributions "
                         "the children were sampled from); build with build_static_tree(sample=True)")
    dev, D = p.device, tree.max_depth
    kids = tree.children()                                                  # (B, N, C)
    C = kids.shape[-1]
    u_acc = uniform((B, D + 1, max(C, 1)), generator, dev)   # node n draws from row depths[n]
    u_bonus = uniform((B,), generator, dev)
    pn = _normalize(p.float())
    law = None
    if C:
        kc = kids.clamp(min=0)
        x = tree.tokens[:, None, :].expand(B, N, N).gather(2, kc).masked_fill(kids < 0, -1)
        a, resid, law = rule.scan(pn, x, kc, tree.child_q.float() if rule.needs_q else None)
        u = u_acc.gather(1, tree.depths.clamp(max=D)[:, :, None].expand(B, N, C))
        choice = torch.where(u < a, torch.arange(C, device=dev), C).amin(-1)  # first accepted child
    else:  # a root alone: nothing to scan
        resid, choice = pn, torch.zeros(B, N, dtype=torch.long, device=dev)
    buf, accept_len, last = _walk(tree, choice, D)
    bonus = _sample(resid.gather(1, last[:, None, None].expand(B, 1, resid.shape[-1]))[:, 0, :V], u_bonus)
    nxt = buf[:, 1:]                                                        # the accepted drafts' nodes
    tokens = tree.tokens.gather(1, nxt.clamp(min=0)).masked_fill(nxt < 0, -1)
    tokens = tokens.scatter(1, accept_len[:, None], bonus[:, None])
    path = buf[:, : D + 1]
    return VerifyResult(path, accept_len, bonus, tokens, _pos_tvd(pn, law, p_ref, path))


def _pos_tvd(pn: Tensor, law: Optional[Tensor], p_ref: Optional[Tensor], path: Tensor) -> Tensor:
    """(B, D + 1) TVD(p_ref, law) at each committed position's node (its parent), 0 past the path."""
    if law is None and p_ref is None:   # the law is p itself
        return torch.zeros(path.shape, device=pn.device)
    ref = pn if p_ref is None else _normalize(p_ref.float())
    node = tvd(ref, pn if law is None else law[..., : pn.shape[-1]])       # (B, N)
    return node.gather(1, path.clamp(min=0)).masked_fill(path < 0, 0.0)


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
    rule = LanternRule(neighbors.to(p.device).long(), int(k), float(delta), residual, delta_nodes)
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
