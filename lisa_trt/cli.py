"""`lisa-trt` command line. Thin: each command builds one config and makes one library call."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .clitools import handle_errors


_handle_errors = handle_errors  # clitools.py: LisaError -> message, exit 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lisa-trt")
@click.option("--threads", "threads", type=click.IntRange(min=1), default=None, envvar="LISA_TRT_THREADS",
              help="CPU threads for torch and ONNX Runtime (env LISA_TRT_THREADS; default: the CPUs this "
                   "process may use, from its affinity and cgroup quota). Idle threads sleep, never spin.")
def main(threads):
    """lisa-trt: LISA speculative decoding for autoregressive image generators.

    Pipeline: train (drafter) -> calibrate (GASV tables) -> export (ONNX) -> build (TensorRT)
    -> run. `lisa-trt demo` runs all of it on the bundled CPU model.
    """
    from .threads import apply_thread_policy

    apply_thread_policy(threads)
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


# ----------------------------------------------------------------------------- shared options

def _model_type_choice():
    from .models.family import model_types

    return click.Choice(model_types())


def config_options(config_help: str, required: bool = False):
    """--config / --image-size / --model-type: the official-config group shared by every command."""

    def deco(fn):
        fn = click.option("--config", "config", required=required, default=None, help=config_help)(fn)
        fn = click.option("--image-size", type=int, default=256, show_default=True,
                          help="Image size for official configs (256/384/512).")(fn)
        fn = click.option("--model-type", type=_model_type_choice(), default=None,
                          help="Model family type for official configs (models/family.py; default c2i).")(fn)
        return fn

    return deco


def model_options(fn):
    fn = click.option("--model", "model", required=True,
                      help="Target checkpoint (.pt official / .safetensors) a bundled set such as 'demo', or a Chameleon / Lumina-mGPT directory.")(fn)
    return config_options("Target config name (GPT-B ... GPT-7B); default: the file's metadata.")(fn)


def _backend_choice(*extra):
    from .engines.base import backend_names

    return click.Choice([*extra, *backend_names()])


def _sampling_range(field):
    """Click callback: the shared range check of lisa_trt.validation (vocab size checked later)."""

    def cb(ctx, param, value):
        from .validation import sampling_problems

        problems = sampling_problems(**{field: value})
        if problems:
            raise click.BadParameter(problems[0].split(" ", 1)[1], ctx=ctx, param=param)
        return value

    return cb


def sampling_options(fn):
    from .config import SamplingConfig

    d = SamplingConfig()
    fn = click.option("--cfg-scale", type=float, default=None, callback=_sampling_range("cfg_scale"),
                      help=f"CFG scale >= 0, 1 = off (default {d.cfg_scale}; demo: its own).")(fn)
    fn = click.option("--temperature", type=float, default=None, callback=_sampling_range("temperature"),
                      help=f"Temperature > 0 (default {d.temperature}).")(fn)
    fn = click.option("--top-k", type=int, default=None, callback=_sampling_range("top_k"),
                      help=f"Top-k, 0 = off, at most the vocabulary size (default {d.top_k}).")(fn)
    fn = click.option("--top-p", type=float, default=None, callback=_sampling_range("top_p"),
                      help=f"Top-p in (0, 1] (default {d.top_p}).")(fn)
    fn = click.option("--cfg-interval", type=int, default=None, help="Guidance off after this step (-1 = always on).")(fn)
    fn = click.option("--greedy", is_flag=True, help="Argmax of the guided logits.")(fn)
    fn = click.option("--seed", type=int, default=0, show_default=True)(fn)
    return fn


def _gpu_choice():
    from .engines.plan import GPUS

    return click.Choice(list(GPUS))


def _precision_choice():
    from .engines.plan import PRECISIONS

    return click.Choice(list(PRECISIONS))


def device_options(what: str):
    """--gpu / --memory-gib: the device a memory plan is checked against (engines/plan.py)."""

    def deco(fn):
        fn = click.option("--memory-gib", type=float, default=None,
                          help="Device memory in GiB (instead of --gpu).")(fn)
        fn = click.option("--gpu", type=_gpu_choice(), default=None, help=what)(fn)
        return fn

    return deco


def _defaults(what: str):
    """Default instances of the dataclasses that hold CLI defaults (one source of truth)."""
    if what == "lantern":
        from .speculative.methods import LanternConfig

        return LanternConfig()
    from .speculative.gasv import GASVConfig

    return GASVConfig()


def _method_choice(kind=None):
    from .speculative.methods import method_names

    return click.Choice(method_names(kind))


def spec_options(fn):
    fn = click.option("--drafter", default=None, help="Drafter .safetensors, or demo-lisa / demo-eagle3 / demo-medusa-lisa (demo default: demo-lisa).")(fn)
    fn = click.option("--verify", type=_method_choice(), default=None,
                      help="Decoding method (speculative/methods.py; default: vanilla AR loop).")(fn)
    fn = click.option("--tables", default=None, help="Calibration tables (lisa-trt calibrate); demo: bundled.")(fn)
    return spec_options_bench(fn)


def spec_options_bench(fn):
    """Tree budget and every registered method's options; defaults read from SpecConfig."""
    from .speculative.methods import SpecConfig, cli_options

    d = SpecConfig().flat()
    for o in reversed(cli_options()):
        default = d.get(o.name)
        if o.name in _EXPOSED_KNOBS:  # parameters of the command functions
            fn = click.option(o.flag, *o.aliases, o.name, type=o.type, default=default,
                              show_default=default is not None, help=o.help)(fn)
        else:  # kept in the click context (spec_knobs), so commands need no new parameters
            fn = click.option(o.flag, *o.aliases, o.name, type=o.type, default=None, expose_value=False,
                              callback=_store_knob, help=o.help)(fn)
    tuned = " (default: the tree tuned for the backend: runtime/autotune.py, measured where shipped)"
    fn = click.option("--tree-top-k", type=int, default=None, help="EAGLE-2 tree: children per node" + tuned)(fn)
    fn = click.option("--tree-depth", type=int, default=None, help="EAGLE-2 tree: expansion rounds" + tuned)(fn)
    fn = click.option("--tree-tokens", type=int, default=None, help="EAGLE-2 tree: nodes incl. root" + tuned)(fn)
    return fn


_EXPOSED_KNOBS = ("lantern_delta", "gasv_kappa", "gasv_lambda")


def method_knob_options(fn):
    """Every registered method's options, kept in the click context (`spec_knobs()`); None = the
    bundle's / tables' value."""
    from .speculative.methods import cli_options

    for o in reversed(cli_options()):
        fn = click.option(o.flag, *o.aliases, o.name, type=o.type, default=None, expose_value=False,
                          callback=_store_knob, help=o.help)(fn)
    return fn


def _store_knob(ctx, param, value):
    if value is not None:
        ctx.meta.setdefault("lisa_knobs", {})[param.name] = value
    return value


def _store_meta(ctx, param, value):
    ctx.meta[param.name] = value
    return value


def _meta(name, default=None):
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(name, default) if ctx is not None else default


def spec_knobs() -> dict:
    """The method options given on the command line that are not command parameters
    ({SpecConfig flat name: value}: gasv_delta, gasv_neighbours, gasv_scope, lantern_gamma ...)."""
    ctx = click.get_current_context(silent=True)
    return dict(ctx.meta.get("lisa_knobs", {})) if ctx is not None else {}


