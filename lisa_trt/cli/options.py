"""Every option that two or more `lisa-trt` commands share, each declared once here (docs/cli.md).

Options that travel together reach the command as ONE dict parameter, which is what the resolve
step (runtime/context.py) takes:

    model_cfg   --config / --image-size / --model-type (+ image_size_given)
    sampling    --cfg-scale --temperature --top-k --top-p --cfg-interval --greedy --seed
    tree        --tree-top-k --tree-depth --tree-tokens
    knobs       every registered method's options (speculative/methods.py MethodOption), by
                SpecConfig flat name: --lantern-delta, --kappa, --lambda, --delta, --sjd-window,
                --gsd-group ...

Options used by one command only are declared in that command's module. A factory takes the
per-command wording (help, default, required); defaults otherwise come from the dataclasses.
"""

from __future__ import annotations

import functools

import click



def _catalogue() -> dict:
    """The registries' names for option choices, without torch (catalogue.py)."""
    from .catalogue_file import snapshot

    return snapshot()


CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}  # every command takes -h (the group's, and serve's own)
LOG_LEVELS = ("debug", "info", "warning", "error")


def compose(*decorators):
    """One decorator applying `decorators` so that `--help` lists them in the order given."""

    def deco(fn):
        for d in reversed(decorators):
            fn = d(fn)
        return fn

    return deco


def packed(into: str, *decorators, extra=None):
    """Options whose values reach the command as one dict `into` ({parameter name: value}).

    extra: optional (click context, dict) -> dict of further entries (e.g. where a value came from)."""

    def deco(fn):
        names: list = []

        @functools.wraps(fn)
        def wrapper(*args, **kw):
            group = {n: kw.pop(n) for n in names}
            if extra is not None:
                group.update(extra(click.get_current_context(), group))
            return fn(*args, **{into: group}, **kw)

        wrapper.__click_params__ = list(getattr(fn, "__click_params__", []))
        before = len(wrapper.__click_params__)
        compose(*decorators)(wrapper)
        names.extend(p.name for p in wrapper.__click_params__[before:])
        return wrapper

    return deco


# ----------------------------------------------------------------------------- model and its config

def image_size_option(**kw):
    kw.setdefault("help", "Image size for official configs (256/384/512).")
    return click.option("--image-size", "image_size", **kw)


def config_options(config_help: str, required: bool = False):
    """--config / --image-size / --model-type (the official-config group) -> `model_cfg`."""
    def given(ctx, group):
        return {"image_size_given": ctx.get_parameter_source("image_size").name != "DEFAULT"}

    return packed(
        "model_cfg",
        click.option("--config", "config", required=required, default=None, help=config_help),
        image_size_option(type=int, default=256, show_default=True),
        click.option("--model-type", type=click.Choice(_catalogue()["model_types"]), default=None,
                     help="Model family type for official configs (models/family.py; default c2i)."),
        extra=given)


def model_options(config_help: str = "Target config name (GPT-B ... GPT-7B); default: the file's metadata.",
                  required: bool = True, model_help: str = ""):
    """--model and its official-config group."""
    return compose(
        click.option("--model", "model", required=required,
                     help=model_help + "Target checkpoint (.pt official / .safetensors), a bundled set such as 'demo', a "
                          "Chameleon / Lumina-mGPT directory, or a Hugging Face name org/name[@revision] "
                          "(from the local HF cache; docs/cli.md)."),
        config_options(config_help))


def vq_options(help: str):
    """--vq / --vq-config."""
    return compose(click.option("--vq", "vq", default=None, help=help),
                   click.option("--vq-config", default="VQ-16", show_default=True,
                                help="VQ config of an official .pt VQ (VQ-16 / VQ-8; safetensors carry their own)."))


# ----------------------------------------------------------------------------- outputs

def out_option(help: str = None, *, dest: str = "out_dir", default=None, required: bool = False, **path):
    """--out: the directory (or file) a command writes."""
    return click.option("--out", dest, default=default, required=required, show_default=default is not None,
                        type=click.Path(**path), help=help)


overwrite_option = click.option("--overwrite", is_flag=True,
                                help="Write into a non-empty --out (earlier images/stats are removed).")


def json_option(help: str = None, *, required: bool = False, **path):
    return click.option("--json", "json_path", required=required, default=None, type=click.Path(**path), help=help)


# ----------------------------------------------------------------------------- prompts

