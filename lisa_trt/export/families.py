"""What differs between model families in the exported graphs (the export side of the family seam).

An `ExportFamily` answers, for one family: the io spec of each graph, the static axis sizes of
an export, valid random inputs of each graph and their PyTorch reference outputs (what
export/validate.py compares an exported graph with), and how an engine directory's manifest
gives back the target / VQ configurations.

    fam = export_family(family)            # the ModelFamily the caller resolved once (family_of(cfg))
    spec = fam.graph_spec(Graph.TARGET_VERIFY, target.config)
    dims = fam.export_dims(target.config, max_cache_len=L, drafter_cfg=dc)
    x = fam.sample_inputs(Graph.TARGET_VERIFY, spec, dims, refs, seed=0)
    want = fam.reference_outputs(Graph.TARGET_VERIFY, refs, x)

The generic exporter (export/onnx.py), validation, quantization, the graph engines and the
TensorRT checks ask the family and never name one. Each family package defines its own in an
`export` sub-module (families/<name>/export.py, on the families' floor, above this one:
tests/test_architecture.py) and registers it with `register_export_family`; this registry has the
model family import that plug-in on first use (`ModelFamily.plugin("export")`), so it imports no
family itself. The drafter, GASV and Medusa graphs are family-independent: `ExportFamily` draws
and references them itself.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import ConfigError, SpecError
from ..models.family import ModelFamily, families, family_of, load_plugin
from ..models.io_spec import Graph, GraphSpec

_TORCH = {"int64": torch.int64, "bool": torch.bool, "float32": torch.float32}


def act_dtype(precision: str) -> torch.dtype:
    """The dtype of "act" tensors for an export precision ("fp16" -> float16, else float32)."""
    return torch.float16 if precision == "fp16" else torch.float32


def spec_dtype(code: str, precision: str) -> torch.dtype:
    """io-spec dtype code -> torch dtype."""
    return act_dtype(precision) if code == "act" else _TORCH[code]



def fused_hidden(drafter, taps: torch.Tensor, hidden_in: torch.Tensor, seq: int) -> torch.Tensor:
    """drafter_fused's step input (its io spec): fc(taps) for the first taps_seq entries, then
    hidden_in, the first `seq` rows. The exported graph (export/onnx.DrafterFusedGraph) and the
    validation reference both call it."""
    h = torch.cat([drafter.project_taps(taps), hidden_in], 1)
    return h.index_select(1, torch.arange(seq, device=h.device))  # an index, not a slice: no shape guard

class ExportFamily:
    """One model family's graphs. Subclasses implement the target / VQ parts; the drafter, GASV and
    Medusa graphs are shared (their inputs and references come from this base class)."""

    name = "?"
    # module whose open_engines(manifest, backend, **options) opens the family's bundles (its
    # GraphTarget subclass and decoder engine, engines/graph.open_family_engines): every family names one
    engines_module: Optional[str] = None
    # manifest file names the family's engine directories held before manifest.json, and True for the
    # one family whose manifest.json files written before the `family` field are its own: read by
    # export/legacy.py, the one place that reads older engine directories
    legacy_manifests: tuple = ()
    unnamed_manifest: bool = False
    default_max_tree: Optional[int] = None  # the family's tree budget default (None: export/layout's)

    def open_engines(self, man, backend: str, **options):
        """The Engines of a read Manifest of this family (engines/graph.load_engines): the module
        `engines_module` names opens them, imported on first use by the families' one loader
        (models/family.load_plugin, which the import floors test follows)."""
        if not self.engines_module:
            raise ConfigError(f"the {self.name} export family names no engines_module: a family's ExportFamily names "
                              "the module whose open_engines(manifest, backend, **options) opens its directories")
        return load_plugin(self.engines_module).open_engines(man, backend, **options)

    def bundle_graphs(self, target, drafter, tables, vq, opts, *, source=None, image_size=None, max_prompt=None):
        """The family's part of one export (export/bundle.BundleGraphs): its target / VQ graph builders,
        cache length, checked tables, static layout and files. Raise InputError before any work."""
        raise NotImplementedError(f"the {self.name} export family does not say which graphs it exports")

    # True when `--torch-weights` (export/bundle.ExportOptions) writes fp32 copies of the family's
    # models that its loaders read back (ModelFamily.load_target / load_decoder of one file); False:
    # refused, the torch backend rebuilding its models from the shared weights file alone
    torch_weights_copy: bool = True

    def graph_module(self, graph: Graph, model, cfg, cache_len: int):
        """The wrapper module (export/onnx._NamedGraph) of one of the family's target / VQ graphs over
        `model` (the target; the decoder for Graph.VQ_DECODE): what the family's bundle traces
        (`graph_builders`) and the torch backend (engines/torch_runner.py) runs eagerly. cfg: the
        target configuration; cache_len: the export's static cache length. None: the family offers
        none for `graph`."""
        return None

    def graph_builders(self, cfg, cache_len: int, vq=None) -> tuple:
        """(BundleGraphs.target, BundleGraphs.vq) of an export, both from `graph_module` (the one
        place a family's wrappers are made, for the exporter and the torch backend alike): the
        prefill and verify wrappers over the target being traced (its precision copy,
        export/memory.resolve), the decoder's over `vq` (None: no decoder graph)."""
        from .memory import resolve

        def target(t_exp, precision):
            return [(g, lambda g=g: self.graph_module(g, resolve(t_exp), cfg, cache_len), precision)
                    for g in (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY)]

        decoder = (lambda: self.graph_module(Graph.VQ_DECODE, vq.eval(), cfg, cache_len)) if vq is not None else None
        return target, decoder

    def tables_sub_vocab(self, target):
        """The sub-vocabulary (models/family.SubVocab) whose head rows the family's GASV tables cover;
        None: the whole head."""
        return None

    def bind_tables(self, tables, target):
        """A bundle's (unbound) GASV tables bound to the rows of `target`'s head they cover
        (`tables_sub_vocab`, calibration.tables.head_rows), in fp32: what the torch backend and a
        Pipeline over a bundle's PyTorch models run GASV with."""
        from ..calibration.tables import head_rows

        return tables.bind(head_rows(target, self.tables_sub_vocab(target)).float())

    def export_patches(self, model) -> dict:
        """{attribute: replacement} shadowing `model`'s data-dependent host checks while it is traced
        (export/onnx._export_mode; the runners check on the host). {}: nothing to patch."""
        return {}

    # -- token-prompt graph targets (engines/prompt_graph.py) ------------------------------

    def prompt_vocab_size(self, cfg) -> int:
        """Token ids (exclusive bound) the prefill graph of a token-prompt family takes: its prompt
        vocabulary (default cfg.vocab_size, the head's)."""
        return cfg.vocab_size

    def prompt_condition(self, cfg):
        """The condition protocol of the family's token-prompt graph target: an object with
        check_cond(cond) -> batch, null_cond(cond) (CFG's unconditional rows) and cfg_rows(cond, null)
        ([cond; null] as one prefill batch), each as the family's torch target does it. None: the
        protocol of models/prompts.PromptTarget (Prompts that carry their own unconditional rows)."""
        return None

    # -- one target graph: the prefill as a verify call ------------------------------------------

    def prefill_ids(self, cfg) -> Optional[dict]:
        """{"offset": o, "count": n} when the verify graph this family exports also embeds the
        prefill's n condition / prompt ids, passed as o + id (recorded in the manifest's target
        record): one target graph then serves prefill and verify, and a backend that prefers it
        (engines/base.Backend.prefill_via_verify) never opens the prefill graph, so the target's
        weights are in memory once. None: the prefill needs its own graph."""
        return None

    # True when every verify graph this family ever exported embeds the prefill's ids (one token
    # embedding for prompts and images): directories exported before the manifest recorded
    # `prefill_ids` qualify too
    verify_embeds_prompts: bool = False

    def bundle_prefill_ids(self, man) -> Optional[dict]:
        """`prefill_ids` of an exported directory: its manifest's record (None for directories
        exported before it, whose verify graphs embed image tokens only, unless
        `verify_embeds_prompts`)."""
        rec = (man.target or {}).get("prefill_ids")
        if not rec and self.verify_embeds_prompts:
            rec = self.prefill_ids(man.target_config)
        return {"offset": int(rec["offset"]), "count": int(rec["count"])} if rec else None

    def verify_embed(self, model, ids):
        """The verify graph's input embedding (traced): ids (B, S) -> (B, S, dim); with
        `prefill_ids`, ids in [offset, offset + count) take the prefill's embedding."""
        return model.embed_tokens(ids)

    def prefill_tokens(self, cfg, cond, rec: dict):
        """(ids (B, T) for the verify graph, prefix validity (B, T) bool) of a condition, for a
        bundle with prefill_ids `rec` (families whose prefill takes a condition, not a prompt)."""
        raise NotImplementedError(f"the {self.name} export family has no condition prefill through verify")

    # -- specs ----------------------------------------------------------------------------

    def graph_spec(self, graph: Graph, cfg) -> GraphSpec:
        """The io spec of `graph` for a target configuration."""
        raise NotImplementedError

    def export_dims(self, cfg, *, max_cache_len: int, drafter_cfg=None, vq_cfg=None, codes: Optional[int] = None,
                    layout: Optional[dict] = None) -> dict:
        """Sizes of every static axis of one export (codes: the GASV tables' vocabulary;
        layout: the family's static sequence layout recorded in the manifest)."""
        raise NotImplementedError

    def prefill_max_seq(self, layout: Optional[dict]) -> Optional[int]:
        """Most tokens the prefill graph takes on its "seq" axis (None: it has no such axis)."""
        return None

    def default_generation(self) -> dict:
        """Generation settings a bundle records when the export is given none."""
        return {}

    def config_record(self, cfg) -> dict:
        """A configuration (target, VQ) as the manifest records it."""
        import dataclasses

        return cfg.to_dict() if hasattr(cfg, "to_dict") else dataclasses.asdict(cfg)

    # -- manifests ------------------------------------------------------------------------

    def target_config(self, man):
        """The target configuration an engine directory's Manifest was exported for."""
        raise NotImplementedError

    def vq_config(self, man):
        """The image decoder's configuration (None when the bundle has no decoder graph)."""
        raise NotImplementedError

    # -- validation inputs ----------------------------------------------------------------

    def input_range(self, name: str, refs: dict, dims: dict) -> Optional[tuple]:
        """[lo, hi) of an integer input's valid values (None: not an id input of this family)."""
        if name == "depth":  # Medusa heads: every head, and depths past the last one (flat logits)
            return 0, refs["drafter"].config.n_heads + 1
        return None

    def sample_inputs(self, graph: Graph, spec: GraphSpec, dims: dict, refs: dict, *, precision: str = "fp32",
                      seed: int = 0, batch: int = 2, seq: int = 3, nodes: int = 3) -> dict:
        """Random inputs that satisfy the graph's contract (valid ids, distinct slots, non-empty masks).

        Args:
            graph, spec: the graph and its io spec.
            dims: static axis sizes (export_dims).
            refs: {"target", "drafter", "tables", "vq"} models (for id ranges and GASV constants).
            precision: "fp32" or "fp16" ("act" tensors get that dtype).
            batch, seq, nodes: sizes of the dynamic axes.
        Returns:
            {input name: tensor}.
        """
        g = torch.Generator().manual_seed(seed)
        d = dict(dims, batch=batch, seq=seq, nodes=nodes)
        # drafter_fused: taps rows then hidden rows, more than seq together (the graph reads the first seq)
        d.update(taps_seq=max(2, seq - 1), hidden_seq=max(2, seq - 1))
        out = {}
        for t in spec.inputs:
            shape, dt, n = t.shape(d), spec_dtype(t.dtype, precision), t.name
            rng = self.input_range(n, refs, d)
            if rng is not None:
                x = torch.randint(rng[0], rng[1], shape, generator=g)
            elif n == "caption_mask":
                lens = torch.randint(1, shape[1] + 1, (shape[0],), generator=g)
                x = torch.arange(shape[1])[None, :] < lens[:, None]  # valid tokens first
            elif n == "cache_slots":
                x = torch.stack([torch.randperm(d["cache_len"], generator=g)[: shape[1]] for _ in range(shape[0])])
            elif n == "attention_mask":
                x = torch.rand(shape, generator=g) < 0.5
                x.scatter_(2, out["cache_slots"][:, :, None], True)  # every query sees at least itself
            elif n == "node_parents":  # a tree: node 0 is a root, every other node's parent comes before it
                x = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, shape[0])])
            elif n == "guided_logits":
                x = filtered_logits(shape, g)
            elif n == "gasv_params":
                x = refs["tables"].config.params()
            else:  # caches, taps, hidden_in, caption_features
                x = torch.randn(shape, generator=g) * (0.5 if n.startswith("past_") else 1.0)
            out[n] = x.to(dt)
        return out

    # -- references -----------------------------------------------------------------------

    @torch.no_grad()
    def reference_outputs(self, graph: Graph, refs: dict, inputs: dict) -> dict:
        """fp32 PyTorch outputs of the models' public API for the graph's named inputs."""
        x = {k: _f32(v) for k, v in inputs.items()}
        if graph in (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY):
            return self.target_reference(graph, refs, x)
        if graph is Graph.VQ_DECODE:
            return self.vq_reference(refs, x)
        if graph is Graph.DRAFTER_PROJECT:
            return dict(hidden=refs["drafter"].project_taps(x["taps"]))
        if graph in (Graph.DRAFTER_STEP, Graph.DRAFTER_COMMIT, Graph.DRAFTER_FUSED):
            from ..models.drafter import DrafterCache

            d = refs["drafter"]
            k, v = x["past_key_values.0.key"].clone(), x["past_key_values.0.value"].clone()
            cache = DrafterCache(d.config, k.shape[0], k.shape[2], torch.float32, "cpu")
            cache.k, cache.v = [k], [v]
            h_in = d.project_taps(x["taps"]) if graph is Graph.DRAFTER_COMMIT else x["hidden_in"]
            if graph is Graph.DRAFTER_FUSED:
                h_in = fused_hidden(d, x["taps"], x["hidden_in"], x["input_ids"].shape[1])
            logits, hidden = d(h_in, x["input_ids"], x["position_ids"], x["cache_slots"], x["attention_mask"], cache)
            return {"logits": logits, "hidden": hidden, **present_rows(cache.k, cache.v, x["cache_slots"])}
        if graph is Graph.GASV:
            from ..speculative.gasv import GASVConfig, gasv_gates
            from ..models.io_spec import GASV_K, GASV_PARAMS

            cfg = GASVConfig(**dict(zip(GASV_PARAMS, x["gasv_params"].tolist())))
            o = gasv_gates(x["guided_logits"], x["node_tokens"], x["node_parents"], refs["tables"], cfg)
            N, k = o.cand.shape
            cand = torch.full((N, GASV_K), -1, dtype=torch.long)
            gate = torch.zeros(N, GASV_K)
            cand[:, :k], gate[:, :k] = o.cand, o.gate
            return dict(p=o.p, delta_eff=o.delta_eff, cand=cand, gate=gate)
        if graph is Graph.MEDUSA_HEADS:
            return dict(logits=refs["drafter"].head_logits(x["hidden"], x["depth"]))
        raise SpecError(f"no reference for {graph}")

    def target_reference(self, graph: Graph, refs: dict, x: dict) -> dict:
        """Outputs of the target's prefill / forward_tokens for the graph's (fp32) inputs."""
        raise NotImplementedError

    def vq_reference(self, refs: dict, x: dict) -> dict:
        raise NotImplementedError


