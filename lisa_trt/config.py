"""Frozen configuration dataclasses every floor shares: sampling settings, and `find_multiple`.

A model's shapes live in its family's package (LlamaGen's GPT / VQ configs:
families/llamagen/config.py); the generic code reads them through models/target_config.py
(`TargetShape`, and the registries of named configs such as "GPT-B", "tiny", "VQ-16").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


def strict_from_dict(cls, d: dict):
    """`cls(**d)` for a config dataclass, refusing fields it does not have (ConfigError listing both)."""
    from .errors import ConfigError

    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} fields {sorted(unknown)}; valid: {sorted(known)}")
    return cls(**d)


def find_multiple(n: int, k: int) -> int:
    """Smallest multiple of k that is >= n (LlamaGen's helper; static cache lengths round up with it)."""
    return n if n % k == 0 else n + k - (n % k)


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings of the reference loop (LlamaGen generate.py semantics)."""

    cfg_scale: float = 1.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    cfg_interval: int = -1
