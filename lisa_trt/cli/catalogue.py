"""The registries' names that `--help` shows, without importing torch (importing it takes seconds).

The names live in registries that import torch (model families, decoding methods, backends, the
GPU / precision tables of deploy/). lisa_trt/assets/cli_catalogue.json is a snapshot of `live()` that the option
factories (options.py, through catalogue_file.py) and the top-level command list read;
tests/cli/test_help_and_logs.py keeps it equal to the registries. `load_command` imports the named
command's module by an import statement (the import floors test sees it). After registering a built-in family / method / backend / GPU or
changing a command's one-line help, regenerate it:

    python -m lisa_trt.cli.catalogue
"""

from __future__ import annotations

import json
from pathlib import Path

from .catalogue_file import FILE as _FILE, hold, snapshot

# command name -> "module:attribute" (modules relative to lisa_trt); load_command imports each
# module by an import statement (the import floors test sees it)
COMMAND_MODULES = {
    "bench": "cli.bench:bench", "build": "cli.export:build", "calibrate": "cli.calibrate:calibrate",
    "convert": "cli.misc:convert", "demo": "cli.misc:demo", "encode-captions": "text.cli:encode_captions",
    "export": "cli.export:export_cmd", "generate": "cli.generate:generate", "openai-api": "serve.cli:openai_api_cmd",
    "plan": "cli.export:plan", "quantize-trt": "cli.export:quantize_trt_cmd",
    "random-checkpoint": "cli.misc:random_checkpoint", "run": "cli.run:run", "serve": "serve.cli:serve_cmd",
    "train": "cli.train:train", "triton-repo": "serve.cli:triton_repo_cmd",
}


def load_command(name: str):
    """The click command `name` (its module imported now)."""
    module, attr = COMMAND_MODULES[name].split(":")
    return getattr(_command_module(module), attr)


def _command_module(module: str):
    """A command module of COMMAND_MODULES, imported on first use (`--help` imports only the named one)."""
    if module == "cli.bench":
        from . import bench as m
    elif module == "cli.calibrate":
        from . import calibrate as m
    elif module == "cli.export":
        from . import export as m
    elif module == "cli.generate":
        from . import generate as m
    elif module == "cli.misc":
        from . import misc as m
    elif module == "cli.run":
        from . import run as m
    elif module == "cli.train":
        from . import train as m
    elif module == "serve.cli":
        from ..serve import cli as m
    elif module == "text.cli":
        from ..text import cli as m
    else:
        raise KeyError(f"{module}: not a command module (cli/catalogue.py _command_module lists them)")
    return m


def live(commands: bool = True) -> dict:
    """The catalogue computed from the registries themselves (imports torch); `commands`: with the
    commands' help (which needs the stored registries' part: option factories read it)."""
    from ..deploy.memory_plan import GPUS, PRECISIONS
    from ..engines.base import backend_names
    from ..models.family import model_types
    from ..calibration.profile import CALIBRATION_GASV
    from ..speculative.methods import LanternConfig, SpecConfig, cli_options, method_names
    from ..train.trainer import TrainConfig

    flat = SpecConfig().flat()
    knobs = [{"flag": o.flag, "aliases": list(o.aliases), "name": o.name, "type": o.type.__name__, "help": o.help,
              "default": flat.get(o.name)} for o in cli_options()]
    return {"model_types": model_types(), "methods": method_names(), "backends": backend_names(),
            "gpus": list(GPUS), "precisions": list(PRECISIONS), "knobs": knobs,
            # defaults that --help prints, of dataclasses in torch modules (train.py; calibrate.py)
            "train_defaults": {k: getattr(TrainConfig(), k) for k in TRAIN_DEFAULTS},
            "calibrate_defaults": {"gasv_kappa": CALIBRATION_GASV.kappa, "gasv_lambda": CALIBRATION_GASV.lam,
                                   "gasv_delta": CALIBRATION_GASV.delta, "gasv_neighbours": CALIBRATION_GASV.neighbours,
                                   "lantern_k": LanternConfig().k},
            "commands": _command_helps() if commands else {}}


TRAIN_DEFAULTS = ("steps", "batch_size", "lr", "ttt_steps", "checkpoint_every")


def _command_helps() -> dict:
    """{command name: the first paragraph of its help} (what `lisa-trt --help` shortens)."""
    return {name: first_paragraph(load_command(name)) for name in COMMAND_MODULES}


def first_paragraph(cmd) -> str:
    import inspect

    return cmd.short_help or " ".join(inspect.cleandoc(cmd.help or "").split("\n\n")[0].split())


def write(path: Path = _FILE) -> None:
    """Regenerate the snapshot from the registries (atomically): the registries' part first (the
    commands' options are made from it), then the commands' help."""
    data = {**live(commands=False), "commands": snapshot().get("commands", {}) if path.exists() else {}}
    for _ in range(2):
        hold(data)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)
        data = live()


if __name__ == "__main__":  # pragma: no cover
    write()
    print(f"wrote {_FILE}")
