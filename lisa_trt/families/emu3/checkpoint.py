"""Loading Emu3 directories strictly: the decoder (`text_model.*`) into an Emu3Target, the VQ-VAE
decoder (`vqmodel.*`, encoder skipped) into an Emu3VQ (the key layout of the BAAI/Emu3-*-hf files
and of transformers' save_pretrained).
Every needed key must be present with the right shape; errors name the configuration the
shapes imply."""

from __future__ import annotations

from pathlib import Path

import torch

from ...models.hf import read_weights, strict_copy
from ..prompt_target import load_vocab_target
from .config import read_emu3_config, read_emu3_vq_config
from .target import Emu3Target

_TEXT = ("text_model.",)
_VQ = "vqmodel."
_VQ_UNUSED = (_VQ + "encoder.", _VQ + "quant_conv.")  # the image encoder: generation only decodes


def implied_config(sd: dict) -> str:
    """The decoder shapes a state dict implies."""
    try:
        vocab, hidden = sd["text_model.model.embed_tokens.weight"].shape
        layers = 1 + max(int(k.split(".")[3]) for k in sd if k.startswith("text_model.model.layers."))
        kv = sd["text_model.model.layers.0.self_attn.k_proj.weight"].shape[0]
        inter = sd["text_model.model.layers.0.mlp.gate_proj.weight"].shape[0]
    except (KeyError, ValueError, IndexError):
        return ""
    return (f"the weights imply vocab_size={vocab}, hidden_size={hidden}, num_hidden_layers={layers}, "
            f"k/v width {kv} (num_key_value_heads * head_dim), intermediate_size={inter}")


def load_emu3(path, device="cpu", dtype=torch.float32) -> Emu3Target:
    """An Emu3 directory's decoder, eval mode (a 8B model needs ~32 GiB in fp32, ~16 GiB in bf16)."""
    path = Path(path)
    return load_vocab_target(Emu3Target, read_emu3_config(path), path, implied_config,
                             head_key="text_model.lm_head.weight", skip=lambda k: not k.startswith(_TEXT),
                             device=device, dtype=dtype)


def load_emu3_vq(path, device="cpu"):
    """The VQ-VAE decoder of an Emu3 directory, with its vocabulary id -> code map."""
    from .vq import Emu3VQ

    path = Path(path)
    vq = Emu3VQ(read_emu3_vq_config(path))
    sd = read_weights(path, keep=lambda k: k.startswith(_VQ) and not k.startswith(_VQ_UNUSED))
    sd = {k[len(_VQ):]: v for k, v in sd.items()}
    strict_copy(vq, sd, str(path), f"Emu3 VQ {vq.config}")
    vq.token_codes_from(read_emu3_config(path))
    return vq.eval().to(device)
