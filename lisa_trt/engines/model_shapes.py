"""Model shapes for memory plans (engines/plan.py): parameter counts by storage kind, sequence lengths.

    s = known_shape("Lumina-mGPT-7B", 768)      # or resolve_model(name | checkpoint | engine dir)
    s.target.params, s.image_tokens, s.cache_len(prompt=128, tree=64)

Every count is arithmetic over a config: `config.py`'s LlamaGen registry, `ChameleonConfig`, the
Janus-Pro facts below, a checkpoint's metadata (safetensors header, `<name>.json` sidecar, HF
`config.json`) or an engine directory's manifest. No weights are read and no model is built; the
tests pin the formulas against the project's own modules (tests/engines/test_plan.py).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from ..config import find_multiple
from ..errors import InputError


@dataclass(frozen=True)
class Weights:
    """Parameters split by how they are stored: matmuls (quantizable) and the rest."""

    linear: int = 0  # matmul weights
    rows: int = 0  # output channels of those matmuls (per-channel scales)
    other: int = 0  # embeddings, norms, biases

    def __add__(self, o: "Weights") -> "Weights":
        return Weights(self.linear + o.linear, self.rows + o.rows, self.other + o.other)

    def bytes(self, p) -> int:
        """Bytes at a Precision (engines/plan.py): matmuls at its weight bytes + scales, the rest at its act bytes."""
        matmuls = int(math.ceil(self.linear * (p.weight + p.scale_per_block))) + self.rows * p.scale_per_row
        return matmuls + self.other * p.act

    @property
    def params(self) -> int:
        return self.linear + self.other


def lin(n_in: int, n_out: int, bias: bool = False) -> Weights:
    return Weights(n_in * n_out, n_out, n_out if bias else 0)


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs of a model, whatever its family."""

    name: str
    family: str  # llamagen | chameleon | janus
    n_layer: int
    dim: int
    n_head: int
    kv_heads: int
    ffn: int
    vocab: int  # rows of the target's logits (image vocabulary, or the whole one for Chameleon)
    image_tokens: int  # tokens of one image span (row-end tokens included)
    span_prefix: int  # tokens between prompt and image codes that the cache holds (Lumina: 3)
    prompt_len: int  # condition prefix / most prompt tokens
    codes: int  # image codes (GASV rows, the drafter's head)
    target: Weights  # the deployed target (prefill + verify)
    image_embed: Weights  # what the drafter's step graph carries to embed a token
    vq_params: int  # decoder + post_quant_conv + codebook
    vq_ch: int  # channels of the decoder's full-resolution feature maps
    pixels: int  # height x width of one image
    image_size: int
    draft_head: int = 0  # drafter head rows (0: codes)
    draft_hidden: int = 0  # 0: dim
    draft_ffn: int = 0  # 0: ffn
    max_cache_len: int = 0  # fixed by an engine directory (0: computed from the settings)
    max_tree: int = 0  # an engine directory's largest tree (0: any)
    has_drafter: bool = True
    has_tables: bool = True
    has_vq: bool = True
    precision: str = ""  # an engine directory's own precision ("" for names / checkpoints)
    max_positions: int = 0  # the checkpoint's RoPE position limit (0: none recorded)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    def cache_len(self, prompt: int, tree: int) -> int:
        if self.max_cache_len:
            return self.max_cache_len
        return find_multiple(prompt + self.span_prefix + self.image_tokens + tree, 8)


# parameter counts of the image decoders (pinned against the project's models by the tests)
VQ16_DECODE_PARAMS = 42_449_795 + 2_304 + 16384 * 8  # LlamaGen VQ-16 (also Janus' VQ: same config)
CHAMELEON_VQ_DECODE_PARAMS = 39_294_851 + 65_792 + 8192 * 256  # Chameleon VQGAN (models/families/chameleon/vq.py)


def repeat(w: Weights, n: int) -> Weights:
    """n copies of w (n layers, n equal matrices)."""
    return Weights(w.linear * n, w.rows * n, w.other * n)


def llama_layer(dim: int, n_head: int, kv_heads: int, ffn: int) -> Weights:
    """A Llama block (LlamaGen's TransformerBlock, DeepSeek-LLM's): q/k/v/o, SwiGLU MLP, two RMSNorms."""
    hd = dim // n_head
    return (lin(dim, (n_head + 2 * kv_heads) * hd) + lin(dim, dim) + repeat(lin(dim, ffn), 2) + lin(ffn, dim)
            + Weights(other=2 * dim))


def _llamagen_shape(cfg, name: str) -> ModelShape:
    """A TargetConfig (models/families/llamagen/model.Transformer's parameters)."""
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


def chameleon_layer(dim: int, n_head: int, kv_heads: int, ffn: int, attention_bias: bool = False,
                    mlp_bias: bool = False) -> Weights:
    hd = dim // n_head
    attn = (lin(dim, n_head * hd, attention_bias) + repeat(lin(dim, kv_heads * hd, attention_bias), 2)
            + lin(dim, dim, attention_bias))
    qk_norm = Weights(other=2 * (n_head + kv_heads) * hd)  # per-head LayerNorm weight + bias
    mlp = repeat(lin(dim, ffn, mlp_bias), 2) + lin(ffn, dim, mlp_bias)
    return attn + qk_norm + mlp + Weights(other=2 * dim)


