"""`lisa-trt run`: generate with an exported engine directory (runtime/pipeline.py)."""

from __future__ import annotations

import click

from ..clitools import handle_errors
from . import options as opt


@click.command()
@opt.engine_dir_argument
@click.argument("prompts", type=click.Path(exists=True, dir_okay=False))
@opt.out_option("Output directory (PNGs, tokens, stats.json).", default="outputs")
@opt.overwrite_option
@click.option("--resume", is_flag=True,
              help="Finish an interrupted run in --out: its finished images are kept and skipped (the same bundle, "
                   "prompts file, seed and settings; each image is written as it finishes).")
@opt.backend_option(opt.backend_choices("auto"), default="auto",
                    help="auto: TensorRT when engines are built and usable, else ONNX Runtime.")
@opt.verify_option(auto=True, default="auto",
                   help="Decoding method; auto: the never-slower choice measured with the bundle's own drafter for "
                        "the backend and precision (`bench ENGINE_DIR --record`), else gasv with the bundle's drafter "
                        "(printed in one line with its reason).")
@opt.threads_option("ORT intra-op threads (default: physical cores).")
@opt.encoder_option("t2i: local flan-t5-xl directory, so PROMPTS may be captions (default $LISA_TRT_TEXT_ENCODER).")
@opt.sampling_options
@opt.tree_options
@opt.device_options("Check the memory plan against this GPU before any work (default: the visible CUDA device "
                    "when the backend is TensorRT; CPU runs are not checked).")
@opt.knob_options(show_defaults=False)
@click.option("--negative-prompt", default=None,
              help="Text-prompt models whose prompter takes one (Emu3, Lumina-mGPT, Janus-Pro): CFG's unconditional rows "
                   "from this text, for every prompt; T5-caption (t2i) bundles: its caption features (with --encoder) "
                   "in place of the learned null caption (class-conditional models: refused, naming why).")
@handle_errors
def run(engine_dir, prompts, out_dir, overwrite, resume, backend, verify, threads, encoder_dir, sampling, tree, gpu,
        memory_gib, knobs, negative_prompt):
    """Generate with an engine directory (default --verify auto: what was measured fastest with its drafter): PNGs and per-image stats.

    PROMPTS: a text file (one class id or name per line; t2i: one caption per line) or JSONL
    ({"class" | "caption" | "caption_features": ..., "seed": .., "cfg": ..}); malformed lines
    are reported with their numbers before any work starts.
    Text-prompt models (Lumina-mGPT, Janus-Pro engine directories): one caption per line.
    A GPU run (or --gpu / --memory-gib) is refused before any work when its memory plan does not
    fit (`lisa-trt plan ENGINE_DIR`)."""
    from ..runtime.commands.run import run as entry
    from ..runtime.context import resolve
    from ..runtime.run_progress import check_run_out

    check_run_out(out_dir, resume=resume, overwrite=overwrite)  # the overwrite rule, before the bundle is read
    rc = resolve(engine_dir=engine_dir, verify=verify, auto=True, sampling=sampling, tree=tree, knobs=knobs,
                 backend=backend)
    rc.run(entry, prompts=prompts, out_dir=out_dir, overwrite=overwrite, resume=resume, threads=threads,
           encoder_dir=encoder_dir, gpu=gpu, memory_gib=memory_gib, negative_prompt=negative_prompt, echo=click.echo)


COMMANDS = (run,)
