"""The Emu3 family's shape plugin for memory plans (deploy/model_shapes.py seam).

Emu3-Gen (BAAI/Emu3-Gen-hf; its config.json `text_config`, checked against the published
configs): a Llama-style decoder of 32 layers, hidden 4096, 32 heads with 8 KV heads, SwiGLU
14336, vocabulary 184,622 (text + 32,768 visual tokens), max_position_embeddings 9216; the VQ
decoder 8 pixels per code. A 720 px image (Emu3-Gen's image_area 518,400) is a 90 x 90 grid:
8,100 visual tokens + 90 end-of-line + 3 end tokens = 8,193 generated tokens.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ...deploy.model_shapes import DEFAULT_PROMPT, ModelShape, Weights, engine_fields, lin, llama_layer, repeat
from ...errors import InputError

KNOWN = ("Emu3-Gen",)
DEFAULT_SIZE = 720
VQ_CODES = 32768
VQ_DOWNSAMPLE = 8
EMU3_VQ_DECODE_PARAMS = 161_251_983  # Emu3VQ (vq.py) of the default Emu3VQConfig: decoder, post-quant conv, codebook
VQ_FULL_RES_CH = 256  # base_channels * channel_multiplier[0]


def span_tokens(image_size: int) -> int:
    """Tokens generated for a square image: h rows of (w visual tokens + end-of-line), then 3 end tokens."""
    if image_size <= 0 or image_size % VQ_DOWNSAMPLE:
        raise InputError(f"Emu3 images are multiples of {VQ_DOWNSAMPLE} px (720 for Emu3-Gen), got {image_size}")
    g = image_size // VQ_DOWNSAMPLE
    return g * (g + 1) + 3


def config_shape(cfg, name: str, image_size: int, prompt_len: int) -> ModelShape:
    """An Emu3Config's shape for one image size and prompt budget."""
    head = Weights() if cfg.tie_word_embeddings else lin(cfg.dim, cfg.vocab_size)
    target = (repeat(llama_layer(cfg.dim, cfg.n_head, cfg.kv_heads, cfg.intermediate_size), cfg.n_layer)
              + Weights(other=cfg.vocab_size * cfg.dim + cfg.dim) + head)
    return ModelShape(name=name, family="emu3", n_layer=cfg.n_layer, dim=cfg.dim, n_head=cfg.n_head,
                      kv_heads=cfg.kv_heads, ffn=cfg.intermediate_size, vocab=cfg.vocab_size,
                      image_tokens=span_tokens(image_size), span_prefix=0, prompt_len=prompt_len, codes=VQ_CODES,
                      target=target, image_embed=Weights(other=cfg.vocab_size * cfg.dim),
                      vq_params=EMU3_VQ_DECODE_PARAMS, vq_ch=VQ_FULL_RES_CH, pixels=image_size ** 2,
                      image_size=image_size, max_positions=cfg.max_position_embeddings)


def _emu3_gen():
    from .config import Emu3Config

    return Emu3Config(vocabulary_map={"<|visual token 000000|>": 0})  # the dataclass defaults are Emu3-Gen's


def known_shape(name: str, image_size=None, prompt_len=None) -> ModelShape:
    return config_shape(_emu3_gen(), name, image_size or DEFAULT_SIZE, prompt_len or DEFAULT_PROMPT)


def checkpoint_shape(path, image_size=None, prompt_len=None) -> ModelShape:
    from .config import read_emu3_config

    p = Path(path)
    return config_shape(read_emu3_config(p), p.name, image_size or DEFAULT_SIZE, prompt_len or DEFAULT_PROMPT)


def engine_shape(d: Path, man=None) -> ModelShape:
    """An engine directory's shape (its manifest, `man` when the caller has read it, and the
    checkpoint config.json it carries)."""
    from ...export.manifest import raw_manifest
    from .config import read_emu3_config

    man = man.to_dict() if man is not None else raw_manifest(d)
    lay = man.get("layout") or {}
    s = config_shape(read_emu3_config(d), d.name, int(lay["image_size"]), int(lay["max_prompt"]))
    return replace(s, **engine_fields(man, s))


__all__ = ["DEFAULT_SIZE", "EMU3_VQ_DECODE_PARAMS", "KNOWN", "checkpoint_shape", "config_shape", "engine_shape",
           "known_shape", "span_tokens"]
