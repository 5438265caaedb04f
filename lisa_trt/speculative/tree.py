"""Draft trees for tree speculative decoding (docs/spec/speculative.md, "EAGLE-2 dynamic draft tree").

A tree holds N = M + 1 nodes per batch row: node 0 is the ROOT (the last committed token, not yet
in the target's KV cache), nodes 1..M are drafted tokens. Every tree in lisa-trt obeys:

- topological order: parents[b, n] < n for n >= 1, parents[b, 0] = -1;
- sibling order = draft order: the children of a node appear in increasing node index in the
  order the drafter proposed them (top-K rank for deterministic drafts, draw order for sampled
  drafts). Verification visits siblings in that order;
- static shapes: all rows have N nodes; rows may hide nodes with `valid` (truncation at the end
  of the image). Invalid nodes are never accepted and attend only to themselves.

Two builders drive a drafter through one callback, `expand_fn(ExpandRequest) -> (B, n, V)
log-probs`, so this module knows nothing about the drafter:
- `build_dynamic_tree`: EAGLE-2 (top-K children, cumulative scores, beam of K, rerank top M);
- `build_static_tree`: a fixed shape from a list of child-rank paths (Medusa/EAGLE-1 style),
  deterministic (top-k) or sampled (without replacement) children.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InputError, unknown_name
from ..validation import debug_checks


# ----------------------------------------------------------------------------- tree buffers

@dataclass(frozen=True)
class DraftTree:
    """Batch-first tree buffers (N = M + 1 nodes, root at index 0).

    Attributes:
        tokens: (B, N) long; tokens[:, 0] is the root (last committed token).
        parents: (B, N) long; -1 for the root, parents[b, n] < n.
        depths: (B, N) long; root 0. Position of node n = root position + depths[b, n].
        ancestors: (B, N, N) bool; [b, i, j] is True iff j == i or j is an ancestor of i (the
            tree attention mask among nodes, for `cache.attention_mask`). Rows of invalid nodes
            are self-only.
        valid: (B, N) bool; the root is always valid and a valid node's parent is valid.
        logprobs: (B, N) fp32 draft log-prob of node n's token under its parent's drafter
            distribution (root 0).
        scores: (B, N) fp32 cumulative draft log-prob along the path (root 0).
        retrieve: (B, P, D + 1) long; one root->leaf path per valid leaf (leaves in node-index
            order), -1 padded; D = deepest valid node over the batch (a property: a tree with a
            static bound makes it on first use, as only the greedy rules read it).
        child_q: optional (B, N, V) fp32; the drafter distribution node n's children were SAMPLED
            from (needed by the sampled-draft rule only; rows of leaves are unused).
    """

    tokens: Tensor
    parents: Tensor
    depths: Tensor
    ancestors: Tensor
    valid: Tensor
    logprobs: Tensor
    scores: Tensor
    paths: Optional[Tensor] = field(default=None, repr=False, compare=False)  # `retrieve` when known
    child_q: Optional[Tensor] = None
    kids: Optional[Tensor] = field(default=None, repr=False, compare=False)  # children() when known
    static: Optional[tuple] = field(default=None, repr=False, compare=False)  # from_parents(static=...)
    ranks: Optional[Tensor] = field(default=None, repr=False, compare=False)  # child_ranks() when known

    @classmethod
    def from_parents(cls, tokens: Tensor, parents: Tensor, *, valid: Optional[Tensor] = None,
                     logprobs: Optional[Tensor] = None, scores: Optional[Tensor] = None,
                     child_q: Optional[Tensor] = None, static: Optional[tuple] = None) -> "DraftTree":
        """Build every buffer from tokens and parent pointers.

        Args:
            tokens: (B, N) long, root first.
            parents: (B, N) long, -1 for the root, parents[b, n] < n.
            valid: (B, N) bool, default all True.
            logprobs: (B, N) draft log-probs per node (default 0).
            scores: (B, N) cumulative scores; default the sum of `logprobs` over the ancestors.
            child_q: (B, N, V) optional drafter distributions (sampled drafts).
            static: (max depth, max children) the tree's builder guarantees (a tree config's
                bounds): the buffers then have fixed shapes, retrieve (B, N, max depth + 1) and
                children (B, N, max children), padded with -1, made with tensor ops alone (no value
                read back), and the pointers are checked only under the debug switch (the builder
                made them). None: shapes fitted to this tree (reads its depth and widths), checked.
        Returns:
            DraftTree.
        """
        tokens, parents = tokens.long(), parents.long()
        B, N = tokens.shape
        dev = tokens.device
        valid = torch.ones(B, N, dtype=torch.bool, device=dev) if valid is None else valid.bool()
        if static is None:
            depths, ancestors, retrieve, kids, ranks = _structure(parents, valid)
        else:
            depths, ancestors, retrieve, kids, ranks = _static_structure(parents, valid, *static)
        logprobs = (torch.zeros(B, N, device=dev) if logprobs is None else logprobs.float())
        logprobs = logprobs.clone()
        logprobs[:, 0] = 0.0
        if scores is None:
            scores = torch.where(ancestors, logprobs[:, None, :], 0.0).sum(-1)
        return cls(tokens, parents, depths, ancestors, valid, logprobs, scores.float(), retrieve,
                   child_q, kids, static, ranks)

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def n_nodes(self) -> int:
        return self.tokens.shape[1]

    @property
    def max_depth(self) -> int:
        """Deepest valid node over the batch (D); with a static bound, the bound (no value read)."""
        if self.static is not None:
            return int(self.static[0])
        return self.retrieve.shape[-1] - 1

    @property
    def retrieve(self) -> Tensor:
        """(B, P, D + 1) root->leaf paths (see the class docstring), made on first use."""
        if self.paths is None:
            shape = None if self.static is None else (self.n_nodes, int(self.static[0]) + 1)
            object.__setattr__(self, "paths", retrieve_paths(self.parents, self.depths, self.ancestors,
                                                              self.valid, shape=shape))
        return self.paths

    def positions(self, root_position: Tensor) -> Tensor:
        """Absolute sequence positions of the nodes: root_position + depth.

        Args:
            root_position: (B,) long position of the root token.
        Returns:
            (B, N) long; invalid nodes get the root's position (never out of range).
        """
        return root_position.long()[:, None] + torch.where(self.valid, self.depths, 0)

    def children(self) -> Tensor:
        """(B, N, C) long child table in sibling (draft) order, -1 padded; C = max children."""
        if self.kids is not None:
            return self.kids
        return children_table(self.parents, self.valid)

    def child_ranks(self) -> Tensor:
        """(B, N) long: each node's column in its parent's row of `children()` (its sibling
        index), -1 for the root and invalid nodes."""
        if self.ranks is not None:
            return self.ranks
        width = None if self.static is None else self.static[1]
        return _kids_and_ranks(self.parents, self.valid, width)[1]

    def truncate(self, max_depth: Union[int, Tensor]) -> "DraftTree":
        """Hide nodes deeper than `max_depth` (end of image: at most remaining - 1 drafts).

        Args:
            max_depth: int or (B,) long per row; values < 0 are treated as 0 (root only).
        Returns:
            DraftTree with the same shapes and `valid &= depths <= max_depth`.
        """
        md = torch.as_tensor(max_depth, device=self.tokens.device).long().clamp(min=0)
        md = md.expand(self.batch_size) if md.dim() == 0 else md
        hide = self.valid & (self.depths > md[:, None])
        if not bool(hide.any()):  # nothing to hide (every step but the last few): the same tree
            return self
        valid = self.valid & ~hide
        return DraftTree.from_parents(self.tokens, self.parents, valid=valid,
                                      logprobs=self.logprobs, scores=self.scores,
                                      child_q=self.child_q, static=self.static)


_STRUCTURES: dict = {}  # small CPU trees: (shape, parents, valid) -> (depths, ancestors, retrieve)
_CACHE_NODES = 256  # cache the structure of trees with B * N up to this (the shapes recur every step)


def _structure(parents: Tensor, valid: Tensor) -> tuple:
    """Checked depths (B, N), ancestors (B, N, N) and retrieve paths of a tree shape, plus its
    child table and ranks (None here unless cached: `children()` makes them on demand).

    Small CPU trees are cached by their parent pointers and validity (a dynamic tree takes one
    of few shapes step after step): a hit returns the very tensors computed before, which are
    never modified in place (DraftTree is frozen; consumers read them)."""
    key = None
    if parents.device.type == "cpu" and parents.numel() <= _CACHE_NODES:
        key = (tuple(parents.shape), parents.numpy().tobytes(), valid.numpy().tobytes())
        hit = _STRUCTURES.get(key)
        if hit is not None:
            return hit
    check_parents(parents, valid)
    B, N = parents.shape
    closure = ancestor_closure(parents)                                    # (B, N, N)
    depths = closure.sum(-1) - 1                                           # (B, N)
    eye = torch.eye(N, dtype=torch.bool, device=parents.device)
    ancestors = torch.where(valid[:, :, None], closure, eye)
    out = (depths, ancestors, retrieve_paths(parents, depths, ancestors, valid), None, None)
    if key is not None:  # cached: the child table and ranks too (verification reads them every step)
        out = out[:3] + _kids_and_ranks(parents, valid)
        if len(_STRUCTURES) >= 4096:
            _STRUCTURES.clear()
        _STRUCTURES[key] = out
    return out


def _static_structure(parents: Tensor, valid: Tensor, max_depth: int, max_children: int) -> tuple:
    """`_structure` with the shapes a tree config bounds: depths, ancestors, children (B, N,
    max_children) and ranks, with tensor ops only (the parent one-hot shared, the closure's
    squarings bounded by max_depth); retrieve is left to first use (None). Pointers checked only
    under the debug switch."""
    if debug_checks():
        check_parents(parents, valid)
    onehot = _parent_onehot(parents)                                        # (B, N child, N parent)
    closure = _closure(onehot, max_depth)                                   # (B, N, N)
    depths = closure.sum(-1) - 1                                            # (B, N)
    eye = torch.eye(parents.shape[1], dtype=torch.bool, device=parents.device)
    ancestors = torch.where(valid[:, :, None], closure, eye)
    kids, ranks = _kids_and_ranks(parents, valid, max_children, onehot)
    return depths, ancestors, None, kids, ranks


def children_table(parents: Tensor, valid: Tensor, width: Optional[int] = None) -> Tensor:
    """(B, N, C) long child table in sibling (draft) order, -1 padded; C = max children, or
    `width` (a bound the caller guarantees: a fixed shape, no value read back)."""
    return _kids_and_ranks(parents, valid, width)[0]


def _kids_and_ranks(parents: Tensor, valid: Tensor, width: Optional[int] = None,
                    onehot: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """children_table, and each node's column in its parent's row of it (B, N) long (-1 for the
    root and invalid nodes). onehot: `_parent_onehot(parents)` when the caller has it."""
    B, N = parents.shape
    onehot = _parent_onehot(parents) if onehot is None else onehot
    is_child = onehot.transpose(1, 2) & valid[:, None, :]                   # (B, N parent, N child)
    rank = is_child.cumsum(-1) - 1
    C = width if width is not None else (int(is_child.sum(-1).max()) if N > 1 else 0)
    # non-children (and, never: past the width the caller bounds) land in the dump column C
    col = torch.where(is_child, rank.clamp(max=C), C)
    table = torch.full((B, N, C + 1), -1, dtype=torch.long, device=parents.device)
    table.scatter_(2, col, torch.arange(N, device=parents.device).expand(B, N, N))
    return table[..., :C], torch.where(is_child, rank, -1).amax(1)


def check_parents(parents: Tensor, valid: Tensor) -> None:
    """Refuse parent pointers that are not a topologically ordered tree (InputError)."""
    B, N = parents.shape
    idx = torch.arange(N, device=parents.device)
    if (parents[:, 0] != -1).any():
        raise InputError("tree root must have parent -1 (node 0 is the root)")
    if N > 1 and ((parents[:, 1:] < 0) | (parents[:, 1:] >= idx[1:])).any():
        raise InputError("tree nodes must be in topological order: 0 <= parents[b, n] < n "
                         "for every non-root node; sort nodes by depth first")
    if not valid[:, 0].all():
        raise InputError("the tree root must be valid")
    parent_valid = valid.gather(1, parents.clamp(min=0))
    if (valid & ~parent_valid).any():
        raise InputError("a valid tree node has an invalid parent; validity must be "
                         "ancestor-closed (use DraftTree.truncate)")


def ancestor_closure(parents: Tensor, max_depth: Optional[int] = None) -> Tensor:
    """(B, N) parent pointers -> (B, N, N) bool, [b, i, j] = j is i or an ancestor of i.

    Boolean transitive closure by repeated squaring: ceil(log2 D) batched matmuls, D the deepest
    node (`max_depth`, a bound the caller guarantees) or N - 1.
    """
    return _closure(_parent_onehot(parents), max_depth)


def _parent_onehot(parents: Tensor) -> Tensor:
    """(B, N child, N parent) bool: [b, i, j] = j is i's parent."""
    return parents[:, :, None] == torch.arange(parents.shape[1], device=parents.device)


