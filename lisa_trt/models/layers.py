"""Building blocks every target family shares: RMSNorm, the static KV cache (per-row positions
through `pad`), cached attention over explicit (tree) masks, the targets' output record; the one
attention module (HF or LlamaGen projection names, optional per-head q/k norm, rotate-half or
adjacent-pair RoPE) and the one SwiGLU MLP every family and the drafter build; and the HF-named
Llama-style decoder (pre- or post-norm block) the HF-directory families (Chameleon, Janus)
parameterise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .target_config import TargetShape
from ..errors import InputError
from .rope import apply_rotary_emb


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        out = xf * torch.rsqrt(torch.mean(xf * xf, dim=-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


def cached_attention(q, k, v, mask, kv: Optional[tuple] = None, slots=None):
    """SDPA of q (B, H, S, D) over k / v (B, Hkv, S, D); with a static cache kv = (k_cache,
    v_cache) (B, Hkv, L, D) the new K/V are first written at cache `slots` (B, S) and attention
    reads the whole cache. GQA: query head h reads kv head h // (H / Hkv). mask (B, 1, S, L)
    bool, or None for causal attention over the new tokens alone."""
    B, n_kv, S, D = k.shape
    if kv is not None and isinstance(kv[0], CacheRows):
        return rows_attention(q, k, v, mask, kv, slots)
    if kv is not None:
        k_cache, v_cache = kv
        idx = slots[:, None, :, None].expand(B, n_kv, S, D)
        kn, vn = k.to(k_cache.dtype), v.to(v_cache.dtype)
        # The cache holds values, never an autograd history: its buffers are views of ONE storage
        # (KVCache.kv), and an in-place write carrying a gradient through one layer's view would
        # leave every other layer's view unwritable. A call with a gradient reads its own new
        # rows through an out-of-place copy instead (the gradient reaches this call's k / v).
        k_cache.scatter_(2, idx, kn.detach())
        v_cache.scatter_(2, idx, vn.detach())
        if torch.is_grad_enabled() and (kn.requires_grad or vn.requires_grad):
            k_cache, v_cache = k_cache.scatter(2, idx, kn), v_cache.scatter(2, idx, vn)
        k, v = k_cache.to(q.dtype), v_cache.to(q.dtype)  # no-op unless the cache has another dtype
    rep = q.shape[1] // n_kv
    if rep != 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)


class CacheRows:
    """A static cache buffer `buf` (B, Hkv, L, D) that attention reads but does not write: the
    step's new K or V rows are left in `rows` (B, Hkv, S, D), for the caller to commit at the
    step's slots (`commit_rows`). Passed in place of a cache tensor in cached_attention's kv."""

    __slots__ = ("buf", "rows")

    def __init__(self, buf: torch.Tensor):
        self.buf, self.rows = buf, None


def rows_attention(q, k, v, mask, kv: tuple, slots):
    """cached_attention over a read-only cache (kv: two CacheRows) plus the new rows, as if the
    rows had been written at `slots` first, in the form TensorRT fuses (its "Fused Attention"
    documentation, the primitive-layer method): the scale on Q before the first matmul, then ONE
    chain BMM1 -> mask -> Softmax -> BMM2 over the keys / values of the cache followed by the new
    rows (concatenated before BMM1: no concatenation of scores, no split of probabilities). The
    cache columns at `slots` are masked out (they hold stale rows) and the new rows' columns read
    the mask at the slots. Scores (BMM1's output) and the softmax in fp32. GQA by grouping the
    queries of a kv head (Q (B, Hkv, rep*S, D) against K (B, Hkv, L+S, D)), not by repeating the
    cache. The new rows are left in kv[0].rows / kv[1].rows; the cache itself is not written."""
    kc, vc = kv[0].buf, kv[1].buf
    B, n_kv, S, D = k.shape
    H, L = q.shape[1], kc.shape[2]
    rep = H // n_kv
    fresh = (torch.arange(L, device=slots.device)[None, None, :] == slots[:, :, None]).any(1)  # (B, L)
    m_cache = mask & ~fresh[:, None, None, :]
    m_new = mask.gather(-1, slots[:, None, None, :].expand(B, mask.shape[1], S, S))
    m = torch.cat([m_cache, m_new], dim=-1)[:, :, None].expand(B, mask.shape[1], rep, S, L + S)
    kn, vn = k.to(kc.dtype), v.to(vc.dtype)
    k_all = torch.cat([kc, kn], dim=2).to(q.dtype)  # (B, Hkv, L + S, D): the cache, then the new rows
    v_all = torch.cat([vc, vn], dim=2).to(q.dtype)
    qg = q.reshape(B, n_kv, rep * S, D) * D ** -0.5  # query head h reads kv head h // rep; the scale on Q, into BMM1
    scores = (qg @ k_all.transpose(-1, -2)).float()  # BMM1, then fp32
    scores = scores.masked_fill(~m.reshape(B, -1, rep * S, L + S), float("-inf"))
    p = torch.softmax(scores, dim=-1).to(q.dtype)
    y = p @ v_all  # BMM2
    kv[0].rows, kv[1].rows = kn, vn
    return y.reshape(B, H, S, D)


def commit_rows(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
    """Write new rows (B, Hkv, S, D) into a cache buffer (B, Hkv, L, D) at `slots` (B, S), in
    place: the one write of a step, S rows per layer (what cached_attention's scatter does)."""
    B, H, S, D = rows.shape
    cache.scatter_(2, slots[:, None, :, None].expand(B, H, S, D), rows.to(cache.dtype))


@dataclass
class TargetOutput:
    logits: torch.Tensor  # (B, S, V) fp32
    taps: Optional[torch.Tensor] = None  # (B, S, 3H): residual stream entering the tap layers
    hidden: Optional[torch.Tensor] = None  # (B, S, H): final normed hidden state


def kv_cache_shape(cfg: TargetShape, batch: int, max_len: int) -> tuple[int, ...]:
    """The K/V storage of a target cache, (2, n_layer, batch, H_kv, max_len, head_dim): what
    `KVCache` allocates and what the memory plan (deploy/memory_plan.py) counts."""
    return (2, cfg.n_layer, batch, cfg.kv_heads, max_len, cfg.head_dim)


class KVCache:
    """Static, preallocated K/V of every layer in ONE tensor `kv` (2, n_layer, B, H_kv, Lmax, D)
    (`kv_cache_shape`), written at absolute slots: `k[i]` / `v[i]` are contiguous per-layer views
    of it (what the engines bind by pointer and the attention writes), and a compaction or a
    commit is one write for all layers (`compact`, `commit`).

    `lengths` (B,) is the committed length of each row (prefix included); `col_valid` (B, Lmax)
    is False for padded t2i text slots, which no query may attend to (except themselves).
    `pad` (B,) is the number of left-padding slots of each row whose positions count from its
    first real token (prompt-id families); `positions(slots)` = slots - pad is the RoPE position
    of a token at those slots (LlamaGen: pad 0, positions are the slots).

    Assigning other per-layer buffers to `k` / `v` (the export shims do, to trace a graph over
    its inputs) detaches them from `kv` (None): `compact` / `select_rows` then work per layer.
    """

    def __init__(self, cfg: TargetShape, batch: int, max_len: int, dtype, device):
        self._alloc(kv_cache_shape(cfg, batch, max_len), dtype, device)

    def _alloc(self, shape: tuple, dtype, device) -> None:
        """Zeroed storage of `shape` (2, n_layer, B, H_kv, Lmax, D) and empty rows."""
        batch, max_len = shape[2], shape[4]
        self._bind(torch.zeros(shape, dtype=dtype, device=device))
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.col_valid = torch.ones(batch, max_len, dtype=torch.bool, device=device)
        self.pad = torch.zeros(batch, dtype=torch.long, device=device)
        self.max_len = max_len
        self._cols = torch.arange(max_len, device=device)  # the slot index of every column

    def _bind(self, kv: torch.Tensor) -> None:
        """Hold `kv` and make the per-layer views (by indexing: each a view of its own, so an
        in-place write to one layer under autograd is tracked on `kv`)."""
        self.kv = kv
        self._k = [kv[0, i] for i in range(kv.shape[1])]
        self._v = [kv[1, i] for i in range(kv.shape[1])]

    @property
    def k(self) -> list:
        return self._k

    @k.setter
    def k(self, bufs) -> None:
        self._k, self.kv = list(bufs), None

    @property
    def v(self) -> list:
        return self._v

    @v.setter
    def v(self, bufs) -> None:
        self._v, self.kv = list(bufs), None

    def positions(self, slots: torch.Tensor) -> torch.Tensor:
        """RoPE positions (B, S) of tokens at cache `slots` (B, S): slots - pad."""
        return slots - self.pad[:, None]

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    def attention_mask(self, slots: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
        """(B, S, Lmax) bool: committed columns plus each node's ancestors' slots (self included).

        Args:
            slots: (B, S) cache slots of the new nodes.
            ancestors: (B, S, S) bool, ancestors[b, i, j] = node j is an ancestor of i (or i == j).
        """
        B, S = slots.shape
        seen = self.visible()                                                  # (B, L) committed
        tree = torch.zeros(B, S, self.max_len, dtype=torch.bool, device=slots.device)
        tree.scatter_(2, slots[:, None, :].expand(B, S, S), ancestors)
        return seen[:, None, :] | tree

    def visible(self) -> torch.Tensor:
        """(B, Lmax) bool: the committed columns every new token sees."""
        return (self._cols < self.lengths[:, None]) & self.col_valid

    def compact(self, src_slots: torch.Tensor, counts: torch.Tensor) -> None:
        """Copy rows src_slots[b, :counts[b]] to lengths[b] + (0..counts[b]-1); lengths += counts.

        Entries past counts[b] are padding: they are written past the new length, where no
        mask can see them and the next step overwrites them. One gather and one scatter for
        every layer's K and V at once (per layer only for buffers assigned from outside)."""
        B, A = src_slots.shape
        if A == 0:
            return
        src = src_slots.clamp(min=0)
        dst = (self.lengths[:, None] + self._cols[None, :A]).clamp(max=self.max_len - 1)
        # Fixed shape: all A entries are copied (padding lands past the new length, unread), so no
        # value is read back to find the ones that move.
        bufs = [self.kv] if self.kv is not None else self.k + self.v
        for buf in bufs:
            lead, (H, D) = buf.shape[:-4], buf.shape[-3::2]
            at = (1,) * len(lead)
            rows = buf.gather(-2, src.view(*at, B, 1, A, 1).expand(*lead, B, H, A, D))
            buf.scatter_(-2, dst.view(*at, B, 1, A, 1).expand(*lead, B, H, A, D), rows)
        self.lengths += counts

    def commit(self, k_rows, v_rows, slots: torch.Tensor) -> None:
        """Write a step's new rows of every layer, k_rows / v_rows: n_layer tensors (B, H_kv, S, D)
        each, at `slots` (B, S): one write for all layers (`commit_rows` per layer for buffers
        assigned from outside)."""
        if self.kv is None:
            for bufs, rows in ((self.k, k_rows), (self.v, v_rows)):
                for buf, r in zip(bufs, rows):
                    commit_rows(buf, r, slots)
            return
        rows = torch.stack([*k_rows, *v_rows])
        rows = rows.view(2, len(rows) // 2, *rows.shape[1:])                  # (2, n_layer, B, H, S, D)
        two, n, B, H, S, D = rows.shape
        self.kv.scatter_(4, slots.view(1, 1, B, 1, S, 1).expand(two, n, B, H, S, D), rows.to(self.kv.dtype))

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only batch rows `index` (e.g. drop finished prompts)."""
        if self.kv is not None:
            self._bind(self.kv[:, :, index])
        else:
            self.k = [t[index] for t in self.k]
            self.v = [t[index] for t in self.v]
        self.lengths = self.lengths[index]
        self.col_valid = self.col_valid[index]
        self.pad = self.pad[index]


# ----------------------------------------------------------------------------- HF decoder

# HF `hidden_act` names -> functions (transformers' ACT2FN for the ones these models use)
ACTIVATIONS: dict[str, Callable] = {"silu": F.silu, "swish": F.silu, "gelu": F.gelu, "relu": F.relu,
                                    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_inv_freq(head_dim: int, theta: float, linear_factor: float = 1.0) -> torch.Tensor:
    """(head_dim // 2,) fp32 inverse frequencies of rotate-half RoPE (HF "default" / "linear")."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    return inv_freq / linear_factor


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor):
    """cos, sin (B, S, head_dim) fp32 for absolute positions (B, S), as HF computes them."""
    freqs = positions[..., None].float() * inv_freq  # (B, S, D/2)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


class RotaryTarget:
    """What an HF-decoder target (an nn.Module whose config has head_dim, rope_theta and
    rope_linear_factor, and whose `output` is its head) shares: the non-persistent `inv_freq`
    buffer, `rope(positions)`, and the normal(0.02) init of its Linear / Embedding weights."""

    def _init_rope_and_weights(self) -> None:
        self.register_buffer("inv_freq", torch.empty(self.config.head_dim // 2), persistent=False)
        self.reset_buffers()
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def reset_buffers(self) -> None:
        """Recompute the RoPE frequencies (after `to_empty`), as transformers does."""
        cfg = self.config
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_linear_factor).to(self.output.weight.device)

    def rope(self, positions: torch.Tensor):
        """cos, sin (B, S, head_dim) fp32 for absolute positions (B, S)."""
        return rope_cos_sin(self.inv_freq, positions)

    def check_positions(self, positions: torch.Tensor) -> None:
        """InputError for a RoPE position past the config's max_position_embeddings."""
        n = self.config.max_position_embeddings
        if positions.numel() and int(positions.max()) >= n:
            raise InputError(f"position {int(positions.max())} is past max_position_embeddings {n}")


class HeadLayerNorm(nn.Module):
    """LayerNorm over head_dim with one gamma/beta per head: weight/bias (H, D) (HF layout)."""

    def __init__(self, heads: int, head_dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim))

    def forward(self, x):  # x (..., H, D)
        return F.layer_norm(x, (x.shape[-1],), None, None, self.eps) * self.weight + self.bias


# RoPE as the attention applies it: q (B, S, H, D), k (B, S, Hkv, D) -> rotated q, k heads first
# (B, H, S, D). Each kind keeps the order of operations of its reference model.
Rope = Callable[[torch.Tensor, torch.Tensor], tuple]


def half_rope(cos: torch.Tensor, sin: torch.Tensor) -> Rope:
    """Rotate-half RoPE (HF) from cos / sin (B, S, D) fp32: heads first, then rotated in q's dtype."""
    def apply(q, k):
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        c, s = cos[:, None].to(q.dtype), sin[:, None].to(q.dtype)
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s
    return apply


def pair_rope(freqs: torch.Tensor) -> Rope:
    """Adjacent-pair RoPE (LlamaGen, drafters) from freqs_cis rows (B or 1, S, D // 2, 2):
    rotated in fp32 (apply_rotary_emb), then heads first."""
    def apply(q, k):
        return apply_rotary_emb(q, freqs).transpose(1, 2), apply_rotary_emb(k, freqs).transpose(1, 2)
    return apply


class Attention(nn.Module):
    """GQA self-attention with a static cache: q/k/v projections, optional per-head q/k norm,
    RoPE (a `Rope`), `cached_attention`, output projection.

    Projection names: HF `q_proj`, `k_proj`, `v_proj`, `o_proj` (default), or with `fused`
    LlamaGen's `wqkv` (rows q, k, v) and `wo`. qk_norm: per-head LayerNorm of q and k
    (`q_norm`, `k_norm`) before RoPE (Chameleon). in_dim: width of the input when it differs
    from the output's `dim` (the drafter reads concat(e, a))."""

    def __init__(self, dim: int, n_head: int, kv_heads: int, head_dim: int, bias: bool = False,
                 qk_norm: bool = False, *, fused: bool = False, in_dim: Optional[int] = None):
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = n_head, kv_heads, head_dim
        self.fused, self.qk_norm = fused, qk_norm
        in_dim = in_dim or dim
        q_size, kv_size = n_head * head_dim, kv_heads * head_dim
        if fused:
            self.wqkv = nn.Linear(in_dim, q_size + 2 * kv_size, bias=bias)
            self.wo = nn.Linear(q_size, dim, bias=bias)
        else:
            self.q_proj = nn.Linear(in_dim, q_size, bias=bias)
            self.k_proj = nn.Linear(in_dim, kv_size, bias=bias)
            self.v_proj = nn.Linear(in_dim, kv_size, bias=bias)
            self.o_proj = nn.Linear(q_size, dim, bias=bias)
        if qk_norm:
            self.q_norm = HeadLayerNorm(n_head, head_dim)
            self.k_norm = HeadLayerNorm(kv_heads, head_dim)

    def _project(self, x):
        """x (B, S, in_dim) -> q (B, S, H, D), k and v (B, S, Hkv, D)."""
        B, S, _ = x.shape
        if self.fused:
            kv_size = self.n_kv * self.head_dim
            q, k, v = self.wqkv(x).split([self.n_head * self.head_dim, kv_size, kv_size], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return (q.view(B, S, self.n_head, self.head_dim), k.view(B, S, self.n_kv, self.head_dim),
                v.view(B, S, self.n_kv, self.head_dim))

    def qkv(self, x: torch.Tensor, rope: Rope):
        """x (B, S, in_dim) -> q (B, H, S, D), k, v (B, Hkv, S, D): q/k normed (qk_norm) and rotated."""
        q, k, v = self._project(x)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q, k)
        return q, k, v.transpose(1, 2)

    def out(self, y: torch.Tensor) -> torch.Tensor:
        """Attention output y (B, H, S, D) -> (B, S, dim) through `o_proj` / `wo`."""
        B, _, S, _ = y.shape
        return (self.wo if self.fused else self.o_proj)(y.transpose(1, 2).reshape(B, S, -1))

    def forward(self, x, rope: Rope, mask, kv=None, slots=None):
        """x (B, S, in_dim); mask (B, 1, S, L) bool or None (causal); kv = (k_cache, v_cache)."""
        return self.out(cached_attention(*self.qkv(x, rope), mask, kv, slots))


class SwiGLU(nn.Module):
    """down(act(gate(x)) * up(x)). `names` are the (gate, up, down) Linear attributes: HF
    `gate_proj`, `up_proj`, `down_proj` (default), LlamaGen `w1`, `w3`, `w2`."""

    def __init__(self, dim: int, hidden: int, bias: bool = False, act: str = "silu",
                 names: tuple = ("gate_proj", "up_proj", "down_proj")):
        super().__init__()
        self.names = tuple(names)
        gate, up, down = self.names
        setattr(self, gate, nn.Linear(dim, hidden, bias=bias))
        setattr(self, up, nn.Linear(dim, hidden, bias=bias))
        setattr(self, down, nn.Linear(hidden, dim, bias=bias))
        self.act = ACTIVATIONS[act]

    def forward(self, x):
        gate, up, down = (getattr(self, n) for n in self.names)
        return down(self.act(gate(x)) * up(x))


class DecoderLayer(nn.Module):
    """Pre-norm block (`self_attn`, `mlp`, `input_layernorm`, `post_attention_layernorm`) of an
    HF-shaped config (dim, n_head, kv_heads, head_dim, intermediate_size, hidden_act,
    attention_bias, mlp_bias, rms_norm_eps). swin_norm: the norms apply to the attention / MLP
    OUTPUTS instead of their inputs (Chameleon's variant)."""

    def __init__(self, cfg, qk_norm: bool = False, swin_norm: bool = False):
        super().__init__()
        self.swin = swin_norm
        self.self_attn = Attention(cfg.dim, cfg.n_head, cfg.kv_heads, cfg.head_dim, cfg.attention_bias, qk_norm)
        self.mlp = SwiGLU(cfg.dim, cfg.intermediate_size, cfg.mlp_bias, cfg.hidden_act)
        self.input_layernorm = RMSNorm(cfg.dim, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.rms_norm_eps)

    def forward(self, x, rope: Rope, mask, kv=None, slots=None):
        if self.swin:
            h = x + self.input_layernorm(self.self_attn(x, rope, mask, kv, slots))
            return h + self.post_attention_layernorm(self.mlp(h))
        h = x + self.self_attn(self.input_layernorm(x), rope, mask, kv, slots)
        return h + self.mlp(self.post_attention_layernorm(h))


class DecoderStack(nn.Module):
    """`embed_tokens`, `layers.N` (DecoderLayer), `norm`: an HF `*Model` body."""

    def __init__(self, cfg, vocab_size: int, qk_norm: bool = False, swin_norm: bool = False):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, cfg.dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg, qk_norm, swin_norm) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.rms_norm_eps)

    def run(self, h, cos, sin, mask, cache, slots, tap_ids=(), last_only: bool = False):
        """The layers over h (B, S, dim); returns (h, taps): taps (B, S or 1, 3 dim) = the residual
        stream entering `tap_ids` (None when empty); last_only: taps at the last position only."""
        rope, tapped = half_rope(cos, sin), []
        for i, layer in enumerate(self.layers):
            if i in tap_ids:
                tapped.extend([h[:, -1:] if last_only else h] * tap_ids.count(i))
            kv = (cache.k[i], cache.v[i]) if cache is not None else None
            h = layer(h, rope, mask, kv, slots)
        return h, (torch.cat(tapped, dim=-1) if tap_ids else None)


def teacher_forcing_plan(valid: torch.Tensor, length: int):
    """Mask (B, 1, L, L) and RoPE positions (B, L) of a left-padded prompt (valid (B, T)) followed
    by L - T generated tokens, without a cache: causal, padding columns hidden (each row sees
    itself), positions counted from each row's first real token."""
    B, T = valid.shape
    dev = valid.device
    col = torch.ones(B, length, dtype=torch.bool, device=dev)
    col[:, :T] = valid
    eye = torch.eye(length, dtype=torch.bool, device=dev)
    mask = (torch.tril(torch.ones(length, length, dtype=torch.bool, device=dev))[None] & col[:, None, :]) | eye
    pos = (torch.arange(length, device=dev)[None] - (~valid).sum(1, keepdim=True)).clamp(min=0)
    return mask[:, None], pos
