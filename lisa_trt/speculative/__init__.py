"""Speculative decoding: sampling math, draft trees, verification rules, decode loops.

The decoders that live in their own file register themselves in the method registry
(methods.py) when imported; importing any module of this package imports them here first."""

from . import sjd, oracle, mcsjd, sjd_pac, gsd, zipar, coupled, sjd_gasv  # noqa: F401, I001  (registration order: the method list's)
