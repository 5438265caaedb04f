"""Library side of the generating commands: condition parsing, export-time generation defaults, and
the files `lisa-trt generate` / `lisa-trt run` write (all writes atomic)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ..errors import InputError
from ..io import atomic_write, write_json


def load_caption_file(path, caption_dim: int):
    """A .safetensors/.npy file of T5 features (+ mask) -> (features, mask) tensors."""
    import numpy as np

    from ..io import load_safetensors

    p = Path(path)
    if p.suffix == ".safetensors":
        t, _ = load_safetensors(p)
        if "caption_features" not in t:
            raise InputError(f"{p} must hold 'caption_features' (B, 120, {caption_dim}) and 'caption_mask' (B, 120)")
        feats = t["caption_features"].float()
        mask = t.get("caption_mask", torch.ones(feats.shape[:2]))
    elif p.suffix == ".npy":
        feats = torch.from_numpy(np.load(p)).float()
        mask_path = p.with_name(p.stem + "_mask.npy")
        mask = torch.from_numpy(np.load(mask_path)) if mask_path.exists() else torch.ones(feats.shape[:2])
    else:
        raise InputError(f"caption features must be .safetensors or .npy, got {p.name}")
    if feats.dim() == 2:
        feats, mask = feats[None], mask.reshape(1, -1)
    return feats, mask


def generation_defaults(model, target, sampling, *, drafter=None, drafter_model=None, tables=None,
                        model_name=None) -> dict:
    """Default generation settings recorded in an exported bundle: sampling, class names, the
    per-backend tree budgets (measured ones when the artifact set ships them), and `sources`: the
    files the bundle was made from (`bench ENGINE_DIR` reads them back; `model_name`: --model as
    given, e.g. a Hub name, default `model`).

    The artifact set's measured never-slower choices are recorded only for a bundle of its own
    drafter (`drafter` its default, timed with it): a drafter the user trained was not measured,
    so `--verify auto` runs it (autotune.auto_method) until `bench ENGINE_DIR` records its own."""
    from ..artifacts import default_drafter
    from ..models.artifact_sets import artifact_set
    from .autotune import default_tree_budgets

    measured, choices, measured_with = None, [], None
    if artifact_set(model) is not None:
        from .demo import _measured_budgets, _measured_choices

        measured = _measured_budgets()
        if drafter is not None and drafter == default_drafter(model):
            from ..export.manifest import drafter_hash

            choices, measured_with = _measured_choices(), {"drafter": drafter_hash(drafter_model)}
    from ..models.family import family_of

    own = family_of(target.config).default_tree  # a family's own tree budget (when no measured one)
    trees = {b: dict(own) for b in ("default", "ort", "torch")} if own and measured is None else None
    gen = {"sampling": dataclasses.asdict(sampling),
           "tree": {**default_tree_budgets(target.config, measured), **(trees or {})}}
    if choices:  # never slower: the measured choice per precision (bench/speed.py)
        from .autotune import record_choices

        gen = record_choices(gen, choices, measured_with)
    from .prompts import class_names_of

    names = class_names_of(model)
    if names:
        gen["class_names"] = names
    gen["sources"] = {k: _source_name(v) for k, v in (("model", model_name or model), ("drafter", drafter), ("tables", tables))
                      if v is not None}
    return gen


def _source_name(value) -> str:
    """A source as `bench` can take it back: a file's absolute path, else the name (an artifact set's)."""
    p = Path(str(value)).expanduser()
    return str(p.resolve()) if p.exists() else str(value)


def load_vq_for(vq, vq_config_name, tc):
    """Load the VQ (path or set name) and check its codebook matches the target's vocabulary."""
    from ..artifacts import vq_config_for
    from ..models.checkpoints import load_vq

    vqm = load_vq(vq, vq_config_for(vq, vq_config_name))
    if vqm.config.codebook_size != tc.vocab_size:
        raise InputError(f"--vq {vq} has {vqm.config.codebook_size} codes but the target's vocabulary is "
                         f"{tc.vocab_size}; pass the VQ the target was trained with")
    return vqm


def decode_and_save(tokens, vq, vq_config_name, tc, out, family) -> list:
    """Decode tokens (B, N), row-major on the target's token grid (`tc.grid_hw`), with `vq` (a
    loaded image decoder, or a path / set name) through `family`, and write PNGs into `out`."""
    vqm = vq if hasattr(vq, "decode_code") else load_vq_for(vq, vq_config_name, tc)
    return save_code_images(family, vqm, tokens.reshape(tokens.shape[0], *tc.grid_hw), out)


def save_code_images(family, vqm, codes, out) -> list:
    """VQ code grids (B, h, w) -> uint8 images (runtime/runner.images, the one tokens-to-pixels path)
    -> PNGs in `out`."""
    from ..imaging import save_images
    from .runner import images

    return save_images(images(family, vqm, codes), out)


def _fresh_out(out_dir, overwrite: bool) -> Path:
    from ..validation import clear_previous_outputs

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if overwrite:
        clear_previous_outputs(out)
    return out


def save_generation(out_dir, tokens: torch.Tensor, record: dict, *, overwrite: bool = False) -> Path:
    """tokens.npy and stats.json (`record`) into `out_dir` (created), each written atomically.

    With `overwrite`, earlier results there (PNGs, tokens.npy, stats.json) are removed first."""
    import numpy as np

    out = _fresh_out(out_dir, overwrite)
    with atomic_write(out / "tokens.npy") as tmp:
        with open(tmp, "wb") as f:
            np.save(f, tokens.cpu().numpy())
    write_json(out / "stats.json", record)
    return out


__all__ = ["decode_and_save", "save_code_images", "load_vq_for", "generation_defaults", "load_caption_file",
           "save_generation"]
