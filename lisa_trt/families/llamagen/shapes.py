"""The LlamaGen family's shape plugin for memory plans (deploy/model_shapes.py seam).

Parameter counts of a TargetConfig (families/llamagen/model.Transformer's parameters), the
known names GPT-B ... GPT-7B (every GPT shape --config takes), lisa-trt .safetensors checkpoints
(metadata only) and engine directories (manifest only). It sits at the engines floor (tests/test_architecture.py: a family
package's `shapes` sub-module); deploy/model_shapes.py finds it through
`LlamaGenFamily.shapes_module`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ...deploy.model_shapes import VQ16_DECODE_PARAMS, ModelShape, Weights, lin, llama_layer, repeat
from ...errors import InputError

from .config import GPT_SHAPES

NAMES = tuple(GPT_SHAPES)  # every name --config takes (GPT-B ... GPT-7B) plans
KNOWN = NAMES
DEFAULT_SIZE = 256
# c2i checkpoints as released (FoundationVision/LlamaGen): GPT-B / GPT-L at 256 (and 384) px,
# GPT-XL / GPT-XXL / GPT-3B at 384 px only; the shapes never released (GPT-XXXL, GPT-1B, GPT-7B)
# at DEFAULT_SIZE
DEFAULT_SIZES = {**{n: DEFAULT_SIZE for n in GPT_SHAPES}, "GPT-XL": 384, "GPT-XXL": 384, "GPT-3B": 384}


def config_shape(cfg, name: str) -> ModelShape:
    """A TargetConfig's shape."""
    layer = llama_layer(cfg.dim, cfg.n_head, cfg.kv_heads, cfg.ffn_hidden)
    if cfg.model_type == "t2i":
        cond = lin(cfg.caption_dim, cfg.dim) + lin(cfg.dim, cfg.dim)  # CaptionMLP (+ its fixed null caption)
        cond = cond + Weights(other=cfg.cls_token_num * cfg.caption_dim)
    else:
        cond = Weights(other=(cfg.num_classes + 1) * cfg.dim)  # LabelEmbedder
    embed_norm = Weights(other=cfg.vocab_size * cfg.dim + cfg.dim)  # tok_embeddings, final norm
    target = repeat(layer, cfg.n_layer) + cond + embed_norm + lin(cfg.dim, cfg.vocab_size)
    h, w = cfg.grid_hw
    return ModelShape(name=name, family="llamagen", n_layer=cfg.n_layer, dim=cfg.dim, n_head=cfg.n_head,
                      kv_heads=cfg.kv_heads, ffn=cfg.ffn_hidden, vocab=cfg.vocab_size, image_tokens=cfg.block_size,
                      span_prefix=0, prompt_len=cfg.cls_token_num, codes=cfg.vocab_size, target=target,
                      image_embed=Weights(other=cfg.vocab_size * cfg.dim), vq_params=VQ16_DECODE_PARAMS, vq_ch=128,
                      pixels=h * w * 256, image_size=h * 16)


def known_shape(name: str, image_size=None, prompt_len=None) -> ModelShape:
    from ...models.target_config import target_config

    size = image_size or DEFAULT_SIZES.get(name, DEFAULT_SIZE)
    if size % 16:
        raise InputError(f"LlamaGen images are multiples of 16 px (VQ-16), got --image-size {size}")
    s = config_shape(target_config(name, image_size=size), name)
    return replace(s, prompt_len=prompt_len or s.prompt_len)


def _checkpoint_config(path: Path):
    from .config import TargetConfig
    from ...deploy.model_shapes import safetensors_metadata

    meta = safetensors_metadata(path) if path.suffix == ".safetensors" else {}
    cfg = meta.get("config")
    if isinstance(cfg, str):
        cfg = json.loads(cfg)
    side = path.with_suffix(".json")
    if cfg is None and side.is_file():
        cfg = json.loads(side.read_text()).get("config")
    if cfg is None:
        raise InputError(f"{path} carries no config (lisa-trt safetensors have one; official .pt files do not): "
                         "plan the known name instead, e.g. `lisa-trt plan GPT-L --image-size 384`")
    return TargetConfig.from_dict(cfg)


def checkpoint_shape(path, image_size=None, prompt_len=None) -> ModelShape:
    """A checkpoint file's shape (its metadata: safetensors header or `<name>.json` sidecar)."""
    p = Path(path)
    cfg = _checkpoint_config(p)
    if image_size and image_size != cfg.grid_hw[0] * 16:
        raise InputError(f"{p} is a {cfg.grid_hw[0] * 16} px checkpoint; drop --image-size or plan another one")
    s = config_shape(cfg, p.stem)
    return replace(s, prompt_len=prompt_len or s.prompt_len)


def engine_shape(d: Path, man=None) -> ModelShape:
    """An engine directory's shape (its manifest: `man` when the caller has read it; the decoder's
    size from its exported weights)."""
    from ...models.io_spec import Graph
    from ...deploy.model_shapes import target_copies
    from ...export.manifest import read_manifest

    man = man if man is not None else read_manifest(d, check_files=False)
    s = config_shape(man.target_config, d.name)
    dc = man.drafter_config
    prec = man.quantization if man.quantization != "none" else man.precision
    vq = man.vq_config
    vq_params = s.vq_params
    if vq is not None and man.has(Graph.VQ_DECODE):  # this bundle's decoder: its exported weights
        g = man.graphs[Graph.VQ_DECODE.value]
        files = [d / g.file] + ([d / g.external_data] if g.external_data else [])
        size = sum(f.stat().st_size for f in files if f.is_file())
        vq_params = size // (4 if man.precision == "fp32" else 2) or vq_params
    return replace(s, max_cache_len=man.max_cache_len, max_tree=man.max_tree, vq_params=vq_params,
                   pixels=s.pixels // 256 * vq.downsample ** 2 if vq else s.pixels, has_drafter=dc is not None,
                   has_tables=man.tables is not None, has_vq=vq is not None, precision=prec,
                   draft_head=dc.head_size if dc else 0, draft_hidden=dc.hidden if dc else 0,
                   draft_ffn=dc.ffn_hidden if dc else 0,
                   vq_ch=vq.ch * vq.decoder_ch_mult[0] if vq else s.vq_ch,
                   codes=int((man.tables or {}).get("vocab_size") or s.codes),
                   target_copies=target_copies(man.to_dict(), s.family))


__all__ = ["DEFAULT_SIZE", "KNOWN", "NAMES", "checkpoint_shape", "config_shape", "engine_shape", "known_shape"]
