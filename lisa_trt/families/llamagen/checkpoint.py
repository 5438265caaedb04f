"""Loading official LlamaGen checkpoints (.pt, DDP or raw) and lisa-trt safetensors, strictly:
the LlamaGen family's target and VQ loaders (models/checkpoints.py reads the files)."""

from __future__ import annotations

from ...errors import CheckpointError, ConfigError
from ...models.checkpoints import PathLike, _clean, read_state_dict, strict_load
from ...models.target_config import target_config, vq_config
from .config import GPT_SHAPES, TargetConfig, VQConfig


def guess_target_config(sd: dict) -> str:
    """Describe the official config a state dict most likely needs (from tensor shapes)."""
    try:
        vocab, dim = sd["tok_embeddings.weight"].shape
        n_layer = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("layers."))
    except (KeyError, ValueError):
        return ""
    t2i = "cls_embedding.uncond_embedding" in sd
    names = [n for n, (L, _, d) in GPT_SHAPES.items() if L == n_layer and d == dim]
    kind = "t2i" if t2i else "c2i"
    extra = ""
    if not t2i and "cls_embedding.embedding_table.weight" in sd:
        extra = f", num_classes={sd['cls_embedding.embedding_table.weight'].shape[0] - 1}"
    if not names:
        return (f"the file looks like a custom config (dim={dim}, n_layer={n_layer}, {kind}, "
                f"vocab_size={vocab}{extra}), "
                f"none of {', '.join(GPT_SHAPES)}; load it from a .safetensors that carries its config")
    mt = " --model-type t2i" if t2i else ""
    return (f"the file looks like {names[0]} ({kind}, vocab_size={vocab}{extra}); pass --config {names[0]}{mt} "
            "(with the --image-size it was trained at)")


def other_artifact(meta: dict):
    """What a lisa-trt file that is not a model checkpoint is, and where it goes (its metadata's
    "kind" / "format"), or None: a drafter passed as --model is told to pass it as --drafter."""
    from ...models.drafter import ARTIFACT_KIND as DRAFTER
    from ...models.medusa import ARTIFACT_KIND as MEDUSA

    kind, fmt = str(meta.get("kind", "")), str(meta.get("format", ""))
    if kind in (DRAFTER, MEDUSA):
        what = "Medusa heads" if kind == MEDUSA else "a drafter"
        target = (meta.get("config") or {}).get("target_name") if isinstance(meta.get("config"), dict) else None
        of = f" (trained for {target})" if target else ""
        return (f"is {what}{of}, not a target model: pass it as --drafter, and the target it was trained for "
                "as --model")
    if fmt.endswith("gasv-tables"):
        return "holds calibration tables (lisa-trt calibrate), not a model: pass it as --tables"
    if kind.startswith("lisa-trt"):
        return f"is a lisa-trt {kind.split('lisa-trt', 1)[1].strip('-/') or 'artifact'} file, not a model checkpoint"
    return None


def _read(path: PathLike, mmap: bool = False):
    """read_state_dict, refusing a lisa-trt file that is not a model (a drafter, tables) by name."""
    sd, meta = read_state_dict(path, mmap=mmap)
    other = other_artifact(meta)
    if other:
        raise CheckpointError(f"{path} {other}")
    return sd, meta


def _resolve_target_config(config, meta: dict) -> TargetConfig:
    if isinstance(config, TargetConfig):
        return config
    if config is None:
        if "config" in meta:
            return TargetConfig.from_dict(meta["config"])
        raise ConfigError("no config given and the file carries none: pass a registry name "
                          "(e.g. 'GPT-B') or a TargetConfig")
    return target_config(config)


def load_llamagen_target(path: PathLike, config=None, device="cpu"):
    """Load a LlamaGen target (official .pt or lisa-trt safetensors), eval mode, fp32.

    The weights are loaded once: the model is built on the meta device and its
    parameters become the file's tensors (`assign`); a zip-format .pt file's tensors are mapped
    from the file, read as they are used (an fp32 file: no copy at all; bf16: one fp32 copy)."""
    import torch

    from ...models.rope import precompute_freqs_cis_2d
    from .model import Transformer

    sd, meta = _read(path, mmap=True)
    cfg = _resolve_target_config(config, meta)
    with torch.device("meta"):
        model = Transformer(cfg)
    strict_load(model, _clean(sd), f"target {cfg.n_layer}x{cfg.dim} ({cfg.model_type})", guess_target_config(sd),
                assign=True)
    del sd
    # the one non-persistent buffer (the 2-D RoPE table), as Transformer.__init__ makes it
    model.register_buffer("freqs_cis", precompute_freqs_cis_2d(cfg.grid_hw, cfg.head_dim, cfg.rope_base,
                                                               cfg.cls_token_num), persistent=False)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ConfigError(f"the checkpoint left {left[:3]} unset")  # strict_load makes this unreachable
    return model.float().eval().to(device)


def load_llamagen_vq(path: PathLike, config=None, device="cpu"):
    """Load a LlamaGen VQ tokenizer; config: "VQ-16", "VQ-8", a VQConfig, or None (metadata)."""
    from .vq import VQModel

    sd, meta = _read(path)
    if isinstance(config, VQConfig):
        cfg = config
    elif config is None:
        if "config" not in meta:
            raise ConfigError("no VQ config given and the file carries none: pass 'VQ-16' or 'VQ-8'")
        cfg = VQConfig.from_dict(meta["config"])
    else:
        cfg = vq_config(config)
    model = VQModel(cfg)
    hint = ""
    if "quantize.embedding.weight" in sd:
        n, d = sd["quantize.embedding.weight"].shape
        hint = f"the file has a {n} x {d} codebook; pass its config (--vq-config VQ-16 or VQ-8)"
    strict_load(model, _clean(sd), "VQ", hint)
    return model.float().eval().to(device)
