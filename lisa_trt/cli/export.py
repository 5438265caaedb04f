"""`lisa-trt export`, `build`, `plan` and `quantize-trt`: ONNX bundles, TensorRT engines, memory plans."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..clitools import handle_errors
from ..engines.allocation import PLAN_BACKENDS
from . import options as opt


def overwrite_option(fn):
    """--overwrite (declared once, options.py) with the wording of a command that replaces a whole
    artifact (io.refuse_existing, the one rule): export, build, calibrate, convert, random-checkpoint,
    quantize-trt. options.py's help speaks of run / generate's output folders."""
    fn = opt.overwrite_option(fn)
    fn.__click_params__[-1].help = ("Replace an existing artifact at the path written (refused without it, before "
                                    "any work; the new one is swapped in only when complete).")
    return fn


# export --precision: plan's spelling (deploy/memory_plan.PRECISIONS); the ones an export writes
# -> (--fp16, --quantize)
EXPORT_PRECISIONS = {"fp32": (False, "none"), "fp16": (True, "none"), "int8": (False, "int8"),
                     "int4": (False, "int4")}


def _precision(ctx, precision, fp16: bool, quantize: str):
    """--precision (plan's spelling) or the older --fp16 / --quantize -> (fp16, quantize); a
    usage error when they disagree."""
    if precision is None:
        return fp16, quantize
    if precision not in EXPORT_PRECISIONS:
        raise click.UsageError(f"--precision {precision}: an export writes {', '.join(EXPORT_PRECISIONS)} graphs "
                               f"({precision} is a precision `lisa-trt plan` sizes, not one the exporter writes); "
                               "for TensorRT fp8 / int8 / int4 engines export fp32 or fp16, then `lisa-trt quantize-trt "
                               "DIR --mode fp8|int8|int4` (docs/quantization.md)", ctx)
    want = EXPORT_PRECISIONS[precision]
    given = [f for f, on in (("--fp16", fp16), (f"--quantize {quantize}", quantize != "none")) if on]
    if given and (fp16, quantize) != want:
        raise click.UsageError(f"--precision {precision} contradicts {' and '.join(given)}; give one of them "
                               "(--precision is the spelling `lisa-trt plan` uses)", ctx)
    return want


@click.command("export")
@opt.model_options()
@opt.drafter_option("Drafter (.safetensors or demo-lisa / demo-eagle3 / demo-medusa-lisa; demo default demo-lisa).")
@opt.tables_option("Calibration tables (demo: bundled).")
@opt.vq_options("VQ checkpoint for the decoder graph (demo: bundled).")
@opt.out_option("Engine directory to write.", required=True)
@overwrite_option
@opt.precision_option("Graph precision, spelled as `lisa-trt plan --precision`: fp32 (default), fp16 (= --fp16), "
                      "int8 / int4 (= --quantize int8 / int4: ONNX Runtime weight quantization of fp32 graphs); "
                      "bf16 / fp8 are refused (TensorRT fp8: lisa-trt quantize-trt).")
@click.option("--fp16", is_flag=True, help="fp16 graphs (norm statistics, softmax, logits kept fp32).")
@click.option("--opset", type=int, default=None, help="ONNX opset (default 23: ONNX Attention).")
@opt.max_tree_option("Largest tree the engines verify (static cache length).")
@click.option("--no-validate", is_flag=True, help="Skip the ORT-vs-PyTorch check of every graph.")
@click.option("--quantize", type=click.Choice(["none", "int8", "int4"]), default="none", show_default=True,
              help="ONNX Runtime weight quantization of target + drafter graphs (docs/quantization.md).")
@click.option("--max-prompt", type=int, default=None,
              help="Text-prompt models (Lumina-mGPT): most prompt tokens a run may use (static cache; default 128).")
@click.option("--torch-weights", is_flag=True,
              help="Also write the fp32 PyTorch weights (weights/*.safetensors, a second copy); by default the torch "
                   "backend reads the graphs' shared weights file, and a --quantize bundle (no fp32 weights in its "
                   "graphs) runs on the torch backend only with this flag (docs/deployment.md).")
@opt.sampling_options
@handle_errors
def export_cmd(model, model_cfg, drafter, tables, vq, vq_config, out_dir, overwrite, precision, fp16, opset, max_tree,
               no_validate, quantize, max_prompt, torch_weights, sampling):
    """ONNX graphs for target, drafter, GASV and VQ decoder + manifest (validated, atomic).

    An existing --out is replaced only with --overwrite (refused before any work)."""
    from ..io import refuse_existing
    from ..runtime.commands.export import export as entry
    from ..runtime.context import resolve

    fp16, quantize = _precision(click.get_current_context(), precision, fp16, quantize)
    refuse_existing(out_dir, overwrite=overwrite)
    rc = resolve(model, sampling=sampling, model_cfg=model_cfg)
    rc.run(entry, out_dir=out_dir, drafter=drafter, tables=tables, vq=vq, vq_config=vq_config, fp16=fp16,
           opset=opset, max_tree=max_tree, validate=not no_validate, quantize=quantize, max_prompt=max_prompt,
           torch_weights=torch_weights, echo=click.echo)


@click.command()
@opt.engine_dir_argument
@click.option("--max-batch", type=int, default=1, show_default=True, help="Prompts per call (CFG doubles it).")
@opt.max_tree_option("Largest tree verified at once (default: the export's).")
@click.option("--timing-cache", default=None, type=click.Path(), help="Reuse/update a TensorRT timing cache.")
@click.option("--refit", is_flag=True, help="Build refittable engines (weight swaps without rebuild).")
@opt.workspace_option("Builder workspace limit in MiB (default: the 1024 MiB `plan` counts).")
@click.option("--attention", type=click.Choice(["auto", "op", "plain"]), default="auto", show_default=True,
              help="auto: first build each attention the bundle holds alone (its fused MatMul -> mask -> "
                   "Softmax -> MatMul chain, or an ONNX Attention node); a refused chain warns (built as "
                   "exported, likely unfused), a refused Attention node is built as plain ops; op: a refused "
                   "probe stops the build; plain: no probe (docs/tensorrt.md).")
@click.option("--dry-run", is_flag=True, help="Check compatibility and plan the profiles; build nothing (one verdict "
                                              "line; --json for the plan).")
@opt.json_option("Also write the build record (with --dry-run: the plan and its profiles) as JSON here; - for stdout.",
                 dir_okay=False)
@overwrite_option
@opt.device_options("Check the memory plan against this GPU first (default: the visible CUDA device).")
@handle_errors
def build(engine_dir, max_batch, max_tree, timing_cache, refit, workspace, attention, dry_run, json_path, overwrite,
          gpu, memory_gib):
    """TensorRT engines for every graph of an exported bundle (Polygraphy loaders, strongly typed).

    Needs TensorRT and an NVIDIA GPU; without them it says what is missing and how to run the
    bundle through ONNX Runtime instead (`lisa-trt run ENGINE_DIR PROMPTS --backend ort`).
    Before any TensorRT work the memory plan (`lisa-trt plan ENGINE_DIR`) is checked against
    --gpu / --memory-gib or the visible CUDA device, and a plan that does not fit is refused.
    Then each attention the bundle holds is built alone (seconds) before the engines (--attention).
    Engines already built in ENGINE_DIR are replaced only with --overwrite (refused before any work)."""
    from ..engines.trt_plans import engines_built
    from ..io import refuse_existing
    from ..runtime.commands.export import build as entry
    from ..runtime.context import resolve
    from ..deploy.memory_plan import WORKSPACE_BYTES  # one default with `plan`

    if not dry_run:
        refuse_existing(engine_dir, overwrite=overwrite, option="ENGINE_DIR",
                        what="already holds built TensorRT engines",
                        exists=engines_built)
    resolve(engine_dir=engine_dir, backend="trt").run(
        entry, max_batch=max_batch, max_tree=max_tree, timing_cache=timing_cache, refit=refit,
        workspace=(workspace << 20) if workspace else WORKSPACE_BYTES, attention=attention, dry_run=dry_run,
        gpu=gpu, memory_gib=memory_gib, json_path=json_path, echo=click.echo)


def _removed(ctx, name: str, value) -> None:
    """A removed option given: a usage error (exit 2) saying why it went and what to do."""
    if value is not None:
        from ..engines.graph import REMOVED_OPTIONS

        raise click.UsageError(f"--{name.replace('_', '-')} was removed: {REMOVED_OPTIONS[name]}", ctx)


@click.command()
@click.argument("model")
@opt.device_options("GPU to plan for (default rtx4090); or --memory-gib.")
@opt.precision_option("Weight precision (default: an engine directory's own, else fp16).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="Images per call.")
@click.option("--tree", type=click.IntRange(min=1), default=None,
              help="Draft-tree nodes verified per call (default: an engine directory's max tree, else 64).")
@opt.image_size_option(type=click.IntRange(min=1), default=None,
                       help="Pixels (default: GPT-B / GPT-L / GPT-XXXL / GPT-1B / GPT-7B 256, "
                            "GPT-XL / GPT-XXL / GPT-3B 384, Lumina-mGPT-7B 768, Janus-Pro-7B 384, Emu3-Gen 720; "
                            "an engine directory: its own).")
@click.option("--prompt-len", type=click.IntRange(min=1), default=None,
              help="Prompt tokens in the cache (default: LlamaGen's condition prefix, 128 for text prompts).")
@click.option("--no-cfg", is_flag=True, help="No classifier-free guidance (CFG doubles the rows).")
@opt.workspace_option("Builder workspace in MiB (default 1024, as `lisa-trt build --workspace`).",
                      type=click.IntRange(min=0))
@click.option("--weight-copies", type=click.IntRange(min=1), default=None,
              help="Copies of the target weights (2: separate prefill and verify engines; default: what "
                   "`lisa-trt build` makes, 1, or 2 for an engine directory exported before one target engine).")
@opt.backend_option(PLAN_BACKENDS, default="trt", help="Runtime planned: TensorRT (trt) or ONNX Runtime (ort).")
@opt.json_option("Write the plan (with `fits`) here as JSON; - for stdout (the table then goes to stderr).",
                 dir_okay=False)
@click.option("--kv-binding", hidden=True, expose_value=False, callback=lambda ctx, param, value: _removed(ctx, "kv_binding", value))
@handle_errors
def plan(model, gpu, memory_gib, precision, batch, tree, image_size, prompt_len, no_cfg, workspace, weight_copies,
         backend, json_path):
    """Memory plan: weights, KV cache, drafter, tables, activations per engine against a GPU.

    MODEL: a known name (GPT-B, GPT-L, GPT-XL, GPT-XXL, GPT-XXXL, GPT-1B, GPT-3B, GPT-7B,
    Lumina-mGPT-7B, Janus-Pro-7B, Emu3-Gen; any case), a checkpoint (.safetensors with its config,
    or a Chameleon / Lumina-mGPT, Janus-Pro or Emu3 directory), a Hugging Face name org/name (its
    config.json only is fetched), or an engine directory. Prints the table and the largest
    batch and tree that fit. Exit status 0 when it fits, 1 when it does not (with the reason), 2
    for bad input (docs/deployment.md)."""
    from ..runtime.commands.export import plan as entry

    if not entry(model, gpu=gpu, memory_gib=memory_gib, precision=precision, batch=batch, tree=tree,
                 image_size=image_size, prompt_len=prompt_len, cfg=not no_cfg,
                 workspace=None if workspace is None else workspace << 20, weight_copies=weight_copies,
                 backend=backend, json_path=json_path, echo=click.echo):
        sys.exit(1)


@click.command("quantize-trt")
@opt.engine_dir_argument
@click.option("--mode", type=click.Choice(["int8", "fp8", "int4"]), required=True,
              help="int8 / fp8: Q/DQ on weights + activations (calibrated); int4: 4-bit weight-only.")
@opt.out_option("New engine directory to write.", required=True)
@overwrite_option
@click.option("--venv", default=None, type=click.Path(),
              help="ModelOpt venv (default $LISA_TRT_MODELOPT_VENV or ~/.cache/lisa-trt/modelopt-venv).")
@click.option("--install/--no-install", default=True, show_default=True,
              help="Create the venv and pip install nvidia-modelopt[onnx] into it when missing.")
@click.option("--calibration-steps", type=int, default=4, show_default=True, help="Calibration steps per graph.")
@handle_errors
def quantize_trt_cmd(engine_dir, mode, out_dir, overwrite, venv, install, calibration_steps):
    """TensorRT Q/DQ graphs through NVIDIA ModelOpt, run in its own venv (docs/quantization.md)."""
    from ..io import refuse_existing
    from ..runtime.commands.export import quantize_trt

    refuse_existing(out_dir, overwrite=overwrite)
    quantize_trt(engine_dir, out_dir, mode, venv=Path(venv) if venv else None, install=install,
                 samples=calibration_steps, echo=click.echo)


COMMANDS = (export_cmd, build, plan, quantize_trt_cmd)
