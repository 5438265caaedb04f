"""Class names of class-conditioned bundles, and how a name becomes a class id.

A bundle's own names (`generation["class_names"]`, e.g. the demo's) come first; a 1000-class
bundle without names (LlamaGen's ImageNet c2i models) takes the ILSVRC-2012 names shipped in
lisa_trt/assets/imagenet/ilsvrc2012_classes.json (index = class id; its `source` field says where
the list comes from). A name matches case-insensitively, with "_" and " " the same
("Golden_Retriever" is "golden retriever"); a name two classes share (ImageNet's "crane", bird and
machine) is refused listing their ids; an unknown one lists the closest names.

Torch-free: the OpenAI front end (a process with no model) lists the names in GET /v1/models.
"""

from __future__ import annotations

import difflib
import functools
import json
from pathlib import Path
from typing import Optional, Sequence

IMAGENET_CLASSES = 1000
_FILE = Path(__file__).resolve().parents[1] / "assets" / "imagenet" / "ilsvrc2012_classes.json"
_LIST_ALL = 20  # lists of at most this many names are spelled out in an error; longer: close matches


@functools.lru_cache(maxsize=1)
def imagenet_class_names() -> tuple:
    """The 1000 ILSVRC-2012 class names, index = class id."""
    names = tuple(json.loads(_FILE.read_text())["names"])
    assert len(names) == IMAGENET_CLASSES, f"{_FILE} lists {len(names)} names"
    return names


def bundle_class_names(names: Optional[Sequence[str]], num_classes: int) -> Optional[list]:
    """The names a class-conditioned bundle answers to: its own, else ImageNet's for 1000 classes."""
    if names:
        return list(names)
    return list(imagenet_class_names()) if int(num_classes or 0) == IMAGENET_CLASSES else None


def _key(name: str) -> str:
    return " ".join(str(name).replace("_", " ").split()).casefold()


def match_class_name(value: str, names: Sequence[str]) -> tuple[Optional[int], Optional[str]]:
    """(class id, None) for a name of `names` (exact, else case- and "_"-insensitive), else
    (None, the problem): ambiguous (the ids that share it) or unknown (None when `names` is short
    enough to be listed by the caller, else the closest names with their ids)."""
    text = str(value).strip()
    if text in names:
        hits = [i for i, n in enumerate(names) if n == text]
    else:
        hits = [i for i, n in enumerate(names) if _key(n) == _key(text)]
    if len(hits) == 1:
        return hits[0], None
    if hits:
        ids = ", ".join(str(i) for i in hits)
        return None, f"class name {text!r} is ambiguous: classes {ids} share it; send the class id"
    if len(names) <= _LIST_ALL:
        return None, None
    keys = [_key(n) for n in names]
    close = difflib.get_close_matches(_key(text), keys, n=5, cutoff=0.6)
    near = ", ".join(f"{names[keys.index(k)]!r} ({keys.index(k)})" for k in close)
    return None, f"unknown class {text!r}" + (f"; close matches: {near}" if near else "")


__all__ = ["IMAGENET_CLASSES", "bundle_class_names", "imagenet_class_names", "match_class_name"]