def _closure(onehot: Tensor, max_depth: Optional[int]) -> Tensor:
    N = onehot.shape[-1]
    a = torch.eye(N, device=onehot.device) + onehot                        # self and parent, fp32
    span = N - 1 if max_depth is None else int(max_depth)
    for _ in range(math.ceil(math.log2(span)) if span > 1 else 0):        # paths up to 2, 4, ... long
        a = torch.bmm(a, a).clamp_(max=1.0)
    return a > 0


def retrieve_paths(parents: Tensor, depths: Tensor, ancestors: Tensor, valid: Tensor,
                   shape: Optional[tuple] = None) -> Tensor:
    """Root->leaf node paths (EAGLE's retrieve_indices), batch-first.

    shape: (P, D + 1) fixed by the caller (bounds it guarantees; no value read back), else fitted.
    Returns:
        (B, P, D + 1) long, P = max number of valid leaves in a row, D = deepest valid node;
        leaves in node-index order, -1 padded.
    """
    B, N = parents.shape
    dev = parents.device
    D1 = int(torch.where(valid, depths, 0).max()) + 1 if shape is None else shape[1]
    has_child = torch.zeros(B, N, device=dev).scatter_add_(
        1, parents.clamp(min=0), (valid & (parents >= 0)).float()) > 0
    leaf = valid & ~has_child                                               # (B, N)
    per_node = torch.full((B, N, D1 + 1), -1, dtype=torch.long, device=dev)
    col = torch.where(ancestors & valid[:, :, None], depths[:, None, :], D1)  # (B, N, N)
    per_node.scatter_(2, col, torch.arange(N, device=dev).expand(B, N, N))
    per_node = per_node[..., :D1]                                           # (B, N, D1)
    P = int(leaf.sum(1).max()) if shape is None else shape[0]
    order = torch.sort((~leaf).to(torch.int8), dim=1, stable=True).indices[:, :P]  # leaves first
    paths = per_node.gather(1, order[:, :, None].expand(B, P, D1))
    return torch.where(leaf.gather(1, order)[:, :, None], paths, -1)