def classes_option(help: str):
    return click.option("--classes", default=None, help=help)


def captions_option(help: str, *, exists: bool = True):
    return click.option("--captions", default=None, type=click.Path(exists=exists), help=help)


def encoder_option(help: str = "t2i: local flan-t5-xl directory (for a captions .txt)."):
    return click.option("--encoder", "encoder_dir", default=None, type=click.Path(), help=help)


def captions_file_option(help: str):
    return click.option("--captions-file", default=None, type=click.Path(exists=True, dir_okay=False), help=help)


prompt_option = click.option("--prompt", "prompts", multiple=True,
                             help="Chameleon / Lumina-mGPT directory models: a text prompt (repeat for a batch).")


def num_images_option(help: str = None):
    return click.option("--num-images", type=int, default=8, show_default=True, help=help)


# ----------------------------------------------------------------------------- sampling

def _sampling_range(field):
    """Click callback: the shared range check of lisa_trt.validation (vocab size checked later)."""

    def cb(ctx, param, value):
        from ..validation import sampling_problems

        problems = sampling_problems(**{field: value})
        if problems:
            raise click.BadParameter(problems[0].split(" ", 1)[1], ctx=ctx, param=param)
        return value

    return cb


def seed_option(fn=None, *, help: str = None):
    opt = click.option("--seed", type=int, default=0, show_default=True, help=help)
    return opt if fn is None else opt(fn)


def cfg_scale_option(help: str, *, checked: bool = True):
    return click.option("--cfg-scale", type=float, default=None, help=help,
                        callback=_sampling_range("cfg_scale") if checked else None)


def temperature_option(help: str):
    return click.option("--temperature", type=float, default=None, callback=_sampling_range("temperature"), help=help)


def top_k_option(help: str):
    return click.option("--top-k", type=int, default=None, callback=_sampling_range("top_k"), help=help)


def top_p_option(help: str):
    return click.option("--top-p", type=float, default=None, callback=_sampling_range("top_p"), help=help)


def sampling_options(fn):
    """The sampling options (SamplingConfig's defaults; an artifact set's own) -> `sampling`."""
    from ..config import SamplingConfig

    d = SamplingConfig()
    return packed(
        "sampling",
        cfg_scale_option(f"CFG scale >= 0, 1 = off (default {d.cfg_scale}; demo: its own)."),
        temperature_option(f"Temperature > 0 (default {d.temperature})."),
        top_k_option(f"Top-k, 0 = off, at most the vocabulary size (default {d.top_k})."),
        top_p_option(f"Top-p in (0, 1] (default {d.top_p})."),
        click.option("--cfg-interval", type=int, default=None, help="Guidance off after this step (-1 = always on)."),
        click.option("--greedy", is_flag=True, help="Argmax of the guided logits."),
        seed_option())(fn)


# ----------------------------------------------------------------------------- speculation

def verify_option(*, auto: bool = False, choices=None, default=None, help: str = None):
    """--verify: a registered method (speculative/methods.py), "auto" first when `auto`, or `choices`."""
    if choices is None:
        choices = (["auto"] if auto else []) + list(_catalogue()["methods"])
    return click.option("--verify", type=click.Choice(list(choices)), default=default,
                        show_default=default is not None, help=help)


def drafter_option(help: str):
    return click.option("--drafter", default=None, help=help)


def tables_option(help: str):
    return click.option("--tables", default=None, help=help)


def tree_options(fn):
    """The EAGLE-2 tree budget (None: the backend's tuned tree / the bundle's) -> `tree`."""
    tuned = " (default: the tree tuned for the backend: runtime/autotune.py, measured where shipped)"
    return packed(
        "tree",
        click.option("--tree-top-k", type=int, default=None, help="EAGLE-2 tree: children per node" + tuned),
        click.option("--tree-depth", type=int, default=None, help="EAGLE-2 tree: expansion rounds" + tuned),
        click.option("--tree-tokens", type=int, default=None, help="EAGLE-2 tree: nodes incl. root" + tuned))(fn)


