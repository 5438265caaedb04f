"""What every click command of lisa-trt shares (the main CLI and the serve / text sub-commands)."""

from __future__ import annotations

import functools
import sys

from .errors import LisaError


def handle_errors(fn):
    """Print a LisaError as a one-paragraph message (no traceback) and exit 2."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except LisaError as e:
            import click

            click.echo(f"error: {e}", err=True)
            sys.exit(2)

    return wrapper


__all__ = ["handle_errors"]