# ----------------------------------------------------------------------------- drafter callback

@dataclass(frozen=True)
class ExpandRequest:
    """One drafter call made by a tree builder: run the drafter on `n` tree nodes at once.

    Attributes:
        tokens: (B, n) long tokens of the nodes to feed (their embeddings are the input).
        parent_slot: (B, n) long index of each node's parent in the PREVIOUS call's node list
            (its output hidden state is this node's input feature). For the first call the
            previous call is the root step (one node), so parent_slot is all 0.
        depth: tree depth of these nodes (1 = children of the root); position = root pos + depth.
        mask: (B, n, slot_offset + n) bool tree-attention mask over all nodes fed to the drafter
            by this tree so far (earlier calls first, then this call), self included. The
            committed prefix (root included) is always visible and is not part of the mask.
        slot_offset: number of nodes fed by earlier calls (this call's first column).
    """

    tokens: Tensor
    parent_slot: Tensor
    depth: int
    mask: Tensor
    slot_offset: int


ExpandFn = Callable[[ExpandRequest], Tensor]
"""expand_fn(request) -> (B, n, V) drafter log-probs (normalised, <= 0; -inf allowed) of the
children of each requested node. With CFG they are the guided, filtered log-probs."""


def build_dynamic_tree(root_token: Tensor, root_logprobs: Tensor, expand_fn: ExpandFn, *,
                       top_k: int, depth: int, total_tokens: int) -> DraftTree:
    """EAGLE-2 dynamic draft tree (docs/spec/speculative.md; EAGLE's `topK_genrate`).

    1. The root's top-K drafter tokens are the depth-1 candidates (score = log q).
    2. `depth` rounds: the K beam nodes are expanded in one `expand_fn` call; each gets its top-K
       children with cumulative score parent + log q; all K*K are kept as candidates; the next
       beam is the top-K of them. Node depths therefore reach depth + 1 (EAGLE convention).
    3. All K + depth*K*K candidates are reranked; the best M = total_tokens - 1 are kept
       (ancestor-closed: a child never outscores its parent, ties broken towards the earlier
       candidate), put in candidate (topological) order, and the root is prepended.

    Args:
        root_token: (B,) long last committed token.
        root_logprobs: (B, V) drafter log-probs at the root.
        expand_fn: drafter callback (see ExpandRequest); called `depth` times with n = K.
        top_k: K; depth: expansion rounds; total_tokens: M + 1 nodes including the root.
    Returns:
        DraftTree with N = total_tokens (all nodes valid); logprobs = log q of each node's token.
    """
    B, V = root_logprobs.shape
    K, M = int(top_k), int(total_tokens) - 1
    n_cand = K + depth * K * K
    if not (1 <= K <= V and depth >= 0 and 0 <= M <= n_cand):
        raise InputError(f"dynamic tree needs 1 <= top_k <= vocab ({V}) and "
                         f"0 <= total_tokens - 1 <= top_k + depth * top_k**2 ({n_cand}); got "
                         f"top_k={top_k}, depth={depth}, total_tokens={total_tokens}")
    dev = root_logprobs.device
    lp, tok = torch.topk(root_logprobs.float().clamp(max=0.0), K, dim=-1)        # (B, K)
    cand_tok, cand_lp, cand_score = [tok], [lp], [lp]
    sels = []  # each later round's beam: its place among the previous round's K*K candidates
    beam_tok, beam_score = tok, lp
    parent_slot = torch.zeros(B, K, dtype=torch.long, device=dev)
    eye = torch.eye(K, dtype=torch.bool, device=dev).expand(B, K, K)
    mask = eye
    for rnd in range(depth):
        req = ExpandRequest(beam_tok, parent_slot, rnd + 1, mask, rnd * K)
        child_lp = _check_expand(expand_fn(req), B, K, V).clamp(max=0.0)        # (B, K, V)
        clp, ctok = torch.topk(child_lp, K, dim=-1)                             # (B, K, K)
        cs = (beam_score[:, :, None] + clp).reshape(B, K * K)
        cand_tok.append(ctok.reshape(B, K * K))
        cand_lp.append(clp.reshape(B, K * K))
        cand_score.append(cs)
        if rnd == depth - 1:
            break
        sel = torch.sort(cs, dim=-1, descending=True, stable=True).indices[:, :K]  # (B, K)
        parent_slot = sel // K
        sels.append(sel)
        beam_tok = ctok.reshape(B, K * K).gather(1, sel)
        beam_score = cs.gather(1, sel)
        prev = mask.gather(1, parent_slot[:, :, None].expand(B, K, mask.shape[-1]))
        mask = torch.cat([prev, eye], dim=-1)                                   # (B, K, (rnd+2)K)
    scores = torch.cat(cand_score, 1)                                           # (B, n_cand)
    keep = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :M]
    keep = torch.sort(keep, dim=-1).values                                      # topological
    par_cand = _beam_parents(sels, keep, K, depth)                               # (B, M)
    # a kept parent's node index is its place in `keep` + 1 (the root is node 0, and -1 -> 0)
    parents = torch.searchsorted(keep, par_cand, right=True)
    if M and debug_checks() and not ((keep.gather(1, (parents - 1).clamp(0, M - 1)) == par_cand) | (par_cand < 0)).all():
        raise InputError("dynamic tree is not ancestor-closed: expand_fn returned scores that "
                         "are not log-probabilities (NaN?)")
    tokens = torch.cat([root_token.long()[:, None], torch.cat(cand_tok, 1).gather(1, keep)], 1)
    logprobs = F.pad(torch.cat(cand_lp, 1).gather(1, keep), (1, 0))             # root first, 0
    node_scores = F.pad(scores.gather(1, keep), (1, 0))
    # fixed shapes per tree config: node depths reach depth + 1, a node has at most K children
    return DraftTree.from_parents(tokens, F.pad(parents, (1, 0), value=-1),
                                  logprobs=logprobs, scores=node_scores, static=(depth + 1, min(K, M)))


