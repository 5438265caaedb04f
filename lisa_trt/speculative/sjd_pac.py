"""SJD-PAC: speculative Jacobi decoding with Proactive drafting and Adaptive Continuation (Kang,
Shu, Li, Zhai, Chen; CVPR 2026, arXiv 2603.18599); lossless, no drafter. docs/spec/decoders.md.

SJD's accepted length per forward is long-tailed: about half of its forwards accept a single
token, because a rejection at slot i leaves the next window starting from a freshly resampled
token whose followers were all drafted for another prefix. SJD-PAC changes two things:

- Proactive drafting (PD): the first `tree_depth - 1` columns of every window, right after its
  root (the token the last rejection resampled), are a K-ary tree (K = `tree_width`): at column
  c every node has the same K children, drawn WITHOUT replacement from that column's draft law;
  the window continues as a single chain below the first-child path. The target verifies the
  tree in the same single forward (tree attention); per node, siblings are tested in order
  with recursive rejection sampling (accept x_j with min(1, p_j(x_j) / q_j(x_j)), q_j = the
  draft law with the earlier siblings removed, p_{j+1} = norm(max(0, p_j - q_j)); all K
  rejected: the slot is resampled from the last residual), which keeps the target's law
  exactly (Jeon et al. 2024, recursive rejection sampling without replacement).
- Adaptive continuation (AC): after the first rejection the rest of the window is not thrown
  away: each later slot keeps its draft with probability min(1, p_new(x) / p_old(x)) against
  the distribution this forward gave it (p_new, computed under the stale prefix) and is
  otherwise redrawn from norm(max(0, p_new - p_old)), so every next draft is distributed as
  p_new (what the next verification assumes) and survives as often as it can. This is the
  maximal coupling of MC-SJD (speculative/mcsjd.py `maximal_coupling`), reused here.

With tree_width 1 the window is a chain and the decoder is MC-SJD. Choices where the paper or
its code leaves one (docs/spec/decoders.md): the stale laws of the next window follow the
accepted path, then first children, then the chain (the main chain where the path has no
child); only the first candidate of a column is coupled with the previous draft, its siblings
are drawn without replacement from the new law (so the verifier's without-replacement law is
exact); the tree always opens the window (every window but the first starts at a rejection or
at the end of a fully accepted window).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from ..errors import InputError
from .methods import Method, MethodOption, register_method
from .sampling import sample_from_logits
from .verify import jacobi_residual, ratio_accept


@dataclass(frozen=True)
class SJDPACSettings:
    """SJD-PAC knobs (flat names sjd_pac_tree_width, sjd_pac_tree_depth; CLI --sjd-pac-width,
    --sjd-pac-depth). Defaults: the paper's K = 4, D = 3 (the root counts as depth 1)."""

    tree_width: int = 4  # K: candidates per tree node (1 = MC-SJD, a chain)
    tree_depth: int = 3  # D: the root plus D - 1 branching columns

    def __post_init__(self):
        if self.tree_width < 1 or self.tree_depth < 1:
            raise InputError(f"SJD-PAC tree_width and tree_depth must be >= 1, got {self.tree_width}, "
                             f"{self.tree_depth}")


@dataclass(frozen=True)
class WindowTree:
    """The static node layout of one window: node 0 the root (column 0); `col`, `branch`,
    `parent` (Nn,); `children` (Nn, K) node ids (-1 none); `main` (W + 1,) the first-child path;
    `ancestors` (Nn, Nn) bool (self included)."""

    col: torch.Tensor
    branch: torch.Tensor
    parent: torch.Tensor
    children: torch.Tensor
    main: torch.Tensor
    ancestors: torch.Tensor


@functools.lru_cache(maxsize=64)
def window_tree(K: int, D: int, W: int) -> WindowTree:
    """K-ary columns 1 .. D - 1, then a chain below the first-child path, W columns in all."""
    parent, col, branch, main, level = [-1], [0], [0], [0], [0]
    for c in range(1, W + 1):
        if c <= D - 1:
            nxt = []
            for n in level:
                for b in range(K):
                    parent.append(n), col.append(c), branch.append(b)
                    nxt.append(len(parent) - 1)
            level = nxt
            main.append(level[0])
        else:
            parent.append(main[-1]), col.append(c), branch.append(0)
            main.append(len(parent) - 1)
    Nn = len(parent)
    children = torch.full((Nn, K), -1, dtype=torch.long)
    for n in range(1, Nn):
        children[parent[n], branch[n]] = n
    anc = torch.eye(Nn, dtype=torch.bool)
    for n in range(1, Nn):
        anc[n] |= anc[parent[n]]
    return WindowTree(torch.tensor(col), torch.tensor(branch), torch.tensor(parent), children,
                      torch.tensor(main), anc)


