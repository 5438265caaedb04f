"""`lisa-trt` command line: the click group; one module per command group (docs/cli.md).

    options.py    every shared option, declared once
    generate.py   generate                      calibrate.py  calibrate
    train.py      train                         export.py     export, build, plan, quantize-trt
    run.py        run                           bench.py        bench
    misc.py       convert, random-checkpoint, demo
    (lisa_trt/text/cli.py: encode-captions; lisa_trt/serve/cli.py: serve, triton-repo, openai-api)

A command parses its options, makes the run context once (runtime/context.py `resolve`) and
calls one entry (runtime/commands/, harness.py `bench_command`, runtime/demo.py `run_demo`);
the entry asks the family's objects what differs, the CLI never asks which family it runs.
"""

from __future__ import annotations

import click

from .options import threads_option


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lisa-trt")
@threads_option("CPU threads for torch and ONNX Runtime (env LISA_TRT_THREADS; default: the CPUs this "
                "process may use, from its affinity and cgroup quota). Idle threads sleep, never spin.",
                type=click.IntRange(min=1), envvar="LISA_TRT_THREADS")
def main(threads):
    """lisa-trt: LISA speculative decoding for autoregressive image generators.

    Pipeline: train (drafter) -> calibrate (GASV tables) -> export (ONNX) -> build (TensorRT)
    -> run. `lisa-trt demo` runs all of it on the bundled CPU model.
    """
    from ..threads import apply_thread_policy

    apply_thread_policy(threads)
    _plain_runtime_warnings()


def _plain_runtime_warnings() -> None:
    """lisa-trt's own RuntimeWarnings print as one `warning: ...` line (no source line)."""
    import warnings

    default = warnings.formatwarning

    def fmt(message, category, filename, lineno, line=None):
        if issubclass(category, RuntimeWarning) and "lisa_trt" in str(filename):
            return f"warning: {message}\n"
        return default(message, category, filename, lineno, line)

    warnings.formatwarning = fmt


def _register(group: click.Group) -> None:
    from ..serve.cli import register as register_serve
    from ..text.cli import encode_captions
    from . import bench, calibrate, export, generate, misc, run, train

    for module in (misc, generate, calibrate, train, bench, export, run):
        for command in module.COMMANDS:
            group.add_command(command)
    group.add_command(encode_captions)  # t2i: captions -> T5 features
    register_serve(group)  # serve, triton-repo, openai-api


_register(main)
from ..runtime.commands.train import loss_switches as _loss_switches  # noqa: F401  (importable from lisa_trt.cli)

__all__ = ["main"]
