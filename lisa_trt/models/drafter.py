"""EAGLE-3-style drafter for the targets of every model family (docs/spec/speculative.md,
"EAGLE-3 drafter").

    g_t  = concat(target residual stream entering layers {2, L//2, L-3})   (B, S, 3H_t)
    h    = fc(g_t)                       at step 0 (the drafter's own output hidden later)
    a    = hidden_norm(h);  e = input_layernorm(E[x])   with E the TARGET's frozen embedding
    h'   = h + o_proj(attn(q/k/v(concat(e, a))))         RoPE: 2-D grid table or 1-D positions
    out  = h' + mlp(post_attention_layernorm(h'))        -> hidden_out
    logits = lm_head(norm(out))                          own head over the image vocabulary

Parameter names follow the EAGLE-3 reference (`fc`, `midlayer.*`, `norm`, `lm_head`).

What the drafter takes from its target (the target protocol every family's target offers):
- `drafter_shape()`: a dict of DrafterConfig fields (width, heads, FFN, vocabulary, norm eps,
  RoPE kind "2d" (LlamaGen's grid table over the target's `grid_hw` (h, w), with
  cls_token_num prefix rows) or "1d" (absolute
  positions, `max_positions` rows: Chameleon / Lumina-mGPT, Janus-Pro), and `warm_head`:
  whether the target's logits are `output(final_norm(h))`, so the head can warm-start);
- `token_embedding_table()`: (V, dim) frozen embedding E of the tokens the decode loop commits
  (LlamaGen / Chameleon: the token embedding; Janus: its generation path over the codebook);
- `output` / `final_norm`: the head and final norm a warm start copies.

Positions (a deliberate choice, documented): the drafter entry that consumes token x sits at
x's absolute sequence position (prefix included), exactly the target's position/slot of x.
So a tree node at depth d below a root at position P has position P + d, and in the TTT unroll
step s of entry j uses position cls_token_num + j + s (EAGLE-3 keeps j for every step; with a
2D RoPE the grid cell of the token matters, so lisa-trt uses the token's own cell).

The drafter keeps its own static KV cache (`DrafterCache`, the target's `KVCache` conventions:
(B, H, Lmax, D), slot == absolute position for committed entries, `attention_mask` and
`compact`). The condition-prefix slots hold no drafter entry and are marked invalid columns.

Inference protocol (what the decode loop does; C = cls_token_num):
- Committed entries come from the TARGET: for each committed image token z_i (the bonus /
  root token included) the entry is (project_taps(tap of position C+i-1), z_i) at
  position = slot = C+i. After prefill the first entry is (tap of the last prefix position, z_0).
  So the drafter's `lengths` = C + number of entries = the target's lengths + 1 (the target does
  not cache the root yet). Entries are written in order with a causal mask from
  `cache.attention_mask(slots, causal ancestors)`; then `cache.lengths += count`.
- The root entry's logits give the depth-1 children. A tree node at depth d consumes its own
  token with hidden_in = its parent's hidden_out, position = root position + d, a scratch slot
  >= lengths, mask = cache.attention_mask(scratch_slots, ancestors incl. self).
- After verification the scratch entries are dropped; the newly accepted tokens are written
  again from the target's taps (EAGLE: the drafter prefix is rebuilt from target features).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import find_multiple, strict_from_dict
from ..errors import ArtifactMismatchError, CheckpointError, ConfigError, InputError
from .checkpoints import target_hash
from .draft_vocab import check_d2t, to_full_vocab
from .layers import Attention, KVCache, RMSNorm, SwiGLU, cached_attention, pair_rope
from .rope import precompute_freqs_cis_2d

SCHEMA_VERSION = 1
ARTIFACT_KIND = "lisa-trt-drafter"


# ----------------------------------------------------------------------------- config

@dataclass(frozen=True)
class DrafterConfig:
    """Shapes of an EAGLE-3 drafter and the target it was made for.

    `hidden` is the drafter width (the target's dim by default); the embedding stays the
    target's (`target_dim` wide), so q/k/v read target_dim + hidden features.
    """

    target_dim: int
    hidden: int
    n_head: int
    ffn_hidden: int
    vocab_size: int
    tap_dim: int
    block_size: int
    cls_token_num: int
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    target_name: str = ""
    target_hash: str = ""
    draft_vocab: int = 0  # 0: the head predicts every code; N: only the d2t codes (draft_vocab.py)
    rope: str = "2d"  # "2d": LlamaGen's grid table; "1d": absolute positions 0..max_positions-1
    max_positions: int = 0  # rows of the 1-D RoPE table (the target's position limit)
    grid_shape: Optional[tuple] = None  # 2-D RoPE: the target's (height, width) in tokens; None: square

    def __post_init__(self):
        if self.grid_shape is not None:
            object.__setattr__(self, "grid_shape", tuple(int(x) for x in self.grid_shape))
        if not 0 <= self.draft_vocab <= self.vocab_size:
            raise ConfigError(f"draft_vocab {self.draft_vocab} must lie in 0..{self.vocab_size} (0 = full vocabulary)")
        if self.hidden % self.n_head:
            raise ConfigError(f"drafter hidden {self.hidden} is not divisible by n_head {self.n_head}")
        if self.rope not in ROPE_KINDS:
            raise ConfigError(f"unknown drafter rope {self.rope!r}; valid: {', '.join(ROPE_KINDS)}")
        if self.tap_dim != 3 * self.target_dim:
            raise ConfigError(f"tap_dim {self.tap_dim} must be 3 x target_dim ({3 * self.target_dim}): "
                              "EAGLE-3 taps three layers of the target")
        if self.rope == "1d":
            if self.head_dim % 2 or self.max_positions < 1:
                raise ConfigError(f"a 1-D RoPE drafter needs an even head_dim (got {self.head_dim}) and "
                                  f"max_positions >= 1 (got {self.max_positions})")
            return
        if self.head_dim % 4:
            raise ConfigError(f"drafter head_dim {self.head_dim} must be a multiple of 4 for 2D RoPE; "
                              "choose n_head so that hidden / n_head is")
        h, w = self.grid_hw
        if h * w != self.block_size:
            raise ConfigError(f"block_size {self.block_size} must be a square (grid x grid tokens) or match "
                              f"grid_shape {self.grid_shape}: the drafter's 2-D RoPE covers the target's grid")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_head

    @property
    def head_size(self) -> int:
        """Rows of lm_head: the draft vocabulary size (the target's vocabulary when not reduced)."""
        return self.draft_vocab or self.vocab_size

    @property
    def grid_hw(self) -> tuple[int, int]:
        """(height, width) of the token grid the 2-D RoPE table covers (the target's `grid_hw`)."""
        if self.grid_shape is not None:
            return self.grid_shape
        g = math.isqrt(self.block_size)
        return (g, g)

    @property
    def seq_len(self) -> int:
        return self.cls_token_num + self.block_size

    @property
    def n_positions(self) -> int:
        """Rows of the RoPE table: positions 0..n_positions-1 are valid."""
        return self.max_positions if self.rope == "1d" else self.seq_len

    def to_dict(self) -> dict:
        """The fields; `rope` / `max_positions` only when not at their defaults, so 2-D drafter
        files, manifests and checkpoints read exactly as before these fields existed."""
        d = dataclasses.asdict(self)
        for k in _LATE_FIELDS:
            if d[k] == _DEFAULTS[k]:
                del d[k]
        if "grid_shape" in d:
            d["grid_shape"] = list(d["grid_shape"])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DrafterConfig":
        return strict_from_dict(cls, d)

    @classmethod
    def for_target(cls, tcfg, *, hidden: Optional[int] = None, n_head: Optional[int] = None,
                   ffn_hidden: Optional[int] = None, target_name: str = "",
                   target_hash: str = "", draft_vocab: int = 0) -> "DrafterConfig":
        """Drafter shapes for a target configuration that knows its drafter's shape:
        `for_shape(tcfg.drafter_shape())` (LlamaGen's TargetConfig: 2-D RoPE). A config without
        one (an HF family's) refuses: use `for_shape(target.drafter_shape())` of its target."""
        if not callable(getattr(tcfg, "drafter_shape", None)):
            raise ConfigError(f"{type(tcfg).__name__} does not give its drafter's shape; build the drafter "
                              "config from the target: DrafterConfig.for_shape(target.drafter_shape())")
        return cls.for_shape(tcfg.drafter_shape(), hidden=hidden, n_head=n_head, ffn_hidden=ffn_hidden,
                             target_name=target_name, target_hash=target_hash, draft_vocab=draft_vocab)

    @classmethod
    def for_shape(cls, shape: dict, *, hidden: Optional[int] = None, n_head: Optional[int] = None,
                  ffn_hidden: Optional[int] = None, target_name: str = "", target_hash: str = "",
                  draft_vocab: int = 0) -> "DrafterConfig":
        """Drafter shapes from a target's `drafter_shape()`: one target layer's width / heads /
        FFN by default; a narrower drafter keeps the target's head_dim and an 8/3 SwiGLU FFN."""
        dim = shape["target_dim"]
        hidden = hidden or dim
        if n_head is None:
            n_head = shape["n_head"] if hidden == dim else max(1, hidden // shape["head_dim"])
        if ffn_hidden is None:
            ffn_hidden = shape["ffn_hidden"] if hidden == dim else find_multiple(int(8 * hidden / 3), 32)
        fields = {k: shape[k] for k in ("vocab_size", "block_size", "cls_token_num", "rope_base", "norm_eps",
                                        "rope", "max_positions")}
        hw = shape.get("grid_hw")  # the family's grid; kept only when it is not the square of block_size
        if hw is not None and tuple(hw)[0] != tuple(hw)[1]:
            fields["grid_shape"] = tuple(hw)
        return cls(target_dim=dim, hidden=hidden, n_head=n_head, ffn_hidden=ffn_hidden, tap_dim=3 * dim,
                   target_name=target_name, target_hash=target_hash, draft_vocab=draft_vocab, **fields)


ROPE_KINDS = ("2d", "1d")
_LATE_FIELDS = ("rope", "max_positions", "grid_shape")  # added after schema 1: omitted from to_dict at their defaults
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DrafterConfig)}


def rope_1d_table(n_pos: int, head_dim: int, base: float) -> torch.Tensor:
    """(n_pos, head_dim // 2, 2) cos/sin for adjacent-pair RoPE over 1-D positions, fp32."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    ang = torch.outer(torch.arange(n_pos, dtype=torch.float), inv)
    return torch.stack([ang.cos(), ang.sin()], dim=-1)


# ----------------------------------------------------------------------------- cache

class DrafterCache(KVCache):
    """The drafter's static KV cache: one layer, the target KVCache's conventions.

    Columns of the condition prefix (slots < cls_token_num) hold no drafter entry and are
    invalid (`col_valid` False), so `attention_mask` never lets a query see them.
    """

    def __init__(self, cfg: DrafterConfig, batch: int, max_len: int, dtype, device):
        self._alloc(self.storage_shape(cfg, batch, max_len), dtype, device)
        self.col_valid[:, : cfg.cls_token_num] = False

    @staticmethod
    def storage_shape(cfg: DrafterConfig, batch: int, max_len: int) -> tuple[int, ...]:
        """The K/V storage, (2, 1, batch, n_head, max_len, head_dim): one layer in the target
        cache's layout (models/layers.kv_cache_shape)."""
        return (2, 1, batch, cfg.n_head, max_len, cfg.head_dim)


# ----------------------------------------------------------------------------- layers

class DrafterLayer(nn.Module):
    """The drafter's decoder layer (EAGLE-3 `midlayer.*` names); Drafter._layer runs it."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.hidden_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.input_layernorm = RMSNorm(cfg.target_dim, cfg.norm_eps)
        # q/k/v read concat(e, a) (target_dim + hidden wide); o_proj back to hidden
        self.self_attn = Attention(cfg.hidden, cfg.n_head, cfg.n_head, cfg.head_dim,
                                   in_dim=cfg.target_dim + cfg.hidden)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.hidden, cfg.ffn_hidden)


Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Drafter(nn.Module):
    """EAGLE-3 drafter: fc on target taps, one decoder layer, own head.

    Args:
        cfg: DrafterConfig.
        embedding: the target's token embedding weight (V, target_dim) or nn.Embedding. It is
            kept as a non-persistent buffer (frozen, never saved with the drafter).
        d2t: with cfg.draft_vocab = N, the (N,) draft -> target id map (a persistent buffer,
            saved with the drafter); default arange(N) until trained/loaded.
    """

    def __init__(self, cfg: DrafterConfig, embedding: Union[nn.Embedding, torch.Tensor],
                 d2t: Optional[torch.Tensor] = None):
        super().__init__()
        self.config = cfg
        weight = embedding.weight if isinstance(embedding, nn.Embedding) else embedding
        if tuple(weight.shape) != (cfg.vocab_size, cfg.target_dim):
            raise ConfigError(f"target embedding has shape {tuple(weight.shape)}; the drafter config "
                              f"expects ({cfg.vocab_size}, {cfg.target_dim})")
        self.fc = nn.Linear(cfg.tap_dim, cfg.hidden, bias=False)
        self.midlayer = DrafterLayer(cfg)
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.head_size, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        if cfg.draft_vocab:
            d2t = torch.arange(cfg.draft_vocab) if d2t is None else check_d2t(d2t, cfg.vocab_size)
            if d2t.numel() != cfg.draft_vocab:
                raise ConfigError(f"d2t has {d2t.numel()} ids; the config says draft_vocab {cfg.draft_vocab}")
            d2t = d2t.to(weight.device)
        elif d2t is not None:
            raise ConfigError("a d2t map needs DrafterConfig.draft_vocab = len(d2t)")
        self.register_buffer("d2t", d2t, persistent=True)  # None (not saved) for a full head
        self.register_buffer("embed_weight", weight.detach(), persistent=False)
        if cfg.rope == "1d":
            freqs = rope_1d_table(cfg.max_positions, cfg.head_dim, cfg.rope_base)
        else:
            freqs = precompute_freqs_cis_2d(cfg.grid_hw, cfg.head_dim, cfg.rope_base, cfg.cls_token_num)
        self.register_buffer("freqs_cis", freqs.to(weight.device), persistent=False)
        self.family: Optional[str] = None  # the target's family name when not LlamaGen (saved with the drafter)

    @property
    def max_positions(self) -> int:
        """Rows of the RoPE table (positions the drafter accepts)."""
        return self.config.n_positions

    # -- construction --------------------------------------------------------------------

    @classmethod
    def from_target(cls, target: nn.Module, *, hidden: Optional[int] = None, n_head: Optional[int] = None,
                    ffn_hidden: Optional[int] = None, target_name: str = "",
                    init_head_from_target: bool = True, d2t: Optional[torch.Tensor] = None) -> "Drafter":
        """A fresh drafter for a target of any family (config + hash from the target, embedding shared).

        The shapes come from `target.drafter_shape()`, the frozen embedding from
        `target.token_embedding_table()` (module docstring). With `init_head_from_target`,
        hidden == target dim and a target whose logits are output(final_norm(h)), `norm` /
        `lm_head` start as copies of the target's final norm and output head (a warm start;
        they are trained); with a reduced vocabulary (`d2t`, see draft_vocab.py) the head copies
        the target rows d2t.
        """
        shape = target.drafter_shape()
        n = 0 if d2t is None else int(torch.as_tensor(d2t).numel())
        cfg = DrafterConfig.for_shape(shape, hidden=hidden, n_head=n_head, ffn_hidden=ffn_hidden,
                                      target_name=target_name, target_hash=target_hash(target), draft_vocab=n)
        d = cls(cfg, target.token_embedding_table(), d2t=d2t).to(target.output.weight.device)
        d.family = getattr(target, "family", None)
        if init_head_from_target and shape.get("warm_head", True) and cfg.hidden == cfg.target_dim:
            with torch.no_grad():
                w = target.output.weight
                d.lm_head.weight.copy_(w if d.d2t is None else w.index_select(0, d.d2t))
                d.norm.weight.copy_(target.final_norm.weight)
        return d

    def new_cache(self, batch: int, max_len: int, dtype=None) -> DrafterCache:
        """A cache of round_up(max_len, 8) slots for `batch` rows."""
        p = self.lm_head.weight
        return DrafterCache(self.config, batch, find_multiple(max_len, 8), dtype or p.dtype, p.device)

    # -- math ----------------------------------------------------------------------------

    def project_taps(self, taps: torch.Tensor) -> torch.Tensor:
        """fc on the target taps: (B, S, 3H_t) -> (B, S, hidden)."""
        return self.fc(taps.to(self.fc.weight.dtype))

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Frozen target embedding E[x]: (B, S) -> (B, S, target_dim)."""
        V = self.config.vocab_size
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= V):
            raise InputError(f"image token ids must lie in [0, {V}); got {int(tokens.min())}..{int(tokens.max())}")
        return F.embedding(tokens, self.embed_weight)

    def _freqs(self, positions: torch.Tensor) -> torch.Tensor:
        if positions.numel() and int(positions.max()) >= self.freqs_cis.shape[0]:
            raise InputError(f"position {int(positions.max())} is past the end of the image "
                             f"(sequence length {self.freqs_cis.shape[0]})")
        return self.freqs_cis[positions]  # (B, S, D/2, 2)

    def _layer(self, hidden_in, tokens, positions, attend: Attend):
        """The decoder layer + head with a pluggable attention (cached or concatenated keys)."""
        layer = self.midlayer
        e = layer.input_layernorm(self.embed(tokens).to(hidden_in.dtype))
        a = layer.hidden_norm(hidden_in)
        q, k, v = layer.self_attn.qkv(torch.cat([e, a], dim=-1), pair_rope(self._freqs(positions)))
        h = hidden_in + layer.self_attn.out(attend(q, k, v))  # attend: (B, H, S, D)
        out = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = to_full_vocab(self.lm_head(self.norm(out)).float(), self.d2t, self.config.vocab_size)
        return logits, out

    def forward(self, hidden_in: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                slots: torch.Tensor, mask: torch.Tensor, cache: DrafterCache):
        """One drafter step over S entries, K/V written into `cache` at `slots`.

        Args:
            hidden_in: (B, S, hidden): project_taps(taps) for entries backed by the target, or
                the drafter's own previous hidden_out for tree expansion.
            tokens: (B, S) image token ids consumed by the entries.
            positions: (B, S) absolute sequence positions of those tokens (RoPE rows).
            slots: (B, S) cache slots to write K/V to.
            mask: (B, S, Lmax) bool, True = may attend (DrafterCache.attention_mask).
            cache: DrafterCache from `new_cache`.
        Returns:
            logits (B, S, V) fp32 predicting the token after each entry's token (with a reduced
                draft vocabulary, codes outside it get draft_vocab.OUT_OF_VOCAB_LOGIT);
            hidden_out (B, S, hidden) to feed the next step.
        """
        def attend(q, k, v):
            return cached_attention(q, k, v, mask[:, None], (cache.k[0], cache.v[0]), slots)

        return self._layer(hidden_in, tokens, positions, attend)

    def forward_kv(self, hidden_in: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                   past_k: Optional[torch.Tensor], past_v: Optional[torch.Tensor], mask: torch.Tensor):
        """Cache-free step for training: attend over concat(past, new) keys (autograd-safe).

        Args:
            hidden_in, tokens, positions: as in `forward`.
            past_k, past_v: (B, H, P, D) keys/values of earlier entries, or None (P = 0).
            mask: (B or 1, S, P + S) bool over the concatenated keys, True = may attend.
        Returns:
            logits (B, S, V) fp32, hidden_out (B, S, hidden), k_all, v_all (B, H, P + S, D).
        """
        keys = {}

        # not cached_attention: the training unroll concatenates keys (no in-place cache write)
        # and returns them, so autograd reaches every step's K/V
        def attend(q, k, v):
            if past_k is not None:
                k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
            keys["k"], keys["v"] = k, v
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])

        logits, out = self._layer(hidden_in, tokens, positions, attend)
        return logits, out, keys["k"], keys["v"]

    # -- artifacts -----------------------------------------------------------------------

    def save(self, path) -> None:
        save_drafter(self, path)

    @classmethod
    def load(cls, path, target: nn.Module, *, map_location=None) -> "Drafter":
        return load_drafter(path, target, map_location=map_location)


