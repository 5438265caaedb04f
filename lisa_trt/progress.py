"""Progress bars for long work (tqdm), or a no-op bar when disabled; ETAs weighted by work."""

from __future__ import annotations

from typing import Optional, Sequence


class _NoBar:
    n = 0

    def set_description(self, *_):
        pass

    def set_postfix_str(self, *_, **__):
        pass

    def update(self, *_):
        pass

    def write(self, *_):
        pass

    def close(self):
        pass


def progress_bar(total: int, enabled: bool, unit: str = "it"):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit=unit)


class WorkEta:
    """Seconds left of a sequence of steps of unequal size (e.g. an export's graphs, sized by
    their weight bytes): the time per unit of work of the finished steps times the work left.

    `start(i)` / `finish(i, seconds)` mark steps; `eta()` is None until one step has finished
    (or when the finished steps had no work)."""

    def __init__(self, work: Sequence[float], floor: float = 1.0):
        self.work = [max(float(w), floor) for w in work]  # a weightless step still takes some time
        self.done_work, self.done_s, self.finished = 0.0, 0.0, set()

    def finish(self, i: int, seconds: float) -> None:
        if i not in self.finished:
            self.finished.add(i)
            self.done_work += self.work[i]
            self.done_s += float(seconds)

    def eta(self, running: Optional[int] = None, running_s: float = 0.0) -> Optional[float]:
        if not self.done_work:
            return None
        rate = self.done_s / self.done_work
        left = sum(w for j, w in enumerate(self.work) if j not in self.finished)
        return max(0.0, rate * left - (running_s if running is not None else 0.0))

    def step_eta(self, i: int) -> Optional[float]:
        """Expected seconds of step i alone (from the finished steps' rate)."""
        if not self.done_work:
            return None
        return self.done_s / self.done_work * self.work[i]


def fmt_seconds(s: Optional[float]) -> str:
    """'?' for None, else '42s' / '3m05s' / '1h02m'."""
    if s is None:
        return "?"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
