"""`lisa-trt run`: generate with an exported engine directory (runtime/pipeline.py)."""

from __future__ import annotations

import sys

import click

from ..clitools import handle_errors
from . import options as opt


@click.command()
@opt.engine_dir_argument
@click.argument("prompts", type=click.Path(exists=True, dir_okay=False))
@opt.out_option("Output directory (PNGs, tokens, stats.json).", default="outputs")
@opt.overwrite_option
@opt.backend_option(opt.backend_choices("auto"), default="auto",
                    help="auto: TensorRT when engines are built and usable, else ONNX Runtime.")
@opt.verify_option(auto=True, default="auto",
                   help="Decoding method; auto: the bundle's recorded never-slower choice for the backend and "
                        "precision (printed with its reason; a bundle without one runs gasv).")
@opt.threads_option("ORT intra-op threads (default: physical cores).")
@opt.encoder_option("t2i: local flan-t5-xl directory, so PROMPTS may be captions (default $LISA_TRT_TEXT_ENCODER).")
@opt.sampling_options
@opt.tree_options
@opt.device_options("Check the memory plan against this GPU before any work (default: the visible CUDA device "
                    "when the backend is TensorRT; CPU runs are not checked).")
@opt.knob_options(show_defaults=False)
@handle_errors
def run(engine_dir, prompts, out_dir, overwrite, backend, verify, threads, encoder_dir, sampling, tree, gpu,
        memory_gib, knobs):
    """Generate with an engine directory (default --verify auto: the bundle's recorded fastest method): PNGs and per-image stats.

    PROMPTS: a text file (one class id or name per line; t2i: one caption per line) or JSONL
    ({"class" | "caption" | "caption_features": ..., "seed": .., "cfg": ..}); malformed lines
    are reported with their numbers before any work starts.
    Text-prompt models (Lumina-mGPT, Janus-Pro engine directories): one caption per line.
    A GPU run (or --gpu / --memory-gib) is refused before any work when its memory plan does not
    fit (`lisa-trt plan ENGINE_DIR`)."""
    from ..deploy.memory_plan import preflight
    from ..engines.trt_plans import engines_built
    from ..runtime.context import resolve

    rc = resolve(engine_dir=engine_dir, verify=verify, auto=True, sampling=sampling, tree=tree, knobs=knobs,
                 backend=backend)
    gpu_backend = backend == "trt" or (backend == "auto" and engines_built(engine_dir))
    preflight(engine_dir, gpu=gpu, memory_gib=memory_gib, gpu_backend=gpu_backend, batch=1,
              tree=tree["tree_tokens"], cfg_scale=sampling["cfg_scale"])  # run decodes one prompt per call
    rc.run("run", _run, prompts=prompts, out_dir=out_dir, overwrite=overwrite, threads=threads,
           encoder_dir=encoder_dir, echo=click.echo)


def _run(rc, *, prompts, out_dir, overwrite, threads, encoder_dir, echo, **_):
    """The family-seam run: Pipeline over the bundle's engines, one decode per prompt."""
    from ..runtime.outputs import save_run
    from ..runtime.pipeline import Pipeline
    from ..runtime.prompts import parse_prompts
    from ..text.prompts import precheck_prompts
    from ..validation import check_out_dir

    check_out_dir(out_dir, overwrite=overwrite)
    precheck_prompts(rc.source, prompts, encoder_dir)  # t2i: prompts + encoder checked before engines load
    pipe = Pipeline.from_dir(rc.source, backend=rc.backend, threads=threads, text_encoder=encoder_dir)
    cfg = pipe.config
    ps = parse_prompts(prompts, model_type=cfg.model_type, num_classes=getattr(cfg, "num_classes", 0),
                       class_names=pipe.class_names)
    if rc.method is None:
        echo(f"verify auto: {pipe.resolve_verify(rc.verify)[2]}")
    s = rc.given["sampling"]
    res = pipe.generate(ps, seed=rc.seed, verify=rc.method or rc.verify, cfg_scale=s["cfg_scale"],
                        temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"], greedy=s["greedy"],
                        progress=sys.stderr.isatty(), **rc.given["tree"], **rc.given["knobs"])
    verify = res.stats[0]["verify"] if res.stats else rc.verify  # what "auto" ran
    mal = sum(st["mal"] for st in res.stats) / len(res.stats)
    secs = sum(st["seconds"] for st in res.stats)
    out = save_run(out_dir, res, ps, {"family": pipe.family.name, "backend": pipe.backend, "verify": verify,
                                      "mal": mal, "seconds": secs, "images": res.stats}, overwrite=overwrite)
    echo(f"{len(res.images)} images -> {out} ({pipe.backend}, {verify}): mean MAL {mal:.2f}, {secs:.2f} s")


COMMANDS = (run,)
