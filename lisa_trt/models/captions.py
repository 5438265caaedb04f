"""Caption features: the generic plumbing of every family conditioned on `CaptionFeatures`.

A caption-conditioned family brings its own text encoder as a plug-in of its package (the module
`ModelFamily.captions_module` names, found by the name `captions`; LlamaGen's FLAN-T5 encoder is
families/llamagen/captions.py). What every such family shares lives here: caption text files,
feature files (`caption_features` (N, L, C) + `caption_mask` (N, L), valid tokens first, as
`lisa-trt encode-captions` writes them), the target's caption shape, and the one way to reach a
family's encoder (`caption_encoder`, through the family's `captions` plug-in that the family object
imports once and holds, `ModelFamily.captions`, never a static import).

Every check (caption file, feature shape, the encoder's own directory checks) runs before any
model is loaded, so a bad input fails in milliseconds with the fix in the message.

Floors: models (imports only core modules and models/; the family object holds its plug-in).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import torch

from ..errors import InputError
from ..io import load_safetensors, save_safetensors
from .conditioning import CaptionFeatures
from .family import families, family_of


# ----------------------------------------------------------------------------- caption files

def read_captions(path) -> list[str]:
    """One caption per line (UTF-8). Every line counts: an empty or blank line is an error
    (it would silently become the empty caption), reported with its line number."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"captions file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{p} is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8, one caption per line")
    lines = text.splitlines()
    empty = [i for i, ln in enumerate(lines, 1) if not ln.strip()]
    if empty:
        shown = ", ".join(map(str, empty[:20])) + (f" (+{len(empty) - 20} more)" if len(empty) > 20 else "")
        raise InputError(f"{p}: empty caption on line(s) {shown}; every line must hold one caption "
                         "(delete the empty lines); nothing was encoded")
    if not lines:
        raise InputError(f"captions file {p} is empty; write one caption per line")
    return [ln.strip() for ln in lines]


def is_feature_file(path) -> bool:
    return Path(path).suffix.lower() in (".safetensors", ".npy")


# ----------------------------------------------------------------------------- feature files

def save_caption_features(path, features: torch.Tensor, mask: torch.Tensor, captions: Optional[Sequence[str]] = None,
                          meta: Optional[dict] = None, dtype: str = "float32") -> None:
    """Write `caption_features` (N, L, C) + `caption_mask` (N, L) (valid tokens first) atomically;
    the captions and the encoder fingerprint go into the header metadata."""
    md = dict(meta or {})
    md["kind"] = "lisa-trt/caption-features"
    if captions is not None:
        md["captions"] = list(captions)
    save_safetensors({"caption_features": features.to(getattr(torch, dtype)).contiguous(),
                      "caption_mask": mask.to(torch.bool).contiguous()}, path, metadata=md)


def load_caption_features(path, tcfg=None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Read a feature file -> (features float32 (N, L, C), mask bool (N, L), metadata).

    Formats: .safetensors with `caption_features` and `caption_mask` (as `encode-captions`
    writes), or .npy features with an optional sibling `<name>_mask.npy`. With `tcfg` the
    shape is checked against the target (caption_shape: L slots, C wide).
    """
    import numpy as np

    p = Path(path)
    if not p.is_file():
        raise InputError(f"caption features file not found: {p}")
    meta: dict = {}
    if p.suffix.lower() == ".safetensors":
        t, meta = load_safetensors(p)
        if "caption_features" not in t:
            raise InputError(f"{p} must hold 'caption_features' (N, L, C) and 'caption_mask' (N, L); "
                             "make it with `lisa-trt encode-captions`")
        feats = t["caption_features"]
        mask = t.get("caption_mask")
    elif p.suffix.lower() == ".npy":
        feats = torch.from_numpy(np.load(p, allow_pickle=False))
        mp = p.with_name(p.stem + "_mask.npy")
        mask = torch.from_numpy(np.load(mp, allow_pickle=False)) if mp.exists() else None
    else:
        raise InputError(f"caption features must be .safetensors or .npy, got {p.name}")
    if feats.dim() == 2:
        feats = feats[None]
        mask = None if mask is None else mask.reshape(1, -1)
    if mask is None:
        mask = torch.ones(feats.shape[:2], dtype=torch.bool)
    feats, mask = feats.float(), mask.to(torch.bool)
    if feats.dim() != 3 or tuple(mask.shape) != tuple(feats.shape[:2]):
        raise InputError(f"{p}: features {tuple(feats.shape)} / mask {tuple(mask.shape)}; expected (N, L, C) / (N, L)")
    if tcfg is not None:
        want = caption_shape(tcfg)
        if tuple(feats.shape[1:]) != want:
            h = encoder_hint(family_of(tcfg))
            raise InputError(f"{p}: caption features are (N, {feats.shape[1]}, {feats.shape[2]}); this target needs "
                             f"(N, {want[0]}, {want[1]}) (encode with --max-length {want[0]} and a "
                             f"{want[1]}-wide {h['name']} encoder: {h['dir']})")
    return feats, mask, meta


# ----------------------------------------------------------------------------- the target and its family's encoder

def caption_shape(tcfg) -> tuple[int, int]:
    """(slots L, width C) of the caption features that condition `tcfg`'s targets (its family
    answers); InputError for a target whose conditions are not captions."""
    c = family_of(tcfg).conditioning(tcfg)
    # A guard, not a branch: the callers (feature files, the training data of train/, a family's
    # encoder checking its target) sit below the runtime's per-kind adapters and may be handed a
    # target of another kind; a method on the kinds would be the capability flag
    # tests/runtime/test_conditions.py keeps out.
    if not isinstance(c, CaptionFeatures):
        raise InputError(f"captions condition text-to-image targets only; this {tcfg.model_type!r} target takes "
                         "other conditions (class ids: pass class ids; token-id prompts: pass prompts)")
    return c.slots, c.width


def caption_encoder(family, encoder_dir=None, *, required: bool = True, **options):
    """`family`'s caption encoder for `encoder_dir` (its plug-in's `caption_encoder(encoder_dir,
    required=, **options)`): an object with `encode(captions) -> (features, mask)`,
    `check_target(cfg)`, `dir`, `fingerprint`, `dim`, `max_length`, `dtype` and `preprocess`.
    The plug-in checks the directory and the options here; nothing loads before the first encode.

    required=False: None when no directory is given or configured (then only feature files work).
    InputError naming the families that have one when `family` has no caption encoder."""
    plugin = family.captions
    if plugin is None:
        have = ", ".join(f.name for f in families() if f.captions_module) or "none"
        raise InputError(f"the {family.name} family has no caption encoder (no `captions` plug-in in its package, "
                         f"ModelFamily.captions_module): its targets are not conditioned on caption features; "
                         f"families with one: {have}")
    return plugin.caption_encoder(encoder_dir, required=required, **options)


def encoder_hint(family) -> dict:
    """How a user gives `family`'s caption encoder, for the generic messages: {"name" (what its
    features are called, e.g. "T5"), "dir" (what --encoder DIR is), "env" (the variable that names a
    default directory)}, from its `captions` plug-in's ENCODER_HINT; a neutral wording without one."""
    plugin = family.captions if getattr(family, "captions_module", None) else None
    hint = getattr(plugin, "ENCODER_HINT", None)
    return {"name": "text-encoder", "dir": "the family's caption encoder directory", "env": None, **(hint or {})}


