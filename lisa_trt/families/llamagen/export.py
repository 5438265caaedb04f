"""The LlamaGen family's export plugin (the export/families.py seam): `LlamaGenGraphs`.

LlamaGen (c2i / t2i) graphs are the io_spec table as it stands: a condition-prefix prefill, the
shared verify / drafter / GASV graphs and the VQ-16 decoder (`bundle_graphs`; export/bundle.py
writes the directory, as for every family), opened by families/llamagen/engines.py (`engines_module`,
as every family names its own). The torch backend runs these bundles. Manifests
written before the `family` field are LlamaGen's (`unnamed_manifest`).

export/families.py finds this module through `LlamaGenFamily.export_module`.
"""

from __future__ import annotations

import dataclasses

import torch

from ...config import find_multiple
from ...export.families import ExportFamily, past_of, present_rows, register_export_family
from ...export.onnx import _NamedGraph, _ShimCache
from ...models.io_spec import Graph, graph_spec
from ...models.rope import grid_hw


def max_cache_len(target_cfg, max_tree: int) -> int:
    """Static cache length of an export: round_up(cls + block + max_tree, 8) (== new_cache(extra))."""
    return find_multiple(target_cfg.seq_len + max_tree, 8)


class TargetPrefillGraph(_NamedGraph):
    """Condition prefix -> K/V at slots [0, T); outputs at the last prefix position."""

    def __init__(self, model, cache_len: int):
        cfg = model.config
        super().__init__(graph_spec(Graph.TARGET_PREFILL, n_layer=cfg.n_layer, model_type=cfg.model_type))
        self.model, self.cache_len = model, cache_len

    def compute(self, x):
        from ...models.family import family_of

        m, cfg = self.model, self.model.config
        cond = family_of(cfg).cond_from_inputs(cfg, x)
        emb, valid = m.cond_embeddings(cond)  # (B, T, dim), (B, T) bool
        B, T, _ = emb.shape
        dev = emb.device
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=dev))
        eye = torch.eye(T, dtype=torch.bool, device=dev)
        mask = (causal[None] & valid[:, None, :]) | eye[None]  # (B, T, T), same as Transformer.prefill
        pad = torch.zeros(B, T, self.cache_len - T, dtype=torch.bool, device=dev)
        mask = torch.cat([mask, pad], dim=-1)  # (B, T, Lmax)
        slots = torch.arange(T, device=dev)[None, :].expand(B, T)
        cache = _ShimCache([x[n] for n in self.spec.input_names if n.startswith("past_key_values.")])
        out = m._run(emb.to(m.output.weight.dtype), m.freqs_cis[:T][None], mask[:, None], cache, slots, True)
        res = dict(logits=out.logits[:, -1:], taps=out.taps[:, -1:], hidden=out.hidden[:, -1:], prefix_valid=valid)
        res.update(zip([n for n in self.spec.output_names if n.startswith("present.")], cache.presents()))
        return res


class TargetVerifyGraph(_NamedGraph):
    """Transformer.forward_tokens over a static cache, taps on."""

    def __init__(self, model):
        super().__init__(graph_spec(Graph.TARGET_VERIFY, n_layer=model.config.n_layer))
        self.model = model

    def compute(self, x):
        m = self.model
        cache = _ShimCache([x[n] for n in self.spec.input_names if n.startswith("past_key_values.")])
        h = GRAPHS.verify_embed(m, x["input_ids"])  # image tokens (+ the prefill's ids: prefill_ids)
        out = m._run(h, m.freqs_cis[x["position_ids"]], x["attention_mask"][:, None], cache, x["cache_slots"], True)
        res = dict(logits=out.logits, taps=out.taps, hidden=out.hidden)
        res.update(zip([n for n in self.spec.output_names if n.startswith("present.")], cache.presents()))
        return res


class VQDecodeGraph(_NamedGraph):
    """VQModel.decode_code over the target's grid: token ids (B, h * w) -> images.

    `grid`: the target config's `grid_hw` (height, width), or the side of a square grid."""

    def __init__(self, vq, grid):
        super().__init__(graph_spec(Graph.VQ_DECODE))
        self.vq, self.grid = vq, grid_hw(grid)

    def compute(self, x):
        tok = x["image_tokens"]
        shape = (tok.shape[0], self.vq.config.codebook_embed_dim, *self.grid)
        return dict(images=self.vq.decode_code(tok, shape).float())


def condition_files(target, tmp) -> dict:
    """What the family's null_cond needs at run time (t2i: the null caption), if anything."""
    from ...models.family import family_of

    tensors = family_of(target.config).condition_tensors(target)
    if not tensors:
        return {}
    from ...io import save_safetensors

    save_safetensors(tensors, tmp / "conditions.safetensors", metadata={"kind": "lisa-trt/conditions"})
    return {"conditions": "conditions.safetensors"}


