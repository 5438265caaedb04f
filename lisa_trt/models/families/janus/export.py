"""Janus-Pro's export plugin (the export/families.py seam): `JanusGraphs` and `export_janus`.

`lisa-trt export JANUS_DIR` writes one self-contained engine directory through the generic
token-prompt exporter (export/prompt_graphs.write_prompt_bundle: trace, validate every graph
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

from ....errors import ArtifactMismatchError, InputError
from ....export.families import ExportFamily, interleave, register_export_family
from ....export.io_spec import GASV_K, GASV_PARAMS, Graph, GraphSpec, TensorSpec, graph_spec
from ....export.onnx import DEFAULT_OPSET, _NamedGraph
from ....export.sizing import resolve
from ....export.prompt_graphs import (PromptStepGraph, check_export_options, prompt_cache_len, prompt_prefill_inputs,
                                      prompt_prefill_spec, prompt_reference_cache, write_prompt_bundle)
from . import cond as C

FAMILY = "janus"
DEFAULT_MAX_PROMPT = 128
DEFAULT_MAX_TREE = 64
CHECKPOINT_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


class JanusCondition:
    """The condition protocol of a Janus graph target (engines/prompt_graph.GraphPromptTarget):
    JanusTarget's checks and unconditional rows (cond.py), [cond; null] by concatenation."""

    def __init__(self, cfg):
        self.cfg = cfg

    def check_cond(self, cond) -> int:
        return C.check_cond(self.cfg, cond)

    def null_cond(self, cond):
        return C.null_cond(self.cfg, cond)

    def cfg_rows(self, cond, null):
        if isinstance(cond, (tuple, list)):
            return tuple(torch.cat([c, n]) for c, n in zip(C.split_cond(cond), C.split_cond(null)))
        return torch.cat([cond, null])


class JanusGraphs(ExportFamily):
    """Janus-Pro's graphs: text-prompt prefill, image-code verify, GASV over the codebook, VQ decoder."""

    name = FAMILY
    engines_module = "lisa_trt.engines.prompt_graph"  # GraphPromptTarget, GraphGridVQ (token-prompt targets)
    exports_bundle = True

    def export_bundle(self, target, drafter, tables, vq, out_dir, *, source, image_size=None, max_prompt=None,
                      max_tree=None, opset=None, generation=None, validate=True, fp16=False, quantize="none"):
        """`export_janus` with the family's defaults (DEFAULT_MAX_PROMPT / _TREE, DEFAULT_OPSET)."""
        return export_janus(target, drafter, tables, vq, source, out_dir, image_size=image_size,
                            max_prompt=max_prompt or DEFAULT_MAX_PROMPT, max_tree=max_tree or DEFAULT_MAX_TREE,
                            opset=opset or DEFAULT_OPSET, generation=generation, validate=validate, fp16=fp16,
                            quantize=quantize)

    # -- specs and axes -------------------------------------------------------------------

    def graph_spec(self, graph: Graph, cfg) -> GraphSpec:
        if graph is Graph.TARGET_PREFILL:
            return prompt_prefill_spec(cfg.n_layer, "left-padded text prompt -> cache slots [0, T); generation-head "
                                                    "outputs at its last position")
        if graph is Graph.VQ_DECODE:
            return GraphSpec(graph, (TensorSpec("image_tokens", "int64", ("batch", "h_lat", "w_lat"),
                                                "VQ codes of the token grid (raster order)"),),
                             (TensorSpec("images", "float32", ("batch", "channels", "height", "width"),
                                         "raw decoder output (about [-1, 1])"),), doc="Janus VQ decoder")
        if graph is Graph.MEDUSA_HEADS:
            raise InputError("Janus-Pro bundles have no Medusa heads graph")
        return graph_spec(graph, n_layer=cfg.n_layer)  # verify, drafter, GASV (over the codebook): the shared table

    def export_dims(self, cfg, *, max_cache_len, drafter_cfg=None, vq_cfg=None, codes=None, layout=None):
        dims = dict(one=1, vocab=cfg.vocab_size, dim=cfg.dim, tap_dim=3 * cfg.dim, kv_heads=cfg.kv_heads,
                    head_dim=cfg.head_dim, cache_len=max_cache_len, n_gasv_params=len(GASV_PARAMS), gasv_k=GASV_K)
        if drafter_cfg is not None:
            dims.update(draft_hidden=drafter_cfg.hidden, draft_heads=drafter_cfg.n_head,
                        draft_head_dim=drafter_cfg.head_dim)
        if vq_cfg is not None and layout and layout.get("latent"):
            h, w = layout["latent"]
            dims.update(h_lat=h, w_lat=w, channels=vq_cfg.out_channels, height=h * vq_cfg.downsample,
                        width=w * vq_cfg.downsample)
        return dims

    def prefill_max_seq(self, layout):
        return int((layout or {}).get("max_prompt") or DEFAULT_MAX_PROMPT)

    def default_generation(self) -> dict:
        return {}  # the Pipeline applies the family's defaults (JanusFamily.default_sampling)

    # -- manifests ------------------------------------------------------------------------

    def target_config(self, man):
        """The recorded JanusConfig with the export's prompt budget (layout max_prompt)."""
        from .config import JanusConfig

        cfg = JanusConfig.from_dict(man.target["config"])
        budget = (man.layout or {}).get("max_prompt")
        return cfg.with_overrides(max_prompt_tokens=int(budget)) if budget else cfg

    def vq_config(self, man):
        from .config import JanusVQConfig

        return JanusVQConfig(**man.vq["config"]) if man.vq else None

    # -- the graph target's protocol ------------------------------------------------------

    def prompt_vocab_size(self, cfg) -> int:
        return cfg.text_vocab_size  # the prefill embeds text ids; verify takes codes (cfg.vocab_size)

    def prompt_condition(self, cfg):
        return JanusCondition(cfg)

    def prefill_ids(self, cfg):
        """The verify graph embeds text id t as vocab_size + t (the prompt's text embedding) next to
        the image codes, so the prefill is one verify call."""
        return {"offset": int(cfg.vocab_size), "count": int(cfg.text_vocab_size)}

    # -- validation -----------------------------------------------------------------------

    def input_range(self, name, refs, dims):
        tc = refs["target"].config
        if name == "input_ids":  # verify and drafter graphs: image codes (the prefill draws its own)
            return 0, tc.vocab_size
        if name == "position_ids":
            hi = tc.max_position_embeddings
            if refs.get("drafter") is not None:
                hi = min(hi, refs["drafter"].max_positions)
            return 0, hi
        if name == "node_tokens":
            return 0, refs["tables"].vocab_size
        if name == "image_tokens":
            return 0, refs["vq"].config.codebook_size
        return super().input_range(name, refs, dims)

    def sample_inputs(self, graph, spec, dims, refs, *, precision="fp32", seed=0, batch=2, seq=3, nodes=3):
        if graph is not Graph.TARGET_PREFILL:
            return super().sample_inputs(graph, spec, dims, refs, precision=precision, seed=seed, batch=batch,
                                         seq=seq, nodes=nodes)
        tc = refs["target"].config
        return prompt_prefill_inputs(spec, dims, tc, tc.text_vocab_size, precision=precision, seed=seed,
                                     batch=batch, seq=seq)

    def target_reference(self, graph, refs, x):
        m = refs["target"]
        cache = prompt_reference_cache(m.config, x)
        if graph is Graph.TARGET_PREFILL:
            T = x["input_ids"].shape[1]
            valid = x["attention_mask"][:, -1, :T]  # what the last prompt position may see: the valid columns
            o = m.prefill((x["input_ids"], valid), cache, taps=True)
        else:
            o = m.forward_tokens(x["input_ids"], x["position_ids"], x["cache_slots"], x["attention_mask"], cache,
                                 taps=True)
        return dict(logits=o.logits, taps=o.taps, hidden=o.hidden, **interleave(cache.k, cache.v))

    def vq_reference(self, refs, x):
        return dict(images=refs["vq"].tokens_to_pixels(x["image_tokens"]).float())


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

