"""ONNX export of a Chameleon-family (Lumina-mGPT) deployment: target, drafter, GASV, VQGAN.

`export_chameleon(target, drafter, tables, vq, tokenizer_dir, out_dir, image_size=...)` writes one
self-contained engine directory through the generic exporter (export/onnx.py: trace, validate
every graph against the PyTorch model, atomic staging), optionally in fp16 or with int8 / int4
weights (export/quantize.py):

    target_prefill.onnx   text prompt (any length <= max_prompt, left-padded) -> static KV cache;
                          outputs at the last prompt position
    target_verify.onnx    S new tokens / a draft tree over the static cache (taps + hidden)
    drafter_project.onnx  drafter fc on the target taps          (with a drafter)
    drafter_step.onnx     one drafter step over its static cache  (with a drafter)
    gasv.onnx             GASV v2 per-node gates over the image-code sub-vocabulary (with
                          tables): code logits, node tokens / parents -> p, delta_eff, cand, gate
    vq_decode.onnx        Chameleon VQGAN: code grid -> pixels    (with a VQGAN)
    tables.safetensors    the image-code tables (GASV version 2: LANTERN / candidate neighbours,
                          drift budgets, GASV constants)
    config.json, tokenizer.json, tokenizer_config.json   the checkpoint's, for the runtime
    manifest.json         family "chameleon"; graphs, hashes, validation, layout (image size,
                          prompt length, latent grid), settings

Both target graphs take the verify graph's token inputs (input_ids, position_ids, cache_slots,
attention_mask): the host computes per-row RoPE positions (left padding, the CFG unconditional
half from position 0), slots and the mask exactly as `ChameleonTarget.prefill` /
`forward_tokens` do (models/prompts.prefill_plan), so the graphs carry no family logic beyond
the model itself. K/V caches are inputs AND outputs updated in place (ScatterElements into the
bound buffer, see export/onnx.py).

This module is the family's part only: the static sequence layout (image size -> span -> cache
length) and `ChameleonGraphs`, whose graph wrappers, bundle, io specs, axes, random inputs and
PyTorch references come from families/prompt_export.VocabPromptGraphs and
export/prompt_graphs.PromptExportFamily (the export/families.py seam). It is the family package's
export plugin: it sits at the export floor (tests/test_architecture.py), the family package never
imports it, and export/families.py finds it through `ChameleonFamily.export_module`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...export.families import register_export_family
from ...export.onnx import DEFAULT_OPSET
from ...export.prompt_graphs import DEFAULT_MAX_PROMPT, prompt_cache_len
from ..prompt_export import VocabPromptGraphs

FAMILY = "chameleon"
ENGINE_FILE = "chameleon_engine.json"  # the manifest of this family's directories before manifest.json
DEFAULT_MAX_TREE = 64
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def latent_grid(image_size: int) -> tuple[int, int]:
    """(h_lat, w_lat) code grid of a square Lumina image."""
    from .lumina import LATENT_PER_GRID, grids

    hg, wg = grids(image_size, image_size)
    return hg * LATENT_PER_GRID, wg * LATENT_PER_GRID


def span_length(image_size: int) -> int:
    """Tokens of one Lumina image span after its prefix: h_lat rows of (w_lat codes + row end)."""
    h, w = latent_grid(image_size)
    return h * (w + 1)


def engine_cache_len(image_size: int, max_prompt: int, max_tree: int) -> int:
    """Static cache length: prompt + span prefix (3) + span + tree scratch, rounded to 8."""
    return prompt_cache_len(max_prompt, 3 + span_length(image_size), max_tree)


# ----------------------------------------------------------------------------- the family's graphs

class ChameleonGraphs(VocabPromptGraphs):
    """The Chameleon family's graphs (export/prompt_graphs.PromptExportFamily): token-input prefill
    and verify over the whole vocabulary, GASV over the image-code sub-vocabulary ("codes"), the
    grid VQGAN decoder."""

    name = FAMILY
    default_max_tree = DEFAULT_MAX_TREE
    legacy_manifests = (ENGINE_FILE,)
    vq_doc = "Chameleon VQGAN decoder"

    def bundle_graphs(self, target, drafter, tables, vq, opts, *, source=None, image_size=None, max_prompt=None):
        """Token-input prefill and verify over the whole vocabulary, a static cache for one image
        size and prompt budget (the span prefix, the span), the VQGAN decoder, the tokenizer files."""
        from . import CHAMELEON

        image_size = int(image_size or CHAMELEON.default_image_size)
        max_prompt = int(max_prompt or self.default_max_prompt)
        layout = {"image_size": image_size, "max_prompt": max_prompt, "latent": list(latent_grid(image_size))}
        return self.vocab_bundle(target, drafter, tables, vq, opts, image_size=image_size,
                                 max_prompt=max_prompt, span=3 + span_length(image_size), layout=layout,
                                 source=source, files=("config.json",) + TOKENIZER_FILES)

    def target_config(self, man):
        from .checkpoint import read_chameleon_config

        return read_chameleon_config(Path(man.dir) / (man.files or {}).get("config", "config.json"))

    def vq_config(self, man):
        from .vq import ChameleonVQConfig

        if not man.vq:
            return None
        return ChameleonVQConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in man.vq["config"].items()})


FAMILY_GRAPHS = register_export_family(ChameleonGraphs())


# ----------------------------------------------------------------------------- bundle

def export_chameleon(target, drafter, tables, vq, tokenizer_dir, out_dir, *, image_size: Optional[int] = None,
                     max_prompt: int = DEFAULT_MAX_PROMPT, max_tree: int = DEFAULT_MAX_TREE,
                     opset: int = DEFAULT_OPSET, generation: Optional[dict] = None, validate: bool = True,
                     fp16: bool = False, quantize: str = "none", lint: bool = False, progress: bool = False):
    """Export a Chameleon-family engine directory (see module docstring); returns its Manifest.

    Args:
        target: ChameleonTarget (fp32, eval) loaded from an HF directory.
        drafter: its ChameleonDrafter, or None.
        tables: image-code GASVTables (`lisa-trt calibrate --model DIR`; calibration.tables.load_tables_for), or None.
        vq: ChameleonVQGAN, or None (no pixels, tokens only at run time).
        tokenizer_dir: folder with tokenizer.json (+ tokenizer_config.json): the checkpoint dir.
        out_dir: destination (replaced atomically if it is an engine directory).
        image_size: the image size the engines serve (fixes the span length and the cache); None: the
            family's default (512).
        max_prompt: most prompt tokens (caption template included) a run may use.
        max_tree: most draft-tree nodes verified per step.
        generation: default settings recorded for `lisa-trt run` (cfg_scale, top_k, ...).
        validate: compare every graph with the fp32 PyTorch model (export/validate.py thresholds:
            fp32 1e-4, fp16 5e-2; int8 0.1 / int4 0.3 for the quantized graphs).
        fp16: fp16 target / drafter graphs (weights, activations, KV cache; RMSNorm statistics,
            RoPE, softmax and logits stay fp32); GASV and VQGAN graphs stay fp32.
        quantize: "none", "int8" or "int4": the target / drafter weights of the fp32 export
            quantized for ONNX Runtime (export/quantize.py; not with fp16).
        lint: run `polygraphy check lint` on every graph.
    """
    from ...export.bundle import export_bundle

    return export_bundle(target, drafter, tables, vq, out_dir, source=tokenizer_dir, image_size=image_size,
                         max_prompt=max_prompt, max_tree=max_tree, opset=opset, generation=generation,
                         validate=validate, fp16=fp16, quantize=quantize, lint=lint, progress=progress)


__all__ = ["DEFAULT_MAX_PROMPT", "DEFAULT_MAX_TREE", "ChameleonGraphs", "engine_cache_len", "export_chameleon",
           "latent_grid", "span_length"]
