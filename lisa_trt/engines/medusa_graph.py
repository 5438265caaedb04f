"""The Medusa heads of an engine bundle (`medusa_heads.onnx`) over any backend's graph runner.

`GraphMedusaHeads` has the `head_logits(hidden, depth)` and `config` of `MedusaHeads`, so
`speculative.medusa.speculative_engines(target, heads)` pairs it with any target engine and the
decode loop runs it like the torch heads (every verification rule). `load_engines` returns it as
`Engines.drafter` for a bundle exported with Medusa heads (manifest drafter `arch: medusa`).
"""

from __future__ import annotations

import torch

from ..errors import InputError
from ..models.io_spec import Graph
from .base import GraphRunner


class GraphMedusaHeads:
    """Medusa heads through one graph runner (ORT, TensorRT, torch ...)."""

    is_medusa = True  # speculative/medusa.speculative_engines pairs it with the target

    def __init__(self, manifest, runner: GraphRunner):
        self.config = manifest.medusa_config
        if self.config is None:
            raise InputError(f"{manifest.dir} records no Medusa heads (manifest drafter arch "
                             f"{manifest.drafter_arch!r}); export the bundle with a Medusa drafter")
        self.hash = manifest.drafter["hash"]
        self.manifest = manifest
        self.runners = {Graph.MEDUSA_HEADS: runner}
        self._run = runner
        self.device = runner.device

    def close(self) -> None:
        self._run.close()

    def head_logits(self, hidden: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        """hidden (B, S, dim), depth (B, S) -> logits (B, S, V) fp32 of head `depth` (flat past the last)."""
        if hidden.dim() != 3 or hidden.shape[-1] != self.config.dim or tuple(hidden.shape[:2]) != tuple(depth.shape):
            raise InputError(f"Medusa heads take hidden (B, S, {self.config.dim}) and depth (B, S); "
                             f"got {tuple(hidden.shape)} and {tuple(depth.shape)}")
        dev = self.device
        out = self._run.run(dict(hidden=hidden.to(device=dev, dtype=torch.float32).contiguous(),
                                 depth=depth.to(device=dev, dtype=torch.int64).contiguous()), ["logits"])
        return out["logits"]


__all__ = ["GraphMedusaHeads"]
