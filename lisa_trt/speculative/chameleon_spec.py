"""Tree speculative decoding of Lumina-mGPT image spans (Chameleon family).

The loop of speculative/decode.py, specialised to the family's differences:
- per-row RoPE positions (left-padded prompts; the CFG unconditional half is the span alone,
  from position 0), so node positions are `cache.positions(slots)`, not the slots;
- row-end positions of the span are FORCED: every distribution there (the drafter's, when the
  tree grows through it, and the target's, when the tree is verified) is one-hot on the row-end
  token, so trees only ever hold that token at those depths (any other candidate has score
  -inf and is rejected) and verification commits it with probability 1;
- code positions are restricted to the image-code tokens after CFG, then temperature / top-k.
Verification: `greedy` (token-identical to lumina.generate_image_tokens(greedy=True)),
`exact` (lossless speculative sampling), and the relaxed rules `lantern` and `gasv` on the
image-code sub-vocabulary with tables from calibration/chameleon_tables.py (the row-end token is
one extra, forced entry of that sub-vocabulary).

GASV is version 2 (docs/spec/lisa.md), applied exactly as the LlamaGen path does
(speculative/methods.py `gasv_rule`): the tree's tokens (as sub-vocabulary indices) and parents
are flattened over the batch with per-row offsets, `gasv_gates` (or the exported GASV graph)
gives p, delta_eff and each node's candidates / gates at its parent over the K codes, and
`verify_gasv` / `verify_gasv_greedy` run on the sub-vocabulary (K codes + row end + other).
Nodes that are not a code drafted at a code position (the forced row end, anything under a
forced parent) get no candidates: their parent's law is one-hot and GASV moves no mass there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..errors import InputError
from .chameleon_decode import device_of, image_token_ids, restrict
from .lumina import LATENT_PER_GRID, LuminaImages, _batch, grids, row_end_mask, tokens_to_codes
from . import verify as V
from .decode import DecodeStats
from .methods import GASVRuleConfig
from .sampling import make_generator, process_logits, sample_from_logits
from .tree import ExpandRequest, build_dynamic_tree


METHODS = ("greedy", "exact", "lantern", "gasv")


@dataclass(frozen=True)
class LuminaSpec:
    method: str = "greedy"  # greedy | exact | lantern | gasv (the last two need code tables)
    cfg_scale: float = 3.0
    temperature: float = 1.0
    top_k: int = 2000
    tree_top_k: int = 4
    depth: int = 4
    total_tokens: int = 16
    lantern_k: int = 1000
    lantern_delta: float = 0.1
    greedy: bool = False  # lantern / gasv: their greedy rules (verify_lantern_greedy / verify_gasv_greedy)
    gasv: GASVRuleConfig = GASVRuleConfig()  # per-run overrides of the tables' GASV v2 constants

    def __post_init__(self):
        if self.method not in METHODS:
            raise InputError(f"Chameleon-family speculation supports {', '.join(METHODS)} verification, "
                             f"not {self.method!r}")


class _Law:
    """Raw logits of the (CFG) batch at span indices -> guided, restricted, forced logits."""

    def __init__(self, spec: LuminaSpec, allowed: torch.Tensor, forced: torch.Tensor, newline: int, B: int):
        self.s, self.allowed, self.forced, self.newline, self.B = spec, allowed, forced, newline, B
        self.cfg = spec.cfg_scale != 1.0

    def __call__(self, raw: torch.Tensor, span_index: torch.Tensor) -> torch.Tensor:
        """raw (2B or B, ..., V); span_index (B, ...) index of the token these logits predict."""
        x = raw.float()
        if self.cfg:
            x = x[self.B:] + self.s.cfg_scale * (x[: self.B] - x[self.B:])
        x = restrict(x, self.allowed)
        if self.s.method != "greedy" and not (self.s.greedy and self.s.method == "exact"):
            x = process_logits(x, self.s.temperature, self.s.top_k)
        at_end = self.forced[span_index.clamp(max=self.forced.numel() - 1)]
        one_hot = torch.full_like(x, float("-inf"))
        one_hot[..., self.newline] = 0.0
        return torch.where(at_end[..., None], one_hot, x)

    def dup(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x]) if self.cfg else x


@torch.no_grad()
def speculative_image_tokens(target, drafter, tokenizer, captions: Sequence[str], width: int, height: int,
                             spec: LuminaSpec = LuminaSpec(), seed: Optional[int] = None, tables=None,
                             gasv=None) -> tuple[LuminaImages, DecodeStats]:
    """Generate one image span per caption with tree speculation (see module docstring).

    target / drafter: the torch models or their exported-graph runners (engines/chameleon_ort.py).
    tables: GASVTables (version 2) over the image codes (calibrate_chameleon), for lantern / gasv.
    gasv: optional GASV v2 engine over the codes, (code logits (N, K), node tokens (N,), node
        parent rows (N,), GASVConfig) -> GASVGates (engines/chameleon_ort.OrtCodeGASV, the
        exported GASV graph); default gasv.gasv_gates(., tables) in torch."""
    verify = _verifier(target, tokenizer, spec, tables, gasv)
    hg, wg = grids(width, height)
    h_lat, w_lat = hg * LATENT_PER_GRID, wg * LATENT_PER_GRID
    dev = device_of(target)
    prefix = tokenizer.span_prefix(width, height)
    rows = [tokenizer.prompt_ids(c, width, height) + prefix for c in captions]
    B, L = len(captions), h_lat * (w_lat + 1)
    law = _Law(spec, image_token_ids(target), row_end_mask(h_lat, w_lat).to(dev), tokenizer.newline, B)
    if law.cfg:
        rows += [prefix] * B
    ids, valid = _batch(rows, dev)
    T = ids.shape[1]
    stats, gen = DecodeStats(), make_generator(seed, dev)
    greedy = spec.method == "greedy" or spec.greedy  # greedy rules take the argmax first token too
    tcache = target.new_cache(ids.shape[0], T + L + spec.total_tokens)
    pre = target.prefill(ids, tcache, valid, taps=True)
    stats.target_forwards += 1
    out = torch.full((B, L), -1, dtype=torch.long, device=dev)
    out[:, 0] = sample_from_logits(law(pre.logits[:, -1], torch.zeros(B, dtype=torch.long, device=dev)), gen, greedy)
    n_done = torch.ones(B, dtype=torch.long, device=dev)
    dcache = drafter.new_cache(tcache.batch, T + L + spec.depth * spec.tree_top_k + spec.total_tokens)
    dcache.col_valid[:, :T] = False  # the prompt holds no drafter entries
    dcache.lengths.fill_(T)
    dlog, dhid = _commit(drafter, dcache, tcache.pad, drafter.project_taps(pre.taps), law.dup(out[:, :1]))
    root_lp, root_h = dlog[:, -1], dhid[:, -1]
    active = torch.arange(B, device=dev)
    while active.numel():
        Bc = active.numel()
        law.B = Bc
        remaining = L - n_done[active]
        root_tok = out[active, n_done[active] - 1]
        tree = _draft(drafter, dcache, tcache, law, spec, root_tok, root_lp, root_h, n_done[active], stats)
        tree = tree.truncate(remaining - 1)
        Nn = tree.n_nodes
        slots = tcache.lengths[:, None] + torch.arange(Nn, device=dev)[None]
        pos = tcache.positions(tcache.lengths[:, None]) + law.dup(torch.where(tree.valid, tree.depths, 0))
        mask = tcache.attention_mask(slots, law.dup(tree.ancestors))
        tout = target.forward_tokens(law.dup(tree.tokens), pos, slots, mask, tcache, taps=True)
        stats.target_forwards += 1
        span_index = n_done[active][:, None] + tree.depths
        res = verify(law(tout.logits, span_index), tree, law.forced[span_index.clamp(max=L - 1)], gen)
        stats.tvd.append(res.tvd)
        ncom = res.accept_len + 1
        stats.committed.append(ncom)
        cols = torch.arange(res.tokens.shape[1], device=dev)[None]
        take = cols < ncom[:, None]
        out[active[:, None].expand_as(take)[take], (n_done[active][:, None] + cols)[take]] = res.tokens[take]
        path = res.path.clamp(min=0)
        tcache.compact(law.dup(slots[:Bc].gather(1, path)), law.dup(ncom))
        taps = tout.taps.gather(1, law.dup(path)[:, :, None].expand(-1, -1, tout.taps.shape[-1]))
        dlog, dhid = _commit(drafter, dcache, tcache.pad, drafter.project_taps(taps),
                             law.dup(res.tokens.clamp(min=0)), counts=law.dup(ncom))
        last = law.dup(ncom - 1)[:, None, None]
        root_lp = dlog.gather(1, last.expand(-1, 1, dlog.shape[-1]))[:, 0]
        root_h = dhid.gather(1, last.expand(-1, 1, dhid.shape[-1]))[:, 0]
        n_done[active] += ncom
        keep = n_done[active] < L
        if not bool(keep.all()):
            idx = torch.nonzero(keep).flatten()
            rows2 = torch.cat([idx, idx + Bc]) if law.cfg else idx
            tcache.select_rows(rows2)
            dcache.select_rows(rows2)
            root_lp, root_h, active = root_lp[rows2], root_h[rows2], active[idx]
    return LuminaImages(out, tokens_to_codes(target, out, h_lat, w_lat)), stats


def _commit(drafter, dcache, pad, hidden_in, tokens, counts=None):
    """Append drafter entries for committed tokens at slots dcache.lengths + j (positions - pad)."""
    Bd, S = tokens.shape
    dev = dcache.lengths.device
    slots = (dcache.lengths[:, None] + torch.arange(S, device=dev)[None]).clamp(max=dcache.max_len - 1)
    causal = torch.tril(torch.ones(S, S, dtype=torch.bool, device=dev))[None].expand(Bd, S, S)
    mask = dcache.attention_mask(slots, causal)
    logits, hidden = drafter.forward(hidden_in, tokens, slots - pad[:, None], slots, mask, dcache)
    dcache.lengths += S if counts is None else counts
    return logits, hidden


def _draft(drafter, dcache, tcache, law, spec, root_tok, root_lp_raw, root_h, n_done, stats):
    """EAGLE-2 dynamic tree from the drafter's guided distributions (row ends forced)."""
    hist = {"h": root_h[:, None]}
    Ld = dcache.lengths
    root_pos = tcache.positions(tcache.lengths[:, None])[:, 0]  # (2B or B,) the root token's position

    def logprobs(raw, span_index):
        return torch.log_softmax(law(raw, span_index), -1)

    def expand(req: ExpandRequest) -> torch.Tensor:
        n = req.tokens.shape[1]
        parent = law.dup(req.parent_slot)
        h_in = hist["h"].gather(1, parent[:, :, None].expand(-1, -1, hist["h"].shape[-1]))
        slots = Ld[:, None] + req.slot_offset + torch.arange(n, device=Ld.device)[None]
        pos = (root_pos[:, None] + req.depth).expand(-1, n)
        cols = req.slot_offset + n
        tree_slots = Ld[:, None] + torch.arange(cols, device=Ld.device)[None]
        m = dcache.attention_mask(slots, torch.zeros(slots.shape[0], n, n, dtype=torch.bool, device=Ld.device))
        m.scatter_(2, tree_slots[:, None, :].expand(-1, n, cols), law.dup(req.mask))
        logits, hidden = drafter.forward(h_in, law.dup(req.tokens), pos, slots, m, dcache)
        stats.drafter_calls += 1
        hist["h"] = hidden
        return logprobs(logits, (n_done + req.depth)[:, None].expand(-1, n))

    return build_dynamic_tree(root_tok, logprobs(root_lp_raw, n_done), expand, top_k=spec.tree_top_k,
                              depth=spec.depth, total_tokens=spec.total_tokens)


