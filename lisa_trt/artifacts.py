"""Name -> artifact resolution: `demo`, `demo-lisa`, `demo-eagle3` and bundled tables, or paths.

Every artifact is checked against the target it is used with (hash of output.weight): drafters
by models/drafter.load_drafter, tables by calibration.tables.check_tables.
"""

from __future__ import annotations

from pathlib import Path

from .errors import CheckpointError, InputError

ASSETS = Path(__file__).resolve().parent / "assets" / "demo"
BUNDLED_DRAFTERS = {"demo-lisa": ASSETS / "drafter_lisa.safetensors",
                    "demo-eagle3": ASSETS / "drafter_eagle3.safetensors",
                    "demo-medusa-lisa": ASSETS / "medusa_lisa.safetensors"}
BUNDLED_TABLES = {"demo": ASSETS / "tables.safetensors"}
_RECIPE = "scripts/demo/train_drafters.sh and scripts/demo/calibrate.sh rebuild them"


def _bundled(name: str, table: dict, kind: str) -> Path:
    path = table[name]
    if not path.is_file():
        raise CheckpointError(f"bundled {kind} {name!r} is missing ({path}); {_RECIPE}")
    return path


def load_target_by_name(model: str, config=None):
    from .models.checkpoints import load_target

    return load_target(model, config)


def load_drafter_by_name(name: str, target):
    """A drafter file path or a bundled name (demo-lisa, demo-eagle3, demo-medusa-lisa), refused
    if made for another target. Medusa artifacts load as MedusaHeads (speculative/medusa.py)."""
    from .models.drafter import load_drafter
    from .models.medusa import is_medusa_file, load_medusa

    path = _bundled(name, BUNDLED_DRAFTERS, "drafter") if name in BUNDLED_DRAFTERS else Path(name)
    if not path.is_file():
        raise InputError(f"drafter {name!r} not found; pass a .safetensors made by `lisa-trt train` "
                         f"or one of {', '.join(BUNDLED_DRAFTERS)}")
    if is_medusa_file(path):
        return load_medusa(path, target).eval()
    return load_drafter(path, target).eval()


def load_tables_by_name(name: str, target):
    """Calibration tables (path or 'demo') bound to the target's head, checked against it."""
    from .calibration.tables import check_tables, load_tables
    from .models.checkpoints import target_hash

    path = _bundled(name, BUNDLED_TABLES, "tables") if name in BUNDLED_TABLES else Path(name)
    if not path.is_file():
        raise InputError(f"tables {name!r} not found; make them with `lisa-trt calibrate`")
    tables = load_tables(path)
    check_tables(tables, target_hash(target), target.config.vocab_size)
    return tables.bind(target.output.weight)


def default_drafter(model: str):
    return "demo-lisa" if model == "demo" else None


def default_tables(model: str):
    return "demo" if model == "demo" else None
