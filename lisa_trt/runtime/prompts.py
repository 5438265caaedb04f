"""Prompt files for `lisa-trt run`: plain text (one class id or name per line) or JSONL.

JSONL lines: {"class": 3 | "coffee", "seed": 7, "cfg": 3.0} for c2i, or
{"caption": "a red car", ...} / {"caption_features": "path.safetensors|.npy", ...} for t2i.
t2i plain text: one caption per line (encoded with the T5 encoder; an empty line is an error).
Every line is checked before any work starts; all problems are reported with line numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ..errors import InputError
from ..models.family import family_of
from ..validation import sampling_problems

_KEYS = {"class", "caption", "caption_features", "seed", "cfg"}


@dataclass(frozen=True)
class Prompt:
    line: int
    class_id: Optional[int] = None
    caption_features: Optional[str] = None
    caption: Optional[str] = None
    seed: Optional[int] = None
    cfg: Optional[float] = None


def _class_id(value, num_classes: int, names: Optional[Sequence[str]]):
    if isinstance(value, bool):
        return None, f"class must be an id or a name, got {value!r}"
    if isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("-").isdigit()):
        i = int(value)
        if 0 <= i < num_classes:
            return i, None
        return None, f"unknown class id {i} (valid 0..{num_classes - 1})"
    if isinstance(value, str) and names and value.strip() in names:
        return list(names).index(value.strip()), None
    allowed = f"ids 0..{num_classes - 1}" + (f" or names {', '.join(names)}" if names else "")
    return None, f"unknown class {value!r} (use {allowed})"


def parse_prompts(path, *, model_type: str = "c2i", num_classes: int = 1000,
                  class_names: Optional[Sequence[str]] = None) -> list[Prompt]:
    """Parse and validate a prompts file.

    Raises:
        InputError listing every malformed line as 'path:LINE: problem'.
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"prompts file not found: {p}")
    lines = p.read_text().splitlines()
    fam = family_of(model_type)
    classes = fam.class_conditioned(model_type)
    jsonl = p.suffix in (".jsonl", ".json") or any(ln.lstrip().startswith("{") for ln in lines)
    if fam.prompted and not jsonl:  # text prompts: one caption per line ('#' lines and blank lines skipped)
        prompts = [Prompt(no, caption=ln.strip()) for no, ln in enumerate(lines, 1)
                   if ln.strip() and not ln.strip().startswith("#")]
        if not prompts:
            raise InputError(f"{p} holds no captions (one caption per line)")
        return prompts
    if model_type == "t2i" and not jsonl:  # a captions file: every line is one caption
        from ..text.encoder import read_captions

        return [Prompt(no, caption=c) for no, c in enumerate(read_captions(p), 1)]
    prompts, errors = [], []
    for no, raw in enumerate(lines, 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        if not jsonl:
            if not classes:
                errors.append(f"{p}:{no}: t2i prompts need JSONL lines with caption_features")
                continue
            cid, err = _class_id(text, num_classes, class_names)
            if err:
                errors.append(f"{p}:{no}: {err}")
            else:
                prompts.append(Prompt(no, class_id=cid))
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            errors.append(f"{p}:{no}: not valid JSON ({e.msg})")
            continue
        if not isinstance(obj, dict):
            errors.append(f"{p}:{no}: each JSONL line must be an object")
            continue
        extra = set(obj) - _KEYS
        if extra:
            errors.append(f"{p}:{no}: unknown keys {sorted(extra)} (allowed: {sorted(_KEYS)})")
            continue
        seed, cfg = obj.get("seed"), obj.get("cfg")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            errors.append(f"{p}:{no}: seed must be a non-negative integer, got {seed!r}")
            continue
        bad = sampling_problems(cfg_scale=cfg, names={"cfg_scale": "cfg"}) if cfg is not None else []
        if bad:
            errors.append(f"{p}:{no}: {bad[0]}")
            continue
        if classes:
            if "class" not in obj:
                errors.append(f"{p}:{no}: missing \"class\" (c2i model)")
                continue
            cid, err = _class_id(obj["class"], num_classes, class_names)
            if err:
                errors.append(f"{p}:{no}: {err}")
                continue
            prompts.append(Prompt(no, class_id=cid, seed=seed, cfg=cfg))
        else:
            feat, cap = obj.get("caption_features"), obj.get("caption")
            if cap is not None:
                if not isinstance(cap, str) or not cap.strip() or feat is not None:
                    errors.append(f"{p}:{no}: \"caption\" must be non-empty text (and not given with caption_features)")
                    continue
                prompts.append(Prompt(no, caption=cap.strip(), seed=seed, cfg=cfg))
                continue
            if not isinstance(feat, str):
                errors.append(f"{p}:{no}: missing \"caption\" text or \"caption_features\" path (t2i model)")
                continue
            fp = (p.parent / feat) if not Path(feat).is_absolute() else Path(feat)
            if not fp.is_file():
                errors.append(f"{p}:{no}: caption features file not found: {fp}")
                continue
            prompts.append(Prompt(no, caption_features=str(fp), seed=seed, cfg=cfg))
    if errors:
        shown = "\n  ".join(errors[:20]) + (f"\n  (+{len(errors) - 20} more)" if len(errors) > 20 else "")
        raise InputError(f"malformed prompts file ({len(errors)} problem(s)); nothing was generated:\n  {shown}")
    if not prompts:
        raise InputError(f"prompts file {p} has no prompts")
    return prompts


# ----------------------------------------------------------------------------- text prompts (prompted families)

def read_text_prompts(path) -> list[str]:
    """A captions file of a prompted family: one caption per line; blank lines and lines starting
    with '#' are skipped."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"captions file {p} does not exist")
    caps = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
    caps = [c for c in caps if c and not c.startswith("#")]
    if not caps:
        raise InputError(f"{p} holds no captions (one caption per line)")
    return caps


def caption_list(family, path=None, n: Optional[int] = None) -> list[str]:
    """Captions of `path` (read_text_prompts), else the family's `default_captions`, cycled to `n`."""
    caps = read_text_prompts(path) if path else list(family.default_captions)
    if not caps:
        raise InputError(f"{family.name} models need captions here: pass --captions-file FILE (one per line)")
    if n is not None:
        caps = (caps * (n // len(caps) + 1))[:n]
    return caps
