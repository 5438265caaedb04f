"""Speculative decoding: sampling math, draft trees, verification rules, decode loops.

Every method registers itself beside its decoder (methods.py registry, session.py contract) when
its module is imported; importing any module of this package imports them here first."""

from . import autoregressive, decode, sjd, oracle, mcsjd, sjd_pac, gsd, zipar, coupled, sjd_gasv, pjd, twod, ssd  # noqa: F401, I001  (registration order: the method list's)
