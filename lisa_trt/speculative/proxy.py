"""A target engine seen through a thin proxy (the drafters that need more of the target than the
DrafterEngine protocol passes: Medusa heads read its final hidden state, the oracle its prompt).

A subclass overrides what it changes (`prefill`, `forward_tokens`); everything else (config,
caches, the condition protocol: check_cond, null_cond, cfg_rows, prompt_len ...) is the wrapped
engine's, so the decode loops run the proxy like the target itself, for every family.
"""

from __future__ import annotations


class TargetProxy:
    """Delegates every attribute it does not define to the wrapped TargetEngine `inner`."""

    def __init__(self, target):
        self.inner = target  # the wrapped TargetEngine

    def __getattr__(self, name):  # only called for attributes not found on the proxy
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def config(self):
        return self.inner.config


__all__ = ["TargetProxy"]