_BEAM_TABLES: dict = {}


def _beam_parents(sels: list, keep: Tensor, K: int, depth: int) -> Tensor:
    """The parent candidate id of each kept candidate `keep` (B, M) of an EAGLE-2 build: -1 (the
    root) for the first K, i for round 0's candidates i K .. i K + K - 1, and for round r >= 1's the
    candidate id K + (r - 1) K^2 + sels[r - 1][i] of beam node i.

    One table over [-1, round 0's beam, later beams] and a static map from candidate id to its
    place there (made once per (K, depth, device))."""
    B, dev = keep.shape[0], keep.device
    key = (K, depth, dev)
    t = _BEAM_TABLES.get(key) if not torch.compiler.is_compiling() else None
    if t is None:
        head = torch.cat([torch.full((1,), -1, device=dev), torch.arange(K, device=dev)])[None]   # (1, 1 + K)
        base = (K + torch.arange(max(depth - 1, 0), device=dev) * K * K)[None, :, None]           # (1, depth - 1, 1)
        rnd = torch.arange(depth, device=dev).repeat_interleave(K * K)                            # round of a candidate
        beam = torch.arange(K, device=dev).repeat_interleave(K).repeat(depth)                     # its beam node
        place = torch.cat([torch.zeros(K, dtype=torch.long, device=dev), 1 + rnd * K + beam])     # (n_cand,)
        t = (head, base, place)
        if not torch.compiler.is_compiling():
            _BEAM_TABLES[key] = t
    head, base, place = t
    table = head.expand(B, -1)
    if sels:
        table = torch.cat([table, (torch.stack(sels, 1) + base).view(B, -1)], 1)
    return table.gather(1, place[keep])


