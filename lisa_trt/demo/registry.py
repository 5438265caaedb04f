"""The name `demo`: the bundled target, VQ tokenizer and quality scorer in lisa_trt/assets/demo/.

Importing this module registers the `demo` target and VQ configs (read from the shipped JSON
files, lazily, so that importing never fails when the assets are absent).

Files (written by scripts/demo/export_assets.py):
    target.safetensors / target.json   LlamaGen GPT c2i (fp16 storage), config in metadata + JSON
    vq.safetensors / vq.json           LlamaGen VQ tokenizer (fp16 storage)
    scorer.safetensors / scorer.json   DemoScorer (fp16 storage)
    demo.json                          class names, default sampling settings, image size
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import SamplingConfig
from ..errors import CheckpointError
from ..models.target_config import register_target, register_vq
from .data import CLASS_NAMES  # noqa: F401  (re-exported: the demo's class names, id order)

if TYPE_CHECKING:  # the classes resolve on first use (importing them imports the families)
    from ..models.target_config import TargetConfig, VQConfig

DEMO_DIR = Path(__file__).resolve().parents[1] / "assets" / "demo"
_FILES = {
    "target": "target.safetensors", "target_config": "target.json",
    "vq": "vq.safetensors", "vq_config": "vq.json",
    "scorer": "scorer.safetensors", "scorer_config": "scorer.json",
    "manifest": "demo.json",
}
_RECIPE = "build them with the recipe in lisa_trt/assets/demo/README.md (scripts/demo/*.py)"


def demo_paths(check: bool = False) -> dict[str, Path]:
    """Paths of the shipped demo files, keyed target, target_config, vq, vq_config, scorer,
    scorer_config, manifest. With check=True a missing file raises CheckpointError."""
    paths = {k: DEMO_DIR / v for k, v in _FILES.items()}
    if check:
        missing = [str(p) for p in paths.values() if not p.is_file()]
        if missing:
            raise CheckpointError(f"the bundled demo model is incomplete: missing {', '.join(missing)}; "
                                  f"reinstall lisa-trt or {_RECIPE}")
    return paths


def assets_present() -> bool:
    return all(p.is_file() for p in demo_paths().values())


def _read_json(key: str) -> dict:
    path = demo_paths()[key]
    if not path.is_file():
        raise CheckpointError(f"missing bundled demo file {path}; reinstall lisa-trt or {_RECIPE}")
    return json.loads(path.read_text())


def demo_target_config(**overrides) -> TargetConfig:
    """The demo target's TargetConfig (from target.json), with optional field overrides."""
    from ..models.target_config import TargetConfig

    return TargetConfig.from_dict({**_read_json("target_config")["config"], **overrides})


def demo_vq_config(**overrides) -> VQConfig:
    from ..models.target_config import VQConfig

    return VQConfig.from_dict({**_read_json("vq_config")["config"], **overrides})


def demo_manifest() -> dict:
    """demo.json: class_names, sampling defaults, image_size, provenance."""
    return _read_json("manifest")


def demo_sampling() -> SamplingConfig:
    """The demo's default sampling settings (vanilla sampling at these is what bench/ scores)."""
    return SamplingConfig(**demo_manifest()["sampling"])


def class_names() -> tuple[str, ...]:
    """The demo's class names in class-id order."""
    return CLASS_NAMES


def load_demo_target(device="cpu"):
    """The bundled LlamaGen target (a fresh Transformer, eval, fp32)."""
    from ..models.checkpoints import load_target

    return load_target(demo_paths(check=True)["target"], device=device)


def load_demo_vq(device="cpu"):
    """The bundled VQ tokenizer (a fresh VQModel, eval, fp32)."""
    from ..models.checkpoints import load_vq

    return load_vq(demo_paths(check=True)["vq"], device=device)


@functools.lru_cache(maxsize=1)
def load_demo_scorer():
    """The bundled DemoScorer (eval, fp32). Cached (its held-out reference statistics are
    cached per scorer object): do not modify or train the returned model."""
    from ..io import load_safetensors
    from .scorer import DemoScorer, ScorerConfig

    paths = demo_paths(check=True)
    tensors, _ = load_safetensors(paths["scorer"])
    model = DemoScorer(ScorerConfig(**_read_json("scorer_config")["config"]))
    try:
        model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{paths['scorer']} does not match the DemoScorer architecture ({e}); {_RECIPE}") from e
    return model.eval()


def score_images(images, labels, scorer=None):
    """(class accuracy, FD-demo) of decoded images under the demo scorer (bench quality)."""
    from .scorer import score_images as _score

    return _score(images, labels, scorer if scorer is not None else load_demo_scorer())


# artifact-set provider hooks (models/artifact_sets.py)
load_target = load_demo_target
load_vq = load_demo_vq

register_target("demo", demo_target_config)
register_vq("demo", demo_vq_config)
