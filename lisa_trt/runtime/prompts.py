"""Prompt files for `lisa-trt run`: plain text (one class id or name per line) or JSONL.

JSONL lines: {"class": 3 | "coffee", "seed": 7, "cfg": 3.0} for c2i, or
{"caption": "a red car", ...} / {"caption_features": "path.safetensors|.npy", ...} for t2i.
t2i plain text: one caption per line (encoded with the T5 encoder; an empty line is an error).
Every line is checked before any work starts; all problems are reported with line numbers.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ..errors import InputError
from ..validation import sampling_problems
from .class_names import bundle_class_names, match_class_name

_KEYS = {"class", "caption", "caption_features", "seed", "cfg"}


@dataclass(frozen=True)
class Prompt:
    line: int
    class_id: Optional[int] = None
    caption_features: Optional[str] = None
    caption: Optional[str] = None
    seed: Optional[int] = None
    cfg: Optional[float] = None


class _LineError(ValueError):
    """One line's problem; reported as 'path:LINE: problem' with every other line's."""


@dataclass(frozen=True)
class _Classes:
    """What a class label may be: an id in 0..num_classes-1, or one of `names`."""

    num_classes: int
    names: Optional[Sequence[str]]

    def parse(self, value) -> int:
        if isinstance(value, bool):
            raise _LineError(f"class must be an id or a name, got {value!r}")
        if isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("-").isdigit()):
            i = int(value)
            if 0 <= i < self.num_classes:
                return i
            raise _LineError(f"unknown class id {i} (valid 0..{self.num_classes - 1})")
        problem = None
        if isinstance(value, str) and self.names:
            cid, problem = match_class_name(value, self.names)
            if cid is not None:
                return cid
        if problem is not None:  # ambiguous, or unknown among many names (the closest listed)
            raise _LineError(f"{problem} (ids 0..{self.num_classes - 1})")
        allowed = f"ids 0..{self.num_classes - 1}" + (f" or names {', '.join(self.names)}" if self.names else "")
        raise _LineError(f"unknown class {value!r} (use {allowed})")


def parse_classes(text: str, num_classes: int, names=None) -> list[int]:
    """'1,2,Golden_Retriever' -> ids: each an id, or a class name matched as every prompt's is
    (`_Classes`: runtime/class_names.match_class_name, case- and "_"-insensitive; a 1000-class model
    without names of its own answers to ImageNet's). InputError naming the bad entry and what is allowed."""
    classes = _Classes(num_classes, bundle_class_names(names, num_classes))
    ids = []
    for tok in [t.strip() for t in text.split(",") if t.strip()]:
        try:
            ids.append(classes.parse(tok))
        except _LineError as e:
            raise InputError(f"--classes: {e}") from None
    if not ids:
        raise InputError("no classes given; pass e.g. --classes 0,1,2")
    return ids


def class_names_of(model) -> Optional[list]:
    """The class names an artifact set ships (e.g. the demo's), else None."""
    from ..models.artifact_sets import artifact_set

    aset = artifact_set(model)
    fn = aset.extra("class_names") if aset is not None else None
    return list(fn()) if fn is not None else None


def _class_id(value, num_classes: int, names: Optional[Sequence[str]]):
    """(class id, None) for an id or name `value`, else (None, the problem)."""
    try:
        return _Classes(num_classes, names).parse(value), None
    except _LineError as e:
        return None, str(e)


def parse_prompts(path, *, num_classes: Optional[int] = None, class_names: Optional[Sequence[str]] = None,
                  captions: Optional[str] = None) -> list[Prompt]:
    """Parse and validate a prompts file in one kind's line format (the run's conditions adapter,
    runtime/conditions.py `parse_file`, says which): class prompts (`num_classes`, with the
    bundle's `class_names`), or captions (`captions="every-line"`: every plain line one caption,
    an empty line an error, as a caption encoder reads them; `"lines"`: one text per non-blank,
    non-'#' line). JSONL files (.jsonl / .json, or every line an object) hold objects; a file of
    plain lines with objects among them is refused, naming the line (`_is_jsonl`).

    Raises:
        InputError listing every malformed line as 'path:LINE: problem'.
    """
    if (num_classes is None) == (captions is None) or captions not in (None, "every-line", "lines"):
        raise ValueError("parse_prompts takes num_classes (class prompts) or captions='every-line' | 'lines'")
    p = Path(path)
    if not p.is_file():
        raise InputError(f"prompts file not found: {p}")
    lines = p.read_text().splitlines()
    jsonl = _is_jsonl(p, lines)
    if not jsonl and captions is not None:  # text conditions (captions, text prompts): one per line
        return _caption_file(p, lines, every_line=captions == "every-line")
    classes = _Classes(num_classes, class_names) if captions is None else None
    parse_line = _line_parser(p, jsonl, classes)
    prompts, errors = [], []
    for no, text in _content_lines(lines):
        try:
            prompts.append(parse_line(no, text))
        except _LineError as e:
            errors.append(f"{p}:{no}: {e}")
    _raise_problems(p, prompts, errors)
    return prompts


def _is_jsonl(p: Path, lines) -> bool:
    """The file's one kind, from its name (.jsonl / .json) or its content: every line an object
    (JSONL) or none (plain). A mix is refused naming the first line of the fewer kind (one JSON
    line among plain ones read the whole file as JSONL before)."""
    if p.suffix in (".jsonl", ".json"):
        return True
    objs, plain = [], []
    for no, text in _content_lines(lines):
        (objs if text.startswith("{") else plain).append(no)
    if objs and plain:
        odd, kind, other = (objs[0], "a JSON object", "plain text") if len(objs) <= len(plain) else \
            (plain[0], "a plain-text line", "JSON objects")
        raise InputError(f"{p}:{odd}: {kind} among {other} ({len(objs)} JSON line(s), {len(plain)} plain): a "
                         "prompts file is either JSONL (every line an object, or a .jsonl name) or plain text (one "
                         "prompt per line); write every line the same way")
    return bool(objs)


def _content_lines(lines):
    """(line number, stripped text) of every line that is neither blank nor a '#' comment."""
    for no, raw in enumerate(lines, 1):
        text = raw.strip()
        if text and not text.startswith("#"):
            yield no, text


def _caption_file(p: Path, lines, *, every_line: bool) -> list[Prompt]:
    """A plain-text file of captions: a text-prompt family's prompts ('#' lines and blank lines
    skipped), or a caption encoder's captions (`every_line`: every line is one caption)."""
    if every_line:
        from ..models.captions import read_captions

        return [Prompt(no, caption=c) for no, c in enumerate(read_captions(p), 1)]
    prompts = [Prompt(no, caption=text) for no, text in _content_lines(lines)]
    if not prompts:
        raise InputError(f"{p} holds no captions (one caption per line)")
    return prompts


def _line_parser(p: Path, jsonl: bool, classes: Optional[_Classes]):
    """(line number, text) -> Prompt for this file's kind of line; raises _LineError."""
    if jsonl:
        condition = functools.partial(_json_class, classes) if classes else functools.partial(_json_caption, p)
        return functools.partial(_json_line, condition)
    return lambda no, text: Prompt(no, class_id=classes.parse(text))


def _json_line(condition, no: int, text: str) -> Prompt:
    """A JSONL object: its shared keys (seed, cfg) checked here, its condition by `condition`."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise _LineError(f"not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise _LineError("each JSONL line must be an object")
    extra = set(obj) - _KEYS
    if extra:
        raise _LineError(f"unknown keys {sorted(extra)} (allowed: {sorted(_KEYS)})")
    seed, cfg = obj.get("seed"), obj.get("cfg")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise _LineError(f"seed must be a non-negative integer, got {seed!r}")
    bad = sampling_problems(cfg_scale=cfg, names={"cfg_scale": "cfg"}) if cfg is not None else []
    if bad:
        raise _LineError(bad[0])
    return Prompt(no, seed=seed, cfg=cfg, **condition(obj))


def _json_class(classes: _Classes, obj: dict) -> dict:
    if "class" not in obj:
        raise _LineError("missing \"class\" (c2i model)")
    return {"class_id": classes.parse(obj["class"])}


def _json_caption(p: Path, obj: dict) -> dict:
    """A t2i condition: caption text, or a features file (relative to the prompts file)."""
    feat, cap = obj.get("caption_features"), obj.get("caption")
    if cap is not None:
        if not isinstance(cap, str) or not cap.strip() or feat is not None:
            raise _LineError("\"caption\" must be non-empty text (and not given with caption_features)")
        return {"caption": cap.strip()}
    if not isinstance(feat, str):
        raise _LineError("missing \"caption\" text or \"caption_features\" path (t2i model)")
    fp = (p.parent / feat) if not Path(feat).is_absolute() else Path(feat)
    if not fp.is_file():
        raise _LineError(f"caption features file not found: {fp}")
    return {"caption_features": str(fp)}


def _raise_problems(p: Path, prompts: list, errors: list[str]) -> None:
    if errors:
        shown = "\n  ".join(errors[:20]) + (f"\n  (+{len(errors) - 20} more)" if len(errors) > 20 else "")
        raise InputError(f"malformed prompts file ({len(errors)} problem(s)); nothing was generated:\n  {shown}")
    if not prompts:
        raise InputError(f"prompts file {p} has no prompts")


# ----------------------------------------------------------------------------- text prompts (prompted families)

def read_text_prompts(path) -> list[str]:
    """A captions file of a prompted family: one caption per line; blank lines and lines starting
    with '#' are skipped."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"captions file {p} does not exist")
    caps = [text for _, text in _content_lines(p.read_text(encoding="utf-8").splitlines())]
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
