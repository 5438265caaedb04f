"""Checks that run before any expensive work: sampling settings, counts, output paths.

Every command (and `Pipeline.generate`, and the JSONL prompt parser) calls these first, so a bad
value fails in well under a second with a message that names the option, the allowed range and
the fix, and nothing is written.

    check_sampling(cfg_scale=-1.0)            -> InputError: --cfg-scale must be >= 0 ...
    probe_writable_dir("out/run1")            -> InputError if out/ cannot be written
    check_out_dir("out/run1", overwrite=False) -> InputError if it already holds files

Value checks of the decode step (finite logits, token ids, positions, cache slots, tree
structure) read tensors back to the host, which on a GPU waits for the device: they run where
data enters (the prefill, the first call of an engine on a new cache, a tree or template built
from outside) and in every steady-state step only under the debug switch `debug_checks()`
(LISA_TRT_DEBUG_CHECKS=1, or `debug_checks_on()` in a with-block).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from pathlib import Path
from typing import Optional

from .errors import InputError

DEBUG_ENV = "LISA_TRT_DEBUG_CHECKS"
_debug_override: Optional[bool] = None


def debug_checks() -> bool:
    """True when the per-step value checks run (each a host read): LISA_TRT_DEBUG_CHECKS set and
    not 0, or inside `debug_checks_on()`. Off by default: the steady-state step
    then reads nothing back but its accepted lengths (DESIGN 5b)."""
    if _debug_override is not None:
        return _debug_override
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


@contextlib.contextmanager
def debug_checks_on(on: bool = True):
    """Run the per-step value checks (on=True) or skip them (False) inside the block, whatever
    LISA_TRT_DEBUG_CHECKS says (tests, a debugging session)."""
    global _debug_override
    old, _debug_override = _debug_override, bool(on)
    try:
        yield
    finally:
        _debug_override = old

# Names used in messages: the CLI option for each SamplingConfig field.
_OPTION = {"cfg_scale": "--cfg-scale", "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p"}
# the same settings as the Python API's keywords (Pipeline.generate / from_dir)
API_NAMES = {"cfg_scale": "cfg_scale=", "temperature": "temperature=", "top_k": "top_k=", "top_p": "top_p=",
             "greedy": "greedy=True"}


def _num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def sampling_problems(*, cfg_scale=None, temperature=None, top_k=None, top_p=None,
                      vocab_size: Optional[int] = None, names: Optional[dict] = None) -> list[str]:
    """Problems with sampling settings (None = not given, not checked); [] when all are valid.

    Ranges: cfg_scale >= 0 (1 = no guidance), temperature > 0, 0 < top_p <= 1,
    0 <= top_k <= vocab_size (0 = off). `names` maps a field to the name shown in messages
    (default: the CLI option, e.g. --top-p; the JSONL parser passes its own keys).
    """
    nm = {**_OPTION, **(names or {})}
    out = []
    if cfg_scale is not None and (not _num(cfg_scale) or cfg_scale < 0):
        out.append(f"{nm['cfg_scale']} must be a number >= 0 (1 = no guidance), got {cfg_scale!r}")
    if temperature is not None and (not _num(temperature) or temperature <= 0):
        out.append(f"{nm['temperature']} must be a number > 0 (use {nm.get('greedy', '--greedy')} for argmax), got "
                   f"{temperature!r}")
    if top_p is not None and (not _num(top_p) or not 0 < top_p <= 1):
        out.append(f"{nm['top_p']} must be in (0, 1] (1 = off), got {top_p!r}")
    if top_k is not None:
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
            out.append(f"{nm['top_k']} must be an integer >= 0 (0 = off), got {top_k!r}")
        elif vocab_size is not None and top_k > vocab_size:
            out.append(f"{nm['top_k']} {top_k} is larger than the vocabulary ({vocab_size} codes); "
                       f"use 0..{vocab_size} (0 = off)")
    return out


def check_sampling(sampling=None, *, vocab_size: Optional[int] = None, names: Optional[dict] = None,
                   **values) -> None:
    """Raise InputError listing every out-of-range sampling setting.

    Pass a SamplingConfig (or any object with cfg_scale / temperature / top_k / top_p) and/or
    the individual values as keywords; keywords win. `names`: how the messages name each setting
    (default the CLI flags; the Python API passes its keywords, API_NAMES).
    """
    if sampling is not None:
        for k in _OPTION:
            values.setdefault(k, getattr(sampling, k, None))
    problems = sampling_problems(vocab_size=vocab_size, names=names, **values)
    if problems:
        raise InputError("invalid sampling settings; nothing was generated:\n  " + "\n  ".join(problems))


def check_positive(value, option: str, *, allow_zero: bool = False) -> None:
    """Counts such as --num-images, --rollouts, --steps: integers >= 1 (or >= 0 with allow_zero)."""
    lo = 0 if allow_zero else 1
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise InputError(f"{option} must be an integer >= {lo}, got {value!r}")


def _existing_ancestor(path: Path) -> Path:
    p = path.absolute()
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    return p


def _probe_dir(d: Path, what: str, target: Path) -> None:
    """Create and delete one temp file in the existing directory `d` (os.access lies for root)."""
    if not d.is_dir():
        raise InputError(f"cannot write {what} {target}: {d} is a file, not a directory; choose another path")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".lisa-trt-probe-", dir=d)
    except OSError as e:
        raise InputError(f"cannot write {what} {target}: {d} is not writable ({e.strerror}); "
                         "choose a writable path (nothing was done)") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def probe_writable_dir(path, what: str = "output directory") -> Path:
    """Check that directory `path` exists and is writable, or could be created; creates nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{what} {path} exists and is a file; choose a directory path")
    _probe_dir(_existing_ancestor(path), what, path)
    return path


def probe_writable_file(path, what: str = "output file") -> Path:
    """Check that file `path` can be written (its directory exists/can be created and is writable)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{what} {path} is a directory; give a file name")
    _probe_dir(_existing_ancestor(path.parent), what, path)
    return path


def check_out_dir(path, *, overwrite: bool = False, what: str = "--out") -> Path:
    """An output directory must be new or empty, unless `overwrite` (then old files are replaced).

    Also probes that it is writable. Keeps results of two runs from mixing in one folder.
    """
    path = probe_writable_dir(path, f"{what} directory")
    if not overwrite and path.is_dir() and any(path.iterdir()):
        raise InputError(f"{what} {path} is not empty; choose a new directory or pass --overwrite "
                         "(files of the previous run that this run does not rewrite are removed)")
    return path


def clear_previous_outputs(path, patterns=("*.png", "tokens.npy", "stats.json")) -> list[Path]:
    """With --overwrite: remove earlier results matching `patterns` (ours), nothing else."""
    removed = []
    path = Path(path)
    if not path.is_dir():
        return removed
    for pat in patterns:
        for f in path.glob(pat):
            if f.is_file():
                f.unlink()
                removed.append(f)
    return removed