def backend_tree(model, target, backend: str = "torch") -> dict:
    """The tree budget tuned for `backend` (measured ones when the artifact set ships them; the
    small CPU tree for torch on a CPU, the EAGLE-2 GPU tree on CUDA / TensorRT)."""
    import torch

    from .models.artifact_sets import artifact_set
    from .runtime.autotune import default_tree_budgets

    measured = None
    if artifact_set(model) is not None:
        from .runtime.demo import _measured_budgets

        measured = _measured_budgets()
    budgets = default_tree_budgets(target.config, measured)
    if backend == "torch" and torch.cuda.is_available():
        return budgets["trt"]
    return budgets.get(backend, budgets["default"])


def make_spec(verify, top_k, depth, total, lantern_delta=None, kappa=None, lam=None, *, tree_default=None,
              **method_options):
    """SpecConfig for `verify` (a non-tree method gets the first tree method's settings).

    Tree settings left as None take `tree_default` (the backend's tuned tree, `backend_tree`)."""
    from .speculative.methods import SpecConfig, method_names

    td = tree_default or {}
    top_k = td.get("top_k") if top_k is None else top_k
    depth = td.get("depth") if depth is None else depth
    total = td.get("total_tokens") if total is None else total
    tree = method_names("tree")
    return SpecConfig.make(verify if verify in tree else tree[0], top_k=top_k, depth=depth, total_tokens=total,
                           lantern_delta=lantern_delta, gasv_kappa=kappa, gasv_lambda=lam,
                           **{**spec_knobs(), **method_options})


def resolve_spec_artifacts(model, target, methods, drafter, tables):
    """Drafter and tables that `methods` need (the bundled ones for the demo model)."""
    from .artifacts import default_drafter, default_tables, load_drafter_by_name, load_tables_by_name
    from .errors import InputError

    from .speculative.methods import get_method

    needs_drafter = [m for m in methods if m is not None and get_method(m).needs_drafter]
    needs_tables = [m for m in methods if m is not None and get_method(m).needs_tables]
    drafter = drafter or default_drafter(model)
    tables = tables or default_tables(model)
    if needs_drafter and drafter is None:
        raise InputError(f"{needs_drafter[0]} verification needs --drafter (train one with `lisa-trt train`)")
    if needs_tables and tables is None:
        raise InputError(f"{needs_tables[0]} verification needs --tables (make them with `lisa-trt calibrate`)")
    dr = load_drafter_by_name(drafter, target) if needs_drafter else None
    tb = load_tables_by_name(tables, target) if needs_tables else None
    return dr, tb


def _is_artifact_set(model) -> bool:
    from .models.artifact_sets import artifact_set

    return artifact_set(model) is not None


def _default_vq(model, vq):
    from .artifacts import default_vq

    return default_vq(model, vq)


def _vq_config_for(vq, vq_config):
    from .artifacts import vq_config_for

    return vq_config_for(vq, vq_config)


def _class_conditioned(tc) -> bool:
    from .models.family import family_of

    return family_of(tc).class_conditioned(tc)


def resolve_target(model, config, image_size, model_type):
    from .config import target_config
    from .models.checkpoints import load_target

    cfg = None
    if config is not None:
        cfg = target_config(config, image_size=image_size, model_type=model_type)
    return load_target(model, cfg)


def resolve_sampling(model, vocab_size=None, **given):
    """SamplingConfig from CLI values; unset values come from the bundle defaults (demo) or
    the dataclass defaults. Checked with lisa_trt.validation (top-k against `vocab_size`)."""
    import dataclasses

    from .config import SamplingConfig

    from .models.artifact_sets import artifact_set

    aset = artifact_set(model)
    base = aset.extra("demo_sampling", SamplingConfig)() if aset is not None else SamplingConfig()
    s = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None and v is not False})
    from .validation import check_sampling

    check_sampling(s, vocab_size=vocab_size)
    return s


# ----------------------------------------------------------------------------- commands

@main.command()
@click.argument("src")
@click.argument("dst")
@config_options("Target config name (GPT-B ...) or VQ-16/VQ-8.", required=True)
@_handle_errors
def convert(src, dst, config, image_size, model_type):
    """Convert an official LlamaGen .pt (target or VQ) to safetensors + config JSON."""
    from .config import target_config, vq_config
    from .models.checkpoints import load_target, load_vq, save_model

    if config.startswith("VQ"):
        cfg = vq_config(config)
        model = load_vq(src, cfg)
    else:
        cfg = target_config(config, image_size=image_size, model_type=model_type)
        model = load_target(src, cfg)
    save_model(model, cfg, dst)
    click.echo(f"wrote {dst} (+ {Path(dst).with_suffix('.json').name})")


@main.command("random-checkpoint")
@click.argument("out")
@config_options("GPT-B ... GPT-7B, tiny, or VQ-16/VQ-8.", required=True)
@click.option("--seed", type=int, default=0, show_default=True)
@_handle_errors
def random_checkpoint(out, config, image_size, model_type, seed):
    """Write a randomly initialised checkpoint in the official layout ({"model": state_dict})."""
    import torch

    from .config import target_config, vq_config
    from .io import atomic_write
    from .models.families.llamagen.model import Transformer
    from .models.families.llamagen.vq import VQModel

    torch.manual_seed(seed)
    if config.startswith("VQ"):
        model = VQModel(vq_config(config))
    else:
        model = Transformer(target_config(config, image_size=image_size, model_type=model_type))
    with atomic_write(out) as tmp:
        torch.save({"model": model.state_dict()}, tmp)
    click.echo(f"wrote {out}")


@main.command()
@model_options
@click.option("--vq", "vq", default=None, help="VQ checkpoint (or 'demo'); without it only tokens are written.")
@click.option("--vq-config", default="VQ-16", show_default=True)
@click.option("--classes", default=None, help="c2i: comma-separated class ids (or names for the demo).")
@click.option("--captions", default=None, type=click.Path(exists=True),
              help="t2i: captions .txt (one per line, needs --encoder) or T5 features (.safetensors / .npy).")
@click.option("--encoder", "encoder_dir", default=None, type=click.Path(), help="t2i: local flan-t5-xl directory (for a captions .txt).")
@click.option("--prompt", "prompts", multiple=True,
              help="Chameleon / Lumina-mGPT directory models: a text prompt (repeat for a batch).")
