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


class GridType(click.ParamType):
    """`HxW` (tokens high x tokens wide, e.g. 16x24) -> (H, W), both positive."""

    name = "HxW"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        h, sep, w = str(value).lower().partition("x")
        if sep and h.strip().isdigit() and w.strip().isdigit() and int(h) > 0 and int(w) > 0:
            return int(h), int(w)
        self.fail(f"{value!r} is not a token grid: write HEIGHTxWIDTH in tokens, both positive, e.g. 16x24", param, ctx)


@click.command("random-checkpoint")
@click.argument("out")
@opt.config_options("GPT-B ... GPT-7B, tiny, or VQ-16/VQ-8.", required=True)
@click.option("--grid", type=GridType(), default=None,
              help="Token grid HxW of a target (e.g. 16x24, non-square allowed; replaces --image-size's square "
                   "grid). OUT must then end in .safetensors: lisa-trt's layout, whose config records the grid.")
@opt.seed_option
@overwrite_option
@handle_errors
def random_checkpoint(out, model_cfg, grid, seed, overwrite):
    """Write a randomly initialised checkpoint in the official layout ({"model": state_dict});
    with --grid, a target in lisa-trt's safetensors layout (its config, grid included, in the
    metadata and a .json beside it).

    An existing OUT is replaced only with --overwrite (refused before any work)."""
    from ..io import refuse_existing
    from ..runtime.commands.checkpoints import random_checkpoint as entry

    if grid is not None:
        _check_grid(out, model_cfg, grid)
    refuse_existing(out, overwrite=overwrite, option="OUT")
    if grid is None:
        entry(out, model_cfg, seed, echo=click.echo)
    else:
        _grid_checkpoint(out, model_cfg, grid, seed)


def _check_grid(out, model_cfg, grid) -> None:
    """--grid's refusals, before any work."""
    name, (h, w) = model_cfg["config"], grid
    if name.startswith("VQ"):
        raise click.UsageError(f"--grid sets a target's token grid; {name} is an image decoder (VQ): drop --grid")
    if model_cfg["image_size_given"]:
        raise click.UsageError(f"--grid {h}x{w} and --image-size both set the grid: pass one (--grid for a "
                               "non-square one)")
    if Path(out).suffix != ".safetensors":
        raise click.UsageError(f"OUT {out!r}: a --grid checkpoint is written as .safetensors (an official .pt holds "
                               f"no config, so its {h}x{w} grid would be lost); name it e.g. "
                               f"{Path(out).with_suffix('.safetensors').name}")


def _grid_checkpoint(out, model_cfg, grid, seed) -> None:
    import torch

    from ..models.checkpoints import save_model
    from ..models.family import family_of
    from ..models.target_config import target_config

    h, w = grid
    cfg = target_config(model_cfg["config"], model_type=model_cfg["model_type"], block_size=h * w, grid_shape=grid)
    torch.manual_seed(seed)
    save_model(family_of(cfg).init_target(cfg), cfg, out)
    click.echo(f"wrote {out} (+ {Path(out).with_suffix('.json').name}; {h} x {w} token grid)")


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
    check_demo_out(Path(out_dir))
    run_demo(Path(out_dir), num_images=num_images, backend=backend, verify=verify, seed=seed, echo=click.echo)
    click.echo(f"details: {Path(out_dir) / 'summary.json'}")


DEMO_ENTRIES = ("engines", "vanilla_vs_lisa.png", "summary.json")  # what run_demo writes in --out


def check_demo_out(out_dir: Path) -> None:
    """An existing --out must be empty or an earlier demo's (its export is reused, its grid and
    summary.json replaced): anything else is refused before any work, so no file of the user's
    (a summary.json of their own) is overwritten."""
    import json

    if not out_dir.is_dir():
        return
    foreign = sorted(p.name for p in out_dir.iterdir()
                     if p.name not in DEMO_ENTRIES and not p.name.startswith(".engines."))  # export staging
    summary = out_dir / "summary.json"
    if summary.exists():
        try:
            ours = {"verify", "results", "deploy"} <= set(json.loads(summary.read_text()))
        except (ValueError, TypeError, OSError):
            ours = False
        foreign += [] if ours else ["summary.json (not a demo summary)"]
    if foreign:
        raise click.UsageError(f"--out {out_dir} holds files the demo did not write ({', '.join(foreign[:5])}"
                               f"{', ...' if len(foreign) > 5 else ''}): choose a new or empty directory, or an "
                               "earlier demo's --out (its export is reused)")


COMMANDS = (convert, random_checkpoint, demo)
