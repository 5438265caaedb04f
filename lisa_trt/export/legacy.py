"""Engine directories written by an older lisa-trt, read as current ones: the one place that knows
an older manifest (bundles already on disk keep opening).

- A manifest without the `family` field (`unnamed_manifest_family`): the family that wrote that
  manifest file (a family's legacy file, `ExportFamily.legacy_manifests`, e.g. Chameleon's
  `chameleon_engine.json`), else the family whose manifest.json files predate the field
  (`ExportFamily.unnamed_manifest`: LlamaGen's).
- A directory whose manifest is a family's legacy file (`legacy_manifest_path`): read by
  export/manifest.manifest_path, raw_manifest and bundle_family.
- Fields a manifest gained later (`weights`, `export`, `layout`, `engines`, the drafter's `arch`,
  the target's `prefill_ids`) read as their empty defaults (export/manifest.Manifest.from_dict).

Graphs a bundle was exported without are added by export/upgrade.add_graphs (it writes the
bundle, so it lives beside the exporter; this module only reads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import ConfigError


def legacy_manifest_files() -> tuple:
    """Manifest file names families wrote before manifest.json (ExportFamily.legacy_manifests)."""
    from .families import export_families

    return tuple(n for f in export_families() for n in f.legacy_manifests)


def legacy_manifest_path(engine_dir) -> Optional[Path]:
    """The legacy manifest file an engine directory holds (a family's, before manifest.json), or None."""
    d = Path(engine_dir)
    for name in legacy_manifest_files():
        if (d / name).is_file():
            return d / name
    return None


def unnamed_manifest_family(file_name: str) -> str:
    """The family of a manifest without a `family` field, from its file name: the family that wrote
    that legacy file, else the family whose manifests predate the field (`unnamed_manifest`)."""
    from .families import export_families

    fams = export_families()
    for f in fams:
        if file_name in f.legacy_manifests:
            return f.name
    for f in fams:
        if f.unnamed_manifest:
            return f.name
    raise ConfigError(f"{file_name} names no family and no export family claims unnamed manifests; re-export it")


def record_family(record: dict, file_name: str) -> str:
    """The family of a raw manifest record read from `file_name`: its `family` field, or for a
    manifest written before the field, unnamed_manifest_family(file_name)."""
    fam = record.get("family")
    return str(fam) if fam else unnamed_manifest_family(file_name)


__all__ = ["legacy_manifest_files", "legacy_manifest_path", "record_family", "unnamed_manifest_family"]