def _check_artifacts(target, drafter, tables):
    """Drafter and tables made for this target (tables bound to the generation head)."""
    from ....calibration.tables import target_hash_of
    from ...checkpoints import target_hash

    th = target_hash(target)
    if drafter is not None and drafter.config.target_hash not in ("", None, th):
        raise ArtifactMismatchError(f"the drafter was trained for target {drafter.config.target_hash}, not {th}")
    if tables is None:
        return None
    if tables.target_hash not in ("", None, target_hash_of(target)) or tables.vocab_size != target.config.vocab_size:
        raise ArtifactMismatchError("the tables were calibrated for another target or codebook; re-run "
                                    "`lisa-trt calibrate --model DIR` for this target")
    return tables if tables.w_tilde is not None else tables.bind(target.output.weight.detach())


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
        validate, fp16, quantize, lint: as export/prompt_graphs.write_prompt_bundle.
    """
    check_export_options(opset, fp16, quantize)  # before any work
    cfg = target.config
    if image_size not in (None, cfg.image_size):
        raise InputError(f"this Janus checkpoint generates {cfg.image_size} x {cfg.image_size} images only, not "
                         f"{image_size}; drop --image-size")
    if int(max_prompt) < 1 or int(max_prompt) + cfg.block_size > cfg.max_position_embeddings:
        raise InputError(f"--max-prompt {max_prompt} + {cfg.block_size} image tokens must fit "
                         f"max_position_embeddings {cfg.max_position_embeddings} (and be >= 1)")
    source = Path(source if source is not None else getattr(target, "source_dir", "") or ".")
    tables = _check_artifacts(target, drafter, tables)
    L = prompt_cache_len(max_prompt, cfg.block_size, max_tree)
    g = cfg.grid_size
    layout = {"image_size": int(cfg.image_size), "max_prompt": int(max_prompt), "latent": [g, g]}

    def target_builders(t_exp, precision):
        spec = FAMILY_GRAPHS.graph_spec
        return [(Graph.TARGET_PREFILL, lambda: PromptStepGraph(resolve(t_exp), spec(Graph.TARGET_PREFILL, cfg), _embed_prompt,
                                                               True), precision),
                (Graph.TARGET_VERIFY, lambda: PromptStepGraph(resolve(t_exp), spec(Graph.TARGET_VERIFY, cfg), _embed_codes_or_prompt,
                                                              False), precision)]

    vq_builder = (lambda: JanusVQGraph(vq.eval(), cfg)) if vq is not None else None
    return write_prompt_bundle(FAMILY_GRAPHS, target, drafter, tables, vq, out_dir, source=source,
                               target_builders=target_builders, vq_builder=vq_builder, layout=layout,
                               max_cache_len=L, max_tree=max_tree, files=CHECKPOINT_FILES, opset=opset,
                               generation=generation, validate=validate, fp16=fp16, quantize=quantize, lint=lint,
                               progress=progress)


__all__ = ["DEFAULT_MAX_PROMPT", "DEFAULT_MAX_TREE", "JanusCondition", "JanusGraphs", "JanusVQGraph", "export_janus"]