def _f32(x):
    return x.float() if torch.is_tensor(x) and x.is_floating_point() else x


def present_rows(ks, vs, slots) -> dict:
    """The present.* outputs a graph must give: the rows at `slots` (B, S) of the caches [k_i], [v_i]
    the eager model wrote -> {"present.{i}.key": (B, Hkv, S, D), "present.{i}.value": ...}."""
    out = {}
    for i, (k, v) in enumerate(zip(ks, vs)):
        idx = slots[:, None, :, None].expand(k.shape[0], k.shape[1], slots.shape[1], k.shape[3])
        out[f"present.{i}.key"], out[f"present.{i}.value"] = k.gather(2, idx), v.gather(2, idx)
    return out


def past_of(x: dict, n_layer: int) -> list:
    """The past_key_values.{i}.key / value inputs, interleaved, cloned (the reference writes into them)."""
    return [x[f"past_key_values.{i}.{p}"].clone() for i in range(n_layer) for p in ("key", "value")]


def filtered_logits(shape, g) -> torch.Tensor:
    """Random logits, each row top-k filtered with its own k (row 0 keeps the full support)."""
    N, V = shape
    x = torch.randn(N, V, generator=g) * 3.0
    for i in range(1, N):
        k = int(torch.randint(1, V + 1, (1,), generator=g))
        kth = torch.topk(x[i], k).values[-1]
        x[i] = x[i].masked_fill(x[i] < kth, float("-inf"))
    return x