# ----------------------------------------------------------------------------- save / load

def _config_path(path: Path) -> Path:
    return path.with_suffix(".json")


def save_drafter(drafter: Drafter, path) -> None:
    """Write `path` (safetensors; the target embedding is not included) + `path.json` config.

    Both carry the config with the target's hash, so the safetensors file alone is complete.
    A drafter of another family than LlamaGen also records the family (and, for 1-D RoPE, the
    position limit as older readers expect it: `max_positions`).
    """
    from ..io import save_safetensors, write_json

    path = Path(path)
    meta = {"kind": ARTIFACT_KIND, "schema_version": SCHEMA_VERSION}
    if drafter.family:
        meta["family"] = drafter.family
    if drafter.config.rope == "1d":
        meta["max_positions"] = drafter.config.max_positions
    meta["config"] = drafter.config.to_dict()
    save_safetensors(dict(drafter.state_dict()), path, metadata=meta)
    write_json(_config_path(path), meta)


def _stored_config(meta: dict) -> DrafterConfig:
    """The DrafterConfig of a file's metadata (files written before `rope` existed record a 1-D
    drafter as family metadata + `max_positions` beside the config)."""
    d = dict(meta["config"])
    if "max_positions" in meta and "rope" not in d:
        d.update(rope="1d", max_positions=int(meta["max_positions"]))
    return DrafterConfig.from_dict(d)