def knob_options(*, only=None, defaults=None, helps=None, show_defaults: bool = True):
    """Every registered method's options (MethodOption) -> `knobs` ({SpecConfig flat name: value}).

    The one route of every rule knob: a method registered with options gets them on every command
    that decorates with this. None values mean the tables' / bundle's / dataclass value.
    Args:
        only: flat names to offer (default: all); defaults: {flat name: value passed when not
        given}; helps: {flat name: help}; show_defaults: show SpecConfig's defaults in --help.
    """
    defaults, helps = defaults or {}, helps or {}
    opts = []
    for o in _catalogue()["knobs"]:  # speculative/methods.py cli_options(), SpecConfig().flat() defaults
        name = o["name"]
        if only is not None and name not in only:
            continue
        kw = dict(default=defaults[name], show_default=True) if name in defaults else \
            dict(default=o["default"] if show_defaults else None, show_default=True, callback=_unless_given)
        opts.append(click.option(o["flag"], *o["aliases"], name, type=_KNOB_TYPES[o["type"]],
                                 help=helps.get(name, o["help"]), **kw))
    return packed("knobs", *opts)


_KNOB_TYPES = {"float": float, "int": int, "str": str, "bool": bool}


def _unless_given(ctx, param, value):
    """A default shown in --help only: None (the tables' / bundle's value) unless given."""
    return None if ctx.get_parameter_source(param.name).name == "DEFAULT" else value


# ----------------------------------------------------------------------------- engines and devices

def engine_dir_argument(fn=None, *, required: bool = True):
    """ENGINE_DIR, the positional engine directory of every command on a bundle (run, build, serve,
    bench, ...); `required=False` where the command also runs without one (bench)."""
    arg = click.argument("engine_dir", required=required, type=click.Path(exists=True, file_okay=False))
    return arg if fn is None else arg(fn)


def backend_option(choices, *, default: str, help: str = None):
    return click.option("--backend", type=click.Choice(list(choices)), default=default, show_default=True, help=help)


def backend_choices(*extra) -> list:
    """`extra` then every registered backend (engines/base.py)."""
    return [*extra, *_catalogue()["backends"]]


def log_options(fn):
    """-q/--quiet, -v/--verbose, --log-level (env LISA_TRT_LOG_LEVEL) -> `log_level`, one of LOG_LEVELS.

    The group's one logging switch (progress.py set_log_level): warning and below hides progress
    bars and progress lines, debug adds lisa-trt's debug log."""

    def level(ctx, group):
        quiet, verbose, given = group.pop("quiet"), group.pop("verbose"), group.pop("level")
        if sum(map(bool, (quiet, verbose, given))) > 1:
            raise click.UsageError("give one of --quiet, --verbose and --log-level", ctx=ctx)
        return {"value": "warning" if quiet else "debug" if verbose else (given or "info").lower()}

    def unpack(f):
        @functools.wraps(f)
        def wrapper(*a, log, **kw):
            return f(*a, log_level=log["value"], **kw)

        return wrapper

    return packed(
        "log",
        click.option("-q", "--quiet", is_flag=True, help="Warnings and errors only: no progress bars or progress lines."),
        click.option("-v", "--verbose", is_flag=True, help="Also lisa-trt's debug log (same as --log-level debug)."),
        click.option("--log-level", "level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default=None,
                     envvar="LISA_TRT_LOG_LEVEL", help="debug | info (default) | warning | error (env LISA_TRT_LOG_LEVEL)."),
        extra=level)(unpack(fn))


def threads_option(help: str, **kw):
    kw.setdefault("type", int)
    return click.option("--threads", "threads", default=None, help=help, **kw)


def _gpu(ctx, param, value):
    """--gpu's value as a GPUS key (any case); a BadParameter naming --memory-gib otherwise."""
    from ..deploy.memory_plan import gpu_name
    from ..errors import InputError

    if value is None:
        return None
    try:
        return gpu_name(value)
    except InputError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


def device_options(what: str):
    """--gpu / --memory-gib: the device a memory plan is checked against (deploy/memory_plan.py)."""
    return compose(click.option("--gpu", metavar="[" + "|".join(_catalogue()["gpus"]) + "]", default=None, callback=_gpu,
                                help=what + " Any case."),
                   click.option("--memory-gib", type=float, default=None,
                                help="Device memory in GiB (instead of --gpu)."))


def precision_option(help: str):
    return click.option("--precision", type=click.Choice(list(_catalogue()["precisions"])), default=None, help=help)


def max_tree_option(help: str):
    return click.option("--max-tree", type=int, default=None, help=help)


def workspace_option(help: str, **kw):
    kw.setdefault("type", int)
    return click.option("--workspace", default=None, help=help, **kw)
