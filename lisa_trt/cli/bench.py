"""`lisa-trt bench`: every method on the same prompts and seeds in one process (lisa_trt/harness.py)."""

from __future__ import annotations

import click

from ..clitools import handle_errors
from . import options as opt


@click.command()
@opt.model_options()
@opt.drafter_option("Drafter path or demo-lisa / demo-eagle3 / demo-medusa-lisa.")
@opt.tables_option("Calibration tables (demo: bundled).")
@click.option("--methods", default="vanilla,exact,lantern,gasv,sjd", show_default=True,
              help="Comma-separated methods (speculative/methods.py); vanilla, the speed-up baseline, always runs.")
@opt.num_images_option("Images per method (prompt i with seed + i).")
@opt.classes_option("Class ids cycled over the images (default: all classes).")
@opt.captions_option("t2i: prompts cycled over the images (captions .txt with --encoder, or T5 features); "
                     "text-prompt models (Lumina-mGPT, Janus-Pro): a captions .txt (default: the family's list).")
@opt.encoder_option()
@opt.backend_option(opt.backend_choices(), default="torch",
                    help="torch: the in-memory models; any other: the exported graphs of --engine-dir.")
@click.option("--engine-dir", default=None, type=click.Path(),
              help="Exported bundle for a graph backend (ort, trt, ...).")
@opt.sampling_options
@opt.tree_options
@opt.knob_options()
@click.option("--sweep", "sweeps", multiple=True,
              help='Knob grid, repeatable: "gasv:kappa=0.5,1,2;lambda=0.6,0.3", "lantern:delta=0.1,0.2;gamma=1".')
@click.option("--quality-cache", default=None, type=click.Path(), help="Directory caching the quality reference "
              "features (real crops, vanilla samples); default runs/quality_cache.")
@opt.json_option("The report: settings and one result per method / sweep point.", required=True)
@click.option("--plot", "plot_path", default=None, type=click.Path(), help="Speed / quality plot (PNG).")
@handle_errors
def bench(model, model_cfg, drafter, tables, methods, num_images, classes, captions, encoder_dir, backend,
          engine_dir, sampling, tree, knobs, sweeps, quality_cache, json_path, plot_path):
    """Run every method on the same prompts and seeds in one process; JSON + speed/quality plot."""
    from ..harness import bench_command
    from ..runtime.context import resolve

    rc = resolve(model, sampling=sampling, tree=tree, knobs=knobs, model_cfg=model_cfg, backend=backend)
    rc.run("bench", bench_command, drafter=drafter, tables=tables, methods=methods, num_images=num_images, classes=classes,
           captions=captions, encoder_dir=encoder_dir, engine_dir=engine_dir, sweeps=sweeps,
           quality_cache=quality_cache, json_path=json_path, plot_path=plot_path, echo=click.echo)


COMMANDS = (bench,)