def without_replacement(p: torch.Tensor, first: torch.Tensor, k: int, gen) -> torch.Tensor:
    """(B, W, V) laws, first (B, W) drawn -> (B, W, k) candidates: `first`, then k - 1 more drawn
    from p without replacement given it (Gumbel top-k); -1 where p has no mass left."""
    if k == 1:
        return first[..., None]
    g = -torch.log(-torch.log(torch.rand(p.shape, generator=gen, device=p.device).clamp(1e-20, 1 - 1e-7)))
    key = torch.where(p > 0, torch.log(p.clamp(min=1e-30)) + g, torch.full_like(p, float("-inf")))
    key.scatter_(-1, first[..., None], float("-inf"))
    val, idx = key.topk(k - 1, dim=-1)
    return torch.cat([first[..., None], torch.where(torch.isfinite(val), idx, -1)], -1)


def rrs_column(p, q, cand, alive, gen, siblings: Optional[int] = None):
    """Recursive rejection sampling of one column's siblings, in order.

    Args:
        p: (B, V) target law at the parent; q: (B, V) the column's draft law; cand (B, K) the
        candidate tokens (-1: none); alive (B,) rows still verifying; siblings: the most
        candidates a node of this column has (the tree's static width there, default K):
        candidates past it are -1 in every row, so their tests are skipped (the K uniforms
        are still drawn: the same random stream).
    Returns:
        (accepted sibling index (B,), -1 if none; residual law (B, V) after the rejections).
    """
    B, K = cand.shape
    u = torch.rand((B, K), generator=gen, device=p.device)
    pick = torch.full((B,), -1, dtype=torch.long, device=p.device)
    p, q = p.float(), q.float()
    for j in range(K if siblings is None else min(siblings, K)):
        x = cand[:, j]
        live = alive & (pick < 0) & (x >= 0)
        xc = x.clamp(min=0)[:, None]
        qs = q.sum(-1, keepdim=True)
        qj = torch.where(qs > 0, q / qs.clamp(min=1e-30), q)
        a = ratio_accept(p.gather(1, xc)[:, 0], qj.gather(1, xc)[:, 0])
        acc = live & (u[:, j] < a)
        pick = torch.where(acc, j, pick)
        rej = live & ~acc
        resid = jacobi_residual(p, qj)
        p = torch.where(rej[:, None], resid / resid.sum(-1, keepdim=True).clamp(min=1e-30), p)
        q = torch.where(live[:, None], q.scatter(1, xc, 0.0), q)
    return pick, p


