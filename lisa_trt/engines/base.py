"""The runner protocol every backend implements (DESIGN.md principle 3).

The speculative loop (speculative/decode.py) talks to a `TargetEngine` and a `DrafterEngine`
and never to a backend directly. Torch tensors are the array type; caches are preallocated
torch buffers that the backend updates in place (ORT binds them through IO binding, TensorRT by
address). A torch `Transformer` / `Drafter` already satisfies the protocols (torch eager
backend); `engines/ort.py` and `engines/trt.py` implement them over exported graphs whose input
and output names come from `export/io_spec.py`.

Graph kinds are explicit (principle 4): one entry point each.
"""

from __future__ import annotations

import enum
from typing import Protocol, runtime_checkable

import torch


class GraphKind(enum.Enum):
    PREFILL = "prefill"  # condition prefix -> cache, logits of the last prefix position
    VERIFY_TREE = "verify_tree"  # S new tokens (a tree) at given positions/slots/mask
    DRAFT_STEP = "draft_step"  # drafter: K beam nodes (or committed tokens) -> logits, hidden
    GASV = "gasv"  # guided logits + node tokens / parents -> p, delta_eff, cand, gate
    VQ_DECODE = "vq_decode"  # token ids -> pixels


@runtime_checkable
class TargetEngine(Protocol):
    """What the decode loop needs from a target backend.

    Same methods and shapes as `lisa_trt.models.llamagen.Transformer`:
    - new_cache(batch, extra) -> KVCache (lengths (B,), col_valid (B, Lmax), k/v buffers)
    - prefill(cond, cache, taps) -> TargetOutput (logits (B, 1, V) fp32, taps (B, 1, 3H))
    - forward_tokens(tokens (B,S), positions (B,S), slots (B,S), mask (B,S,Lmax), cache, taps)
      -> TargetOutput (logits (B, S, V) fp32, taps (B, S, 3H) when asked)
    - null_cond(cond), check_cond(cond) -> batch size
    """

    config: object

    def new_cache(self, batch: int, extra: int = 0): ...

    def prefill(self, cond, cache, taps: bool = False): ...

    def forward_tokens(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                       mask: torch.Tensor, cache, taps: bool = False): ...

    def null_cond(self, cond): ...

    def check_cond(self, cond) -> int: ...


@runtime_checkable
class DrafterEngine(Protocol):
    """What the decode loop needs from a drafter backend (`lisa_trt.models.drafter.Drafter`).

    - new_cache(batch, max_len) -> DrafterCache
    - project_taps(taps (B,S,3H)) -> (B,S,H)
    - forward(hidden_in (B,S,H), tokens (B,S), positions, slots, mask (B,S,Lmax), cache)
      -> (logits (B,S,V), hidden_out (B,S,H))
    """

    def new_cache(self, batch: int, max_len: int, dtype=None): ...

    def project_taps(self, taps: torch.Tensor) -> torch.Tensor: ...

    def forward(self, hidden_in: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                slots: torch.Tensor, mask: torch.Tensor, cache): ...


class Timer:
    """Accumulates wall time per phase (draft / verify / host) for the decode stats."""

    def __init__(self):
        import time

        self._now = time.perf_counter
        self.totals: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        self.totals[phase] = self.totals.get(phase, 0.0) + seconds

    def measure(self, phase: str):
        timer = self

        class _Ctx:
            def __enter__(self):
                self.t0 = timer._now()

            def __exit__(self, *exc):
                timer.add(phase, timer._now() - self.t0)

        return _Ctx()