def encoder_fix(family, *, cli: bool = True) -> str:
    """The clause naming how to give `family`'s caption encoder: "pass --encoder DIR (a local
    flan-t5-xl directory) or set $LISA_TRT_TEXT_ENCODER" for LlamaGen (cli=False: text_encoder=DIR)."""
    h = encoder_hint(family)
    arg = "--encoder DIR" if cli else "text_encoder=DIR (CLI: --encoder DIR)"
    return f"pass {arg} ({h['dir']})" + (f" or set ${h['env']}" if h["env"] else "")


def caption_family(name: Optional[str] = None):
    """The family whose caption encoder `lisa-trt encode-captions` uses: the one named `name`
    (it must have a caption encoder), else the one family that has one. InputError naming the
    families that have one (and --family when there are several)."""
    have = [f for f in families() if f.captions_module]
    names = ", ".join(f.name for f in have) or "none"
    if name is not None:
        fam = next((f for f in families() if f.name == name), None)
        if fam is None:
            raise InputError(f"unknown family {name!r}; registered: {', '.join(f.name for f in families())} "
                             f"(families with a caption encoder: {names})")
        if fam.captions_module is None:
            caption_encoder(fam)  # raises naming the families that have one
        return fam
    if len(have) != 1:
        raise InputError(f"{len(have)} registered families have a caption encoder ({names}); "
                         + ("name one with --family NAME" if have else "add a `captions` plug-in to a family's package"))
    return have[0]


# ----------------------------------------------------------------------------- one entry point

def caption_conds(source, tcfg, *, encoder=None, encoder_dir=None, device="cpu",
                  progress: bool = False) -> tuple[torch.Tensor, torch.Tensor, list]:
    """Conditions for a caption target from `source`: a captions text file (needs an encoder, or
    encoder_dir for its family's, e.g. $LISA_TRT_TEXT_ENCODER for LlamaGen's), a list of caption
    strings, or a feature file.

    All checks happen before the encoder is loaded. Returns (features, mask, captions or []).
    """
    slots, _ = caption_shape(tcfg)
    if isinstance(source, (list, tuple)):
        captions = list(source)
    elif is_feature_file(source):
        feats, mask, meta = load_caption_features(source, tcfg)
        return feats, mask, list(meta.get("captions") or [])
    else:
        captions = read_captions(source)
    if encoder is None:
        encoder = caption_encoder(family_of(tcfg), encoder_dir, device=device, max_length=slots)
    encoder.check_target(tcfg)
    feats, mask = encoder.encode(captions, progress=progress)
    return feats, mask, captions


def cycle_conds(cond: tuple, n: int) -> tuple:
    """Repeat (features, mask) rows cyclically to n rows."""
    feats, mask = cond
    idx = torch.arange(n) % feats.shape[0]
    return feats[idx], mask[idx]


class GuidedCaptions(tuple):
    """A caption condition (features (B, L, C), mask (B, L)) whose classifier-free guidance has
    unconditional rows of its own: `null` = (features, mask) of each row's negative caption,
    encoded by the same caption encoder, and `negative` (B,) bool, the rows that have one (the
    others keep the target's learned null caption). It unpacks and indexes as the plain pair; the
    family's null_cond takes the `null` rows (families/llamagen); `rows(a, b)` slices all of it.
    Made by text/prompts.with_negative_captions (Pipeline.generate's negative_prompt)."""

    def __new__(cls, feats: torch.Tensor, mask: torch.Tensor, null: tuple, negative: torch.Tensor):
        obj = super().__new__(cls, (feats, mask))
        obj.null, obj.negative = tuple(null), negative
        return obj

    def rows(self, a: int, b: int) -> "GuidedCaptions":
        return GuidedCaptions(self[0][a:b], self[1][a:b], tuple(t[a:b] for t in self.null), self.negative[a:b])