class TreeWindow:
    """SJD-PAC's window shape for the one Jacobi loop (sjd.py `sjd_generate(shape=...)`): the
    K-ary proactive tree of depth D after the root, then a chain; recursive rejection sampling
    per column; adaptive continuation (MC-SJD's coupling) for the next drafts."""

    name = "SJD-PAC"

    def __init__(self, K: int, D: int):
        self.K, self.D = int(K), int(D)

    def scratch(self, window: int) -> int:
        return window_tree(self.K, self.D, window).col.numel()

    def start(self, p0: torch.Tensor, gen) -> None:
        B, window, V = p0.shape
        self.window = window
        self.q = p0  # (B, window, V): column c + 1's draft law
        first = torch.multinomial(p0.reshape(-1, V), 1, generator=gen).reshape(B, window)
        self.cand = without_replacement(p0, first, self.K, gen)  # (B, window, K)

    def inputs(self, root: torch.Tensor, cache, n_positions: int):
        """The whole window's tree at every step (one input shape; verify cuts a row's commits where
        its image ends)."""
        dev = root.device
        tr = self.tr = window_tree(self.K, self.D, self.window)
        tr_col, tr_br = tr.col.to(dev), tr.branch.to(dev)
        Nn = tr_col.numel()
        node_tok = self.cand[:, tr_col[1:] - 1, tr_br[1:]]
        self.ids = torch.cat([root, node_tok], 1)  # (B, Nn) node tokens, -1 for an empty candidate
        toks = self.toks = self.ids.clamp(min=0)
        slots = self.slots = (cache.lengths[:, None] + torch.arange(Nn, device=dev)[None]).clamp(max=cache.max_len - 1)
        pos = (cache.positions(cache.lengths[:, None]) + tr_col[None]).clamp(max=n_positions - 1)
        mask = cache.attention_mask(slots, tr.ancestors.to(dev)[None].expand(slots.shape[0], Nn, Nn))
        return toks, pos, slots, mask, tr_col

    def verify(self, p_now: torch.Tensor, n_done: torch.Tensor, N_img: int, gen, greedy: bool):
        B, W = p_now.shape[0], self.window
        dev = p_now.device
        tr, ids, q = self.tr, self.ids, self.q
        ch = tr.children.to(dev)
        rows = torch.arange(B, device=dev)
        lim = (N_img - n_done - 1).clamp(min=0)  # drafts a row may still commit
        cur = torch.zeros(B, dtype=torch.long, device=dev)
        alive = n_done < N_img
        acc = torch.zeros(B, dtype=torch.long, device=dev)
        last = torch.full((B,), -1, dtype=torch.long, device=dev)
        for c in range(1, W + 1):
            kids = ch[cur]  # (B, K)
            stop = alive & ((kids[:, 0] < 0) | (c > lim))  # no child here / image end: bonus below
            alive = alive & ~stop
            p_par = p_now[rows, cur]
            # below the K-ary columns a node has one child (the chain): one sibling to test
            pick, resid = rrs_column(p_par, q[:, c - 1], torch.where(kids >= 0, node_tok_at(ids, kids), -1),
                                     alive, gen, siblings=self.K if c <= self.D - 1 else 1)
            rejected = alive & (pick < 0)
            draw = torch.multinomial(resid, 1, generator=gen)[:, 0]
            last = torch.where(rejected, draw, last)
            took = alive & (pick >= 0)
            cur = torch.where(took, kids.gather(1, pick.clamp(min=0)[:, None])[:, 0], cur)
            acc = acc + took.long()
            alive = took
        # rows that stopped without a rejection commit a fresh draw from p_now at their node
        bonus = sample_from_logits(torch.log(p_now[rows, cur]), gen, greedy)
        last = torch.where(last < 0, bonus, last)
        ncom = torch.where(n_done < N_img, acc + 1, 0)
        path = self.path = _path(tr.parent.to(dev), cur, W)  # (B, W + 1) node ids root first (-1 after the end)
        path_tok = self.toks.gather(1, path.clamp(min=0))  # (B, W + 1): root, then the accepted drafts
        base = torch.cat([path_tok[:, 1:], last[:, None]], 1)
        toks = torch.where(torch.arange(W + 1, device=dev)[None] < acc[:, None], base, last[:, None])
        self.acc = acc
        return ncom, toks, torch.zeros(B, device=dev)  # lossless: TVD 0

    def advance(self, p_now: torch.Tensor, ncom: torch.Tensor, cache, guide, prior, n_next: torch.Tensor, gen):
        from .mcsjd import maximal_coupling

        B = p_now.shape[0]
        cache.compact(guide.dup(self.slots[:B].gather(1, self.path.clamp(min=0))), guide.dup(ncom))
        self.q, self.cand = _next_drafts(p_now, self.q, self.cand, self.path, self.acc, ncom, self.tr, self.window,
                                         self.window, self.K, prior, n_next, gen, maximal_coupling)


def sjd_pac_generate(target, cond, *, sampling, window: int = 16, seed: Optional[int] = None, spec=None,
                     layout=None, generator: Optional[torch.Generator] = None, on_step=None):
    """SJD-PAC on one batch -> (tokens (B, N), DecodeStats): the one Jacobi loop (sjd.py) with the
    tree window. window: draft columns per forward."""
    from .methods import SpecConfig
    from .sjd import sjd_generate

    s = (spec or SpecConfig()).settings("sjd-pac")
    return sjd_generate(target, cond, sampling=sampling, window=window, seed=seed, generator=generator,
                        layout=layout, shape=TreeWindow(s.tree_width, s.tree_depth), on_step=on_step)


