"""Old names of the Chameleon-family tables, kept for the callers that still import them.

Calibration is one driver for every family (calibration/profile.py `calibrate` over the request's
SequenceLayout, whose `sub_vocab` is the image-code sub-vocabulary); binding and loading are
calibration/tables.py `tables_for` / `load_tables_for` with that SubVocab
(models/families/chameleon ChameleonFamily.sub_vocab). New code uses those directly.
"""

from __future__ import annotations

from ..models.families.chameleon import CHAMELEON
from .tables import GASVTables, load_tables_for


class CodeVocab:
    """`CodeVocab.for_target(target, newline)`: the family's SubVocab (code_ids, codes, K, lut, back)."""

    @staticmethod
    def for_target(target, newline: int):
        return CHAMELEON.sub_vocab(target, newline)


def load_chameleon_tables(path, target, newline: int) -> GASVTables:
    """Tables for this target's image codes (hash checked), bound to the head's code rows."""
    return load_tables_for(path, target, CHAMELEON.sub_vocab(target, newline))
