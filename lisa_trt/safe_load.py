"""Loading PyTorch pickles safely, with refusals explained in lisa-trt's own words.

Every `.pt` / `.pth` file is read with ``torch.load(weights_only=True)``: the unpickler then
only rebuilds tensors and plain containers, so a file whose pickle would call a function
(``os.system``, ``print``, any class) is refused instead of executed. torch's own refusal
message recommends retrying with ``weights_only=False``, i.e. running the file's code; lisa-trt
never shows that advice. It names the refused object and offers safe ways forward instead.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

from .errors import CheckpointError

_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.<>]+)")


def refused_object(err: Exception) -> str | None:
    """The Python object a weights-only load refused to build (e.g. 'builtins.print'), if stated."""
    m = _GLOBAL.search(str(err))
    return m.group(1) if m else None


def refusal_message(path, err: Exception, what: str = "checkpoint") -> str:
    """Our explanation for a weights-only refusal of `path` (never suggests weights_only=False)."""
    obj = refused_object(err)
    named = f" (it asks for {obj})" if obj else ""
    return (f"refusing to load {what} {path}: the file's pickle would run code or build Python objects "
            f"other than tensors{named}, and lisa-trt only reads plain tensors from .pt files. Official "
            "checkpoints contain only tensors, so this file was made differently or has been "
            "tampered with. If you wrote it yourself, re-save just the weights (torch.save(model.state_dict(), "
            "path)) or convert them to .safetensors, then try again.")


def is_refusal(err: Exception) -> bool:
    """True when `err` is torch's weights-only refusal (as opposed to a corrupt / truncated file)."""
    return isinstance(err, pickle.UnpicklingError) and _GLOBAL.search(str(err)) is not None


def unreadable_message(path, err: Exception, what: str = "checkpoint") -> str:
    """A one-line reason for a file torch cannot read at all, without torch's advice paragraphs."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip() and "weights_only" not in ln]
    reason = lines[-1] if lines else type(err).__name__
    return (f"{path} is not a readable PyTorch {what}: neither a zip nor a legacy torch.save file, or "
            f"truncated (torch said: {type(err).__name__}: {reason[:200]}). lisa-trt reads .pt files holding "
            "weights (torch.save of a state dict), its own .safetensors, and Hugging Face model directories; check "
            "the path, or download the file again")


def safe_torch_load(path, what: str = "checkpoint", mmap: bool = False):
    """``torch.load(path, map_location="cpu", weights_only=True)`` with our error messages.

    mmap: map a zip-format file's tensors instead of reading them (pages are read as they are
    used; the legacy non-zip format, which cannot be mapped, is read as before).

    Raises:
        CheckpointError: missing file, refused pickle (names the object), or unreadable file.
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{what} not found: {path}")
    try:
        if mmap:
            import zipfile

            mmap = zipfile.is_zipfile(str(path))
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=bool(mmap))
    except pickle.UnpicklingError as e:
        if is_refusal(e):
            raise CheckpointError(refusal_message(path, e, what)) from None
        raise CheckpointError(unreadable_message(path, e, what)) from None
    except Exception as e:  # zip / EOF / runtime errors from a truncated or foreign file
        raise CheckpointError(unreadable_message(path, e, what)) from None
