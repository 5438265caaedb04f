"""The Janus-Pro family's shape plugin for memory plans (deploy/model_shapes.py seam).

Janus-Pro-7B: the DeepSeek-LLM-7B backbone (Janus-Pro paper, arXiv 2501.17811, Table 1: 7B with
vocabulary 100K, embedding 4096, 32 heads, 30 layers; HF text_config: LlamaConfig, vocab 102400,
intermediate 11008 (DeepSeek-LLM-7B), MHA (32 kv heads)). Image generation (transformers
models/janus/configuration_janus.py, JanusVQVAEConfig: 16384 codes of dim 8, channel multipliers
1,1,2,2,4, i.e. LlamaGen's VQ-16; image_token_embed_dim "same as the text embeddings"): gen_embed
(16384 x 8) -> gen_aligner (8 -> H -> H, GELU MLP) into the LM; gen_head (H -> H -> 16384) out of
it. Images are 384 px: 24 x 24 = 576 codes (patch 16). Deployed for generation: the text
embedding (prompts), the layers, the final norm and the gen_* modules; the text lm_head and the
SigLIP understanding encoder are not part of the image engines.

It sits at the engines floor (tests/test_architecture.py: a family package's `shapes`
sub-module); deploy/model_shapes.py finds it through `JanusFamily.shapes_module`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ...deploy.model_shapes import (
    DEFAULT_PROMPT,
    VQ16_DECODE_PARAMS,
    ModelShape,
    Weights,
    engine_fields,
    lin,
    llama_layer,
    repeat,
)
from ...errors import InputError

JANUS = dict(n_layer=30, dim=4096, n_head=32, kv_heads=32, ffn=11008, text_vocab=102400, codes=16384,
             code_dim=8, image_size=384, patch=16)
KNOWN = ("Janus-Pro-7B",)
DEFAULT_SIZE = 384


def janus_target(n_layer: int, dim: int, n_head: int, kv_heads: int, ffn: int, text_vocab: int, codes: int,
                 code_dim: int) -> tuple[Weights, Weights]:
    """(target weights, image-token embedding path) of a Janus generation deployment."""
    layer = llama_layer(dim, n_head, kv_heads, ffn)
    embed = Weights(other=codes * code_dim) + lin(code_dim, dim, True) + lin(dim, dim, True)  # gen_embed + aligner
    head = lin(dim, dim, True) + lin(dim, codes, True)  # gen_head
    return repeat(layer, n_layer) + Weights(other=text_vocab * dim + dim) + embed + head, embed


def janus_shape(name: str, image_size: int, prompt_len: int, native_size=None, **over) -> ModelShape:
    """The shape of a Janus-Pro deployment: JANUS with `over` replaced; native_size: the checkpoint's
    image size (the only one it generates; default JANUS's)."""
    j = {**JANUS, **over}
    j["image_size"] = native_size or j["image_size"]
    if image_size != j["image_size"]:
        raise InputError(f"Janus-Pro generates {j['image_size']} px images ({j['image_size'] // 16} x "
                         f"{j['image_size'] // 16} codes); got --image-size {image_size}")
    target, embed = janus_target(j["n_layer"], j["dim"], j["n_head"], j["kv_heads"], j["ffn"], j["text_vocab"],
                                 j["codes"], j["code_dim"])
    side = image_size // j["patch"]
    return ModelShape(name=name, family="janus", n_layer=j["n_layer"], dim=j["dim"], n_head=j["n_head"],
                      kv_heads=j["kv_heads"], ffn=j["ffn"], vocab=j["codes"], image_tokens=side * side,
                      span_prefix=0, prompt_len=prompt_len, codes=j["codes"], target=target, image_embed=embed,
                      vq_params=VQ16_DECODE_PARAMS, vq_ch=128, pixels=image_size ** 2, image_size=image_size,
                      max_positions=j.get("max_positions", 0))


def config_shape(cfg, name: str, image_size=None, prompt_len=None) -> ModelShape:
    """A JanusConfig's shape (the generation path's aligner depth taken as the 7B's two layers)."""
    return janus_shape(name, image_size or cfg.image_size, prompt_len or cfg.max_prompt_tokens,
                       n_layer=cfg.n_layer, dim=cfg.dim, n_head=cfg.n_head, kv_heads=cfg.kv_heads,
                       ffn=cfg.intermediate_size, text_vocab=cfg.text_vocab_size, codes=cfg.codebook_size,
                       code_dim=cfg.code_dim, native_size=cfg.image_size, patch=cfg.image_size // cfg.grid_size,
                       max_positions=cfg.max_position_embeddings)


def known_shape(name: str, image_size=None, prompt_len=None) -> ModelShape:
    return janus_shape(name, image_size or DEFAULT_SIZE, prompt_len or DEFAULT_PROMPT)


def checkpoint_shape(path, image_size=None, prompt_len=None) -> ModelShape:
    from .config import read_janus_config

    p = Path(path)
    return config_shape(read_janus_config(p), p.name, image_size, prompt_len or DEFAULT_PROMPT)


def engine_shape(d: Path, man=None) -> ModelShape:
    """An engine directory's shape (its manifest: `man` when the caller has read it)."""
    from ...export.manifest import read_manifest

    man = man if man is not None else read_manifest(d, check_files=False)
    s = config_shape(man.target_config, d.name, int(man.layout["image_size"]), int(man.layout["max_prompt"]))
    return replace(s, **engine_fields(man.to_dict(), s))


__all__ = ["DEFAULT_SIZE", "JANUS", "KNOWN", "checkpoint_shape", "config_shape", "engine_shape", "janus_shape",
           "janus_target", "known_shape"]
