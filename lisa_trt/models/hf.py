"""HF checkpoint-directory helpers shared by the directory families (config.json layouts of
transformers 4.x / 5.x, safetensors shards)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

from ..errors import CheckpointError, ConfigError


class HFDecoderShape:
    """The config protocol (n_layer, n_positions, n_head, kv_heads, dim, tap_layers, cond_dims) over
    an HF decoder config's field names; a family's frozen config dataclass inherits it."""

    def cond_dims(self) -> dict:
        """No static condition axes (models/target_config.TargetShape.cond_dims): the prompt is
        token ids of per-request length, the prefill graph's dynamic "seq" axis."""
        return {}

    @property
    def n_layer(self) -> int:
        return self.num_hidden_layers

    @property
    def n_positions(self) -> int:
        """RoPE positions the model accepts (the tree decoder clamps drafter positions to it)."""
        return self.max_position_embeddings

    @property
    def n_head(self) -> int:
        return self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads

    @property
    def dim(self) -> int:
        return self.hidden_size

    @property
    def tap_layers(self) -> tuple[int, int, int]:
        """EAGLE-3 taps: residual stream entering layers {2, L//2, L-3} (0-based)."""
        L = self.num_hidden_layers
        return (min(2, L - 1), L // 2, max(L - 3, 0))

    def rope_1d_drafter_shape(self, vocab_size: int, block_size: int, warm_head: bool) -> dict:
        """A target's `drafter_shape()` for this decoder: 1-D RoPE over absolute positions (the
        prompt length varies, so no fixed condition prefix), one layer's width / heads / FFN."""
        return dict(target_dim=self.dim, n_head=self.n_head, head_dim=self.head_dim,
                    ffn_hidden=self.intermediate_size, vocab_size=vocab_size, block_size=block_size,
                    cls_token_num=0, rope_base=self.rope_theta, norm_eps=self.rms_norm_eps, rope="1d",
                    max_positions=self.max_position_embeddings, warm_head=warm_head)


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


def empty_model(make: Callable, dtype):
    """make() built on the meta device (no random init of weights that are all loaded next),
    then materialised, uninitialised, on the CPU in `dtype`. Call `reset_buffers()` after."""
    import torch

    with torch.device("meta"):
        model = make()
    return model.to_empty(device="cpu").to(dtype)


def model_from_state(make: Callable, sd: dict, where: str, describe: str, hint: str = "", dtype=None):
    """make()'s target holding exactly `sd`, eval: built on the meta device and materialised
    (`empty_model`, fp32 unless `dtype`), its RoPE buffers remade and a tied head re-tied
    (`reset_buffers`, models/layers.RotaryTarget), then filled by `strict_copy` (every key and
    shape checked, errors naming `where`, `describe` and `hint`). What a family's loader and its
    ModelFamily.target_from_state (a bundle's shared weights, export/weights.py) both build."""
    import torch

    model = empty_model(make, dtype or torch.float32)
    model.reset_buffers()
    strict_copy(model, sd, where, describe, hint)
    return model.eval()


def strict_copy(model, sd: dict, where: str, describe: str, hint: str = "", ignore=()) -> None:
    """Copy `sd` into `model`'s tensors, strictly: every missing, unknown or mis-shaped key is
    listed with the config expected (`describe`) and `hint` (e.g. what the weights imply).
    `ignore`: keys neither side needs (a tied head)."""
    import torch

    from ..io import state_dict_problems

    own = {k: t for k, t in model.state_dict().items() if k not in ignore}
    sd = {k: t for k, t in sd.items() if k not in ignore}
    problems = state_dict_problems(own, sd, other="config")
    if problems:
        lines = [f"{where}: weights do not match config.json ({describe}):", *problems]
        if hint:
            lines.append(f"  hint: {hint}; fix config.json or use the matching weights")
        raise CheckpointError("\n".join(lines))
    with torch.no_grad():
        for k, t in own.items():
            t.copy_(sd[k].to(t.dtype))


def read_weights(path: Path, keep: Optional[Callable[[str], bool]] = None) -> dict:
    """{key: tensor} of a (possibly sharded) safetensors checkpoint directory, for the keys with
    keep(key) (all by default)."""
    from safetensors import safe_open

    sd = {}
    for f in weight_files(Path(path)):
        try:
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    if keep is None or keep(k):
                        sd[k] = h.get_tensor(k)
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{f} is not a readable safetensors file ({e})") from e
    return sd


def stream_weights(model, path: Path, where: str, describe: str, hint: Callable[[dict], str] = lambda sd: "",
                   ignore=(), skip: Callable[[str], bool] = lambda k: False) -> None:
    """`strict_copy` of a (possibly sharded) safetensors directory, one tensor at a time.

    The keys and shapes of every shard are checked first from the files' headers (nothing is
    read), then each tensor is read, converted to the model's dtype and copied into place, and
    dropped: the peak is the model plus one tensor, not the model plus the whole checkpoint (a
    bf16 checkpoint is read as it is and converted tensor by tensor). `skip(key)`: entries
    nobody needs (e.g. an HF VQ encoder); `hint(shapes)`: what the shapes imply, for the error.
    """
    import torch
    from safetensors import safe_open

    from ..io import state_dict_problems

    files = weight_files(Path(path))
    where_is, shapes = {}, {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    if not skip(k) and k not in ignore:
                        where_is[k] = f
                        shapes[k] = torch.empty(h.get_slice(k).get_shape(), device="meta")
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{f} is not a readable safetensors file ({e})") from e
    own = {k: t for k, t in model.state_dict().items() if k not in ignore}
    problems = state_dict_problems(own, shapes, other="config")
    if problems:
        lines = [f"{where}: weights do not match config.json ({describe}):", *problems]
        h = hint(shapes)
        if h:
            lines.append(f"  hint: {h}; fix config.json or use the matching weights")
        raise CheckpointError("\n".join(lines))
    with torch.no_grad():
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    if k in own and where_is.get(k) == f:
                        own[k].copy_(h.get_tensor(k))  # copy_ converts the dtype