def load_drafter(path, target: nn.Module, *, map_location=None, check_target: bool = True,
                 family: Optional[str] = None) -> Drafter:
    """Load a drafter for `target` (any family); refuses one made for another target.

    Args:
        path: the .safetensors file written by `save_drafter`.
        target: the target (its embedding table is shared, its hash checked).
        check_target: compare the stored target hash with target_hash(target).
        family: refuse files that do not record this family (e.g. "chameleon").
    Raises:
        ArtifactMismatchError: made for a different target or an unknown schema version.
        CheckpointError: unreadable file or missing/unknown tensors.
    """
    from ..io import load_safetensors

    path = Path(path)
    tensors, meta = load_safetensors(path)
    if meta.get("kind") != ARTIFACT_KIND or "config" not in meta:
        raise CheckpointError(f"{path} is not a lisa-trt drafter (no drafter config in its metadata); "
                              "make one with `lisa-trt train`")
    if family is not None and meta.get("family") != family:
        got = f"family {meta['family']}" if meta.get("family") else "no family: a class / caption drafter"
        raise CheckpointError(f"{path} is not a {family}-family lisa-trt drafter (it records {got}); train one "
                              "for this model with `lisa-trt train`")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise ArtifactMismatchError(f"{path} has drafter schema version {meta.get('schema_version')}; this "
                                    f"lisa-trt reads version {SCHEMA_VERSION}. Retrain or convert the drafter.")
    cfg = _stored_config(meta)
    if check_target:
        have = target_hash(target)
        if cfg.target_hash != have:
            name = f" ({cfg.target_name})" if cfg.target_name else ""
            raise ArtifactMismatchError(
                f"drafter {path} was trained for target hash {cfg.target_hash}{name}, but the loaded "
                f"target has hash {have}. A drafter only works with the exact target it was distilled "
                "from: load that target, or train a drafter for this one with `lisa-trt train`.")
    drafter = Drafter(cfg, target.token_embedding_table(), d2t=tensors.get("d2t"))
    drafter.family = meta.get("family")
    try:
        drafter.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path} does not match its own drafter config: {e}") from e
    device = map_location if map_location is not None else target.output.weight.device
    return drafter.to(device).eval()


def read_drafter_config(path) -> DrafterConfig:
    """The config stored beside a drafter file (no weights loaded)."""
    path = Path(path)
    cp = _config_path(path)
    if not cp.is_file():
        raise CheckpointError(f"no drafter config {cp} next to {path}")
    return _stored_config(json.loads(cp.read_text()))
