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
    GASV = "gasv"  # guided logits -> p_raw, p_soft, gate
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