# ----------------------------------------------------------------------------- registry

_FAMILIES: dict[str, ExportFamily] = {}


def register_export_family(family: ExportFamily) -> ExportFamily:
    """Make `family` the export family of its `name` (a later registration replaces an earlier one)."""
    _FAMILIES[family.name] = family
    return family


def export_families() -> list:
    """Every family's ExportFamily (each model family's export plug-in imported), registration order."""
    for fam in families():
        if fam.name not in _FAMILIES:
            fam.plugin("export")
    return list(_FAMILIES.values())


def export_family(family) -> ExportFamily:
    """The ExportFamily of `family`, the ModelFamily the caller resolved once (family_of / detect_family,
    a Manifest's `model_family`, a RunContext's `family`); its export plug-in is imported on first use
    (ModelFamily.plugin("export")) and registers itself.

    Compatibility: a torch target or a target config (what some callers hold instead of its family)
    is resolved here by one explicit look-up, `family_of(config)`. Anything else is a ConfigError
    naming the fix; a family name recorded in a manifest goes through `export_family_named`."""
    if not isinstance(family, ModelFamily):
        family = _family_of_config(family)
    family.plugin("export")
    xf = _FAMILIES.get(family.name)
    if xf is None:
        known = ", ".join(f.name for f in export_families())
        raise ConfigError(f"the {family.name} family has no export family (known: {known}); its package registers "
                          "one in its export plug-in (families/<name>/export.py, ModelFamily.export_module) with "
                          "export.families.register_export_family")
    return xf


