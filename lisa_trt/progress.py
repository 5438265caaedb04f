"""Progress bars for long work (tqdm), or a no-op bar when disabled."""

from __future__ import annotations


class _NoBar:
    n = 0

    def set_description(self, *_):
        pass

    def update(self, *_):
        pass

    def close(self):
        pass


def progress_bar(total: int, enabled: bool, unit: str = "it"):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit=unit)
