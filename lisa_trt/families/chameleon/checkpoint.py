"""Loading HF-format Chameleon / Lumina-mGPT checkpoint directories, strictly.

A directory holds `config.json` (`model_type: "chameleon"`) and the weights as
`model.safetensors`, or shards listed in `model.safetensors.index.json`. Every key of the
decoder must be present with the right shape and nothing unknown may remain, except the
`model.vqmodel.*` entries HF stores for the VQ encoder (unused for generation: images are
decoded with the VQGAN of chameleon_vq.py). Errors name the configuration the file implies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

import torch

from ...errors import ConfigError
from ...models.hf import rope_params
from ..prompt_family import read_config_json
from ..prompt_target import load_vocab_target
from .model import ChameleonConfig, ChameleonTarget

PathLike = Union[str, Path]
SUPPORTED_MODEL_TYPES = ("chameleon", "chameleon_xllmx")
_IGNORED_PREFIXES = ("model.vqmodel.",)
_CONFIG_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "max_position_embeddings", "rms_norm_eps", "hidden_act",
                  "attention_bias", "mlp_bias", "swin_norm", "tie_word_embeddings", "bos_token_id",
                  "eos_token_id", "vocabulary_map")


def read_chameleon_config(path: PathLike) -> ChameleonConfig:
    """Parse `DIR/config.json` into a ChameleonConfig; clear errors for wrong directories."""
    cfg_path, raw = read_config_json(path, "a Chameleon / Lumina-mGPT checkpoint is an HF directory with "
                                     "config.json and model*.safetensors (see docs/chameleon.md)")
    mt = raw.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"{cfg_path} has model_type {mt!r}; lisa-trt loads directories of model_type "
                          f"{' / '.join(SUPPORTED_MODEL_TYPES)} (Chameleon, Lumina-mGPT). LlamaGen "
                          "checkpoints are single .pt / .safetensors files, not directories.")
    kw = {k: raw[k] for k in _CONFIG_FIELDS if k in raw and raw[k] is not None}
    kw["num_key_value_heads"] = raw.get("num_key_value_heads") or raw["num_attention_heads"]
    if isinstance(kw.get("eos_token_id"), list):
        kw["eos_token_id"] = kw["eos_token_id"][0]
    kw["rope_theta"], kw["rope_linear_factor"] = rope_params(raw)
    try:
        return ChameleonConfig(**kw)
    except TypeError as e:
        raise ConfigError(f"{cfg_path}: {e}") from e


def implied_config(sd: dict) -> str:
    """Describe the config a state dict implies (from tensor shapes)."""
    try:
        vocab, hidden = sd["model.embed_tokens.weight"].shape
        layers = 1 + max(int(k.split(".")[2]) for k in sd if k.startswith("model.layers."))
        heads = sd["model.layers.0.self_attn.q_norm.weight"].shape[0]
        kv = sd["model.layers.0.self_attn.k_norm.weight"].shape[0]
        inter = sd["model.layers.0.mlp.gate_proj.weight"].shape[0]
    except (KeyError, ValueError, IndexError):
        return ""
    return (f"the weights imply vocab_size={vocab}, hidden_size={hidden}, num_hidden_layers={layers}, "
            f"num_attention_heads={heads}, num_key_value_heads={kv}, intermediate_size={inter}")


def load_chameleon(path: PathLike, device="cpu", dtype=torch.float32) -> ChameleonTarget:
    """Load an HF Chameleon / Lumina-mGPT directory into a ChameleonTarget (eval mode).

    Args:
        path: directory with config.json and model.safetensors (or shards + index).
        dtype: parameter dtype (fp32 default; a 7B model needs ~28 GiB in fp32, ~14 GiB in bf16).
    """
    path = Path(path)
    return load_vocab_target(ChameleonTarget, read_chameleon_config(path), path, implied_config,
                             head_key="lm_head.weight", skip=lambda k: k.startswith(_IGNORED_PREFIXES),
                             device=device, dtype=dtype)
