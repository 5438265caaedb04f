"""Loading a Janus-Pro HF directory strictly: the target and the VQ decoder.

Weights are `model.safetensors` or shards listed in `model.safetensors.index.json`. Only the
tensors a model needs are read (a 7B checkpoint's understanding tower is never materialised).

Target: every key of JanusTarget must be present with the right shape, and every other key
must fall under one of `TARGET_IGNORED` (the understanding path and the separately-loaded VQ);
anything else is refused. VQ: every decoder key under `model.vqmodel.` must be present, and the
only other `model.vqmodel.` keys allowed are the encoder's (`VQ_IGNORED`). Models are built on
the meta device and materialised with `to_empty` (no random init of billions of weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import torch

from ...errors import ConfigError
from ...models.hf import empty_model, model_from_state, read_weights, strict_copy
from .config import JanusConfig, read_janus_config
from .target import JanusTarget
from .vq import JanusVQ

PathLike = Union[str, Path]
TARGET_IGNORED = (
    "model.vision_model.",  # SigLIP understanding tower
    "model.aligner.",  # its projection into the language model
    "model.vqmodel.",  # the VQ model: loaded by load_janus_vq (decoder) / unused (encoder)
    "lm_head.",  # the TEXT head (understanding mode); tied to embed_tokens in HF's layout
)
VQ_PREFIX = "model.vqmodel."
VQ_IGNORED = ("encoder.", "quant_conv.")  # image -> codes; generation only decodes


def _implied(sd: dict) -> str:
    """The shapes a target state dict implies (for the mismatch hint)."""
    try:
        vocab, hidden = sd["model.language_model.embed_tokens.weight"].shape
        layers = 1 + max(int(k.split(".")[3]) for k in sd if k.startswith("model.language_model.layers."))
        inter = sd["model.language_model.layers.0.mlp.gate_proj.weight"].shape[0]
        codes, code_dim = sd["model.generation_embeddings.weight"].shape
    except (KeyError, ValueError, IndexError):
        return ""
    return (f"the weights imply text vocab {vocab}, hidden_size {hidden}, {layers} layers, intermediate_size "
            f"{inter}, codebook {codes} x {code_dim}")


def _config(path: Path, config) -> JanusConfig:
    if isinstance(config, JanusConfig):
        return config
    if config is None:
        return read_janus_config(path)
    if isinstance(config, dict):
        return read_janus_config(path, **config)
    raise ConfigError(f"config must be None, a JanusConfig or a dict of JanusConfig overrides; got "
                      f"{type(config).__name__}")


def load_janus_target(path: PathLike, config: Optional[Union[JanusConfig, dict]] = None, device="cpu",
                      dtype=torch.float32) -> JanusTarget:
    """Load the image-generation target of a Janus-Pro directory (eval mode).

    Args:
        path: HF directory (config.json model_type "janus", model.safetensors or shards).
        config: None (read config.json), a JanusConfig, or overrides such as {"max_prompt_tokens": 256}.
        dtype: parameter dtype (fp32 default; Janus-Pro-7B needs ~28 GiB in fp32, ~14 GiB in bf16).
    """
    path = Path(path)
    cfg = _config(path, config)
    sd = read_weights(path, lambda k: not k.startswith(TARGET_IGNORED))
    model = model_from_state(lambda: JanusTarget(cfg), sd, str(path), cfg.describe(), _implied(sd), dtype)
    model.source_dir = str(path)
    return model.to(device)


def load_janus_vq(path: PathLike, config: Optional[Union[JanusConfig, dict]] = None, device="cpu",
                  dtype=torch.float32) -> JanusVQ:
    """Load the VQ decoder (`model.vqmodel.*`) of a Janus-Pro directory (eval mode)."""
    path = Path(path)
    cfg = _config(path, config).vq
    raw = read_weights(path, lambda k: k.startswith(VQ_PREFIX))
    sd = {k[len(VQ_PREFIX):]: v for k, v in raw.items() if not k[len(VQ_PREFIX):].startswith(VQ_IGNORED)}
    model = empty_model(lambda: JanusVQ(cfg), dtype)
    hint = ""
    if "quantize.embedding.weight" in sd:
        n, d = sd["quantize.embedding.weight"].shape
        hint = f"the file has a {n} x {d} codebook"
    strict_copy(model, sd, f"{path} (VQ decoder, {VQ_PREFIX}*)", str(cfg), hint)
    return model.eval().to(device)
