"""Progress bars for long work (tqdm), or a no-op bar when disabled; ETAs weighted by work; the
process's log level (the CLI group's -q / -v / --log-level).

Bars are drawn only where someone watches them: stderr a terminal, TQDM_DISABLE unset (or 0),
the log level info or debug. A log file gets none (tqdm's carriage-return updates are noise there).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional, Sequence

_LEVEL = {"level": "info"}  # set once by the CLI group; the library's default when embedded


def set_log_level(level: str) -> None:
    """The process's verbosity: debug | info | warning | error (CLI: -v / default / -q / --log-level).

    Configures the `lisa_trt` logger (one `LEVEL name: message` line on stderr) and, at error,
    hides warnings too."""
    import warnings

    level = level.lower()
    if level not in ("debug", "info", "warning", "error"):
        raise ValueError(f"log level must be debug, info, warning or error, got {level!r}")
    _LEVEL["level"] = level
    log = logging.getLogger("lisa_trt")
    log.setLevel(getattr(logging, level.upper()))
    if not any(getattr(h, "_lisa_trt", False) for h in log.handlers):
        handler = logging.StreamHandler()  # sys.stderr at the time of the call
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler._lisa_trt = True
        log.addHandler(handler)
    if level == "error":
        warnings.simplefilter("ignore")


def log_level() -> str:
    return _LEVEL["level"]


def chatty() -> bool:
    """Progress lines and bars wanted (log level info or debug)."""
    return _LEVEL["level"] in ("debug", "info")


def say(echo):
    """`echo` when progress lines are wanted, else a no-op (results and errors print regardless)."""
    return echo if chatty() else (lambda *a, **k: None)


def bars_wanted(stream=None) -> bool:
    """Draw a progress bar? Only on a terminal, with TQDM_DISABLE unset, at log level info / debug."""
    if os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false", "no"):
        return False
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return chatty() and bool(isatty and isatty())


class _NoBar:
    """A bar that draws nothing; `lines`: its write() still prints (a bar asked for where none is drawn,
    e.g. off a terminal: the lines a bar writes between its updates are a log's content)."""

    n = 0
    lines = False

    def set_description(self, *_):
        pass

    def set_postfix_str(self, *_, **__):
        pass

    def update(self, *_):
        pass

    def write(self, text="", *_, **__):
        if self.lines and chatty():
            print(text, file=sys.stderr)

    def close(self):
        pass


# tqdm's layout without its own ETA, for bars whose caller shows a work-weighted one (WorkEta) in the
# postfix: tqdm's assumes equal steps, so two disagreeing ETAs showed (export: 8:30 vs 2:43)
OWN_ETA_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


def progress_bar(total: int, enabled: bool, unit: str = "it", *, own_eta: bool = False, **kw):
    """A tqdm bar, or a no-op one when not `enabled` or not `bars_wanted()`; `own_eta`: the caller
    shows its own ETA (set_postfix_str), so tqdm's is left out."""
    if not (enabled and bars_wanted()):
        bar = _NoBar()
        bar.lines = enabled
        return bar
    from tqdm import tqdm

    if own_eta:
        kw.setdefault("bar_format", OWN_ETA_FORMAT)
    return tqdm(total=total, unit=unit, **kw)


class _NoBarIter(_NoBar):
    """An iterable with a bar's methods that draws nothing (callers may set_postfix on it)."""

    def __init__(self, iterable):
        self._it = iterable

    def __iter__(self):
        return iter(self._it)

    def __len__(self):
        return len(self._it)

    def set_postfix(self, *_, **__):
        pass


def iterate(iterable, enabled: bool, **kw):
    """`iterable` under a tqdm bar when `enabled` and `bars_wanted()`, else a bar that draws nothing."""
    if not (enabled and bars_wanted()):
        return _NoBarIter(iterable)
    from tqdm import tqdm

    return tqdm(iterable, **kw)


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