def sjd_pac_decoder(target, drafter, tables, gasv, spec):
    """SJD-PAC's Decoder (Method.decoder): the one Jacobi loop with the tree window."""
    from .sjd import JacobiDecoder

    s, window = spec.settings("sjd-pac"), spec.settings("sjd").window
    return JacobiDecoder(target, "sjd-pac", window, lambda session: TreeWindow(s.tree_width, s.tree_depth),
                         TreeWindow(s.tree_width, s.tree_depth).scratch(window))


def node_tok_at(toks: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """Tokens (B, ...) of node ids `nodes` (B, ...) (>= 0) in the window `toks` (B, Nn)."""
    return toks.gather(1, nodes.clamp(min=0).reshape(toks.shape[0], -1)).reshape(nodes.shape)


def _path(parent: torch.Tensor, leaf: torch.Tensor, W: int) -> torch.Tensor:
    """(B, W + 1) node ids from the root to `leaf` (B,), padded with -1 after the leaf."""
    B = leaf.shape[0]
    chain = [leaf]
    for _ in range(W):
        chain.append(torch.where(chain[-1] > 0, parent[chain[-1].clamp(min=0)], -1))
    back = torch.stack(chain[::-1], 1)  # (B, W + 1): leaf last, -1 before the root
    n = (back >= 0).sum(1)  # nodes on the path
    idx = (torch.arange(W + 1, device=leaf.device)[None] + (W + 1 - n)[:, None]).clamp(max=W)
    out = back.gather(1, idx)
    return torch.where(torch.arange(W + 1, device=leaf.device)[None] < n[:, None], out, -1)


def _next_drafts(p_now, q, cand, path, acc, ncom, tr: WindowTree, W, window, K, prior, n_next, gen, couple):
    """The next window's draft laws (B, window, V) and candidates (B, window, K) (module docstring).

    Next column j (1-based) was this window's column c = ncom + j: its stale law is p_now at the
    node of column c - 1 on the followed path (accepted path, then first children, the main
    chain where that path has none; a fresh prior beyond this window), its first candidate the
    maximal coupling of this window's first candidate at column c with that law."""
    B, _, V = p_now.shape
    dev = p_now.device
    children, main = tr.children.to(dev), tr.main.to(dev)
    follow = [path[:, 0]]
    for c in range(1, W + 1):
        on_path = c <= acc
        kid = children[follow[-1].clamp(min=0), 0]
        nxt = torch.where(on_path, path[:, min(c, W)], torch.where(kid >= 0, kid, main[c]))
        follow.append(nxt)
    follow = torch.stack(follow, 1)  # (B, W + 1): a node per column 0 .. W
    j = torch.arange(1, window + 1, device=dev)[None]
    src = ncom[:, None] + j - 1  # the column whose node gives the law of next column j
    fresh = src > W
    node = follow.gather(1, src.clamp(max=W))
    stale = p_now.gather(1, node[:, :, None].expand(-1, -1, V))
    p_new = torch.where(fresh[..., None], prior(n_next[:, None] + j - 1), stale)
    old_c = (src + 1).clamp(max=W) - 1  # this window's column ncom + j, 0-based into q / cand
    has_old = (src + 1) <= W
    old = cand[:, :, 0].gather(1, old_c)
    p_old = q.gather(1, old_c[:, :, None].expand(-1, -1, V))
    coupled = couple(p_new, p_old, old, gen)
    indep = torch.multinomial(p_new.reshape(-1, V), 1, generator=gen).reshape(B, window)
    first = torch.where(has_old, coupled, indep)
    return p_new, without_replacement(p_new, first, K, gen)


register_method(Method(
    "sjd-pac", "sjd", "SJD-PAC: speculative Jacobi decoding with a proactive K-ary draft tree after each "
    "rejection and adaptive continuation of the window (lossless, no drafter)", settings=SJDPACSettings,
    decoder=sjd_pac_decoder,
    options=(MethodOption("--sjd-pac-width", "sjd_pac_tree_width", int, "SJD-PAC: candidates per node of the "
                          "proactive draft tree (K; 1 = MC-SJD)."),
             MethodOption("--sjd-pac-depth", "sjd_pac_tree_depth", int, "SJD-PAC: depth of the proactive draft "
                          "tree, the root included (D; the window continues as a chain)."))))

__all__ = ["SJDPACSettings", "TreeWindow", "WindowTree", "rrs_column", "sjd_pac_decoder", "sjd_pac_generate", "window_tree", "without_replacement"]