@sampling_options
@spec_options
@click.option("--out", "out_dir", default="outputs", show_default=True, type=click.Path())
@click.option("--overwrite", is_flag=True, help="Write into a non-empty --out (earlier images/stats are removed).")
@_handle_errors
def generate(model, config, image_size, model_type, vq, vq_config, classes, captions, encoder_dir, prompts, cfg_scale,
             temperature, top_k, top_p, cfg_interval, greedy, seed, drafter, verify, tables,
             tree_top_k, tree_depth, tree_tokens, lantern_delta, gasv_kappa, gasv_lambda, out_dir, overwrite):
    """Generate images: the reference AR loop, or tree speculation with --drafter/--verify.

    Writes PNGs (when a VQ is known), tokens.npy and stats.json."""
    import dataclasses

    if _is_chameleon(model):  # Chameleon family (Lumina-mGPT): text prompts, see docs/chameleon.md
        from .runtime.chameleon import cli_generate

        size_given = click.get_current_context().get_parameter_source("image_size").name != "DEFAULT"
        return cli_generate(model, prompts, out_dir, image_size if size_given else None, vq, cfg_scale,
                            temperature, top_k, greedy, seed, verify, drafter,
                            tuple(d if v is None else v for v, d in zip((tree_top_k, tree_depth, tree_tokens), (4, 4, 16))),
                            tables)
    import torch

    from .errors import InputError
    from .runtime.outputs import class_names_of, decode_and_save, load_vq_for, parse_classes, save_generation
    from .speculative.methods import method_names
    from .speculative.run import run_method
    from .validation import check_out_dir

    from .models.family import family_of

    check_out_dir(out_dir, overwrite=overwrite)
    from .text.train import precheck_captions

    precheck_captions(captions, encoder_dir)  # before any model loads
    target = resolve_target(model, config, image_size, model_type)
    vq = _default_vq(model, vq)
    vqm = load_vq_for(vq, vq_config, tc=target.config) if vq is not None else None  # fails before generating
    tc = target.config
    s = resolve_sampling(model, target.config.vocab_size, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k,
                         top_p=top_p, cfg_interval=cfg_interval, greedy=greedy)
    if family_of(tc).class_conditioned(tc):
        if classes is None:
            raise InputError("c2i models need --classes (e.g. --classes 0,1,2)")
        cond = torch.tensor(parse_classes(classes, tc.num_classes, class_names_of(model)))
    else:
        from .text.train import prompt_conds

        cond, _ = prompt_conds(tc, captions, encoder_dir, what="generate")
    verify = verify or method_names("ar")[0]  # default: the vanilla AR loop
    dr, tb = resolve_spec_artifacts(model, target, [verify], drafter, tables)
    spec = make_spec(verify, tree_top_k, tree_depth, tree_tokens, lantern_delta, gasv_kappa, gasv_lambda,
                     tree_default=backend_tree(model, target, "torch"))
    n_img = len(cond) if torch.is_tensor(cond) else cond[0].shape[0]
    click.echo(f"{verify}: decoding {n_img} image(s), {tc.block_size} tokens each"
               + ("" if verify in method_names("ar") else
                  f", draft tree top-k {spec.tree.top_k} / depth {spec.tree.depth} / {spec.tree.total_tokens} nodes "
                  "(smaller trees are faster on a CPU: --tree-tokens)") + " ...", err=True)
    from .progress import progress_bar

    show = sys.stderr.isatty()
    bar = progress_bar(n_img * tc.block_size, show, unit="token")
    tokens, st = run_method(verify, target, dr, tb, cond, sampling=s, spec=spec, seed=seed,  # no bar: no per-step sync
                            on_progress=(lambda done: bar.update(done - bar.n)) if show else None)
    bar.close()
    stats = st.as_dict()
    click.echo(f"{verify}: MAL {stats['mal']:.2f}, {stats['target_forwards']} target forwards, "
               f"mean TVD {stats['mean_tvd']:.4f}, {stats['times']['total']:.2f} s")
    tree_rec = dataclasses.asdict(spec.tree) if verify in method_names("tree") else None
    out = save_generation(out_dir, tokens, {"verify": verify, "sampling": dataclasses.asdict(s), "tree": tree_rec,
                                            **stats},
                          overwrite=overwrite)
    if vqm is not None:
        paths = decode_and_save(tokens, vqm, vq_config, tc, out)
        click.echo(f"wrote {len(paths)} images and tokens.npy to {out}")
    else:
        click.echo(f"wrote tokens.npy to {out} (pass --vq to decode images)")


def _chameleon_size(image_size, default: int = 512) -> int:
    """--image-size for Chameleon directory models: the given one, else Lumina-mGPT's default."""
    given = click.get_current_context().get_parameter_source("image_size").name != "DEFAULT"
    return image_size if given else default


def _is_chameleon(model) -> bool:
    """A Chameleon / Lumina-mGPT HF directory (docs/chameleon.md), not a bundled artifact set."""
    from .models.artifact_sets import artifact_set

    return artifact_set(model) is None and Path(model).is_dir()


@main.command()
@model_options
@click.option("--vq", "vq", default=None, help="VQ checkpoint whose codebook defines the geometry ('demo' for the demo).")
@click.option("--vq-config", default="VQ-16", show_default=True)
@click.option("--out", "out_path", required=True, type=click.Path(), help="Output .safetensors.")
@click.option("--rollouts", type=int, default=64, show_default=True, help="Images generated for the drift budgets.")
@click.option("--samples-per-pos", type=int, default=8, show_default=True)
@click.option("--quantile", type=float, default=0.5, show_default=True)
@click.option("--clusters", type=int, default=None, help="Default round(2 sqrt(V)).")
@click.option("--cluster-space", type=click.Choice(["codebook", "w_tilde"]), default="codebook", show_default=True)
@click.option("--lantern-k", type=int, default=_defaults("lantern").k, show_default=True)
@click.option("--kappa", type=float, default=_defaults("gasv").kappa, show_default=True)
@click.option("--lambda", "lam", type=float, default=_defaults("gasv").lam, show_default=True)
@click.option("--captions", default=None, type=click.Path(exists=True),
              help="t2i: rollout prompts, cycled to --rollouts (captions .txt with --encoder, or T5 features).")
@click.option("--encoder", "encoder_dir", default=None, type=click.Path(), help="t2i: local flan-t5-xl directory (for a captions .txt).")
@click.option("--captions-file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Chameleon directory models: rollout captions, one per line (default: built-in list).")
@click.option("--delta", type=float, default=None, expose_value=False, callback=_store_knob,
              help="GASV default mass budget (default 1: no cap).")
@click.option("--neighbours", type=int, default=None, expose_value=False, callback=_store_knob,
              help="GASV K_n: candidates per draft, also the calibration's N(z) (default 16).")
@sampling_options
@_handle_errors
def calibrate(model, config, image_size, model_type, vq, vq_config, out_path, rollouts, samples_per_pos,
              quantile, clusters, cluster_space, lantern_k, kappa, lam, captions, encoder_dir, captions_file, cfg_scale,
              temperature, top_k, top_p, cfg_interval, greedy, seed):
    """GASV whitening / cluster / budget tables and LANTERN neighbour lists, from rollouts."""
    if _is_chameleon(model):  # image-code tables (runtime/chameleon.py, docs/chameleon.md)
        from .runtime.chameleon import calibrate_cli

        t = calibrate_cli(model, out_path, image_size=_chameleon_size(image_size), vq=vq, captions_file=captions_file,
                          rollouts=rollouts, samples_per_pos=samples_per_pos, quantile=quantile, clusters=clusters,
                          lantern_k=lantern_k, kappa=kappa, lam=lam, cfg_scale=3.0 if cfg_scale is None else cfg_scale,
                          temperature=1.0 if temperature is None else temperature,
                          top_k=2000 if top_k is None else top_k, seed=seed)
        return click.echo(f"wrote {out_path}: {t.n_clusters} clusters over {t.vocab_size} image codes")
    from .calibration.profile import calibrate as run_calibration
    from .calibration.tables import save_tables
    from .models.checkpoints import load_vq
    from .speculative.gasv import GASVConfig
    from .validation import check_positive, probe_writable_file

    check_positive(rollouts, "--rollouts")
    check_positive(samples_per_pos, "--samples-per-pos")
    check_positive(clusters, "--clusters")
    probe_writable_file(out_path, "--out file")
    from .text.train import precheck_captions

    precheck_captions(captions, encoder_dir)  # before any model loads
    target = resolve_target(model, config, image_size, model_type)
    vq = _default_vq(model, vq)
    if vq is None:
        from .errors import InputError

        raise InputError("calibration needs the VQ codebook: pass --vq (e.g. vq_ds16_c2i.pt)")
    conds = None
    if not _class_conditioned(target.config):
        from .text.train import prompt_conds

        conds, _ = prompt_conds(target.config, captions, encoder_dir, n=rollouts, what="calibration rollouts")
    vqm = load_vq(vq, _vq_config_for(vq, vq_config))
    s = resolve_sampling(model, target.config.vocab_size, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k,
                         top_p=top_p,
                         cfg_interval=cfg_interval, greedy=greedy)
    tables = run_calibration(target, vqm.codebook().detach(), conds=conds, num_rollouts=rollouts,
                             samples_per_pos=samples_per_pos, quantile=quantile, n_clusters=clusters,
                             cluster_space=cluster_space, lantern_k=lantern_k, seed=seed, sampling=s,
                             gasv=GASVConfig(kappa=kappa, lam=lam, **spec_knobs()))
    save_tables(tables, out_path)
    click.echo(f"wrote {out_path}: {tables.n_clusters} clusters, theta_geo {tables.theta_geo:.3f}, "
               f"LANTERN k {tables.lantern_neighbors.shape[1]}")