def _check_expand(out: Tensor, B: int, n: int, V: int) -> Tensor:
    if tuple(out.shape) != (B, n, V):
        raise InputError(f"expand_fn must return (B, n, V) = {(B, n, V)} log-probs, "
                         f"got {tuple(out.shape)}")
    return out.float()


# ----------------------------------------------------------------------------- static trees

@dataclass(frozen=True)
class TreeTemplate:
    """A static tree shape from child-rank paths ([0] = the root's best child, [0, 1] = that
    child's second-best child, ...). Nodes are sorted by (depth, path): topological, siblings
    in rank order.

    Attributes:
        paths: the sorted paths (node n >= 1 is paths[n - 1]).
        parents, ranks, depths: (N,) long; root parent -1, rank 0, depth 0.
    """

    paths: tuple
    parents: Tensor
    ranks: Tensor
    depths: Tensor

    @property
    def n_nodes(self) -> int:
        return len(self.paths) + 1

    @property
    def max_depth(self) -> int:
        return int(self.depths.max())

    def children_of(self, node: int) -> list[int]:
        return [c for c in range(1, self.n_nodes) if int(self.parents[c]) == node]


def tree_template(paths: Sequence[Sequence[int]]) -> TreeTemplate:
    """Child-rank paths -> TreeTemplate. Refuses duplicates, empty or non-prefix-closed lists."""
    ps = sorted({tuple(int(i) for i in p) for p in paths}, key=lambda p: (len(p), p))
    if len(ps) != len(paths) or any(len(p) == 0 or min(p) < 0 for p in ps):
        raise InputError("tree paths must be distinct, non-empty lists of child ranks >= 0, "
                         "e.g. [[0], [1], [0, 0]]")
    index = {p: i + 1 for i, p in enumerate(ps)}
    missing = [p for p in ps if len(p) > 1 and p[:-1] not in index]
    if missing:
        raise InputError(f"tree paths must be prefix-closed; the parent of {list(missing[0])} "
                         "is missing")
    parents = [-1] + [index[p[:-1]] if len(p) > 1 else 0 for p in ps]
    return TreeTemplate(tuple(ps), torch.tensor(parents), torch.tensor([0] + [p[-1] for p in ps]),
                        torch.tensor([0] + [len(p) for p in ps]))


