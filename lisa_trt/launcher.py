"""The `lisa-trt` console script (and `python -m lisa_trt`).

Before the full CLI loads (its option lists import torch, seconds on a busy machine), `serve`
checks its ports, so a taken port is refused at once with a one-line message.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence


def _command_index(argv: Sequence[str]) -> Optional[int]:
    """Index of the sub-command in argv (after the group's own options), None if none."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--threads", "--log-level"):  # the group's options that take a value
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            return i
    return None


def main(argv: Optional[Sequence[str]] = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    i = _command_index(argv)
    if i is not None and argv[i] == "serve":
        from .serve.cli import preflight

        preflight(argv[i + 1:])  # exits 2 with the message when a port is taken
    from .cli import main as cli

    return cli.main(args=argv, prog_name="lisa-trt")


if __name__ == "__main__":  # pragma: no cover
    main()
