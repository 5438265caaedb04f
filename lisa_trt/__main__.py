"""`python -m lisa_trt ...` is the `lisa-trt` command."""

from .launcher import main

main()
