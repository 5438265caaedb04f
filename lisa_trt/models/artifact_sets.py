"""Named artifact sets: a model name (e.g. "demo") that stands for shipped, matching artifacts.

A set names its target and VQ (loaded through a provider module, imported only when used), its
bundled drafters and tables, the drafter / tables used by default, and optional extras the
provider offers (sampling defaults, class names, a quality scorer, measured tree budgets).
Every "is this the demo?" question in the CLI and runtime asks this registry instead:

    s = artifact_set(model)            # None for a checkpoint path
    drafter = drafter or (s and s.default_drafter)

A provider module defines `load_target(device)`, `load_vq(device)` and optionally
`demo_sampling()`, `class_names()`, `load_demo_scorer()` (see lisa_trt/demo/registry.py).
Floors: models (the provider is imported by name, so no import runs up a floor).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ASSETS = Path(__file__).resolve().parents[1] / "assets"


@dataclass(frozen=True)
class ArtifactSet:
    """One registered set (see the module docstring)."""

    name: str
    provider: str  # module path of the loaders
    drafters: dict = field(default_factory=dict)  # bundled drafter name -> file
    tables: dict = field(default_factory=dict)  # bundled tables name -> file
    default_drafter: Optional[str] = None
    default_tables: Optional[str] = None
    vq: Optional[str] = None  # the set's VQ name (load_vq resolves it), when it ships one

    def module(self):
        return importlib.import_module(self.provider)

    def load_target(self, device="cpu"):
        return self.module().load_target(device=device)

    def load_vq(self, device="cpu"):
        return self.module().load_vq(device=device)

    def extra(self, name: str, default=None):
        """An optional provider hook (e.g. "demo_sampling", "class_names"), or `default`."""
        return getattr(self.module(), name, default)


_SETS: dict[str, ArtifactSet] = {}


def register_artifact_set(s: ArtifactSet) -> ArtifactSet:
    _SETS[s.name] = s
    return s


def artifact_set(name) -> Optional[ArtifactSet]:
    """The set registered as `name`, or None (e.g. `name` is a file path)."""
    return _SETS.get(name) if isinstance(name, str) else None


def registered_names() -> list:
    """Every registered set's name ("demo", ...), sorted (`--model dmeo`: did you mean demo)."""
    return sorted(_SETS)


def bundled_file(name: str, kind: str) -> Optional[Path]:
    """The file of a bundled drafter / tables `name` in any set ("drafters" | "tables"), else None."""
    for s in _SETS.values():
        table = getattr(s, kind)
        if name in table:
            return table[name]
    return None


def bundled_names(kind: str) -> list:
    return [n for s in _SETS.values() for n in getattr(s, kind)]


_DEMO = ASSETS / "demo"
register_artifact_set(ArtifactSet(
    "demo", "lisa_trt.demo.registry",
    drafters={"demo-lisa": _DEMO / "drafter_lisa.safetensors", "demo-eagle3": _DEMO / "drafter_eagle3.safetensors",
              "demo-medusa-lisa": _DEMO / "medusa_lisa.safetensors"},
    tables={"demo": _DEMO / "tables.safetensors"}, default_drafter="demo-lisa", default_tables="demo", vq="demo"))



def did_you_mean(path) -> str:
    """'; did you mean 'demo' (a bundled model)?' for a bare name (no suffix, no folder) close to a
    registered set's name (e.g. 'dmeo'), else ''."""
    import difflib

    name = str(path)
    if Path(name).suffix or "/" in name or "\\" in name:
        return ""
    close = difflib.get_close_matches(name, registered_names(), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r} (a bundled model)?" if close else ""


__all__ = ["ArtifactSet", "artifact_set", "bundled_file", "bundled_names", "did_you_mean", "register_artifact_set", "registered_names"]
