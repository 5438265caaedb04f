"""Atomic file writes and safetensors helpers (docs/design.md principle 6: writes are temp + rename).

The one rule of every command that writes an artifact (export, build, calibrate, convert,
random-checkpoint, quantize-trt; run / generate through validation.check_out_dir): an existing
artifact is replaced only with `--overwrite`, and the refusal comes before any work
(`refuse_existing`); the write itself stays atomic (`atomic_write`, `atomic_dir`).
"""

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


@contextlib.contextmanager
def atomic_dir(out_dir, *, marker: str | None = None, what: str = "output", check=None, stage_name=None):
    """Yield a hidden staging directory next to `out_dir`; on success it replaces `out_dir`.

    The one atomic-directory helper (exports, bundles). On any failure (or interrupt) the
    staging directory is removed and `out_dir` is left untouched. A previous `out_dir` is moved
    aside, the new one renamed in, the old one deleted: a kill between the two renames leaves
    no `out_dir` at all, never a half-written one. Entries get the umask's usual modes.

    Args:
        out_dir: the final directory.
        marker: a file name an existing non-empty `out_dir` must contain to be replaced (e.g.
            manifest.json), so that an unrelated directory is never deleted.
        what: what the directory is, for the error message.
        check: optional `check(out_dir)` that raises if `out_dir` must not be replaced; called
            before any work and again just before the swap (export/staging.check_replaceable).
        stage_name: optional `stage_name(out_dir) -> Path` for the staging directory (e.g. one
            carrying the PID, so a later run can tell an abandoned leftover from a live one).
    Raises:
        InputError: `out_dir` exists, is not empty and lacks `marker`.
    """
    import shutil
    import uuid

    from .errors import InputError

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if marker and out_dir.exists() and not (out_dir / marker).is_file() and any(out_dir.iterdir()):
        raise InputError(f"{out_dir} exists and is not a lisa-trt {what} (no {marker}); "
                         "choose an empty or new --out directory")
    if check is not None:
        check(out_dir)
    if stage_name is not None:
        tmp = Path(stage_name(out_dir))
        tmp.mkdir()
    else:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_UMASK)
        for p in tmp.rglob("*"):
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~_UMASK)
        old = None
        if out_dir.exists():
            if check is not None:
                check(out_dir)  # again: files may have appeared meanwhile
            old = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def refuse_existing(path, *, overwrite: bool, option: str = "--out", what: str = "already exists",
                    exists=None) -> Path:
    """The overwrite rule: raise before any work when `path` holds an artifact and not `overwrite`.

    Args:
        path: the file or directory a command is about to write.
        overwrite: the command's --overwrite flag (True: nothing is checked).
        option: how the message names the path's option ("--out", "DST", "ENGINE_DIR").
        what: what is there, for the message ("already exists", "already holds built TensorRT engines").
        exists: optional `exists(path) -> bool` for an artifact that is not the path itself (the
            engines inside an engine directory); default: a file, or a non-empty directory.
    Raises:
        InputError: naming the path and the fix (--overwrite, or another path).
    """
    from .errors import InputError

    path = Path(path)
    if overwrite:
        return path
    if exists is not None:
        found = exists(path)
    else:
        found = path.is_file() or (path.is_dir() and any(path.iterdir()))
    if found:
        raise InputError(f"{option} {path} {what}; nothing was done. Pass --overwrite to replace it "
                         "(the new one is written beside it and swapped in only when complete), or choose another path")
    return path


def state_dict_problems(own: dict, sd: dict, other: str = "model") -> list:
    """Lines listing the missing / unexpected keys and shape mismatches of `sd` against `own`
    (empty when they match): the body of every strict-loading error."""
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    shapes = [f"{k}: file {tuple(sd[k].shape)} vs {other} {tuple(own[k].shape)}"
              for k in sorted(set(own) & set(sd)) if tuple(own[k].shape) != tuple(sd[k].shape)]

    def show(xs):
        return ", ".join(xs[:8]) + (f" (+{len(xs) - 8} more)" if len(xs) > 8 else "")

    return [f"  {name}: {show(xs)}" for name, xs in
            (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes)) if xs]


def write_json(path, obj) -> None:
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_json_output(path, obj, echo) -> bool:
    """A command's --json output: `path` "-" prints `obj` to stdout through `echo`, any other path
    is written atomically. Returns True when it went to stdout (the caller then keeps its other
    lines off stdout)."""
    if str(path) == "-":
        echo(json.dumps(obj, indent=2, sort_keys=True, default=str))
        return True
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    return False


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
