"""Model shapes for memory plans (deploy/memory_plan.py): parameter counts by storage kind, sequence lengths.

    s = known_shape("GPT-L", 384)      # or resolve_model(name | checkpoint | engine dir)
    s.target.params, s.image_tokens, s.cache_len(prompt=128, tree=64)

Every count is arithmetic over a config: a known name, a checkpoint's metadata (safetensors
header, `<name>.json` sidecar, HF `config.json`) or an engine directory's manifest. No weights are
read and no model is built; the tests pin the formulas against the project's own modules
(tests/engines/test_plan.py).

The generic part lives here (Weights, ModelShape, the Llama block, the dispatch); what a family's
models weigh is the family's shape plugin, `families/<name>/shapes.py` (it sits at this
floor: tests/test_architecture.py), named by `ModelFamily.shapes_module` and imported by name on
first use. A plugin module defines KNOWN (names), DEFAULT_SIZE (pixels), known_shape(name,
image_size, prompt_len), checkpoint_shape(path, image_size, prompt_len) for the checkpoints its
family claims, and engine_shape(dir, manifest=None) for its engine directories (the Manifest when read).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
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
        """Bytes at a Precision (deploy/memory_plan.py): matmuls at its weight bytes + scales, the rest at its act bytes."""
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
    family: str  # the family's name (ModelFamily.name)
    n_layer: int
    dim: int
    n_head: int
    kv_heads: int
    ffn: int
    vocab: int  # rows of the target's logits (the image vocabulary, or a whole text + image head)
    image_tokens: int  # tokens of one image span (row-end tokens included)
    span_prefix: int  # tokens between prompt and image codes that the cache holds (e.g. an image span's prefix)
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
    target_copies: int = 1  # copies of the target's weights the engines hold (engine_fields)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    def cache_len(self, prompt: int, tree: int) -> int:
        if self.max_cache_len:
            return self.max_cache_len
        return find_multiple(prompt + self.span_prefix + self.image_tokens + tree, 8)


# parameter count of the VQ-16 image decoder (decoder + post_quant_conv + codebook; pinned by the tests)
VQ16_DECODE_PARAMS = 42_449_795 + 2_304 + 16384 * 8
DEFAULT_PROMPT = 128  # text prompt tokens of token-prompt families (their exporters' DEFAULT_MAX_PROMPT)


def repeat(w: Weights, n: int) -> Weights:
    """n copies of w (n layers, n equal matrices)."""
    return Weights(w.linear * n, w.rows * n, w.other * n)


def llama_layer(dim: int, n_head: int, kv_heads: int, ffn: int) -> Weights:
    """A Llama block: q/k/v/o, SwiGLU MLP, two RMSNorms."""
    hd = dim // n_head
    return (lin(dim, (n_head + 2 * kv_heads) * hd) + lin(dim, dim) + repeat(lin(dim, ffn), 2) + lin(ffn, dim)
            + Weights(other=2 * dim))


def engine_fields(man: dict, s: ModelShape) -> dict:
    """ModelShape fields an engine directory's raw manifest fixes (cache, tree, artifacts, precision,
    drafter sizes), over the family's shape `s`."""
    dr = (man.get("drafter") or {}).get("config") or {}
    q = man.get("quantization") or "none"
    return dict(max_cache_len=int(man["max_cache_len"]), max_tree=int(man["max_tree"]),
                target_copies=target_copies(man, s.family),
                has_drafter=man.get("drafter") is not None, has_tables=man.get("tables") is not None,
                has_vq=man.get("vq") is not None, precision=q if q != "none" else man.get("precision", "fp32"),
                codes=int((man.get("tables") or {}).get("vocab_size") or s.codes),
                draft_head=int(dr.get("draft_vocab") or dr.get("vocab_size") or 0),
                draft_hidden=int(dr.get("hidden", 0)), draft_ffn=int(dr.get("ffn_hidden", 0)))


def target_copies(man: dict, family: str) -> int:
    """Copies of the target's weights an engine directory's TensorRT engines hold: 1 when its
    verify graph runs the prefill too (the manifest's target `prefill_ids`, or a family whose
    verify graphs always embed prompts) and no target_prefill engine was built, else 2 (separate
    prefill and verify engines: engines/build.default_build_graphs)."""
    from ..engines.trt_plans import built_graphs
    from ..export.families import export_family_named

    if "target_prefill" in built_graphs(man):
        return 2
    if (man.get("target") or {}).get("prefill_ids") or export_family_named(family).verify_embeds_prompts:
        return 1
    return 2