def likely_tree_paths(rank_probs: Sequence[float], n_paths: int, max_depth: int) -> list[list[int]]:
    """The `n_paths` paths of highest prod(rank_probs[rank]) (how Medusa's mc_sim trees were
    chosen from simulated top-k accuracies). Best-first, so the result is prefix-closed."""
    heap = [(-rank_probs[r], (r,)) for r in range(len(rank_probs))]
    heapq.heapify(heap)
    out: list[list[int]] = []
    while heap and len(out) < n_paths:
        neg, path = heapq.heappop(heap)
        out.append(list(path))
        if len(path) < max_depth:
            for r in range(len(rank_probs)):
                heapq.heappush(heap, (neg * rank_probs[r], path + (r,)))
    return out


# Preset names end in the number of drafted nodes M (the tree has M + 1 nodes with the root).
PRESET_TREES: dict[str, list[list[int]]] = {
    "chain4": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]],
    "star8": [[i] for i in range(8)],
    "tree15": [[0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0],
               [0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 0, 0]],
    "tree31": [[0], [1], [2], [3], [4], [5],
               [0, 0], [0, 1], [0, 2], [0, 3], [1, 0], [1, 1], [1, 2], [2, 0], [2, 1], [3, 0],
               [4, 0], [5, 0],
               [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [1, 0, 0], [1, 0, 1],
               [2, 0, 0], [0, 2, 0],
               [0, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 0], [1, 0, 0, 0]],
    # mc_sim_7b_63-like: 63 drafted nodes chosen best-first from made-up top-10 accuracies.
    "mc63": likely_tree_paths([0.40, 0.15, 0.08, 0.05, 0.035, 0.025, 0.02, 0.015, 0.01, 0.008],
                              63, 5),
}