class StaticCacheTarget:
    """Shared host-side logic of exported-graph targets (ORT, TensorRT): conditions through the
    torch model's own code (one source of truth) and caches of the engines' static length.

    Subclasses set: config, manifest, max_cache_len, dtype, device, _cond (see load_conditions).
    """

    def check_cond(self, cond) -> int:
        from ..models.llamagen import Transformer

        return Transformer.check_cond(self, cond)

    def null_cond(self, cond):
        from ..models.llamagen import Transformer

        return Transformer.null_cond(self._cond, cond)

    def load_conditions(self, manifest) -> None:
        """The null caption (t2i) shipped in the bundle, for null_cond."""
        import types
        from pathlib import Path

        u = None
        if "conditions" in (manifest.files or {}):
            from ..io import load_safetensors

            u = load_safetensors(Path(manifest.dir) / manifest.files["conditions"])[0]["uncond_embedding"]
        self._cond = types.SimpleNamespace(config=self.config, cls_embedding=types.SimpleNamespace(uncond_embedding=u))

    def new_cache(self, batch: int, extra: int = 0, dtype=None):
        """A KVCache of the engines' static length (>= round_up(seq_len + extra, 8))."""
        from ..config import find_multiple
        from ..errors import InputError
        from ..models.llamagen import KVCache

        need = find_multiple(self.config.seq_len + extra, 8)
        if need > self.max_cache_len:
            raise InputError(f"a cache with {extra} extra slots needs length {need}, but these engines were exported "
                             f"with a static cache of {self.max_cache_len} (max_tree {self.manifest.max_tree}); "
                             "re-export with a larger --max-tree or use a smaller tree budget")
        if dtype is not None and dtype != self.dtype:
            raise InputError(f"the engines' KV cache is {self.dtype}; cannot make a {dtype} cache")
        return KVCache(self.config, batch, self.max_cache_len, self.dtype, self.device)


    # -- prefill I/O shared by the graph backends ------------------------------------------

    def _prefill_io(self, cond, cache) -> tuple[dict, dict]:
        """(inputs, outputs) of the prefill graph for `cond` (outputs preallocated)."""
        import torch

        from ..errors import InputError

        cfg, dev = self.config, self.device
        B = self.check_cond(cond)
        if B != cache.batch:
            raise InputError(f"condition batch {B} does not match the cache batch {cache.batch}")
        if cfg.model_type == "c2i":
            inputs = dict(class_ids=cond.to(device=dev, dtype=torch.int64).contiguous())
        else:
            inputs = dict(caption_features=cond[0].to(device=dev, dtype=self.dtype).contiguous(),
                          caption_mask=cond[1].to(device=dev, dtype=torch.bool).contiguous())
        out = self._outputs(B, 1)
        out["prefix_valid"] = torch.empty(B, cfg.cls_token_num, dtype=torch.bool, device=dev)
        return inputs, out

    def _prefill_done(self, cache, out: dict, taps: bool):
        """Record the prefix in the cache bookkeeping; the TargetOutput of the prefill."""
        from ..models.llamagen import TargetOutput

        T = self.config.cls_token_num
        cache.col_valid[:] = True
        cache.col_valid[:, :T] = out["prefix_valid"].to(cache.col_valid.device)
        cache.lengths.fill_(T)
        return TargetOutput(out["logits"], out["taps"] if taps else None, out["hidden"])


class StaticCacheDrafter:
    """Shared logic of exported-graph drafters: DrafterCache of the engines' static length."""

    def new_cache(self, batch: int, max_len: int, dtype=None):
        from ..config import find_multiple
        from ..errors import InputError
        from ..models.drafter import DrafterCache

        if find_multiple(max_len, 8) > self.max_cache_len:
            raise InputError(f"a drafter cache of {max_len} slots does not fit the engines' static length "
                             f"{self.max_cache_len}; re-export with a larger --max-tree")
        if dtype is not None and dtype != self.dtype:
            raise InputError(f"the engines' drafter cache is {self.dtype}; cannot make a {dtype} cache")
        return DrafterCache(self.config, batch, self.max_cache_len, self.dtype, self.device)


class GraphGASV:
    """Shared call of the GASV graph runners (ORT, TensorRT): GASV v2 per-node gates.

    (logits (N, V), tokens (N,), parents (N,), cfg) -> GASVGates, as `gasv.gasv_gates`.
    Subclasses set: config (GASVConfig recorded at export), vocab_size, device, _run.
    """

    def __call__(self, logits, tokens, parents, cfg=None):
        import torch

        from ..errors import InputError
        from ..export.io_spec import GASV_K
        from ..speculative.gasv import GASVGates, check_logits

        check_logits(logits)
        cfg = cfg or self.config
        if logits.shape[1] != self.vocab_size:
            raise InputError(f"GASV tables are for vocabulary {self.vocab_size}, logits have {logits.shape[1]}")
        if cfg.scope != "neighbours" or cfg.neighbours > GASV_K:
            raise InputError(f"the GASV graph gates the first {GASV_K} codebook neighbours (scope 'neighbours'); "
                             f"got scope {cfg.scope!r}, neighbours {cfg.neighbours}: use the torch backend")
        dev, N = self.device, logits.shape[0]
        out = dict(p=torch.empty(logits.shape, dtype=torch.float32, device=dev),
                   delta_eff=torch.empty(N, dtype=torch.float32, device=dev),
                   cand=torch.empty(N, GASV_K, dtype=torch.int64, device=dev),
                   gate=torch.empty(N, GASV_K, dtype=torch.float32, device=dev))
        self._run.run(dict(guided_logits=logits.to(device=dev, dtype=torch.float32).contiguous(),
                           node_tokens=tokens.to(device=dev, dtype=torch.int64).contiguous(),
                           node_parents=parents.to(device=dev, dtype=torch.int64).contiguous(),
                           gasv_params=cfg.params(dev)), out)
        k = cfg.neighbours
        return GASVGates(out["p"], out["delta_eff"], out["cand"][:, :k], out["gate"][:, :k])


class GraphVQDecoder:
    """Shared `decode_code` of the VQ-decoder graph runners (ORT, TensorRT)."""

    def decode_code(self, indices, shape=None):
        import torch

        from ..errors import InputError

        B, N = indices.shape
        if N != self.grid * self.grid:
            raise InputError(f"expected {self.grid * self.grid} tokens per image, got {N}")
        V = self.config.codebook_size
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= V):
            raise InputError(f"image token ids must lie in [0, {V}); got {int(indices.min())}..{int(indices.max())}")
        side = self.grid * self.config.downsample
        out = torch.empty(B, 3, side, side, dtype=torch.float32, device=self.device)
        self._run.run(dict(image_tokens=indices.to(device=self.device, dtype=torch.int64).contiguous()),
                      dict(images=out))
        return out
