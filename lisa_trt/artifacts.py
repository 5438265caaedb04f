"""Name -> artifact resolution: bundled drafters / tables of the registered artifact sets
(models/artifact_sets.py: `demo-lisa`, `demo-eagle3`, `demo`), or paths.

Every artifact is checked against the target it is used with (hash of output.weight): drafters
by models/drafter.load_drafter, tables by calibration.tables.check_tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .errors import CheckpointError, InputError
from .models.artifact_sets import artifact_set, bundled_file, bundled_names

_RECIPE = "scripts/demo/train_drafters.sh and scripts/demo/calibrate.sh rebuild them"


def _bundled(name: str, kind: str) -> Optional[Path]:
    path = bundled_file(name, kind)
    if path is not None and not path.is_file():
        raise CheckpointError(f"bundled {kind[:-1]} {name!r} is missing ({path}); {_RECIPE}")
    return path


def load_drafter_by_name(name: str, target):
    """A drafter file path or a bundled name (demo-lisa, demo-eagle3, demo-medusa-lisa), refused
    if made for another target. Medusa artifacts load as MedusaHeads (speculative/medusa.py)."""
    from .models.drafter import load_drafter
    from .models.medusa import is_medusa_file, load_medusa

    path = _bundled(name, "drafters") or Path(name)
    if not path.is_file():
        raise InputError(f"drafter {name!r} not found; pass a .safetensors made by `lisa-trt train` "
                         f"or one of {', '.join(bundled_names('drafters'))}")
    if is_medusa_file(path):
        return load_medusa(path, target).eval()
    return load_drafter(path, target).eval()


def load_tables_by_name(name: str, target, sub_vocab=None):
    """Calibration tables (path or 'demo') bound to the target's head, checked against it.

    sub_vocab: the request layout's sub-vocabulary when the head is wider than the codebook
    (models/family.SubVocab): the tables are bound to those head rows."""
    from .calibration.tables import check_tables, load_tables, tables_for
    from .models.checkpoints import target_hash

    path = _bundled(name, "tables") or Path(name)
    if not path.is_file():
        raise InputError(f"tables {name!r} not found; make them with `lisa-trt calibrate`")
    tables = load_tables(path)
    if sub_vocab is not None:
        return tables_for(tables, target, sub_vocab)
    check_tables(tables, target_hash(target), target.config.vocab_size)
    return tables.bind(target.output.weight)


def default_drafter(model: str):
    """The drafter an artifact set uses by default (None for a checkpoint path)."""
    s = artifact_set(model)
    return s.default_drafter if s else None


def default_tables(model: str):
    """The tables an artifact set uses by default (None for a checkpoint path)."""
    s = artifact_set(model)
    return s.default_tables if s else None


def default_vq(model: str, vq=None):
    """`vq` if given, else the artifact set's own VQ name (None for a checkpoint path)."""
    s = artifact_set(model)
    return vq or (s.vq if s else None)


def vq_config_for(vq, vq_config):
    """The VQ config name to pass to load_vq: none for set names and safetensors (self-describing)."""
    return None if artifact_set(vq) is not None or str(vq).endswith(".safetensors") else vq_config


def find_vq(source, vq=None, vq_config: str = "VQ-16", *, family, vocab_size: Optional[int] = None) -> tuple:
    """The image decoder of a run: `(decoder, None)`, or `(None, why)` when there is none.

    The decoder is `vq` (a path or set name; default: the artifact set of `source`'s own), else
    the family's own beside its checkpoint `source` (`vq_beside_checkpoint`: e.g. DIR/vqgan/); why is None when
    a family without its own decoder got no `vq`. A named `vq` that fails to load raises.
    vocab_size: the target's vocabulary, which a code-token family's codebook must match."""
    from .errors import ConfigError
    from .models.checkpoints import load_vq

    vq = default_vq(source, vq)
    if vq is None and not family.vq_beside_checkpoint:
        return None, None
    if vq is None:
        try:
            return load_vq(source), None
        except ConfigError as e:
            return None, str(e)
    if family.vq_beside_checkpoint:  # its decoders describe themselves (--vq-config is LlamaGen's)
        return load_vq(vq), None
    vqm = load_vq(vq, vq_config_for(vq, vq_config))
    if vocab_size is not None and vqm.config.codebook_size != vocab_size:
        raise InputError(f"--vq {vq} has {vqm.config.codebook_size} codes but the target's vocabulary is "
                         f"{vocab_size}; pass the VQ the target was trained with")
    return vqm, None