def preset_template(name: str) -> TreeTemplate:
    """A named static tree (PRESET_TREES); unknown names list the valid ones."""
    if name not in PRESET_TREES:
        raise unknown_name("static tree", name, PRESET_TREES)
    return tree_template(PRESET_TREES[name])


def static_tree_from_topk(template: TreeTemplate, root_token: Tensor, topk_tokens: Tensor,
                          topk_logprobs: Optional[Tensor] = None,
                          child_q: Optional[Tensor] = None) -> DraftTree:
    """Fill a static shape with given per-node drafter candidates.

    Args:
        template: the tree shape.
        root_token: (B,) long.
        topk_tokens: (B, N, k) drafter candidates at every node, best (or first drawn) first;
            node n's token = topk_tokens[:, parent(n), rank(n)]. k > max rank.
        topk_logprobs: (B, N, k) their draft log-probs (optional).
        child_q: (B, N, V) drafter distributions when the candidates were SAMPLED.
    Returns:
        DraftTree (N = template.n_nodes).
    """
    B, N = topk_tokens.shape[:2]
    if N != template.n_nodes or topk_tokens.shape[2] <= int(template.ranks.max()):
        raise InputError(f"topk_tokens must be (B, {template.n_nodes}, > max rank "
                         f"{int(template.ranks.max())}), got {tuple(topk_tokens.shape)}")
    dev = topk_tokens.device
    par, rank = template.parents[1:].to(dev), template.ranks[1:].to(dev)
    tokens = torch.cat([root_token.long()[:, None], topk_tokens[:, par, rank].long()], 1)
    lp = None
    if topk_logprobs is not None:
        lp = torch.cat([torch.zeros(B, 1, device=dev), topk_logprobs[:, par, rank].float()], 1)
    parents = template.parents.to(dev).expand(B, N)
    return DraftTree.from_parents(tokens, parents, logprobs=lp, child_q=child_q)