LUMINA_CODES = 8192  # Chameleon VQGAN n_embed


def lumina_span(image_size: int) -> int:
    """Tokens of one square Lumina image span: h_lat rows of (w_lat codes + row end), 16 px codes
    (models/families/chameleon/lumina.py: 32-px size grids, 2 codes per grid side)."""
    if image_size <= 0 or image_size % 32:
        raise InputError(f"Lumina-mGPT images are multiples of 32 px (512 / 768 / 1024), got {image_size}")
    lat = image_size // 16
    return lat * (lat + 1)


def _chameleon_shape(cfg, name: str, image_size: int, prompt_len: int) -> ModelShape:
    """A ChameleonConfig (models/families/chameleon/model.ChameleonTarget's parameters)."""
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


# Janus-Pro-7B: the DeepSeek-LLM-7B backbone (Janus-Pro paper, arXiv 2501.17811, Table 1: 7B with
# vocabulary 100K, embedding 4096, 32 heads, 30 layers; HF text_config: LlamaConfig, vocab 102400,
# intermediate 11008 (DeepSeek-LLM-7B), MHA (32 kv heads)). Image generation (transformers
# models/janus/configuration_janus.py, JanusVQVAEConfig: 16384 codes of dim 8, channel multipliers
# 1,1,2,2,4, i.e. LlamaGen's VQ-16; image_token_embed_dim "same as the text embeddings"): gen_embed
# (16384 x 8) -> gen_aligner (8 -> H -> H, GELU MLP) into the LM; gen_head (H -> H -> 16384) out of
# it. Images are 384 px: 24 x 24 = 576 codes (patch 16). Deployed for generation: the text
# embedding (prompts), the layers, the final norm and the gen_* modules; the text lm_head and the
# SigLIP understanding encoder are not part of the image engines.
JANUS = dict(n_layer=30, dim=4096, n_head=32, kv_heads=32, ffn=11008, text_vocab=102400, codes=16384,
             code_dim=8, image_size=384, patch=16)


def janus_target(n_layer: int, dim: int, n_head: int, kv_heads: int, ffn: int, text_vocab: int, codes: int,
                 code_dim: int) -> tuple[Weights, Weights]:
    """(target weights, image-token embedding path) of a Janus generation deployment."""
    layer = llama_layer(dim, n_head, kv_heads, ffn)
    embed = Weights(other=codes * code_dim) + lin(code_dim, dim, True) + lin(dim, dim, True)  # gen_embed + aligner
    head = lin(dim, dim, True) + lin(dim, codes, True)  # gen_head
    return repeat(layer, n_layer) + Weights(other=text_vocab * dim + dim) + embed + head, embed


def _janus_shape(name: str, image_size: int, prompt_len: int, **over) -> ModelShape:
    j = {**JANUS, **over}
    if image_size != j["image_size"]:
        raise InputError(f"Janus-Pro generates {j['image_size']} px images ({j['image_size'] // 16} x "
                         f"{j['image_size'] // 16} codes); got --image-size {image_size}")
    target, embed = janus_target(j["n_layer"], j["dim"], j["n_head"], j["kv_heads"], j["ffn"], j["text_vocab"],
                                 j["codes"], j["code_dim"])
    side = image_size // j["patch"]
    return ModelShape(name=name, family="janus", n_layer=j["n_layer"], dim=j["dim"], n_head=j["n_head"],
                      kv_heads=j["kv_heads"], ffn=j["ffn"], vocab=j["codes"], image_tokens=side * side,
                      span_prefix=0, prompt_len=prompt_len, codes=j["codes"], target=target, image_embed=embed,
                      vq_params=VQ16_DECODE_PARAMS, vq_ch=128, pixels=image_size ** 2, image_size=image_size)


LLAMAGEN_NAMES = ("GPT-B", "GPT-L", "GPT-XL", "GPT-XXL", "GPT-3B")
KNOWN = (*LLAMAGEN_NAMES, "Lumina-mGPT-7B", "Janus-Pro-7B")
DEFAULT_PROMPT = 128  # text prompt tokens of Lumina / Janus (models/families/chameleon/export.DEFAULT_MAX_PROMPT)
DEFAULT_SIZE = {"llamagen": 256, "chameleon": 768, "janus": 384}


