"""Atomic file writes and safetensors helpers (docs/design.md principle 6: writes are temp + rename)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch

from .errors import CheckpointError

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_write(path):
    """Yield a temporary path next to `path`; rename it over `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path, obj) -> None:
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_safetensors(tensors: dict, path, metadata: dict | None = None) -> None:
    """Save tensors atomically; `metadata` values are JSON-encoded into the header."""
    from safetensors.torch import save_file

    meta = {k: json.dumps(v) for k, v in (metadata or {}).items()}
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    with atomic_write(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)


def load_safetensors(path) -> tuple[dict, dict]:
    """Load (tensors, metadata) from a safetensors file written by `save_safetensors`."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no such file: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw_meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from e
    meta = {}
    for k, v in raw_meta.items():
        try:
            meta[k] = json.loads(v)
        except (ValueError, TypeError):
            meta[k] = v
    return tensors, meta


def tensor_hash(t: torch.Tensor) -> str:
    """sha256 of a tensor's fp32 bytes, first 16 hex digits (stable across devices and dtypes)."""
    data = t.detach().to(torch.float32).contiguous().cpu().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]
