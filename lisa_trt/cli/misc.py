"""`lisa-trt convert`, `random-checkpoint` and `demo`: checkpoints and the bundled demo."""

from __future__ import annotations

from pathlib import Path

import click

from ..clitools import handle_errors
from . import options as opt
from .export import overwrite_option


@click.command()
@click.argument("src")
@click.argument("dst")
@opt.config_options("Target config name (GPT-B ...) or VQ-16/VQ-8.", required=True)
@overwrite_option
@handle_errors
def convert(src, dst, model_cfg, overwrite):
    """Convert an official LlamaGen .pt (target or VQ) to safetensors + config JSON.

    An existing DST is replaced only with --overwrite (refused before any work)."""
    from ..io import refuse_existing
    from ..runtime.commands.checkpoints import convert as entry

    refuse_existing(dst, overwrite=overwrite, option="DST")
    entry(src, dst, model_cfg, echo=click.echo)


@click.command("random-checkpoint")
@click.argument("out")
@opt.config_options("GPT-B ... GPT-7B, tiny, or VQ-16/VQ-8.", required=True)
@opt.seed_option
@overwrite_option
@handle_errors
def random_checkpoint(out, model_cfg, seed, overwrite):
    """Write a randomly initialised checkpoint in the official layout ({"model": state_dict}).

    An existing OUT is replaced only with --overwrite (refused before any work)."""
    from ..io import refuse_existing
    from ..runtime.commands.checkpoints import random_checkpoint as entry

    refuse_existing(out, overwrite=overwrite, option="OUT")
    entry(out, model_cfg, seed, echo=click.echo)


@click.command()
@opt.out_option("Directory for the exported engines (cached), the PNG grid and summary.json.",
                default="lisa-trt-demo")
@opt.num_images_option("Images per method (one per class, cycled).")
@opt.backend_option(["ort", "torch"], default="ort")
@opt.verify_option(choices=["exact", "lantern", "gasv"], default="gasv",
                   help="Verification rule of the LISA run (vanilla is the baseline).")
@opt.seed_option
@handle_errors
def demo(out_dir, num_images, backend, verify, seed):
    """The whole pipeline on the bundled CPU model: export (cached), then vanilla vs LISA
    through ONNX Runtime; prints speed-up, MAL and quality, writes a side-by-side PNG grid."""
    from ..runtime.demo import run_demo
    from ..validation import check_positive, probe_writable_dir

    check_positive(num_images, "--num-images")
    probe_writable_dir(out_dir, "--out directory")
    run_demo(Path(out_dir), num_images=num_images, backend=backend, verify=verify, seed=seed, echo=click.echo)
    click.echo(f"details: {Path(out_dir) / 'summary.json'}")


COMMANDS = (convert, random_checkpoint, demo)
