"""`python -m lisa_trt.cli ...` is the `lisa-trt` command (without the launcher's early `serve` port check)."""

from . import main

main()
