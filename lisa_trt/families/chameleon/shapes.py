"""The Chameleon / Lumina-mGPT family's shape plugin for memory plans (deploy/model_shapes.py seam).

Parameter counts of a ChameleonConfig (families/chameleon/model.ChameleonTarget's
parameters), the Lumina image span, the known name Lumina-mGPT-7B (Chameleon-7B: the dataclass
defaults), HF directories (config.json only) and engine directories (manifest only). It sits at
the engines floor (tests/test_architecture.py: a family package's `shapes` sub-module);
deploy/model_shapes.py finds it through `ChameleonFamily.shapes_module`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ...deploy.model_shapes import DEFAULT_PROMPT, ModelShape, Weights, engine_fields, lin, repeat
from ...errors import InputError

KNOWN = ("Lumina-mGPT-7B",)
DEFAULT_SIZE = 768
LUMINA_CODES = 8192  # Chameleon VQGAN n_embed
CHAMELEON_VQ_DECODE_PARAMS = 39_294_851 + 65_792 + 8192 * 256  # Chameleon VQGAN (vq.py)


def chameleon_layer(dim: int, n_head: int, kv_heads: int, ffn: int, attention_bias: bool = False,
                    mlp_bias: bool = False) -> Weights:
    hd = dim // n_head
    attn = (lin(dim, n_head * hd, attention_bias) + repeat(lin(dim, kv_heads * hd, attention_bias), 2)
            + lin(dim, dim, attention_bias))
    qk_norm = Weights(other=2 * (n_head + kv_heads) * hd)  # per-head LayerNorm weight + bias
    mlp = repeat(lin(dim, ffn, mlp_bias), 2) + lin(ffn, dim, mlp_bias)
    return attn + qk_norm + mlp + Weights(other=2 * dim)


def lumina_span(image_size: int) -> int:
    """Tokens of one square Lumina image span: h_lat rows of (w_lat codes + row end), 16 px codes
    (lumina.py: 32-px size grids, 2 codes per grid side)."""
    if image_size <= 0 or image_size % 32:
        raise InputError(f"Lumina-mGPT images are multiples of 32 px (512 / 768 / 1024), got {image_size}")
    lat = image_size // 16
    return lat * (lat + 1)


def config_shape(cfg, name: str, image_size: int, prompt_len: int) -> ModelShape:
    """A ChameleonConfig's shape for one image size and prompt budget."""
    layer = chameleon_layer(cfg.dim, cfg.n_head, cfg.kv_heads, cfg.intermediate_size, cfg.attention_bias,
                            cfg.mlp_bias)
    head = Weights() if cfg.tie_word_embeddings else lin(cfg.dim, cfg.vocab_size)
    target = repeat(layer, cfg.n_layer) + Weights(other=cfg.vocab_size * cfg.dim + cfg.dim) + head
    return ModelShape(name=name, family="chameleon", n_layer=cfg.n_layer, dim=cfg.dim, n_head=cfg.n_head,
                      kv_heads=cfg.kv_heads, ffn=cfg.intermediate_size, vocab=cfg.vocab_size,
                      image_tokens=lumina_span(image_size), span_prefix=3, prompt_len=prompt_len,
                      codes=LUMINA_CODES, target=target, image_embed=Weights(other=cfg.vocab_size * cfg.dim),
                      vq_params=CHAMELEON_VQ_DECODE_PARAMS, vq_ch=128, pixels=image_size ** 2, image_size=image_size,
                      max_positions=cfg.max_position_embeddings)


def known_shape(name: str, image_size=None, prompt_len=None) -> ModelShape:
    from .model import ChameleonConfig

    return config_shape(ChameleonConfig(), name, image_size or DEFAULT_SIZE, prompt_len or DEFAULT_PROMPT)


def checkpoint_shape(path, image_size=None, prompt_len=None) -> ModelShape:
    from .checkpoint import read_chameleon_config

    p = Path(path)
    return config_shape(read_chameleon_config(p), p.name, image_size or DEFAULT_SIZE, prompt_len or DEFAULT_PROMPT)


def engine_shape(d: Path, man=None) -> ModelShape:
    """An engine directory's shape (its manifest, `man` when the caller has read it, and the
    checkpoint config.json it carries)."""
    from ...export.manifest import raw_manifest
    from .checkpoint import read_chameleon_config

    man = man.to_dict() if man is not None else raw_manifest(d)
    lay = man.get("layout") or man  # manifest.json keeps them in `layout`; older chameleon_engine.json at the top
    s = config_shape(read_chameleon_config(d), d.name, int(lay["image_size"]), int(lay["max_prompt"]))
    return replace(s, **engine_fields(man, s))


__all__ = ["CHAMELEON_VQ_DECODE_PARAMS", "DEFAULT_SIZE", "KNOWN", "LUMINA_CODES", "chameleon_layer", "checkpoint_shape",
           "config_shape", "engine_shape", "known_shape", "lumina_span"]
