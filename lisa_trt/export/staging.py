"""Staging directories for atomic exports: names, stale-leftover cleanup, foreign-file guard.

An export writes everything into hidden directories next to ``OUT`` and renames the result
into place at the end. A process killed hard (kill -9, OOM, power loss) cannot clean up, so it
leaves ``.OUT.staging-PID-XXXX`` (and, inside the ONNX step, ``..OUT.staging-PID-XXXX.*.partial``)
or ``.OUT.old-XXXX`` behind. The next export next to ``OUT`` removes those whose writer is gone
(`clean_stale_staging`); an export that is still running (its PID is alive) is never touched.

An existing ``OUT`` is replaced only if every file in it was written by lisa-trt (listed in its
manifest, or the build's engines/records): files a user put there are never deleted; the export
refuses before any work and lists them (`foreign_files`).
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from pathlib import Path

from ..errors import InputError

# Files `lisa-trt build` and ORT add to an engine directory besides the manifest's entries.
_OWN_PATTERNS = ("manifest.json", "*.onnx", "*.onnx.data", "*.plan", "*.engine", "*.cache", "build*.json",
                 "weights/*.safetensors", "weights/*.json", "tables.safetensors", "*.timing")
_LEGACY_AGE_S = 6 * 3600  # leftovers without a PID in their name: removed when older than this


def staging_dir_name(out_dir: Path) -> Path:
    """A fresh hidden staging path next to `out_dir`, tagged with this process's PID."""
    out_dir = Path(out_dir)
    return out_dir.parent / f".{out_dir.name}.staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_staging(out_dir: Path) -> list[Path]:
    """Leftovers of interrupted exports of `out_dir` whose writer is no longer running."""
    out_dir = Path(out_dir)
    parent, name = out_dir.parent, re.escape(out_dir.name)
    if not parent.is_dir():
        return []
    pat = re.compile(rf"^\.{{1,2}}{name}\.(staging-(?P<pid>\d+)-[0-9a-f]+|staging-[0-9a-f]+|old-[0-9a-f]+)")
    found = []
    now = time.time()
    for p in parent.iterdir():
        m = pat.match(p.name)
        if not m:
            continue
        pid = m.group("pid")
        if pid is not None:
            if _pid_alive(int(pid)):
                continue
        else:  # no PID (older lisa-trt, or an .old- directory): only when clearly abandoned
            try:
                if now - p.lstat().st_mtime < _LEGACY_AGE_S:
                    continue
            except OSError:
                continue
        found.append(p)
    return sorted(found)


def clean_stale_staging(out_dir: Path, echo=None) -> list[Path]:
    """Remove `stale_staging(out_dir)`; returns what was removed (echo(msg) reports it)."""
    removed = []
    for p in stale_staging(out_dir):
        size = _du(p)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
        if echo is not None:
            echo(f"removed {p.name} ({size / 1e6:.1f} MB) left by an interrupted export")
    return removed


def _du(p: Path) -> int:
    try:
        if p.is_file():
            return p.stat().st_size
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    except OSError:
        return 0


def own_files(out_dir: Path) -> set[str]:
    """Relative paths in `out_dir` that lisa-trt wrote (manifest entries + known build outputs)."""
    import json

    out_dir = Path(out_dir)
    own = set()
    man = out_dir / "manifest.json"
    if man.is_file():
        try:
            m = json.loads(man.read_text())
        except (OSError, ValueError):
            m = {}
        own.update(str(v) for v in (m.get("files") or {}).values())
        for g in (m.get("graphs") or {}).values():
            for k, v in (g or {}).items():
                if isinstance(v, str) and (k == "file" or k.endswith("_file") or k == "engine"):
                    own.add(v)
    for pat in _OWN_PATTERNS:
        own.update(str(f.relative_to(out_dir)) for f in out_dir.glob(pat))
    return own


def foreign_files(out_dir: Path) -> list[str]:
    """Files in an existing `out_dir` that an export did not write (would be lost by a replace)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    own = own_files(out_dir)
    return sorted(str(f.relative_to(out_dir)) for f in out_dir.rglob("*")
                  if (f.is_file() or f.is_symlink()) and str(f.relative_to(out_dir)) not in own)


def check_replaceable(out_dir: Path) -> None:
    """Refuse (before any work) to replace an `out_dir` holding files lisa-trt did not write."""
    out_dir = Path(out_dir)
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise InputError(f"--out {out_dir} is a file; choose a directory path")
    if not any(out_dir.iterdir()):
        return
    if not (out_dir / "manifest.json").is_file():
        raise InputError(f"{out_dir} exists and is not a lisa-trt engine directory (no manifest.json); "
                         "choose an empty or new --out directory")
    extra = foreign_files(out_dir)
    if extra:
        shown = ", ".join(extra[:8]) + (f" (+{len(extra) - 8} more)" if len(extra) > 8 else "")
        raise InputError(f"{out_dir} holds files lisa-trt did not write ({shown}); an export replaces the whole "
                         "directory, so move them elsewhere or choose another --out (nothing was done)")
