"""The stored catalogue (lisa_trt/assets/cli_catalogue.json), read without torch: the registries'
names that the option factories (options.py) and `lisa-trt --help` show.

catalogue.py writes it from the registries and loads the commands; this module only reads it, so
the commands (which read it through options.py) import nothing that imports them back.
"""

from __future__ import annotations

import json
from pathlib import Path

FILE = Path(__file__).resolve().parents[1] / "assets" / "cli_catalogue.json"

_SNAPSHOT: dict = {}  # catalogue.write fills it while regenerating (the commands' options read it)


def snapshot() -> dict:
    """The stored catalogue (no torch), read once."""
    if not _SNAPSHOT:
        _SNAPSHOT.update(json.loads(FILE.read_text()))
    return _SNAPSHOT


def hold(data: dict) -> None:
    """Make `data` what snapshot() answers (catalogue.write, before its commands read their options)."""
    _SNAPSHOT.clear()
    _SNAPSHOT.update(data)


__all__ = ["FILE", "hold", "snapshot"]
