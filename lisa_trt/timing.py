"""Wall-time accounting per phase (core floor: used by the decode loops and the engines)."""

from __future__ import annotations

import time


class Timer:
    """Accumulates wall time per phase (draft / verify / host) for the decode stats."""

    def __init__(self):
        self._now = time.perf_counter
        self.totals: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        self.totals[phase] = self.totals.get(phase, 0.0) + seconds

    def measure(self, phase: str) -> "_Measure":
        """Context manager adding the time spent inside it to `phase`."""
        return _Measure(self, phase)


class _Measure:
    """One timed section (a plain class: `measure` runs several times per decode step)."""

    __slots__ = ("timer", "phase", "t0")

    def __init__(self, timer: Timer, phase: str):
        self.timer, self.phase, self.t0 = timer, phase, 0.0

    def __enter__(self):
        self.t0 = self.timer._now()
        return self

    def __exit__(self, *exc):
        self.timer.add(self.phase, self.timer._now() - self.t0)


__all__ = ["Timer"]