@main.command()
@model_options
@click.option("--vq", "vq", default=None, help="VQ checkpoint (codebook geometry for the LISA loss); 'demo' for the demo.")
@click.option("--vq-config", default="VQ-16", show_default=True)
@click.option("--out", "out_dir", required=True, type=click.Path(), help="Run directory (resumed if it has checkpoints).")
@click.option("--loss", type=click.Choice(["lisa", "eagle3", "eagle1"]), default="lisa", show_default=True)
@click.option("--steps", type=int, default=None)
@click.option("--batch-size", type=int, default=None)
@click.option("--lr", type=float, default=None)
@click.option("--ttt-steps", type=int, default=None)
@click.option("--data", "source", type=click.Choice(["self", "tokens", "images"]), default="self", show_default=True,
              help="self: target-generated sequences; tokens: --token-file; images: --image-dir encoded with the VQ.")
@click.option("--token-file", default=None, type=click.Path())
@click.option("--image-dir", default=None, type=click.Path(), help="One sub-folder of images per class (--data images).")
@click.option("--captions", default=None, type=click.Path(),
              help="t2i: captions .txt (needs --encoder) or caption features .safetensors (encode-captions).")
@click.option("--encoder", "encoder_dir", default=None, type=click.Path(), help="t2i: local flan-t5-xl directory.")
@click.option("--num-samples", type=int, default=None, help="Self-distillation sequences.")
@click.option("--features", type=click.Choice(["online", "cache"]), default="online", show_default=True)
@click.option("--cfg-scale", type=float, default=None, help="Deployment CFG scale for self-distillation.")
@click.option("--drafter-hidden", type=int, default=None)
@click.option("--drafter-heads", type=int, default=None)
@click.option("--loss-off", default="", help="LISA terms to switch off (ablation), comma-separated: "
              "selection, soft_gate, veto, truncated_ce, kd.")
@click.option("--eval-every", type=int, default=0, show_default=True,
              help="Every N steps: held-out MAL proxy, top-1/top-3 agreement and real decoding MAL "
                   "(--eval-images prompts) logged to metrics.jsonl; 0 = only at the end.")
@click.option("--arch", type=click.Choice(["eagle3", "medusa"]), default="eagle3", show_default=True,
              help="Drafter architecture: EAGLE-3 drafter, or Medusa heads on the target's last hidden state.")
@click.option("--medusa-heads", type=int, default=4, show_default=True, help="Number of Medusa heads (--arch medusa).")
@click.option("--draft-vocab", type=int, default=None,
              help="Reduced draft vocabulary: the head predicts only the N most frequent training codes (EAGLE-3 d2t).")
@click.option("--checkpoint-every", type=int, default=None)
@click.option("--bf16", is_flag=True)
@click.option("--eval-images", type=int, default=4, show_default=True,
              help="Held-out prompts decoded with the trained drafter (real MAL, exact verification); 0 = skip.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--extend", is_flag=True,
              help="Continue a finished (or interrupted) run in OUT to a larger --steps; only the logging / "
                   "checkpoint / eval cadence may change too. The cosine schedule is stretched to the new total "
                   "(a warm restart).")
