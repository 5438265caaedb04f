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

Commands load lazily: `lisa-trt --help` lists them from catalogue.py's snapshot and
`lisa-trt CMD ...` imports CMD's module only, so no `--help` imports torch.
"""

from __future__ import annotations

import click

from .catalogue import COMMAND_MODULES, load_command as _load
from .options import CONTEXT_SETTINGS, log_options, threads_option

class LazyGroup(click.Group):
    """Commands imported when named; the listing from the catalogue; Ctrl-C exits 130."""

    def list_commands(self, ctx):
        return sorted(set(COMMAND_MODULES) | set(self.commands))

    def get_command(self, ctx, name):
        if name in self.commands or name not in COMMAND_MODULES:
            return super().get_command(ctx, name)
        return _load(name)

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        head = rest[:rest.index("--")] if "--" in rest else rest
        ctx.meta["lisa_trt.help"] = any(a in ctx.help_option_names for a in head)  # `CMD --help`: no torch
        return name, cmd, rest

    def format_commands(self, ctx, formatter):
        from .catalogue import snapshot

        from .catalogue import first_paragraph, snapshot

        helps, names = snapshot()["commands"], self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))  # click's own Group.format_commands
        rows = [(n, click.Command(n, help=helps.get(n) or first_paragraph(self.get_command(ctx, n)))
                 .get_short_help_str(limit)) for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            raise click.exceptions.Exit(130) from None  # 128 + SIGINT, as a shell reports it


@click.group(cls=LazyGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="lisa-trt")
@threads_option("CPU threads for torch and ONNX Runtime (env LISA_TRT_THREADS; default: the CPUs this "
                "process may use, from its affinity and cgroup quota). Idle threads sleep, never spin.",
                type=click.IntRange(min=1), envvar="LISA_TRT_THREADS")
@log_options
def main(threads, log_level):
    """lisa-trt: LISA speculative decoding for autoregressive image generators.

    Pipeline: train (drafter) -> calibrate (GASV tables) -> export (ONNX) -> build (TensorRT)
    -> run. `lisa-trt demo` runs all of it on the bundled CPU model.
    """
    from ..progress import set_log_level
    from ..threads import apply_thread_policy

    set_log_level(log_level)
    if not click.get_current_context().meta.get("lisa_trt.help"):
        apply_thread_policy(threads)  # sizes torch's pools, so it imports torch: not for a command's --help
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


def __getattr__(name):
    if name == "_loss_switches":  # importable from lisa_trt.cli (tests); loads torch, so only when asked
        from ..runtime.commands.train import loss_switches

        return loss_switches
    raise AttributeError(name)


__all__ = ["main", "COMMAND_MODULES"]