def _verifier(target, tokenizer, spec: LuminaSpec, tables, gasv=None):
    """verify(logits (B, N, V), tree, forced (B, N), gen) -> VerifyResult for spec.method."""
    if spec.method == "greedy" or (spec.method == "exact" and spec.greedy):
        return lambda logits, tree, forced, gen: V.verify_greedy(logits, tree)
    if spec.method == "exact":
        return lambda logits, tree, forced, gen: V.verify_exact(torch.softmax(logits, -1), tree, gen)
    from ..calibration.chameleon_tables import CodeVocab, extend, sub_logits

    if tables is None:
        raise InputError(f"{spec.method} verification needs image-code calibration tables "
                         "(lisa_trt.calibration.chameleon_tables.calibrate_chameleon)")
    vocab = CodeVocab.for_target(target, tokenizer.newline)
    if tables.vocab_size != vocab.K:
        raise InputError(f"the tables cover {tables.vocab_size} codes; this target has {vocab.K} image codes")
    dev = device_of(target)
    lut, back = vocab.lut(target.config.vocab_size, dev), vocab.back(dev)
    nb = tables.lantern_neighbors.long().to(dev)
    nb = torch.cat([nb, torch.zeros(2, nb.shape[1], dtype=torch.long, device=dev)])  # row end / other rows
    gasv_cfg = None
    if spec.method == "gasv":
        gasv_cfg = gasv.config if gasv is not None else tables.config
        over = spec.gasv.overrides()
        if over:
            gasv_cfg = dataclasses.replace(gasv_cfg, **over)

    def verify(logits, tree, forced, gen):
        sub_tree = dataclasses.replace(tree, tokens=lut[tree.tokens])
        sub = sub_logits(logits, vocab, forced)
        if spec.method == "lantern":
            p, k = extend(torch.softmax(sub, -1), forced), min(spec.lantern_k, nb.shape[1])
            res = (V.verify_lantern_greedy(p, sub_tree, nb, k=k, delta=spec.lantern_delta) if spec.greedy else
                   V.verify_lantern(p, sub_tree, gen, nb, k=k, delta=spec.lantern_delta))
        else:
            p, cand, gate, delta_eff = _code_gasv(sub, sub_tree, forced, vocab.K, tables, gasv, gasv_cfg)
            res = (V.verify_gasv_greedy(p, sub_tree, cand, gate, delta_eff) if spec.greedy else
                   V.verify_gasv(p, sub_tree, gen, cand, gate, delta_eff))
        tok = torch.where(res.tokens >= 0, back[res.tokens.clamp(min=0)], res.tokens)
        return dataclasses.replace(res, tokens=tok, bonus=back[res.bonus])

    return verify