@click.option("--captions-file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Chameleon directory models: self-distillation captions, one per line (default: built-in list).")
@_handle_errors
def train(model, config, image_size, model_type, vq, vq_config, out_dir, loss, steps, batch_size, lr,
          ttt_steps, source, token_file, image_dir, captions, encoder_dir, num_samples, features, cfg_scale,
          drafter_hidden, drafter_heads, checkpoint_every, bf16, eval_images, seed, captions_file, loss_off, eval_every,
          arch, medusa_heads, draft_vocab, extend):
    """Distil a drafter (LISA locality-informed loss, or EAGLE-3/EAGLE-1 baselines).

    Resumes from OUT/checkpoints after an interruption. Multi-GPU: run under torchrun."""
    if _is_chameleon(model):  # EAGLE-3 step-0 KL distillation, resumable (runtime/chameleon.py)
        from .errors import InputError
        from .runtime.chameleon import train_cli

        if source != "self" or bf16 or features != "online":
            raise InputError("Chameleon directory models train on target rollouts only (--data self, fp32, "
                             "--features online); see docs/chameleon.md")
        kw = dict(num_samples=num_samples, steps=steps, batch_size=batch_size, lr=lr, cfg_scale=cfg_scale,
                  checkpoint_every=checkpoint_every)
        info = train_cli(model, out_dir, image_size=_chameleon_size(image_size), captions_file=captions_file,
                         drafter_hidden=drafter_hidden, drafter_heads=drafter_heads, seed=seed,
                         **{k: v for k, v in kw.items() if v is not None})
        return click.echo(f"wrote {Path(out_dir) / 'drafter.safetensors'} ({info['steps']} steps)")
    from .models.checkpoints import load_vq
    from .train.data import DataConfig
    from .train.losses import LossConfig
    from .train.trainer import TrainConfig, train_drafter
    from .validation import check_positive, probe_writable_dir

    for value, opt in ((steps, "--steps"), (batch_size, "--batch-size"), (num_samples, "--num-samples"),
                       (checkpoint_every, "--checkpoint-every")):
        check_positive(value, opt)
    check_positive(eval_images, "--eval-images", allow_zero=True)
    from .validation import check_sampling

    check_sampling(cfg_scale=cfg_scale)
    probe_writable_dir(out_dir, "--out run directory")
    from .text.train import precheck_captions

    precheck_captions(captions, encoder_dir)  # before any model loads
    target = resolve_target(model, config, image_size, model_type)
    vq = _default_vq(model, vq)
    if vq is None:
        from .errors import InputError

        raise InputError("training needs the VQ codebook (LISA locality geometry): pass --vq")
    caption_file = None
    if not _class_conditioned(target.config):  # captions encoded before any data work
        from .text.train import training_caption_file

        caption_file = training_caption_file(target.config, captions, encoder_dir, out_dir, source)
    vqm = load_vq(vq, _vq_config_for(vq, vq_config))
    if source == "images":
        from .errors import InputError
        from .train.data import encode_image_folder

        if image_dir is None:
            raise InputError("--data images needs --image-dir (one sub-folder of images per class)")
        token_file = str(encode_image_folder(vqm, image_dir, Path(out_dir) / "image_tokens.safetensors",
                                             grid=target.config.grid_size))
        source = "tokens"
    data_kw = dict(source=source, token_file=token_file, features=features, caption_file=caption_file)
    if num_samples is not None:
        data_kw["num_samples"] = num_samples
    if cfg_scale is not None:
        data_kw["cfg_scale"] = cfg_scale
    elif _is_artifact_set(model):
        data_kw["cfg_scale"] = resolve_sampling(model).cfg_scale
    kw = dict(steps=steps, batch_size=batch_size, lr=lr, ttt_steps=ttt_steps, drafter_hidden=drafter_hidden,
              drafter_heads=drafter_heads, checkpoint_every=checkpoint_every, seed=seed, draft_vocab=draft_vocab,
              eval_every=eval_every or None)
    cfg = TrainConfig(**{k: v for k, v in kw.items() if v is not None}, bf16=bf16, target_name=model,
                      loss=LossConfig(kind=loss, **_loss_switches(loss_off)), data=DataConfig(**data_kw))
    from .train.evaluate import decode_eval
    from .train.messages import format_eval, resume_hint

    try:
        if arch == "medusa":
            from .train.medusa import train_medusa

            if draft_vocab or eval_every or extend:
                from .errors import InputError

                raise InputError("--draft-vocab, --eval-every and --extend apply to the EAGLE-3 drafter (--arch eagle3); "
                                 "Medusa heads keep the full vocabulary and evaluate once at the end")
            result = train_medusa(target, vqm.codebook().detach(), cfg, out_dir, n_heads=medusa_heads)
        else:
            def eval_fn(drafter, step):  # real decoding MAL on held-out prompts (exact verification)
                return {"decode_mal": decode_eval(target, drafter, cfg, eval_images)["mal"]} if eval_images else {}

            result = train_drafter(target, vqm.codebook().detach(), cfg, out_dir, eval_fn=eval_fn, extend=extend)
    except KeyboardInterrupt:
        click.echo("\n" + resume_hint(out_dir, cfg.steps), err=True)
        sys.exit(130)
    click.echo(f"wrote {result.get('drafter', Path(out_dir) / 'drafter.safetensors')}")
    click.echo(format_eval(result.get("eval", {})))
    import os

    if eval_images and int(os.environ.get("RANK", "0")) == 0:  # one rank under torchrun
        from .artifacts import load_drafter_by_name

        ev = decode_eval(target, load_drafter_by_name(str(result["drafter"]), target), cfg, eval_images)
        from .io import write_json

        write_json(Path(out_dir) / "eval_decode.json", ev)
        click.echo(f"held-out decoding ({eval_images} images, exact verification): MAL {ev['mal']:.3f}")


def _loss_switches(text: str) -> dict:
    """--loss-off "selection,kd" -> {"selection": False, "kd": False} (LossConfig switches)."""
    from .errors import InputError

    valid = ("selection", "soft_gate", "veto", "truncated_ce", "kd")
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    bad = [n for n in names if n not in valid]
    if bad:
        raise InputError(f"unknown LISA term(s) {bad} in --loss-off; valid: {', '.join(valid)}")
    return {n: False for n in names}


@main.command()
@model_options
@click.option("--drafter", default=None, help="Drafter path or demo-lisa / demo-eagle3 / demo-medusa-lisa.")
@click.option("--tables", default=None, help="Calibration tables (demo: bundled).")
@click.option("--methods", default="vanilla,exact,lantern,gasv,sjd", show_default=True)
@click.option("--num-images", type=int, default=8, show_default=True)
@click.option("--classes", default=None, help="Class ids cycled over the images (default: all classes).")
@click.option("--captions", default=None, type=click.Path(exists=True),
              help="t2i: prompts cycled over the images (captions .txt with --encoder, or T5 features).")
@click.option("--encoder", "encoder_dir", default=None, type=click.Path(), help="t2i: local flan-t5-xl directory (for a captions .txt).")
@click.option("--backend", type=_backend_choice(), default="torch", show_default=True,
              help="torch: the in-memory models; any other: the exported graphs of --engine-dir.")
@click.option("--engine-dir", default=None, type=click.Path(), help="Exported bundle for a graph backend (ort, trt, ...).")
@click.option("--sjd-window", type=int, default=16, show_default=True)
@sampling_options
@spec_options_bench
@click.option("--sweep", "bench_sweep", multiple=True, expose_value=False, callback=_store_meta,
              help='Knob grid, repeatable: "gasv:kappa=0.5,1,2;lambda=0.6,0.3", "lantern:delta=0.1,0.2;gamma=1".')
@click.option("--quality-cache", "bench_quality_cache", default=None, type=click.Path(), expose_value=False,
              callback=_store_meta, help="Directory caching the quality reference features (real crops, vanilla "
              "samples); default runs/quality_cache.")
