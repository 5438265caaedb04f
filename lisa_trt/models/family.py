"""Model families: everything that differs between autoregressive image models of one kind.

A family owns its conditioning (validate a condition, the null condition for CFG, the prefill
graph's condition inputs), checkpoint loading, and the image decoder. LlamaGen (class-to-image
`c2i` and text-to-image `t2i`, models/llamagen_family.py) is the first family; a second one (e.g. Chameleon / Lumina-mGPT)
registers its own `ModelFamily` subclass under its `model_type` names and nothing else in the
speculative loop, the engines or the runtime changes.

    fam = family_of(cfg)                 # cfg.model_type -> the family
    B = fam.check_cond(cfg, cond)        # InputError with the fix on a bad condition
    inputs = fam.cond_inputs(cfg, cond, device, act_dtype)   # prefill graph inputs by name

Floors: models (this file imports only core modules; models/llamagen.py calls into it).
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch

from ..errors import ConfigError


class ModelFamily:
    """One model family; subclasses implement the conditioning and artifact hooks.

    Attributes:
        name: family name ("llamagen").
        model_types: the TargetConfig.model_type values it serves.
    """

    name = "?"
    model_types: tuple = ()

    # -- conditioning ---------------------------------------------------------------------

    def check_cond(self, cfg, cond) -> int:
        """Validate a condition for `cfg`; returns the batch size. Raises InputError with the fix."""
        raise NotImplementedError

    def null_cond(self, cfg, cond, uncond_embedding: Optional[torch.Tensor] = None):
        """The unconditional condition for CFG, same batch size as `cond`."""
        raise NotImplementedError

    def class_conditioned(self, cfg_or_type) -> bool:
        """True when conditions are class ids (prompt files, training data, calibration use them)."""
        return False

    def condition_tensors(self, target) -> dict:
        """Tensors an engine bundle must carry for null_cond at run time ({} when none)."""
        return {}

    def cond_specs(self, cfg_or_type) -> tuple:
        """The prefill graph's condition inputs: ((name, dtype code, axes, doc), ...)."""
        raise NotImplementedError

    def cond_inputs(self, cfg, cond, device, act_dtype) -> dict:
        """{prefill input name: tensor} for a validated condition."""
        raise NotImplementedError

    def cond_from_inputs(self, cfg, inputs: dict):
        """Inverse of cond_inputs (the exported prefill graph rebuilds the model's condition)."""
        raise NotImplementedError

    def example_cond(self, cfg, batch: int, generator=None):
        """A random valid condition (validation, tests)."""
        raise NotImplementedError

    # -- artifacts ------------------------------------------------------------------------

    def load_target(self, path, config=None):
        raise NotImplementedError

    def load_decoder(self, path, config=None):
        """The image decoder (tokens -> pixels) of this family."""
        raise NotImplementedError


class UnknownModelTypeError(ConfigError, ValueError):
    """A model_type no registered family serves."""


_FAMILIES: dict[str, ModelFamily] = {}


def register_family(family: ModelFamily) -> ModelFamily:
    """Serve `family.model_types` with `family` (a later registration replaces an earlier one)."""
    for t in family.model_types:
        _FAMILIES[t] = family
    return family


# built-in families, imported on first use (model_type -> module that registers it)
_BUILTIN = {"c2i": "lisa_trt.models.llamagen_family", "t2i": "lisa_trt.models.llamagen_family",
            "janus": "lisa_trt.models.families.janus"}


def model_types() -> list:
    """Every registered model_type (built-in and registered)."""
    return sorted(set(_FAMILIES) | set(_BUILTIN))


def family_of(cfg_or_type) -> ModelFamily:
    """The family serving a TargetConfig (or a model_type string)."""
    t = getattr(cfg_or_type, "model_type", cfg_or_type)
    if t not in _FAMILIES and t in _BUILTIN:
        importlib.import_module(_BUILTIN[t])  # registers itself
    fam = _FAMILIES.get(t)
    if fam is None:
        raise UnknownModelTypeError(f"unknown model_type {t!r}; registered: {', '.join(model_types())} "
                                    "(a new family registers itself with models.family.register_family)")
    return fam


__all__ = ["ModelFamily", "UnknownModelTypeError", "family_of", "model_types", "register_family"]
