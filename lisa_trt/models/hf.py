"""HF checkpoint-directory helpers shared by the directory families (config.json layouts of
transformers 4.x / 5.x, safetensors shards)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import CheckpointError, ConfigError


def rope_params(raw: dict) -> tuple[float, float]:
    """(rope_theta, linear factor) from transformers 4.x (rope_theta/rope_scaling) or 5.x
    (rope_parameters) config.json layouts."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return theta, 1.0
    if kind == "linear":
        return theta, float(params.get("factor", scaling.get("factor", 1.0)))
    raise ConfigError(f"RoPE scaling {kind!r} is not supported (supported: default, linear)")


def weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index ({e})") from e
        files = sorted({path / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} lists shards that are missing: {', '.join(missing)}")
        return files
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    others = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.safetensors"))
    hint = f" (found {', '.join(others)})" if others else ""
    raise CheckpointError(f"{path} has no model.safetensors or model.safetensors.index.json{hint}; "
                          "re-save the model with save_pretrained(safe_serialization=True)")