@click.option("--json", "json_path", required=True, type=click.Path())
@click.option("--plot", "plot_path", default=None, type=click.Path())
@_handle_errors
def bench(model, config, image_size, model_type, drafter, tables, methods, num_images, classes, captions, encoder_dir,
          backend,
          engine_dir, sjd_window, cfg_scale, temperature, top_k, top_p, cfg_interval, greedy, seed,
          tree_top_k, tree_depth, tree_tokens, lantern_delta, gasv_kappa, gasv_lambda, json_path, plot_path):
    """Run every method on the same prompts and seeds in one process; JSON + speed/quality plot."""
    import torch

    from .artifacts import default_drafter
    from .bench import parse_methods, run_bench, save_bench
    from .validation import check_positive, probe_writable_file

    check_positive(num_images, "--num-images")
    probe_writable_file(json_path, "--json file")
    if plot_path:
        probe_writable_file(plot_path, "--plot file")
    ms = parse_methods(methods)
    from .text.train import precheck_captions

    precheck_captions(captions, encoder_dir)  # before any model loads
    target = resolve_target(model, config, image_size, model_type)
    texts = None
    if not _class_conditioned(target.config):  # prompts checked before engines load
        from .text.train import prompt_conds

        t2i_conds, texts = prompt_conds(target.config, captions, encoder_dir, n=num_images, what="bench")
    s = resolve_sampling(model, target.config.vocab_size, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k, top_p=top_p,
                         cfg_interval=cfg_interval, greedy=greedy)
    from .bench import parse_sweep

    runs = [r for text in (_meta("bench_sweep") or ()) for r in parse_sweep(text)]
    dr, tb = resolve_spec_artifacts(model, target, ms + [m for _, m, _ in runs], drafter, tables)
    tgt_engine, dr_engine, gasv_engine = target, dr, None
    if backend != "torch":
        tgt_engine, dr_engine, gasv_engine = _graph_bench_engines(backend, engine_dir, target, dr, tb)
    from .runtime.outputs import class_names_of, parse_classes

    names = class_names_of(model)
    ncls = target.config.num_classes
    if texts is not None:
        cl = t2i_conds
    else:
        cl = parse_classes(classes, ncls, names) if classes else list(range(ncls))
        cl = [cl[i % len(cl)] for i in range(num_images)]
    scorer_fn = decode_fn = quality = None
    from .models.artifact_sets import artifact_set

    aset = artifact_set(model)
    if aset is not None and aset.extra("score_images") is not None:
        score_images, scorer = aset.extra("score_images"), aset.extra("load_demo_scorer")()
        vqm = aset.load_vq()
        g = target.config.grid_size

        def decode_fn(tokens):
            with torch.no_grad():
                return vqm.decode_code(tokens, (tokens.shape[0], vqm.config.codebook_embed_dim, g, g)).clamp(-1, 1)

        def scorer_fn(images, labels):
            import warnings

            with warnings.catch_warnings():  # too few images for FD: said once below, in words
                warnings.simplefilter("ignore", UserWarning)
                return score_images(images, labels, scorer)

        if texts is None:
            quality = _bench_quality(target, scorer, decode_fn, cl, s, seed)
    spec = make_spec("gasv", tree_top_k, tree_depth, tree_tokens, lantern_delta, gasv_kappa, gasv_lambda,
                     tree_default=backend_tree(model, target, backend))
    report = run_bench(tgt_engine, dr_engine, tb, ms, cl, sampling=s, spec=spec, seed=seed, gasv=gasv_engine,
                       scorer_fn=scorer_fn, decode_fn=decode_fn, sjd_window=sjd_window, runs=runs,
                       quality=quality if aset is not None and texts is None and len(cl) >= 32 else None,
                       settings_extra={"model": model, "drafter": drafter or default_drafter(model),
                                       "backend": backend, "command": " ".join(sys.argv),
                                       **({"captions": texts} if texts is not None else {})})
    save_bench(report, json_path, plot_path)
    from .demo.scorer import INDICATIVE_BELOW

    for m, r in report["results"].items():
        fd = r.get("fd_demo", float("nan"))
        q = (f", class_acc {r['class_acc']:.3f}, FD-demo {'n/a' if fd != fd else format(fd, '.2f')}"
             if "class_acc" in r else "")
        if "kid_real" in r:
            q = (f", acc {r['class_acc']:.3f}+-{r['class_acc_se']:.3f}, KID-real {1e3 * r['kid_real']:.2f}"
                 f"+-{1e3 * r['kid_real_se']:.2f}e-3" + (f", KID-vanilla {1e3 * r['kid_vanilla']:.2f}+-"
                 f"{1e3 * r['kid_vanilla_se']:.2f}e-3" if "kid_vanilla" in r else "")
                 + {True: " [neutral]", False: " [not neutral]", None: " [underpowered]"}[r["quality_neutral"]])
        click.echo(f"{m:8s} MAL {r['mal']:.2f}  {r['seconds_per_image']:.3f} s/img  speed-up {r['speedup']:.2f}x  "
                   f"TVD {r['mean_tvd']:.4f}{q}" + (f"  efficiency {r['drafter_efficiency']:.2f}"
                                                    if "drafter_efficiency" in r else ""))
    if model == "demo" and num_images < INDICATIVE_BELOW:
        click.echo(f"quality from {num_images} images is indicative only (FD-demo is biased upwards below "
                   f"{INDICATIVE_BELOW} images; bench/demo_quality.json uses 256)")


def _bench_quality(target, scorer, decode_fn, classes, sampling, seed):
    """The quality reference of a demo bench: real held-out crops and vanilla samples drawn with
    seeds disjoint from the bench's (seed + 1_000_003 + i), cached on disk."""
    import dataclasses

    import torch

    from .io import tensor_hash
    from .quality import QualityReference
    from .speculative.autoregressive import generate as ar_generate

    vseed = seed + 1_000_003

    def vanilla_images():
        cond = torch.as_tensor(classes).long()
        toks = torch.cat([ar_generate(target, cond[i: i + 64], seed=vseed + i, **dataclasses.asdict(sampling))
                          for i in range(0, len(cond), 64)])
        return decode_fn(toks)

    key = {"target": tensor_hash(target.output.weight), "sampling": dataclasses.asdict(sampling),
           "classes": list(map(int, classes)), "seed": vseed}
    return QualityReference(scorer, vanilla_fn=vanilla_images, vanilla_key=key,
                            cache_dir=_meta("bench_quality_cache") or "runs/quality_cache")


@main.command()
@click.argument("engine_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--max-batch", type=int, default=1, show_default=True, help="Prompts per call (CFG doubles it).")
@click.option("--max-tree", type=int, default=None, help="Largest tree verified at once (default: the export's).")
@click.option("--timing-cache", default=None, type=click.Path(), help="Reuse/update a TensorRT timing cache.")
@click.option("--refit", is_flag=True, help="Build refittable engines (weight swaps without rebuild).")
@click.option("--workspace", type=int, default=None, help="Builder workspace limit in MiB.")
@click.option("--dry-run", is_flag=True, help="Check compatibility and print the profiles; build nothing.")
@device_options("Check the memory plan against this GPU first (default: the visible CUDA device).")
@_handle_errors
def build(engine_dir, max_batch, max_tree, timing_cache, refit, workspace, dry_run, gpu, memory_gib):
    """TensorRT engines for every graph of an exported bundle (Polygraphy loaders, strongly typed).

    Needs TensorRT and an NVIDIA GPU; without them it says what is missing and how to run the
    bundle through ONNX Runtime instead (`lisa-trt run ENGINE_DIR PROMPTS --backend ort`).
    Before any TensorRT work the memory plan (`lisa-trt plan ENGINE_DIR`) is checked against
    --gpu / --memory-gib or the visible CUDA device, and a plan that does not fit is refused."""
    from .export.chameleon_onnx import is_chameleon_engine

    if is_chameleon_engine(engine_dir):
        from .errors import InputError

        raise InputError(f"{engine_dir} is a Chameleon-family engine directory: TensorRT engines are not available "
                         "for this family yet; run it with ONNX Runtime (`lisa-trt run ENGINE_DIR CAPTIONS`)")
    from .engines.plan import preflight

    preflight(engine_dir, gpu=gpu, memory_gib=memory_gib, gpu_backend=True, batch=max_batch, tree=max_tree,
              cfg=True, workspace=(workspace << 20) if workspace else None)  # before any TensorRT work
    from .engines.build import build_engines

    rec = build_engines(engine_dir, profiles=None, timing_cache=timing_cache, refit=refit,
                        workspace=(workspace << 20) if workspace else None, max_batch=max_batch,
                        max_tree=max_tree, dry_run=dry_run)
    click.echo(json.dumps(rec, indent=2, default=str))


