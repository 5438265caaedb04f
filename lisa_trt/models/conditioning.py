"""What a target is conditioned on: one object per kind, answered by the target's family.

    cond = family_of(cfg).conditioning(cfg)
    ClassLabels(num_classes)        # class ids (LlamaGen c2i)
    CaptionFeatures(slots, width)   # text-encoder caption features (LlamaGen t2i: FLAN-T5)
    TextPrompts(negative)           # text encoded by the family's prompter (Chameleon, Janus, Emu3)

The generic layers read these objects (their fields and `random`), and each layer that acts per
kind keeps one table of per-kind objects, picked by `for_kind` (the runtime's adapters,
runtime/conditions.py `_ADAPTERS`; training's data sources, train/data.py `_KIND_DATA`); nothing
outside the families asks which family it runs, and no code outside those tables asks which kind
it has. `cfg` may also be a bare model_type string (a prompts file parsed before any model
loads): then the sizes are None.

Floors: models (imports only core modules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import InputError  # no torch at import: serve's CLI reads these before any model loads


class Conditioning:
    """A conditioning kind; subclasses are frozen dataclasses."""

    kind = "?"

    def random(self, n: int, generator=None):
        """`n` random conditions (calibration rollouts without given ones); InputError naming what
        to pass when this kind cannot be drawn at random."""
        raise InputError(f"{self.kind} conditions cannot be drawn at random: {self.what_to_pass}")

    what_to_pass = "pass the conditions"


@dataclass(frozen=True)
class ClassLabels(Conditioning):
    """Class ids in 0..num_classes-1 (names through the bundle's label list)."""

    num_classes: Optional[int] = None
    kind = "class"

    def random(self, n: int, generator=None):
        """(n,) LongTensor of class ids in 0..num_classes-1 (never the null id)."""
        import torch

        if not self.num_classes:
            raise InputError("the number of classes is unknown here; load the target first")
        return torch.randint(0, self.num_classes, (n,), generator=generator)


@dataclass(frozen=True)
class CaptionFeatures(Conditioning):
    """(slots L, width C) caption features of a text encoder, with a validity mask."""

    slots: Optional[int] = None
    width: Optional[int] = None
    kind = "caption"
    what_to_pass = ("t2i targets take caption features: conds=(features, mask); CLI: --captions CAPTIONS.txt "
                    "--encoder DIR (the family's caption encoder), or a .safetensors from `lisa-trt encode-captions`")


@dataclass(frozen=True)
class TextPrompts(Conditioning):
    """Text prompts the family's `prompter` encodes into a Request (its own layout and VQ grid;
    the family's `default_captions` when a command needs prompts and none are given).

    negative: the prompter's `encode(..., negative=TEXTS)` builds CFG's unconditional rows from
    negative texts (one per prompt, encoded by the same prompter) instead of its own."""

    negative: bool = False
    kind = "text"
    what_to_pass = "pass its prompts: the Request of the family's prompter (CLI: --prompt TEXT or a captions file)"


def for_kind(kind: Conditioning, table: dict, where: str):
    """The entry of `table` ({kind class: per-kind object}) for `kind`: the one place a layer asks
    which kind it has; InputError naming the valid kinds for a kind the table does not know."""
    for cls, entry in table.items():
        if isinstance(kind, cls):
            return entry
    raise InputError(f"unknown conditioning {type(kind).__name__} for {where}; valid: "
                     f"{', '.join(c.__name__ for c in table)} (models/conditioning.py)")
