"""Error types. User errors say what went wrong, what is allowed, and what to do."""

from __future__ import annotations


class LisaError(Exception):
    """Base class for every error lisa-trt raises on purpose (bad input, mismatched artifacts)."""


class ConfigError(LisaError):
    """An unknown registry name or an inconsistent configuration."""


class CheckpointError(LisaError):
    """A checkpoint file that cannot be loaded for the requested configuration."""


class ArtifactMismatchError(LisaError):
    """An artifact (tables, drafter, engines) made for another target or schema version."""


class SpecError(ConfigError, ValueError):
    """A graph io spec, registry entry or method definition that breaks its contract."""


class UnknownTensorError(LisaError, KeyError):
    """A tensor name a graph's io spec does not declare."""


class InputError(LisaError):
    """Bad user input: class ids, caption features, prompt files, numeric problems."""


def unknown_name(kind: str, name: str, valid) -> ConfigError:
    """Build the standard 'unknown registry name' error listing the valid names."""
    names = ", ".join(sorted(valid))
    return ConfigError(f"unknown {kind} {name!r}; valid names: {names}")
