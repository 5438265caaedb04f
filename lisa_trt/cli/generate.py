"""`lisa-trt generate`: decode images from a checkpoint in memory (no export)."""

from __future__ import annotations

import click

from ..clitools import handle_errors
from . import options as opt


@click.command()
@opt.model_options()
@opt.vq_options("VQ checkpoint (or 'demo'); without it only tokens are written.")
@opt.classes_option("c2i: comma-separated class ids or names (the model's, or ImageNet's for 1000 classes; "
                    "any case, _ for a space).")
@opt.captions_option("t2i: captions .txt (one per line, needs --encoder) or T5 features (.safetensors / .npy).")
@opt.encoder_option()
@opt.prompt_option
@opt.sampling_options
@opt.drafter_option("Drafter .safetensors, or demo-lisa / demo-eagle3 / demo-medusa-lisa (demo default: demo-lisa).")
@opt.verify_option(help="Decoding method (speculative/methods.py; default: vanilla AR loop).")
@opt.tables_option("Calibration tables (lisa-trt calibrate); demo: bundled.")
@opt.tree_options
@opt.knob_options()
@opt.out_option("Output directory (PNGs, tokens.npy, stats.json).", default="outputs")
@opt.overwrite_option
@handle_errors
def generate(model, model_cfg, vq, vq_config, classes, captions, encoder_dir, prompts, sampling, drafter, verify,
             tables, tree, knobs, out_dir, overwrite):
    """Generate images: the reference AR loop, or tree speculation with --drafter/--verify.

    Writes PNGs (when a VQ is known), tokens.npy and stats.json."""
    from ..runtime.commands.generate import generate as entry
    from ..runtime.context import resolve
    from ..speculative.methods import baseline_method

    rc = resolve(model, verify=verify, default_verify=baseline_method(), sampling=sampling, tree=tree,
                 knobs=knobs, model_cfg=model_cfg)
    rc.run(entry, prompts=prompts, out_dir=out_dir, overwrite=overwrite, vq=vq, vq_config=vq_config,
           classes=classes, captions=captions, encoder_dir=encoder_dir, drafter=drafter, tables=tables,
           echo=click.echo)


COMMANDS = (generate,)