def _plugins() -> list:
    """[(ModelFamily, its shape plugin module)] of every family that has one."""
    from ..models.family import families

    return [(f, f.shapes) for f in families() if f.shapes is not None]


def _plugin(family_name: str):
    for f, mod in _plugins():
        if f.name == family_name:
            return mod
    raise InputError(f"the {family_name} family has no shape plugin (ModelFamily.shapes_module): it cannot be "
                     "planned yet")


def known_names() -> tuple:
    """Every known model name, over the families' shape plugins."""
    return tuple(n for _, mod in _plugins() for n in mod.KNOWN)


def default_sizes() -> dict:
    """{family name: default image size in pixels} of the families that plan."""
    return {f.name: mod.DEFAULT_SIZE for f, mod in _plugins()}


def __getattr__(name):  # KNOWN / DEFAULT_SIZE: computed from the plugins on first use
    if name == "KNOWN":
        return known_names()
    if name == "DEFAULT_SIZE":
        return default_sizes()
    raise AttributeError(name)


def canonical_name(name: str) -> str:
    """The known name equal to `name` ignoring case (`name` itself when none is)."""
    return {n.lower(): n for n in known_names()}.get(str(name).lower(), str(name))


def known_shape(name: str, image_size: Optional[int] = None, prompt_len: Optional[int] = None) -> ModelShape:
    """The shape of a known name (known_names(): each family's KNOWN), matched in any case."""
    name = canonical_name(name)
    for _, mod in _plugins():
        if name in mod.KNOWN:
            return mod.known_shape(name, image_size, prompt_len)
    raise InputError(f"unknown model {name!r}{_did_you_mean(name)}; give a known name ({', '.join(known_names())}), "
                     "a checkpoint (.safetensors with its config, or an HF model directory), or an engine directory")


def _did_you_mean(name: str) -> str:
    """' (did you mean Emu3-Gen?)' for a name close to known ones (any case), else ''."""
    import difflib

    lower = {n.lower(): n for n in known_names()}
    close = difflib.get_close_matches(str(name).lower(), list(lower), n=2, cutoff=0.5)
    return f" (did you mean {' or '.join(lower[c] for c in close)}?)" if close else ""


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


def resolve_model(model, image_size: Optional[int] = None, prompt_len: Optional[int] = None, *,
                  manifest=None) -> ModelShape:
    """A known name, a checkpoint (file or HF directory), or an engine directory (`manifest`: its
    Manifest when the caller has read it, so the directory is not read again)."""
    if isinstance(model, ModelShape):
        return model
    if manifest is not None and manifest.dir is not None and Path(model).resolve() == Path(manifest.dir).resolve():
        if image_size or prompt_len:
            raise InputError(f"{model} is an engine directory: its image size and prompt length are fixed at "
                             "export; drop --image-size / --prompt-len (or plan the checkpoint)")
        return _plugin(manifest.family).engine_shape(Path(manifest.dir), manifest)
    name = str(model)
    known = known_names()
    if canonical_name(name) in known or not Path(name).exists():
        if not Path(name).exists() and (Path(name).suffix or "/" in name):
            raise InputError(f"{name} not found: give an existing checkpoint or engine directory, or a known name "
                             f"({', '.join(known)})")
        return known_shape(name, image_size, prompt_len)
    p = Path(name)
    if p.is_dir():
        from ..export.manifest import bundle_family, manifest_path

        if manifest_path(p) is not None:
            if image_size or prompt_len:
                raise InputError(f"{p} is an engine directory: its image size and prompt length are fixed at "
                                 "export; drop --image-size / --prompt-len (or plan the checkpoint)")
            return _plugin(bundle_family(p)).engine_shape(p)
    from ..errors import ConfigError
    from ..models.family import detect_family

    try:
        fam = detect_family(p)
    except ConfigError as e:
        raise InputError(str(e)) from e
    return _plugin(fam.name).checkpoint_shape(p, image_size, prompt_len)


__all__ = ["DEFAULT_PROMPT", "VQ16_DECODE_PARAMS", "ModelShape", "Weights", "default_sizes", "engine_fields",
           "canonical_name", "known_names", "known_shape", "lin", "llama_layer", "repeat", "resolve_model", "safetensors_metadata",
           "target_copies"]
