"""The token dataset type shared by the c2i (train/data.py) and t2i (train/captions.py) data
builders, and two small helpers they both use (kept apart so neither imports the other back)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..io import load_safetensors, save_safetensors, tensor_hash


@dataclass
class TokenDataset:
    """Image token sequences and their training conditions (class ids; num_classes = null), or
    for t2i targets a train.captions.CaptionConds (caption rows + null flags)."""

    tokens: torch.Tensor  # (N, block) long
    cond: object  # (N,) long, or CaptionConds

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def split(self, n_eval: int) -> tuple["TokenDataset", "TokenDataset"]:
        """(first len - n_eval rows, last n_eval rows)."""
        n = len(self) - n_eval
        return TokenDataset(self.tokens[:n], self.cond[:n]), TokenDataset(self.tokens[n:], self.cond[n:])

    def fingerprint(self) -> str:
        if hasattr(self.cond, "fingerprint"):
            return tensor_hash(self.tokens.flatten().double()) + self.cond.fingerprint()
        return tensor_hash(torch.cat([self.tokens.flatten(), self.cond]).double())

    def save(self, path) -> None:
        if hasattr(self.cond, "tensors"):
            save_safetensors({"tokens": self.tokens, **self.cond.tensors()}, path, metadata={"kind": "lisa-trt-tokens-t2i"})
            return
        save_safetensors({"tokens": self.tokens, "classes": self.cond}, path, metadata={"kind": "lisa-trt-tokens"})



def _matches(path: Path, key: dict) -> bool:
    if not path.is_file():
        return False
    try:
        _, meta = load_safetensors(path)
    except Exception:
        return False
    return meta.get("key") == key


def _tqdm(it, enabled: bool, **kw):
    """`it` under a progress bar when `enabled` and someone watches (progress.py `iterate`)."""
    from ..progress import iterate

    return iterate(it, enabled, **kw)