@main.command()
@click.argument("model")
@device_options("GPU to plan for (default rtx4090); or --memory-gib.")
@click.option("--precision", type=_precision_choice(), default=None,
              help="Weight precision (default: an engine directory's own, else fp16).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="Images per call.")
@click.option("--tree", type=click.IntRange(min=1), default=None,
              help="Draft-tree nodes verified per call (default: an engine directory's max tree, else 64).")
@click.option("--image-size", type=click.IntRange(min=1), default=None,
              help="Pixels (default: GPT-* 256, Lumina-mGPT 768, Janus-Pro 384).")
@click.option("--prompt-len", type=click.IntRange(min=1), default=None,
              help="Prompt tokens in the cache (default: LlamaGen's condition prefix, 128 for text prompts).")
@click.option("--no-cfg", is_flag=True, help="No classifier-free guidance (CFG doubles the rows).")
@click.option("--workspace", type=click.IntRange(min=0), default=None,
              help="Builder workspace in MiB (default 1024, as `lisa-trt build --workspace`).")
@click.option("--weight-copies", type=click.IntRange(min=1), default=1, show_default=True,
              help="Copies of the target weights (2: separate prefill and verify engines).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="Write the plan (with `fits`) here.")
@_handle_errors
def plan(model, gpu, memory_gib, precision, batch, tree, image_size, prompt_len, no_cfg, workspace, weight_copies,
         json_path):
    """Memory plan: weights, KV cache, drafter, tables, activations per engine against a GPU.

    MODEL: a known name (GPT-B, GPT-L, GPT-XL, GPT-XXL, GPT-3B, Lumina-mGPT-7B, Janus-Pro-7B),
    a checkpoint (.safetensors with its config, or a Chameleon / Lumina-mGPT directory), or an
    engine directory. Prints the table and the largest batch and tree that fit. Exit status 0
    when it fits, 1 when it does not (with the reason), 2 for bad input (docs/deployment.md)."""
    from .engines.plan import make_plan

    p = make_plan(model, gpu=gpu, memory_gib=memory_gib, precision=precision, batch=batch, tree=tree,
                  image_size=image_size, prompt_len=prompt_len, cfg=not no_cfg,
                  workspace=None if workspace is None else workspace << 20, weight_copies=weight_copies)
    click.echo(p.table())
    if json_path:
        from .io import write_json

        write_json(json_path, p.to_dict())
        click.echo(f"wrote {json_path}")
    if not p.fits:
        click.echo(f"does not fit: {p.reason}", err=True)
        sys.exit(1)


def _graph_bench_engines(backend, engine_dir, target, drafter, tables):
    """Graph engines for `bench --backend B`, checked against the artifacts being benchmarked."""
    from .errors import InputError
    from .engines.graph import load_engines
    from .export.manifest import drafter_hash, tables_hash
    from .models.checkpoints import target_hash

    if engine_dir is None:
        raise InputError(f"--backend {backend} needs --engine-dir (make one with `lisa-trt export`)")
    e = load_engines(engine_dir, backend, target_hash=target_hash(target),
                     drafter_hash=drafter_hash(drafter) if drafter is not None else None,
                     tables_hash=tables_hash(tables) if tables is not None else None)
    return e.target, e.drafter, e.gasv


@main.command("export")
@model_options
@click.option("--drafter", default=None, help="Drafter (.safetensors or demo-lisa / demo-eagle3 / demo-medusa-lisa; demo default demo-lisa).")
@click.option("--tables", default=None, help="Calibration tables (demo: bundled).")
@click.option("--vq", "vq", default=None, help="VQ checkpoint for the decoder graph (demo: bundled).")
@click.option("--vq-config", default="VQ-16", show_default=True)
@click.option("--out", "out_dir", required=True, type=click.Path(), help="Engine directory to write.")
@click.option("--fp16", is_flag=True, help="fp16 graphs (norm statistics, softmax, logits kept fp32).")
@click.option("--opset", type=int, default=None, help="ONNX opset (default 23: ONNX Attention).")
@click.option("--max-tree", type=int, default=None, help="Largest tree the engines verify (static cache length).")
@click.option("--no-validate", is_flag=True, help="Skip the ORT-vs-PyTorch check of every graph.")
@click.option("--quantize", type=click.Choice(["none", "int8", "int4"]), default="none", show_default=True,
              help="ONNX Runtime weight quantization of target + drafter graphs (docs/quantization.md).")
@click.option("--max-prompt", type=int, default=None,
              help="Chameleon directory models: most prompt tokens a run may use (static cache; default 128).")
@sampling_options
@_handle_errors
def export_cmd(model, config, image_size, model_type, drafter, tables, vq, vq_config, out_dir, fp16, opset, max_tree,
               no_validate, max_prompt, quantize, cfg_scale, temperature, top_k, top_p, cfg_interval, greedy, seed):
    """ONNX graphs for target, drafter, GASV and VQ decoder + manifest (validated, atomic)."""
    if _is_chameleon(model):  # export/chameleon_onnx.py (fp32; docs/chameleon.md)
        from .errors import InputError
        from .runtime.chameleon import export_cli

        if fp16:
            raise InputError("--fp16 is not available for Chameleon-family exports yet (fp32 graphs)")
        gen = {k: v for k, v in dict(cfg_scale=cfg_scale, temperature=temperature, top_k=top_k).items() if v is not None}
        man = export_cli(model, out_dir, image_size=_chameleon_size(image_size), drafter=drafter, tables=tables, vq=vq,
                         max_prompt=max_prompt, max_tree=max_tree, opset=opset, generation=gen,
                         validate=not no_validate)
        for name, g in man["graphs"].items():
            click.echo(f"{name:16s} fp32  max|ORT - torch| {g.get('validation', {}).get('max_abs', 'n/a')}")
        return click.echo(f"wrote {out_dir} ({len(man['graphs'])} graphs, cache {man['max_cache_len']} slots)")
    from .artifacts import default_drafter, default_tables, load_drafter_by_name, load_tables_by_name
    from .models.checkpoints import load_vq
    from .runtime.bundle import export_full_bundle
    from .runtime.outputs import generation_defaults
    from .validation import probe_writable_dir

    probe_writable_dir(out_dir, "--out engine directory")
    target = resolve_target(model, config, image_size, model_type)
    drafter = drafter or default_drafter(model)
    tables = tables or default_tables(model)
    vq = _default_vq(model, vq)
    dr = load_drafter_by_name(drafter, target) if drafter else None
    tb = load_tables_by_name(tables, target) if tables else None
    vqm = load_vq(vq, _vq_config_for(vq, vq_config)) if vq else None
    s = resolve_sampling(model, target.config.vocab_size, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k,
                         top_p=top_p,
                         cfg_interval=cfg_interval, greedy=greedy)
    man = export_full_bundle(target, dr, tb, vqm, out_dir, fp16=fp16, opset=opset, max_tree=max_tree,
                             generation=generation_defaults(model, target, s), validate=not no_validate,
                             quantize=quantize)
    for name, g in man.graphs.items():
        err = (g.validation or {}).get("max_error")
        prec = (g.quantization or {}).get("mode", g.precision)
        click.echo(f"{name:16s} {prec}  max|ORT - torch| {err if err is not None else 'n/a'}")
    if man.quantization != "none":
        from .export.quantize import quantization_summary

        for line in quantization_summary(man):
            click.echo(line)
    q = "" if man.quantization == "none" else f", {man.quantization} weights"
    click.echo(f"wrote {out_dir} ({len(man.graphs)} graphs, {man.precision}{q}, opset {man.opset})")


@main.command()
@click.argument("engine_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("prompts", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", default="outputs", show_default=True, type=click.Path())
@click.option("--overwrite", is_flag=True, help="Write into a non-empty --out (earlier images/stats are removed).")
@click.option("--backend", type=_backend_choice("auto"), default="auto", show_default=True)
@click.option("--verify", type=click.Choice(["auto"] + list(_method_choice().choices)), default="auto", show_default=True,
              help="Decoding method; auto: the bundle's recorded never-slower choice for the backend and "
                   "precision (printed with its reason; a bundle without one runs gasv).")
@click.option("--threads", type=int, default=None, help="ORT intra-op threads (default: physical cores).")
@click.option("--encoder", "encoder_dir", default=None, type=click.Path(),
              help="t2i: local flan-t5-xl directory, so PROMPTS may be captions (default $LISA_TRT_TEXT_ENCODER).")
@sampling_options
@click.option("--tree-top-k", type=int, default=None)
@click.option("--tree-depth", type=int, default=None)
@click.option("--tree-tokens", type=int, default=None)
@device_options("Check the memory plan against this GPU before any work (default: the visible CUDA device "
                "when the backend is TensorRT; CPU runs are not checked).")
@method_knob_options
@_handle_errors
def run(engine_dir, prompts, out_dir, overwrite, backend, verify, threads, encoder_dir, cfg_scale, temperature, top_k,
        top_p, cfg_interval, greedy, seed, tree_top_k, tree_depth, tree_tokens, gpu, memory_gib):
    """Generate with an engine directory (default --verify auto: the bundle's recorded fastest method): PNGs and per-image stats.

    PROMPTS: a text file (one class id or name per line; t2i: one caption per line) or JSONL
    ({"class" | "caption" | "caption_features": ..., "seed": .., "cfg": ..}); malformed lines
    are reported with their numbers before any work starts.
    Chameleon engine directories (lisa-trt export --model DIR): one caption per line.
    A GPU run (or --gpu / --memory-gib) is refused before any work when its memory plan does not
    fit (`lisa-trt plan ENGINE_DIR`)."""
    from .engines.plan import engines_recorded, preflight
    from .export.chameleon_onnx import is_chameleon_engine

    gpu_backend = backend == "trt" or (backend == "auto" and engines_recorded(engine_dir))
    preflight(engine_dir, gpu=gpu, memory_gib=memory_gib, gpu_backend=gpu_backend, batch=1, tree=tree_tokens,
              cfg_scale=cfg_scale)  # run decodes one prompt per call

    if is_chameleon_engine(engine_dir):  # runtime/chameleon.py, ONNX Runtime
        from .errors import InputError
        from .runtime.chameleon import run_cli

        if backend not in ("auto", "ort"):
            raise InputError(f"Chameleon engine directories run on ONNX Runtime only (--backend ort), not {backend}")
        if verify == "auto":  # Chameleon bundles record no decode choice yet
            verify = "gasv"
            click.echo("verify auto: this Chameleon bundle records no decode choice; running gasv")
        st = run_cli(engine_dir, prompts, out_dir, verify=verify, cfg_scale=cfg_scale, temperature=temperature,
                     top_k=top_k, greedy=greedy, seed=seed, tree=(tree_top_k, tree_depth, tree_tokens), threads=threads)
        mal = f", MAL {st['mal']:.2f}" if "mal" in st else ""
        return click.echo(f"{len(st['captions'])} images -> {out_dir} (ort, {verify}){mal}, {st['seconds']:.2f} s")
    from .runtime.outputs import save_run
    from .runtime.pipeline import Pipeline
    from .runtime.prompts import parse_prompts
    from .validation import check_out_dir

    check_out_dir(out_dir, overwrite=overwrite)
    from .text.prompts import precheck_prompts

    precheck_prompts(engine_dir, prompts, encoder_dir)  # t2i: prompts + encoder checked before engines load
    pipe = Pipeline.from_dir(engine_dir, backend=backend, threads=threads, text_encoder=encoder_dir)
    cfg = pipe.config
    ps = parse_prompts(prompts, model_type=cfg.model_type, num_classes=cfg.num_classes, class_names=pipe.class_names)
    if verify == "auto":
        click.echo(f"verify auto: {pipe.resolve_verify(verify)[2]}")
    res = pipe.generate(ps, seed=seed, verify=verify, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k,
                        top_p=top_p, greedy=greedy, tree_top_k=tree_top_k, tree_depth=tree_depth,
                        tree_tokens=tree_tokens, progress=sys.stderr.isatty(), **spec_knobs())
    verify = res.stats[0]["verify"] if res.stats else verify  # what "auto" ran
    out = save_run(out_dir, res, ps, {"backend": pipe.backend, "verify": verify, "images": res.stats},
                   overwrite=overwrite)
    mal = sum(st["mal"] for st in res.stats) / len(res.stats)
    secs = sum(st["seconds"] for st in res.stats)
    click.echo(f"{len(res.images)} images -> {out} ({pipe.backend}, {verify}): mean MAL {mal:.2f}, {secs:.2f} s")


@main.command()
@click.option("--out", "out_dir", default="lisa-trt-demo", show_default=True, type=click.Path())
@click.option("--num-images", type=int, default=8, show_default=True, help="Images per method (one per class, cycled).")
@click.option("--backend", type=click.Choice(["ort", "torch"]), default="ort", show_default=True)
@click.option("--verify", type=click.Choice(["exact", "lantern", "gasv"]), default="gasv", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@_handle_errors
def demo(out_dir, num_images, backend, verify, seed):
    """The whole pipeline on the bundled CPU model: export (cached), then vanilla vs LISA
    through ONNX Runtime; prints speed-up, MAL and quality, writes a side-by-side PNG grid."""
    from .runtime.demo import run_demo
    from .validation import check_positive, probe_writable_dir

    check_positive(num_images, "--num-images")
    probe_writable_dir(out_dir, "--out directory")
    run_demo(Path(out_dir), num_images=num_images, backend=backend, verify=verify, seed=seed,
                       echo=click.echo)
    click.echo(f"details: {Path(out_dir) / 'summary.json'}")


@main.command("quantize-trt")
@click.argument("engine_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--mode", type=click.Choice(["int8", "fp8", "int4"]), required=True,
              help="int8 / fp8: Q/DQ on weights + activations (calibrated); int4: 4-bit weight-only.")
@click.option("--out", "out_dir", required=True, type=click.Path(), help="New engine directory to write.")
@click.option("--venv", default=None, type=click.Path(),
              help="ModelOpt venv (default $LISA_TRT_MODELOPT_VENV or ~/.cache/lisa-trt/modelopt-venv).")
@click.option("--install/--no-install", default=True, show_default=True,
              help="Create the venv and pip install nvidia-modelopt[onnx] into it when missing.")
@click.option("--calibration-steps", type=int, default=4, show_default=True)
@_handle_errors
def quantize_trt_cmd(engine_dir, mode, out_dir, venv, install, calibration_steps):
    """TensorRT Q/DQ graphs through NVIDIA ModelOpt, run in its own venv (docs/quantization.md)."""
    from .engines.trt_quantize import quantize_trt

    man = quantize_trt(engine_dir, out_dir, mode, venv=Path(venv) if venv else None, install=install,
                       samples=calibration_steps, echo=click.echo)
    for name, g in sorted(man.graphs.items()):
        if g.quantization:
            click.echo(f"{name:16s} {g.quantization['mode']}  {g.quantization['qdq']}")
    click.echo(f"wrote {out_dir} ({man.quantization}; TensorRT-compatibility check passed); "
               f"build with `lisa-trt build {out_dir}`")



from .text.cli import encode_captions  # noqa: E402  (t2i: captions -> T5 features)

main.add_command(encode_captions)
from .serve.cli import register as _register_serve; _register_serve(main)  # noqa: E402,E702 serve, triton-repo

if __name__ == "__main__":  # pragma: no cover
    main()
