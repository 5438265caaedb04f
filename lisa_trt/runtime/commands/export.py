"""`lisa-trt export`, `build`, `plan` and `quantize-trt`: an ONNX bundle, its engines, memory plan, Q/DQ copy."""

from __future__ import annotations


def export(rc, *, out_dir, drafter, tables, vq, vq_config, fp16, opset, max_tree, validate, quantize, max_prompt,
           echo, torch_weights=False, **_):
    """export/bundle.export_bundle (the family's graphs, one writer for every family); one line per graph."""
    from ...artifacts import (
        default_drafter,
        default_tables,
        find_vq,
        load_drafter_by_name,
        load_tables_by_name,
    )
    from ...export.bundle import export_bundle
    from ..outputs import generation_defaults

    rc = rc.load(dirs={"--out engine directory": out_dir})
    target, source = rc.target, rc.source
    _export_family(rc)  # a family without an ExportFamily: refused, naming what is missing
    drafter, tables = drafter or default_drafter(source), tables or default_tables(source)
    sub_vocab = rc.conditions.sub_vocab(rc)
    dr = load_drafter_by_name(drafter, target) if drafter else None
    tb = load_tables_by_name(tables, target, sub_vocab) if tables else None
    vqm, _ = find_vq(source, vq, vq_config, family=rc.family)
    generation = generation_defaults(source, target, rc.sampling, drafter=drafter, drafter_model=dr, tables=tables,
                                     model_name=rc.given.get("model"))
    man = export_bundle(target, dr, tb, vqm, out_dir, source=source, image_size=rc.given.get("image_size"),
                        max_prompt=max_prompt, max_tree=max_tree, opset=opset, generation=generation,
                        validate=validate, fp16=fp16, quantize=quantize, torch_weights=torch_weights)
    _print_export(man, out_dir, echo)


def _export_family(rc):
    """The bound target's ExportFamily (export/families.py), or an InputError naming what is missing."""
    from ...errors import ConfigError, InputError
    from ...export.families import export_family

    try:
        return export_family(rc.target)
    except ConfigError as e:
        raise InputError(f"{rc.family.name} models cannot be exported yet: the family registers no ExportFamily "
                         "(the io specs, static axes and PyTorch references of its target and VQ graphs, "
                         "export/families.py); generate, train and calibrate run in memory. " + str(e)) from e


def _print_export(man, out_dir, echo) -> None:
    """Each graph's precision and validation error, the quantization summary, the bundle."""
    for name, g in man.graphs.items():
        err = (g.validation or {}).get("max_error")
        prec = (g.quantization or {}).get("mode", g.precision)
        echo(f"{name:16s} {prec}  max|ORT - torch| {err if err is not None else 'n/a'}")
    if man.quantization != "none":
        from ...export.quantize import quantization_summary

        for line in quantization_summary(man):
            echo(line)
    q = "" if man.quantization == "none" else f", {man.quantization} weights"
    echo(f"wrote {out_dir} ({len(man.graphs)} graphs, {man.precision}{q}, opset {man.opset})")


def build(rc, *, max_batch, max_tree, timing_cache, refit, workspace, dry_run, gpu, memory_gib, echo,
          attention="auto", json_path=None, **_):
    """The memory plan checked, then the engines built (deploy/build.py); prints one verdict line
    (build_verdict), and the build record as JSON to `json_path` ("-": stdout) when given."""
    from ...deploy.build import build_engines, build_verdict
    from ...deploy.memory_plan import preflight
    from ...io import write_json_output

    if json_path and json_path != "-":
        _check_json_folder(json_path)

    preflight(rc.source, gpu=gpu, memory_gib=memory_gib, gpu_backend=True, batch=max_batch, tree=max_tree,
              cfg=True, workspace=workspace)  # before any TensorRT work
    rec = build_engines(rc.source, profiles=None, timing_cache=timing_cache, refit=refit, workspace=workspace,
                        max_batch=max_batch, max_tree=max_tree, attention=attention, dry_run=dry_run,
                        warn=lambda msg: echo(msg, err=True))
    to_stdout = json_path == "-"
    echo(build_verdict(rec, rc.source), err=to_stdout)
    if json_path and not write_json_output(json_path, rec, echo):
        echo(f"wrote {json_path}")


def _check_json_folder(json_path) -> None:
    """InputError when --json names a file in a folder that does not exist (nothing is created)."""
    from pathlib import Path

    from ...errors import InputError

    folder = Path(json_path).parent
    if not folder.is_dir():
        raise InputError(f"--json {json_path}: the folder {folder} does not exist; create it first "
                         f"(mkdir -p {folder}) or write the plan elsewhere")


def plan(model, *, json_path, echo, **settings) -> bool:
    """The memory plan of `model` (deploy/memory_plan.make_plan) printed, written to `json_path`
    when given ("-": stdout, the table then on stderr); True when it fits, else False after saying why."""
    from ...deploy.memory_plan import make_plan
    from ...models.hub import resolve_model

    from ...io import write_json_output

    to_stdout = json_path == "-"  # the JSON alone on stdout; the table goes to stderr
    if json_path and not to_stdout:
        _check_json_folder(json_path)
    p = make_plan(resolve_model(model, need="config"), **settings)  # a Hub name: its config.json only
    echo(p.table(), err=to_stdout)
    if json_path and not write_json_output(json_path, p.to_dict(), echo):
        echo(f"wrote {json_path}")
    if not p.fits:
        echo(f"does not fit: {p.reason}", err=True)
    return p.fits


def quantize_trt(engine_dir, out_dir, mode, *, venv, install, samples, echo) -> None:
    """deploy/trt_quantize.quantize_trt, then each quantized graph's mode and Q/DQ placement."""
    from ...deploy.trt_quantize import quantize_trt as run_quantize

    man = run_quantize(engine_dir, out_dir, mode, venv=venv, install=install, samples=samples, echo=echo)
    for name, g in sorted(man.graphs.items()):
        if g.quantization:
            echo(f"{name:16s} {g.quantization['mode']}  {g.quantization['qdq']}")
    echo(f"wrote {out_dir} ({man.quantization}; TensorRT-compatibility check passed); "
         f"build with `lisa-trt build {out_dir}`")