def _family_of_config(obj) -> ModelFamily:
    """The ModelFamily of a torch target or a target config: export_family's compatibility path."""
    cfg = getattr(obj, "config", obj)
    if isinstance(obj, str) or not isinstance(getattr(cfg, "model_type", None), str):
        raise ConfigError(f"export_family takes a model family (models/family.ModelFamily), a torch target or a "
                          f"target config, not {type(obj).__name__} {obj!r:.60}: resolve the family once "
                          "(family_of(config), Manifest.model_family) and pass it; a manifest's recorded family "
                          "name: export_family_named(name)")
    return family_of(cfg)


def export_family_named(name: str) -> ExportFamily:
    """The ExportFamily an engine directory's manifest records by name (Manifest.family, read before
    its target configuration can be): found in this registry, every family's export plug-in imported
    when it is not there yet. No model family is looked up (the Manifest's `model_family` is, once)."""
    xf = _FAMILIES.get(name)
    if xf is None:
        known = ", ".join(f.name for f in export_families())
        xf = _FAMILIES.get(name)
        if xf is None:
            raise ConfigError(f"no export family {name!r}; known: {known} (a bundle from a newer lisa-trt? upgrade, or "
                              "re-export it with this one; a family package registers one with register_export_family)")
    return xf


__all__ = ["ExportFamily", "act_dtype", "export_families", "export_family", "export_family_named", "filtered_logits",
           "fused_hidden", "past_of", "present_rows", "register_export_family", "spec_dtype"]