def known_shape(name: str, image_size: Optional[int] = None, prompt_len: Optional[int] = None) -> ModelShape:
    """The shape of a known name (GPT-B ... GPT-3B, Lumina-mGPT-7B, Janus-Pro-7B)."""
    from ..config import _GPT_SHAPES, target_config

    if name == "Lumina-mGPT-7B":
        from ..models.families.chameleon.model import ChameleonConfig

        return _chameleon_shape(ChameleonConfig(), name, image_size or DEFAULT_SIZE["chameleon"],
                                prompt_len or DEFAULT_PROMPT)  # Chameleon-7B: the dataclass defaults
    if name == "Janus-Pro-7B":
        return _janus_shape(name, image_size or DEFAULT_SIZE["janus"], prompt_len or DEFAULT_PROMPT)
    if name in _GPT_SHAPES:
        size = image_size or DEFAULT_SIZE["llamagen"]
        if size % 16:
            raise InputError(f"LlamaGen images are multiples of 16 px (VQ-16), got --image-size {size}")
        s = _llamagen_shape(target_config(name, image_size=size), name)
        return replace(s, prompt_len=prompt_len or s.prompt_len)
    raise InputError(f"unknown model {name!r}: give a known name ({', '.join(KNOWN)}), a checkpoint "
                     "(.safetensors with its config), a Chameleon / Lumina-mGPT directory, or an engine directory")


def safetensors_metadata(path) -> dict:
    """The metadata of a .safetensors file, from its header only (no tensor is read)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise InputError(f"{path} is not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", head)
        if n > 100 << 20:
            raise InputError(f"{path} has an implausible safetensors header of {n} bytes")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise InputError(f"{path} is not a safetensors file ({e})") from e
    return header.get("__metadata__") or {}


def _checkpoint_config(path: Path):
    from ..config import TargetConfig

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


def _engine_shape(d: Path) -> ModelShape:
    """An engine directory of either family (export.manifest.bundle_family)."""
    from ..export.io_spec import Graph
    from ..export.manifest import bundle_family, raw_manifest, read_manifest

    if bundle_family(d) == "chameleon":
        from ..models.families.chameleon.checkpoint import read_chameleon_config

        man = raw_manifest(d)
        lay = man.get("layout") or man  # manifest.json keeps them in `layout`; older chameleon_engine.json at the top
        cfg = read_chameleon_config(d)
        s = _chameleon_shape(cfg, d.name, int(lay["image_size"]), int(lay["max_prompt"]))
        dr = (man.get("drafter") or {}).get("config") or {}
        q = man.get("quantization") or "none"
        return replace(s, max_cache_len=int(man["max_cache_len"]), max_tree=int(man["max_tree"]),
                       has_drafter=man.get("drafter") is not None, has_tables=man.get("tables") is not None,
                       has_vq=man.get("vq") is not None, precision=q if q != "none" else man.get("precision", "fp32"),
                       codes=int((man.get("tables") or {}).get("vocab_size") or s.codes),
                       draft_head=int(dr.get("draft_vocab") or dr.get("vocab_size") or 0),
                       draft_hidden=int(dr.get("hidden", 0)), draft_ffn=int(dr.get("ffn_hidden", 0)))
    man = read_manifest(d, check_files=False)
    s = _llamagen_shape(man.target_config, d.name)
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
                   codes=int((man.tables or {}).get("vocab_size") or s.codes))


def resolve_model(model, image_size: Optional[int] = None, prompt_len: Optional[int] = None) -> ModelShape:
    """A known name, a checkpoint file, a Chameleon / Lumina-mGPT directory, or an engine directory."""
    if isinstance(model, ModelShape):
        return model
    name = str(model)
    if name in KNOWN or not Path(name).exists():
        if not Path(name).exists() and (Path(name).suffix or "/" in name):
            raise InputError(f"{name} not found: give an existing checkpoint or engine directory, or a known name "
                             f"({', '.join(KNOWN)})")
        return known_shape(name, image_size, prompt_len)
    p = Path(name)
    if p.is_dir():
        from ..export.manifest import manifest_path

        if manifest_path(p) is not None:
            if image_size or prompt_len:
                raise InputError(f"{p} is an engine directory: its image size and prompt length are fixed at "
                                 "export; drop --image-size / --prompt-len (or plan the checkpoint)")
            return _engine_shape(p)
        from ..models.families.chameleon.checkpoint import read_chameleon_config

        return _chameleon_shape(read_chameleon_config(p), p.name, image_size or DEFAULT_SIZE["chameleon"],
                                prompt_len or DEFAULT_PROMPT)
    cfg = _checkpoint_config(p)
    if image_size and image_size != cfg.grid_hw[0] * 16:
        raise InputError(f"{p} is a {cfg.grid_hw[0] * 16} px checkpoint; drop --image-size or plan another one")
    s = _llamagen_shape(cfg, p.stem)
    return replace(s, prompt_len=prompt_len or s.prompt_len)


__all__ = ["CHAMELEON_VQ_DECODE_PARAMS", "DEFAULT_PROMPT", "DEFAULT_SIZE", "JANUS", "KNOWN", "LLAMAGEN_NAMES",
           "LUMINA_CODES", "VQ16_DECODE_PARAMS", "ModelShape", "Weights", "chameleon_layer", "janus_target",
           "known_shape", "lin", "llama_layer", "repeat", "lumina_span", "resolve_model", "safetensors_metadata"]
