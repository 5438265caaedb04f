"""The export side of token-prompt targets (models/prompts.py: left-padded prompt rows, per-row
RoPE positions), shared by every family whose target takes a prompt of tokens rather than a
condition prefix (engines/prompt_graph.py runs what these export).

    class MyGraphs(PromptExportFamily): ...              # a family's ExportFamily: specs, axes, inputs, references
    spec = prompt_prefill_spec(n_layer)                  # token inputs + past -> last-position outputs
    g = xf.graph_module(Graph.TARGET_VERIFY, model, cfg, L)   # a PromptStepGraph: model._run over host-made
                                                         # positions / slots / mask (export and torch backend)
    tables = check_bundle_artifacts(target, drafter, tables, code_ids)   # made for this target, bound
    graphs = xf.prompt_bundle(target, tables, vq, opts, ...)  # its BundleGraphs (export/bundle.py)
    x = prompt_prefill_inputs(spec, dims, vocab, seed=0) # a valid left-padded batch (validation)
    L = prompt_cache_len(max_prompt, n_tokens, max_tree) # the static cache length of one export

Both target graphs take the verify graph's token inputs (input_ids, position_ids, cache_slots,
attention_mask): the host computes positions, slots and the mask exactly as the torch target's
prefill / forward_tokens do (models/prompts.prefill_plan), so the graphs carry no family logic
beyond the model. A family supplies its embeddings (`prompt_embed` for the prefill, `verify_embed`),
its decoder's wrapper (`graph_module` for Graph.VQ_DECODE) and a target with
`_run(h, positions, mask, cache, slots, taps, last_only=...)`; the torch backend runs the same
wrappers over the models it rebuilds from the bundle's shared weights file.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

import torch

from ..config import find_multiple
from .families import ExportFamily, present_rows
from ..models.io_spec import (
    Graph,
    GraphSpec,
    TensorSpec,
    common_dims,
    gasv_spec,
    graph_spec,
    target_kv,
    target_outputs,
    token_inputs,
)
from .layout import DEFAULT_MAX_TREE
from .onnx import _NamedGraph, _ShimCache

DEFAULT_MAX_PROMPT = 128  # prompt tokens (template included) an export serves unless told (--max-prompt)


def vq_settings(vq_cfg) -> tuple:
    """(n_codes, downsample, out_channels): the VQ settings a family's decoder config declares
    (codes it takes, pixels per code side, image channels); ConfigError naming a missing one."""
    from ..errors import ConfigError

    missing = [n for n in ("n_codes", "downsample", "out_channels") if not hasattr(vq_cfg, n)]
    if missing:
        raise ConfigError(f"{type(vq_cfg).__name__} does not declare the VQ settings {', '.join(missing)}: a family's "
                          "VQ config answers n_codes, downsample and out_channels (docs/families.md)")
    return int(vq_cfg.n_codes), int(vq_cfg.downsample), int(vq_cfg.out_channels)


class PromptExportFamily(ExportFamily):
    """The ExportFamily of a token-prompt family.

    Shared: the io specs (prefill over the prompt's tokens, verify / drafter / Medusa from the
    common table, GASV over `gasv_axis`, the VQ decoder over the code grid), the static axes, the
    validation inputs (prompt ids drawn from `prompt_vocab_size`, image codes from the head's
    vocabulary, VQ codes from the decoder's declared `n_codes`) and the references (the torch target's
    prefill / forward_tokens, the family's `codes_to_pixels`). A family subclass names itself,
    says how its manifests give back its configurations (target_config, vq_config), embeds its
    prompts and tokens (`prompt_embed`, `verify_embed`), adds its decoder's wrapper to
    `graph_module`, and answers its bundle's graphs (`bundle_graphs`, usually through `prompt_bundle`).
    Its bundles open on the torch backend (its ModelFamily answers target_from_state /
    decoder_from_state)."""

    engines_module = "lisa_trt.engines.prompt_graph"  # GraphPromptTarget, GraphGridVQ (token-prompt targets)
    default_max_prompt = DEFAULT_MAX_PROMPT
    default_max_tree = DEFAULT_MAX_TREE
    prefill_doc = "left-padded prompt -> cache slots [0, T); outputs at its last position"
    gasv_axis = "vocab"  # GASV's vocabulary axis: the head's ("vocab"), or a sub-vocabulary's own ("codes")
    vq_doc = "VQ decoder"
    torch_weights_copy = False  # the torch backend reads the shared weights file (HF loaders read directories)

    def prompt_embed(self, model, ids):
        """The prefill graph's input embedding (traced, no host checks): prompt ids (B, T) ->
        (B, T, dim); default the verify graph's (`verify_embed`)."""
        return self.verify_embed(model, ids)

    def graph_module(self, graph, model, cfg, cache_len):
        """A PromptStepGraph over the target for the prefill (`prompt_embed`, outputs at the last
        position) and the verify graph (`verify_embed`); None for other graphs (a family adds its
        decoder's)."""
        if graph not in (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY):
            return None
        prefill = graph is Graph.TARGET_PREFILL
        embed = self.prompt_embed if prefill else self.verify_embed
        return PromptStepGraph(model, self.graph_spec(graph, cfg), embed, last_only=prefill)

    def prompt_bundle(self, target, tables, vq, opts, *, layout: dict, max_cache_len: int, source, files: tuple):
        """The BundleGraphs of a token-prompt family (export/bundle.py): its two target graphs and its
        decoder's (`graph_builders`), the drafter's project / step graphs (the prompt loops commit
        through them: no commit graph), GASV over the tables' vocabulary, the static `layout`, the
        checkpoint `files` (config.json first) copied from the target's source directory (else
        `source`), the tables without the bound head (the runner binds them), and the shared
        weights indexed for the torch backend. InputError for `--torch-weights` (no fp32 copy: the
        torch backend reads the shared weights file)."""
        from ..errors import InputError
        from .bundle import BundleGraphs

        if opts.torch_weights:
            raise InputError(f"--torch-weights writes fp32 copies that {self.name} bundles do not use: the torch backend "
                             "rebuilds their models from the shared weights file. Drop --torch-weights (a quantized "
                             f"{self.name} bundle runs on --backend ort or trt)")
        target_graphs, vq_graph = self.graph_builders(target.config, max_cache_len, vq)
        return BundleGraphs(target=target_graphs, max_cache_len=max_cache_len, tables=tables,
                            saved_tables=replace(tables, w_tilde=None) if tables is not None else None,
                            vq=vq_graph, layout=layout, codes=tables.vocab_size if tables is not None else None,
                            files=lambda dest: copy_checkpoint_files(target, source, dest, files),
                            drafter_commit=False, torch_backend=True)

    # -- specs and axes -------------------------------------------------------------------

    def graph_spec(self, graph: Graph, cfg) -> GraphSpec:
        if graph is Graph.TARGET_PREFILL:
            return prompt_prefill_spec(cfg.n_layer, self.prefill_doc)
        if graph is Graph.GASV:
            return gasv_spec(self.gasv_axis)
        if graph is Graph.VQ_DECODE:
            return GraphSpec(graph, (TensorSpec("image_tokens", "int64", ("batch", "h_lat", "w_lat"),
                                                "VQ codes of the latent grid (raster order)"),),
                             (TensorSpec("images", "float32", ("batch", "channels", "height", "width"),
                                         "raw decoder output (about [-1, 1])"),), doc=self.vq_doc)
        return graph_spec(graph, n_layer=cfg.n_layer)  # verify, drafter, Medusa heads: the shared table

    def export_dims(self, cfg, *, max_cache_len, drafter_cfg=None, vq_cfg=None, codes=None, layout=None):
        dims = common_dims(cfg, max_cache_len=max_cache_len, drafter_cfg=drafter_cfg)
        if codes:
            dims["codes"] = int(codes)
        if vq_cfg is not None and layout and layout.get("latent"):
            h, w = layout["latent"]
            _, ds, channels = vq_settings(vq_cfg)
            dims.update(h_lat=h, w_lat=w, channels=channels, height=h * ds, width=w * ds)
        return dims

    def prefill_max_seq(self, layout):
        return int((layout or {}).get("max_prompt") or self.default_max_prompt)

    # -- validation -----------------------------------------------------------------------

    def input_range(self, name, refs, dims):
        tc = refs["target"].config
        if name == "input_ids":  # verify and drafter graphs: the head's ids (the prefill draws its own)
            return 0, tc.vocab_size
        if name == "position_ids":
            hi = tc.max_position_embeddings
            if refs.get("drafter") is not None and hasattr(refs["drafter"], "max_positions"):
                hi = min(hi, refs["drafter"].max_positions)
            return 0, hi
        if name == "node_tokens":
            return 0, refs["tables"].vocab_size
        if name == "image_tokens":
            return 0, vq_settings(refs["vq"].config)[0]
        return super().input_range(name, refs, dims)

    def sample_inputs(self, graph, spec, dims, refs, *, precision="fp32", seed=0, batch=2, seq=3, nodes=3):
        if graph is not Graph.TARGET_PREFILL:
            return super().sample_inputs(graph, spec, dims, refs, precision=precision, seed=seed, batch=batch,
                                         seq=seq, nodes=nodes)
        tc = refs["target"].config  # a left-padded batch of the prompt vocabulary's ids
        return prompt_prefill_inputs(spec, dims, tc, self.prompt_vocab_size(tc), precision=precision, seed=seed,
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
        return dict(logits=o.logits, taps=o.taps, hidden=o.hidden, **present_rows(cache.k, cache.v, x["cache_slots"]))

    def vq_reference(self, refs, x):
        from ..models.family import family_of

        return dict(images=family_of(refs["target"].config).codes_to_pixels(refs["vq"], x["image_tokens"]).float())


def check_bundle_artifacts(target, drafter, tables, code_ids: Optional[torch.Tensor] = None):
    """The drafter and tables made for `target` (export/onnx.check_inputs, every family's check);
    the tables bound to the head rows they cover.

    code_ids: the head ids the tables' vocabulary covers (a sub-vocabulary's codes), None: the
    whole head. Raises ArtifactMismatchError naming the fix; returns the bound tables (or None)."""
    from .onnx import check_inputs

    check_inputs(target, drafter, tables, code_ids)
    if tables is None or tables.w_tilde is not None:
        return tables
    w = target.output.weight.detach()
    return tables.bind(w if code_ids is None else w[code_ids.to(w.device)])


def prompt_prefill_spec(n_layer: int, doc: str = "left-padded prompt -> cache slots [0, T); outputs at its last "
                                                 "position") -> GraphSpec:
    """The prefill graph of a token-prompt target: the verify graph's token inputs + the caches."""
    past, present = target_kv(n_layer)
    return GraphSpec(Graph.TARGET_PREFILL, token_inputs() + past,
                     target_outputs(last=True, where="last prompt position") + present, doc)


def prompt_cache_len(max_prompt: int, n_tokens: int, max_tree: int) -> int:
    """Static cache length: the prompt budget + the generated tokens + tree scratch, rounded to 8."""
    return find_multiple(int(max_prompt) + int(n_tokens) + int(max_tree), 8)


class PromptStepGraph(_NamedGraph):
    """`model._run` over a static cache with host-made positions / slots / mask.

    embed(model, ids): token ids (B, S) -> input embeddings (B, S, dim), without host checks (traced;
    the family's `prompt_embed` / `verify_embed`); last_only: the prefill graph (outputs at the last
    input position only). Made by PromptExportFamily.graph_module."""

    def __init__(self, model, spec: GraphSpec, embed: Callable, last_only: bool):
        super().__init__(spec)
        self.model, self.last_only = model, last_only
        self._embed = embed  # a function of (model, ids), not a module: no second path to the model's modules

    def compute(self, x):
        cache = _ShimCache([x[n] for n in self.spec.input_names if n.startswith("past_key_values.")])
        h = self._embed(self.model, x["input_ids"])
        out = self.model._run(h, x["position_ids"], x["attention_mask"][:, None], cache, x["cache_slots"], True,
                              last_only=self.last_only)
        res = dict(logits=out.logits, taps=out.taps, hidden=out.hidden)
        res.update(zip([n for n in self.spec.output_names if n.startswith("present.")], cache.presents()))
        return res


def prompt_prefill_inputs(spec: GraphSpec, dims: dict, cfg, vocab: int, *, precision: str = "fp32", seed: int = 0,
                          batch: int = 2, seq: int = 3) -> dict:
    """Valid random inputs of a token-prompt prefill graph: a left-padded batch (row 0 full, the
    others padded, as CFG's unconditional rows may be) of ids in [0, vocab), its slots / positions /
    mask from models/prompts.prefill_plan (the host side of the torch prefill), random caches."""
    from ..models.layers import KVCache
    from ..models.prompts import prefill_plan

    g = torch.Generator().manual_seed(seed)
    B, T = batch, seq
    ids = torch.randint(0, vocab, (B, T), generator=g)
    pad = torch.cat([torch.zeros(1, dtype=torch.long), torch.randint(0, T, (B - 1,), generator=g)])
    valid = torch.arange(T)[None, :] >= pad[:, None]
    plan = KVCache(replace(cfg, num_hidden_layers=1), B, dims["cache_len"], torch.float32, "cpu")
    slots, pos, mask = prefill_plan(ids, plan, valid)
    x = dict(input_ids=ids, position_ids=pos, cache_slots=slots.contiguous(), attention_mask=mask)
    act = torch.float16 if precision == "fp16" else torch.float32
    for t in spec.inputs:
        if t.name.startswith("past_"):
            x[t.name] = (torch.randn(t.shape(dict(dims, batch=B)), generator=g) * 0.5).to(act)
    return x


def prompt_reference_cache(cfg, x: dict):
    """A KVCache over the (cloned) past inputs of a graph's fp32 inputs, for the torch reference."""
    from ..models.layers import KVCache
    from .families import past_of

    past = past_of(x, cfg.n_layer)
    cache = KVCache(replace(cfg, num_hidden_layers=1), past[0].shape[0], past[0].shape[2], torch.float32, "cpu")
    cache.k, cache.v = past[0::2], past[1::2]
    return cache


def copy_checkpoint_files(target, source, dest, names) -> dict:
    """The checkpoint files `names` (config.json, tokenizer files, ...) into the bundle `dest`, from
    the target's source directory, else `source`; {role (file stem): file}. config.json is required."""
    import shutil
    from pathlib import Path

    from ..errors import InputError

    files = {}
    for name in names:
        src = Path(getattr(target, "source_dir", "") or source) / name
        if not src.is_file():
            src = Path(source) / name
        if src.is_file():
            shutil.copyfile(src, Path(dest) / name)
            files[name.split(".")[0]] = name
    if "config" not in files:
        raise InputError("the target has no source directory with config.json; load it with lisa_trt.load_target(DIR)")
    return files


__all__ = ["DEFAULT_MAX_PROMPT", "PromptExportFamily", "PromptStepGraph", "check_bundle_artifacts",
           "copy_checkpoint_files", "prompt_cache_len", "prompt_prefill_inputs",
           "prompt_prefill_spec", "prompt_reference_cache"]
