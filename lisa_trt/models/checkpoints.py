"""Loading official LlamaGen checkpoints (.pt, DDP or raw) and lisa-trt safetensors, strictly.

Pickles are read with `torch.load(weights_only=True)` only: a file whose pickle would run code
is refused. `freqs_cis` and `*.kv_cache.*` entries some official files carry are dropped; every
other key must match exactly (the official loader's strict=False hides mistakes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Union

import torch

from ..errors import ArtifactMismatchError, CheckpointError
from ..safe_load import safe_torch_load
from ..io import load_safetensors, save_safetensors, state_dict_problems, tensor_hash, write_json

PathLike = Union[str, Path]
_DROP_SUFFIXES = ("freqs_cis",)


def target_hash(model) -> str:
    """Identity of a target: sha256 of its output head weight (fp32 bytes), 16 hex digits."""
    return tensor_hash(model.output.weight)


def read_heads_artifact(path, target, *, kind: str, schema_version: int, label: str, arch: str,
                        check_target: bool = True):
    """(config dict, tensors) of a lisa-trt heads artifact (Medusa heads, 2-D heads: safetensors
    whose metadata holds kind, schema_version and config with the target's hash), refused with the
    fix for another artifact kind, another schema version or (check_target) another target."""
    path = Path(path)
    tensors, meta = load_safetensors(path)
    if meta.get("kind") != kind or "config" not in meta:
        raise CheckpointError(f"{path} is not a lisa-trt {label} heads artifact; make one with `lisa-trt train --arch {arch}`")
    if meta.get("schema_version") != schema_version:
        raise ArtifactMismatchError(f"{path} has {label} heads schema version {meta.get('schema_version')}; this "
                                    f"lisa-trt reads version {schema_version}")
    cfg = meta["config"]
    if check_target and cfg.get("target_hash") != target_hash(target):
        raise ArtifactMismatchError(f"{label} heads {path} were trained for target hash {cfg.get('target_hash')}, not "
                                    f"{target_hash(target)}: load that target or train heads for this one")
    return cfg, tensors


def read_state_dict(path: PathLike, mmap: bool = False) -> tuple[dict, dict]:
    """Read weights from .pt/.pth/.bin (weights_only) or .safetensors -> (state_dict, metadata).

    mmap: a zip-format .pt file's tensors are mapped from the file, not read (safe_torch_load)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}{_did_you_mean(path)}")
    if path.suffix == ".safetensors":
        return load_safetensors(path)
    obj = safe_torch_load(path, "checkpoint", mmap=mmap)  # weights_only; refusals in our own words
    if isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        obj = obj["model"]  # DDP training checkpoints
    if not isinstance(obj, dict) or not all(torch.is_tensor(v) for v in obj.values()):
        raise CheckpointError(f"{path} does not hold a state dict (a mapping of names to tensors) but "
                              f"{_describe(obj)}; a .pt checkpoint is a torch.save of the weights "
                              "({\"model\": state_dict} or the state dict itself), else pass a lisa-trt .safetensors")
    return dict(obj), {}


def _describe(obj) -> str:
    """A short description of what a .pt file held instead of a state dict."""
    if torch.is_tensor(obj):
        return f"one tensor of shape {tuple(obj.shape)}"
    if isinstance(obj, dict):
        odd = [k for k, v in obj.items() if not torch.is_tensor(v)][:3]
        return f"a mapping whose entries {odd} are not tensors"
    return f"a {type(obj).__name__}"


def _did_you_mean(path: Path) -> str:
    """'; did you mean 'demo' (a bundled model)?' for a bare name close to a bundled artifact set."""
    from .artifact_sets import did_you_mean

    return did_you_mean(path)


def _clean(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        k = k[len("module."):] if k.startswith("module.") else k
        if k.endswith(_DROP_SUFFIXES) or ".kv_cache." in k:
            continue
        out[k] = v
    return out


def strict_load(model: torch.nn.Module, sd: dict, what: str, hint: str = "", assign: bool = False) -> None:
    """load_state_dict(strict=True) with an error that lists every problem and a likely fix.

    hint: what the file looks like and the fix (the family's guess from its shapes, e.g. "the file
    looks like GPT-B ...; pass --config GPT-B").

    assign: the model's parameters become the state dict's tensors (a model built on the meta
    device: no second copy of the weights)."""
    own = model.state_dict()
    problems = state_dict_problems(own, sd)
    if problems:
        lines = [f"checkpoint does not match the {what} configuration:", *problems]
        lines.append(f"  hint: {hint or 'pass the configuration the file was written with'}")
        raise CheckpointError("\n".join(lines))
    model.load_state_dict(sd, strict=True, assign=assign)  # else copies into the model's tensors, converting each


def model_with_state(model: torch.nn.Module, sd: dict, what: str):
    """`model` holding exactly `sd` (strict_load), fp32, eval: a ModelFamily's target_from_state /
    decoder_from_state (export/weights.py) over a freshly built model."""
    strict_load(model, sd, what)
    return model.float().eval()


def load_target(path: PathLike, config=None, device="cpu"):
    """Load a target of any family, eval mode, fp32 (the public `lisa_trt.load_target`).

    Args:
        path: a registered bundle name such as "demo", a LlamaGen checkpoint file (official .pt
            or lisa-trt safetensors), or an HF checkpoint directory of a registered family
            (Chameleon / Lumina-mGPT, Janus-Pro; see docs/families.md); models/family.py's
            `detect_family` decides. A Hugging Face name `org/name[@revision]` that is not a
            local path resolves through the local Hugging Face cache, as `--model` does.
        config: LlamaGen files: a registry name ("GPT-B", ...), a TargetConfig, or None to use
            the file's metadata. Directory families read their config.json.
    """
    from .family import detect_family
    from .hub import resolve_model

    bundled = _bundled("target", path)
    if bundled is not None:
        return bundled
    path = resolve_model(path)  # a Hugging Face name org/name[@rev]: its snapshot (models/hub.py)
    return detect_family(path).load_target(path, config, device=device)


def load_vq(path: PathLike, config=None, device="cpu"):
    """Load the image decoder (VQ) of any family (the public `lisa_trt.load_vq`).

    path: "demo" (a bundle name), a LlamaGen VQ file (config: "VQ-16", "VQ-8", a VQConfig, or
    None for the file's metadata), or a family's checkpoint directory (its decoder), also as a
    Hugging Face name `org/name[@revision]` resolved through the local cache (models/hub.py)."""
    from .family import detect_family, families

    from .hub import resolve_model

    bundled = _bundled("vq", path)
    if bundled is not None:
        return bundled
    path = resolve_model(path)  # a Hugging Face name org/name[@rev]: its snapshot (models/hub.py)
    p = Path(path)
    if p.is_dir():
        for fam in families():
            if fam.claims(p):
                return fam.load_decoder(p, config, device=device)
        for fam in families():  # a bare decoder folder (e.g. Chameleon's vqgan/)
            if fam.claims_decoder(p):
                return fam.load_decoder(p, config, device=device)
    return detect_family(path).load_decoder(path, config, device=device)


def _bundled(kind: str, path):
    """Registered artifact-set names (e.g. 'demo', models/artifact_sets.py) resolve to shipped weights."""
    from .artifact_sets import artifact_set

    if not isinstance(path, str) or Path(path).suffix:
        return None
    s = artifact_set(path)
    if s is None:
        return None
    return s.load_target() if kind == "target" else s.load_vq()


def save_model(model, config, path: PathLike, dtype=None, extra_meta: dict | None = None) -> None:
    """Write weights as safetensors with the config (and target hash) in its metadata, plus a
    `<name>.json` sidecar with the same config. Atomic."""
    path = Path(path)
    sd = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v)
          for k, v in model.state_dict().items()}
    meta = {"config": config.to_dict(), "schema": 1, **(extra_meta or {})}
    if "output.weight" in sd:  # hash what a loader will see (after any dtype cast)
        meta["target_hash"] = tensor_hash(sd["output.weight"])
    save_safetensors(sd, path, meta)
    write_json(path.with_suffix(".json"), meta)


def read_config_json(path: PathLike) -> dict:
    with open(path) as f:
        return json.load(f)