def sample_without_replacement(q: Tensor, k: int, generator: Optional[torch.Generator]) -> Tensor:
    """k draws without replacement from q (..., V), in draw order (Gumbel top-k, which has the
    law of sequential sampling). Entries with q = 0 come last (only if the support < k)."""
    u = torch.rand(q.shape, generator=generator, device=q.device).clamp(min=1e-20)
    keys = torch.log(q.float()) - torch.log(-torch.log(u))
    return torch.topk(keys, k, dim=-1).indices


def build_static_tree(template: TreeTemplate, root_token: Tensor, root_logprobs: Tensor,
                      expand_fn: ExpandFn, *, sample: bool = False,
                      generator: Optional[torch.Generator] = None) -> DraftTree:
    """Draft a static tree level by level through `expand_fn`.

    Children of a node are its drafter top-k (sample=False: deterministic drafts, rank r = r-th
    best) or k draws without replacement from q = exp(log-probs) in draw order (sample=True; the
    tree then carries child_q for the sampled-draft rule). One expand_fn call per depth, on the
    nodes of that depth that have children.

    Args:
        template: tree shape; root_token: (B,) long; root_logprobs: (B, V) drafter log-probs.
        expand_fn: drafter callback (see ExpandRequest).
        sample: sampled instead of top-k children; generator: RNG for sampling.
    Returns:
        DraftTree (N = template.n_nodes).
    """
    B, V = root_logprobs.shape
    N, dev = template.n_nodes, root_logprobs.device
    parents_t, ranks_t, depths_t = (t.tolist() for t in (template.parents, template.ranks,
                                                         template.depths))
    closure = ancestor_closure(template.parents[None].to(dev))[0]          # (N, N)
    tokens = torch.zeros(B, N, dtype=torch.long, device=dev)
    tokens[:, 0] = root_token.long()
    logprobs = torch.zeros(B, N, device=dev)
    child_q = torch.zeros(B, N, V, device=dev) if sample else None
    expanding, level_lp, fed = [0], root_logprobs.float()[:, None, :], []
    has_kids = {parents_t[c] for c in range(1, N)}
    for d in range(template.max_depth):
        kids = [c for c in range(1, N) if depths_t[c] == d + 1]
        slot = {n: i for i, n in enumerate(expanding)}
        width = max(ranks_t[c] for c in kids) + 1
        if sample:
            q = torch.softmax(level_lp, dim=-1)                              # (B, e, V)
            draws = sample_without_replacement(q, width, generator)
            child_q[:, expanding] = q
        else:
            draws = torch.topk(level_lp, width, dim=-1).indices            # (B, e, width)
        drawn_lp = level_lp.gather(-1, draws)
        src_slot = torch.tensor([slot[parents_t[c]] for c in kids], device=dev)
        src_rank = torch.tensor([ranks_t[c] for c in kids], device=dev)
        tokens[:, kids] = draws[:, src_slot, src_rank]
        logprobs[:, kids] = drawn_lp[:, src_slot, src_rank]
        nxt = [c for c in kids if c in has_kids]
        if not nxt:
            break
        cols = fed + nxt
        req = ExpandRequest(
            tokens=tokens[:, nxt],
            parent_slot=torch.tensor([slot[parents_t[c]] for c in nxt], device=dev).expand(B, -1),
            depth=d + 1,
            mask=closure[nxt][:, cols].expand(B, -1, -1),
            slot_offset=len(fed))
        level_lp = _check_expand(expand_fn(req), B, len(nxt), V)
        expanding, fed = nxt, cols
    return DraftTree.from_parents(tokens, template.parents.to(dev).expand(B, N),
                                  logprobs=logprobs, child_q=child_q)
