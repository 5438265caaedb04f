"""Janus-Pro's export plugin (the export/families.py seam): `JanusGraphs` and `export_janus`.

`lisa-trt export JANUS_DIR` writes one self-contained engine directory through the generic
token-prompt exporter (export/bundle.write_bundle: trace, validate every graph
against the PyTorch model, atomic staging; fp32, fp16, or int8 / int4 weights):

    target_prefill.onnx   text prompt ids (left-padded, <= max_prompt) -> static KV cache;
                          outputs of the generation head at the last prompt position
    target_verify.onnx    image codes / a draft tree over the static cache (taps + hidden), the
                          codes embedded through generation_embeddings + generation_aligner
    drafter_project.onnx, drafter_step.onnx   the EAGLE-3 drafter (with a drafter)
    gasv.onnx             GASV v2 gates over the codebook (with tables)
    vq_decode.onnx        the VQ decoder: code grid (grid x grid) -> pixels (with a VQ)
    config.json, generation_config.json, tokenizer.json, tokenizer_config.json   the checkpoint's
    manifest.json         family "janus"; layout: image size, prompt budget, latent grid

The engine directory opens through engines/prompt_graph.py (`engines_module`): the graph target
takes this family's conditions (prompt ids, or (ids, mask)) and builds CFG's unconditional rows
exactly as JanusTarget does (cond.py), so the generic decode loops, `run`, `bench`, `serve` and
`Pipeline.from_dir` drive it unchanged.

This module sits at the export floor (tests/test_architecture.py: a family package's `export`
sub-module); the family package never imports it, export/families.py finds it through
`JanusFamily.export_module`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from ...errors import InputError
from ...export.families import register_export_family
from ...models.io_spec import Graph
from ...export.onnx import DEFAULT_OPSET, _NamedGraph
from ...export.prompt_graphs import DEFAULT_MAX_PROMPT, PromptExportFamily, check_bundle_artifacts, prompt_cache_len
from . import cond as C

FAMILY = "janus"
DEFAULT_MAX_TREE = 64
CHECKPOINT_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


class JanusCondition:
    """The condition protocol of a Janus graph target (engines/prompt_graph.GraphPromptTarget):
    JanusTarget's checks, the family's unconditional rows (JanusFamily.null_cond), [cond; null] as
    JanusTarget joins them (cond.cfg_rows), within the prefill's prompt budget."""

    def __init__(self, cfg):
        self.cfg = cfg

    def check_cond(self, cond) -> int:
        return C.check_cond(self.cfg, cond)

    def null_cond(self, cond):
        from ...models.family import family_of

        return family_of(self.cfg).null_cond(self.cfg, cond)

    def cfg_rows(self, cond, null):
        """[cond; null] (cond.cfg_rows), refused when the shared width of a negative text's rows
        passes the bundle's prompt budget (its prefill's --max-prompt)."""
        rows = C.cfg_rows(cond, null)
        T, budget = C.split_cond(rows)[0].shape[1], self.cfg.max_prompt_tokens
        if T > budget:
            raise InputError(f"the guided prompt rows are {T} tokens wide (the prompt and its negative text, "
                             f"left-padded to one width); this engine directory takes at most {budget}: shorten "
                             "the negative prompt, or re-export with a larger --max-prompt")
        return rows


class JanusGraphs(PromptExportFamily):
    """Janus-Pro's graphs (export/prompt_graphs.PromptExportFamily): text-prompt prefill, image-code
    verify, GASV over the codebook (the whole generation head), VQ decoder."""

    name = FAMILY
    default_max_tree = DEFAULT_MAX_TREE
    prefill_doc = "left-padded text prompt -> cache slots [0, T); generation-head outputs at its last position"
    vq_doc = "Janus VQ decoder"

    def bundle_graphs(self, target, drafter, tables, vq, opts, *, source=None, image_size=None, max_prompt=None):
        """Text-prompt prefill, code verify over the generation head, one image size (the
        checkpoint's), the VQ decoder, the checkpoint's config and tokenizer files."""
        cfg = target.config
        max_prompt = int(max_prompt or self.default_max_prompt)
        if image_size not in (None, cfg.image_size):
            raise InputError(f"this Janus checkpoint generates {cfg.image_size} x {cfg.image_size} images only, not "
                             f"{image_size}; drop --image-size")
        if max_prompt < 1 or max_prompt + cfg.block_size > cfg.max_position_embeddings:
            raise InputError(f"--max-prompt {max_prompt} + {cfg.block_size} image tokens must fit "
                             f"max_position_embeddings {cfg.max_position_embeddings} (and be >= 1)")
        source = Path(source if source is not None else getattr(target, "source_dir", "") or ".")
        tables = check_bundle_artifacts(target, drafter, tables)  # the codebook: the whole generation head
        L = prompt_cache_len(max_prompt, cfg.block_size, opts.max_tree)
        g = cfg.grid_size
        layout = {"image_size": int(cfg.image_size), "max_prompt": max_prompt, "latent": [g, g]}
        return self.prompt_bundle(target, tables, vq, opts, layout=layout, max_cache_len=L, source=source,
                                  files=CHECKPOINT_FILES)

    def prompt_embed(self, model, ids):
        """Text prompt ids through the language model's embedding."""
        return _embed_prompt(model, ids)

    def verify_embed(self, model, ids):
        """Image codes through the generation path, text ids (vocab_size + t) through the text
        embedding (`prefill_ids`)."""
        return _embed_codes_or_prompt(model, ids)

    def graph_module(self, graph, model, cfg, cache_len):
        """The prefill / verify PromptStepGraph (PromptExportFamily), the VQ decoder's JanusVQGraph."""
        if graph is Graph.VQ_DECODE:
            return JanusVQGraph(model, cfg)
        return super().graph_module(graph, model, cfg, cache_len)

    def target_config(self, man):
        """The recorded JanusConfig with the export's prompt budget (layout max_prompt)."""
        from .config import JanusConfig

        cfg = JanusConfig.from_dict(man.target["config"])
        budget = (man.layout or {}).get("max_prompt")
        return cfg.with_overrides(max_prompt_tokens=int(budget)) if budget else cfg

    def vq_config(self, man):
        from .config import JanusVQConfig

        return JanusVQConfig(**man.vq["config"]) if man.vq else None

    def prompt_vocab_size(self, cfg) -> int:
        return cfg.text_vocab_size  # the prefill embeds text ids; verify takes codes (cfg.vocab_size)

    def prompt_condition(self, cfg):
        return JanusCondition(cfg)

    def prefill_ids(self, cfg):
        """The verify graph embeds text id t as vocab_size + t (the prompt's text embedding) next to
        the image codes, so the prefill is one verify call."""
        return {"offset": int(cfg.vocab_size), "count": int(cfg.text_vocab_size)}