def _code_gasv(sub, sub_tree, forced, K: int, tables, gasv, cfg):
    """GASV v2 quantities of a tree over the image-code sub-vocabulary.

    Args:
        sub: (B, N, K) guided, filtered code logits (forced rows: placeholder zeros).
        sub_tree: the DraftTree with sub-vocabulary tokens (codes 0..K-1, row end K, other K + 1).
        forced: (B, N) rows whose law is one-hot on the row end.
        tables / gasv / cfg: bound code tables, the optional GASV engine, the GASVConfig.
    Returns:
        p (B, N, K + 2) extended distributions; cand, gate (B, N, Kn) over code indices;
        delta_eff (B, N).
    """
    from ..calibration.chameleon_tables import extend
    from .gasv import gasv_gates

    B, N, _ = sub.shape
    dev = sub.device
    tok = sub_tree.tokens.clamp(min=0)
    par = sub_tree.parents
    # gates only for a code drafted under a code row (the forced row end has a one-hot law)
    code = (tok < K) & (par >= 0) & ~forced.gather(1, par.clamp(min=0))
    offs = torch.arange(B, device=dev)[:, None] * N
    flat_tok = torch.where(code, tok, 0).reshape(-1)
    flat_par = torch.where(code, par + offs, -1).reshape(-1)
    logits = sub.reshape(B * N, K)
    if gasv is not None and cfg.scope == "neighbours":
        out = gasv(logits, flat_tok, flat_par, cfg)
    else:
        out = gasv_gates(logits, flat_tok, flat_par, tables, cfg)
    keep = code.reshape(-1, 1).to(out.gate.device)
    Kn = out.cand.shape[-1]
    cand = torch.where(keep, out.cand.long(), -1).reshape(B, N, Kn).to(dev)
    gate = torch.where(keep, out.gate.float(), 0.0).reshape(B, N, Kn).to(dev)
    p = extend(out.p.to(dev).reshape(B, N, K), forced)
    return p, cand, gate, out.delta_eff.to(dev).reshape(B, N)