class LlamaGenGraphs(ExportFamily):
    """LlamaGen (c2i / t2i): the io_spec table as it stands, condition prefix prefill, VQ-16 decoder."""

    name = "llamagen"
    engines_module = "lisa_trt.families.llamagen.engines"  # LlamaGenGraphTarget, GraphVQ
    unnamed_manifest = True  # a manifest.json without a `family` field predates the field: LlamaGen's

    def bundle_graphs(self, target, drafter, tables, vq, opts, *, source=None, image_size=None, max_prompt=None):
        """Condition-prefix prefill + verify over a static cache of round_up(seq_len + max_tree, 8),
        the VQ-16 decoder, the null caption (t2i); tables bound to the head for the GASV graph."""
        from ...export.bundle import BundleGraphs
        from ...export.onnx import check_inputs

        check_inputs(target, drafter, tables)
        bound = tables.bind(target.output.weight) if tables is not None and tables.w_tilde is None else tables
        cfg = target.config
        lmax = max_cache_len(cfg, opts.max_tree)
        target_graphs, vq_graph = self.graph_builders(cfg, lmax, vq)
        return BundleGraphs(target=target_graphs, max_cache_len=lmax, tables=bound, saved_tables=tables,
                            vq=vq_graph, files=lambda dest: condition_files(target, dest), torch_backend=True)

    def graph_module(self, graph, model, cfg, cache_len):
        """TargetPrefillGraph / TargetVerifyGraph over the target, VQDecodeGraph over the decoder."""
        if graph is Graph.TARGET_PREFILL:
            return TargetPrefillGraph(model, cache_len)
        if graph is Graph.TARGET_VERIFY:
            return TargetVerifyGraph(model)
        if graph is Graph.VQ_DECODE:
            return VQDecodeGraph(model, cfg.grid_hw)
        return None

    def graph_spec(self, graph, cfg):
        from ...models.io_spec import graph_spec

        return graph_spec(graph, n_layer=getattr(cfg, "n_layer", 0), model_type=getattr(cfg, "model_type", "c2i"))

    def export_dims(self, cfg, *, max_cache_len, drafter_cfg=None, vq_cfg=None, codes=None, layout=None):
        from ...models.io_spec import export_dims

        return export_dims(cfg, max_cache_len=max_cache_len, drafter_cfg=drafter_cfg, vq_cfg=vq_cfg)

    def default_generation(self):
        from ...config import SamplingConfig

        return dataclasses.asdict(SamplingConfig())

    def target_config(self, man):
        from .config import TargetConfig

        return TargetConfig.from_dict(man.target["config"])

    def vq_config(self, man):
        from .config import VQConfig

        return VQConfig.from_dict(man.vq["config"]) if man.vq else None

    def prefill_ids(self, cfg):
        """c2i with one class token: the verify graph embeds class c (null class included) as id
        vocab_size + c, so the prefill is one verify call. t2i (caption features, not ids): None."""
        if getattr(cfg, "model_type", "c2i") != "c2i" or cfg.cls_token_num != 1:
            return None
        return {"offset": cfg.vocab_size, "count": cfg.num_classes + 1}

    def verify_embed(self, model, ids):
        rec = self.prefill_ids(model.config)
        if rec is None:
            return model.embed_tokens(ids)
        cond = ids >= rec["offset"]
        tok = model.tok_embeddings(torch.where(cond, 0, ids))
        cls = model.cls_embedding.embedding_table(torch.where(cond, ids - rec["offset"], 0))
        return torch.where(cond[..., None], cls, tok)  # the same rows as tok_embeddings / cond_embeddings

    def prefill_tokens(self, cfg, cond, rec):
        ids = cond.to(torch.int64).reshape(-1, 1) + rec["offset"]
        return ids, torch.ones(ids.shape, dtype=torch.bool)

    def export_patches(self, model) -> dict:
        """Check-free replacements of the target's data-dependent host checks (export/onnx._export_mode)."""
        from .model import Transformer

        if not isinstance(model, Transformer):
            return {}
        return dict(embed_tokens=model.tok_embeddings.forward, check_cond=lambda cond: None)

    def input_range(self, name, refs, dims):
        tcfg = refs["target"].config
        if name == "class_ids":
            return 0, tcfg.num_classes + 1
        if name in ("input_ids", "node_tokens"):
            return 0, tcfg.vocab_size
        if name == "image_tokens":
            return 0, refs["vq"].config.codebook_size
        if name == "position_ids":
            return tcfg.cls_token_num, tcfg.seq_len
        return super().input_range(name, refs, dims)

    def target_reference(self, graph, refs, x):
        from ...models.family import family_of
        from ...models.layers import KVCache

        m = refs["target"]
        cfg = m.config
        past = past_of(x, cfg.n_layer)
        cache = KVCache(cfg, past[0].shape[0], past[0].shape[2], torch.float32, "cpu")
        cache.k, cache.v = past[0::2], past[1::2]
        if graph is Graph.TARGET_PREFILL:
            o = m.prefill(family_of(cfg).cond_from_inputs(cfg, x), cache, taps=True)
            res = dict(prefix_valid=cache.col_valid[:, : cfg.cls_token_num].clone())
            slots = torch.arange(cfg.cls_token_num)[None, :].expand(cache.batch, -1)
        else:
            o = m.forward_tokens(x["input_ids"], x["position_ids"], x["cache_slots"], x["attention_mask"], cache,
                                 taps=True)
            res, slots = {}, x["cache_slots"]
        res.update(logits=o.logits, taps=o.taps, hidden=o.hidden, **present_rows(cache.k, cache.v, slots))
        return res

    def vq_reference(self, refs, x):
        vq, tok = refs["vq"], x["image_tokens"]
        h, w = refs["target"].config.grid_hw
        return dict(images=vq.decode_code(tok, (tok.shape[0], vq.config.codebook_embed_dim, h, w)))


GRAPHS = register_export_family(LlamaGenGraphs())

__all__ = ["GRAPHS", "LlamaGenGraphs", "TargetPrefillGraph", "TargetVerifyGraph", "VQDecodeGraph", "condition_files",
           "max_cache_len"]
