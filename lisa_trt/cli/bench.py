"""`lisa-trt bench`: every method on the same prompts and seeds in one process (lisa_trt/harness.py)."""

from __future__ import annotations

import click

from ..clitools import handle_errors
from . import options as opt


@click.command()
@opt.engine_dir_argument(required=False)
@opt.model_options(required=False, model_help="Without ENGINE_DIR: required. With it: default the model the bundle "
                                               "was exported from (its manifest records it). ")
@opt.drafter_option("Drafter path or demo-lisa / demo-eagle3 / demo-medusa-lisa (with ENGINE_DIR: default the "
                    "bundle's own).")
@opt.tables_option("Calibration tables (demo: bundled; with ENGINE_DIR: default the bundle's own).")
@click.option("--methods", default="vanilla,exact,lantern,gasv,sjd", show_default=True,
              help="Comma-separated methods (speculative/methods.py); vanilla, the speed-up baseline, always runs.")
@opt.num_images_option("Images per method (prompt i with seed + i).")
@opt.classes_option("Class ids cycled over the images (default: all classes).")
@opt.captions_option("t2i: prompts cycled over the images (captions .txt with --encoder, or T5 features); "
                     "text-prompt models (Lumina-mGPT, Janus-Pro): a captions .txt (default: the family's list).")
@opt.encoder_option()
@opt.backend_option(opt.backend_choices("auto"), default=None,
                    help="torch: the in-memory models; any other: the exported graphs of ENGINE_DIR (default: "
                         "auto, TensorRT when built and usable, else ONNX Runtime, with ENGINE_DIR; torch without).")
@click.option("--engine-dir", "engine_dir_opt", default=None, type=click.Path(exists=True, file_okay=False),
              help="The same as ENGINE_DIR (the older spelling).")
@click.option("--record", is_flag=True,
              help="With ENGINE_DIR on a graph backend: record the never-slower choice of this run beside the "
                   "bundle's manifest (measured_choices.json), so that `--verify auto` runs what was measured on "
                   "this bundle (use enough --num-images: relaxed rules need 32 for a quality verdict).")
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
def bench(engine_dir, model, model_cfg, drafter, tables, methods, num_images, classes, captions, encoder_dir, backend,
          engine_dir_opt, record, sampling, tree, knobs, sweeps, quality_cache, json_path, plot_path):
    """Run every method on the same prompts and seeds in one process; JSON + speed/quality plot.

    With ENGINE_DIR (an exported bundle): its graphs, and the model, drafter and tables it was
    exported from unless given; with --record its never-slower choice is kept for `--verify auto`."""
    from ..harness import bench_command, bundle_knobs, bundle_sources
    from ..runtime.context import resolve

    if engine_dir and engine_dir_opt and engine_dir != engine_dir_opt:
        raise click.UsageError(f"ENGINE_DIR {engine_dir} and --engine-dir {engine_dir_opt} differ: give one")
    engine_dir = engine_dir or engine_dir_opt
    model, drafter, tables, backend = bundle_sources(engine_dir, model, drafter, tables, backend)
    knobs = bundle_knobs(engine_dir, backend, knobs)  # the bundle's measured knobs (zipar's window), as run's
    rc = resolve(model, sampling=sampling, tree=tree, knobs=knobs, model_cfg=model_cfg, backend=backend)
    rc.run(bench_command, drafter=drafter, tables=tables, methods=methods, num_images=num_images, classes=classes,
           captions=captions, encoder_dir=encoder_dir, engine_dir=engine_dir, sweeps=sweeps, record=record,
           quality_cache=quality_cache, json_path=json_path, plot_path=plot_path, echo=click.echo)


COMMANDS = (bench,)