FAMILY_GRAPHS = register_export_family(JanusGraphs())


# ----------------------------------------------------------------------------- wrappers

def _embed_prompt(m, ids):
    return m.model.language_model.embed_tokens(ids)


def _embed_codes(m, codes):
    """JanusTarget.embed_image_tokens without its host-side range check (the runner checks)."""
    return m.model.generation_aligner(m.model.generation_embeddings(codes))


def _embed_codes_or_prompt(m, ids):
    """The verify graph's embedding: codes [0, vocab_size) through the generation path, text ids
    as vocab_size + t through the text embedding (JanusGraphs.prefill_ids); the same rows as
    _embed_codes / _embed_prompt."""
    V = m.config.vocab_size
    text = ids >= V
    codes = _embed_codes(m, torch.where(text, 0, ids))
    prompt = _embed_prompt(m, torch.where(text, ids - V, 0)).to(codes.dtype)
    return torch.where(text[..., None], prompt, codes)


class JanusVQGraph(_NamedGraph):
    """JanusVQ.tokens_to_pixels on the code grid, without its host-side checks."""

    def __init__(self, vq, target_cfg):
        super().__init__(FAMILY_GRAPHS.graph_spec(Graph.VQ_DECODE, target_cfg))
        self.vq = vq

    def compute(self, x):
        quant = F.normalize(self.vq.quantize.embedding(x["image_tokens"]), p=2, dim=-1)
        return dict(images=self.vq.decoder(self.vq.post_quant_conv(quant.permute(0, 3, 1, 2).contiguous())).float())


# ----------------------------------------------------------------------------- bundle

def export_janus(target, drafter, tables, vq, source, out_dir, *, image_size: Optional[int] = None,
                 max_prompt: int = DEFAULT_MAX_PROMPT, max_tree: int = DEFAULT_MAX_TREE, opset: int = DEFAULT_OPSET,
                 generation: Optional[dict] = None, validate: bool = True, fp16: bool = False, quantize: str = "none",
                 lint: bool = False, progress: bool = False):
    """Export a Janus-Pro engine directory (see module docstring); returns its Manifest.

    Args:
        target: JanusTarget (fp32, eval) loaded from an HF directory (lisa_trt.load_target).
        drafter: its EAGLE-3 drafter, or None.
        tables: GASVTables over the codebook (`lisa-trt calibrate --model DIR`), or None.
        vq: the JanusVQ decoder, or None (tokens only at run time).
        source: the checkpoint directory (config.json, generation_config.json, tokenizer files).
        out_dir: destination (replaced atomically if it is an engine directory).
        image_size: must be the checkpoint's (Janus generates one size); None: that size.
        max_prompt: most prompt tokens (chat template included) a run may use.
        max_tree: most draft-tree nodes verified per step.
        generation: default settings recorded for `lisa-trt run`.
        validate, fp16, quantize, lint: as export/bundle.write_bundle.
    """
    from ...export.bundle import export_bundle

    return export_bundle(target, drafter, tables, vq, out_dir, source=source, image_size=image_size,
                         max_prompt=max_prompt, max_tree=max_tree, opset=opset, generation=generation,
                         validate=validate, fp16=fp16, quantize=quantize, lint=lint, progress=progress)


__all__ = ["DEFAULT_MAX_PROMPT", "DEFAULT_MAX_TREE", "JanusCondition", "JanusGraphs", "JanusVQGraph", "export_janus"]
