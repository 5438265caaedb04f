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

    def measure(self, phase: str):
        timer = self

        class _Ctx:
            def __enter__(self):
                self.t0 = timer._now()

            def __exit__(self, *exc):
                timer.add(phase, timer._now() - self.t0)

        return _Ctx()


__all__ = ["Timer"]
