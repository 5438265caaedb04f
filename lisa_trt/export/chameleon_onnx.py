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

This module is the family's part only: the target / VQGAN graph wrappers, the static sequence
layout (image size -> span -> cache length) and `ChameleonGraphs`, the family's io specs, axes,
random inputs and PyTorch references (the export/families.py seam).
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Optional

import torch

from ..config import find_multiple
from ..errors import ArtifactMismatchError, InputError
from .families import ExportFamily, interleave, past_of, register_export_family
from .io_spec import GASV_K, GASV_PARAMS, Graph, GraphSpec, TensorSpec, gasv_spec, graph_spec, target_kv, \
    target_outputs, token_inputs
from .manifest import CHAMELEON_ENGINE_FILE as ENGINE_FILE  # noqa: F401 (the manifest of older exports)
from .onnx import (DEFAULT_OPSET, GASVGraph, _NamedGraph, _ShimCache, drafter_builders, export_graphs,
                   half_drafter, staging_dir)
from .sizing import PrecisionCopy

FAMILY = "chameleon"
DEFAULT_MAX_PROMPT = 128
DEFAULT_MAX_TREE = 64
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def latent_grid(image_size: int) -> tuple[int, int]:
    """(h_lat, w_lat) code grid of a square Lumina image."""
    from ..models.families.chameleon.lumina import LATENT_PER_GRID, grids

    hg, wg = grids(image_size, image_size)
    return hg * LATENT_PER_GRID, wg * LATENT_PER_GRID


def span_length(image_size: int) -> int:
    """Tokens of one Lumina image span after its prefix: h_lat rows of (w_lat codes + row end)."""
    h, w = latent_grid(image_size)
    return h * (w + 1)


def engine_cache_len(image_size: int, max_prompt: int, max_tree: int) -> int:
    """Static cache length: prompt + span prefix (3) + span + tree scratch, rounded to 8."""
    return find_multiple(max_prompt + 3 + span_length(image_size) + max_tree, 8)


# ----------------------------------------------------------------------------- the family's graphs

class ChameleonGraphs(ExportFamily):
    """The Chameleon family's graphs: token-input prefill, image-code GASV, grid VQGAN decoder."""

    name = FAMILY
    engines_module = "lisa_trt.engines.prompt_graph"  # GraphPromptTarget, GraphGridVQ (token-prompt targets)
    exports_bundle = True

    def export_bundle(self, target, drafter, tables, vq, out_dir, *, source, image_size=None, max_prompt=None,
                      max_tree=None, opset=None, generation=None, validate=True, fp16=False, quantize="none"):
        """`export_chameleon` with the family's defaults (its image size, DEFAULT_MAX_PROMPT / _TREE / _OPSET)."""
        from ..models.family import family_of

        return export_chameleon(target, drafter, tables, vq, source, out_dir,
                                image_size=image_size or family_of(target.config).default_image_size, max_prompt=max_prompt or DEFAULT_MAX_PROMPT,
                                max_tree=max_tree or DEFAULT_MAX_TREE, opset=opset or DEFAULT_OPSET,
                                generation=generation, validate=validate, fp16=fp16, quantize=quantize)

    def graph_spec(self, graph: Graph, cfg) -> GraphSpec:
        if graph is Graph.TARGET_PREFILL:
            past, present, aliases = target_kv(cfg.n_layer)
            return GraphSpec(graph, token_inputs() + past, target_outputs(last=True, where="last prompt position")
                             + present, aliases, "left-padded prompt -> cache slots [0, T); outputs at its last position")
        if graph is Graph.GASV:
            return gasv_spec("codes")
        if graph is Graph.VQ_DECODE:
            return GraphSpec(graph, (TensorSpec("image_tokens", "int64", ("batch", "h_lat", "w_lat"),
                                                "VQ codes of each latent cell"),),
                             (TensorSpec("images", "float32", ("batch", "channels", "height", "width"),
                                         "pixels in about [-1, 1]"),), doc="Chameleon VQGAN decoder")
        if graph is Graph.MEDUSA_HEADS:
            raise InputError("Chameleon-family bundles have no Medusa heads graph")
        return graph_spec(graph, n_layer=cfg.n_layer)  # verify and drafter graphs: the shared table

    def export_dims(self, cfg, *, max_cache_len, drafter_cfg=None, vq_cfg=None, codes=None, layout=None):
        dims = dict(one=1, vocab=cfg.vocab_size, dim=cfg.dim, tap_dim=3 * cfg.dim, kv_heads=cfg.kv_heads,
                    head_dim=cfg.head_dim, cache_len=max_cache_len, n_gasv_params=len(GASV_PARAMS), gasv_k=GASV_K)
        if codes:
            dims["codes"] = int(codes)
        if drafter_cfg is not None:
            dims.update(draft_hidden=drafter_cfg.hidden, draft_heads=drafter_cfg.n_head,
                        draft_head_dim=drafter_cfg.head_dim)
        if vq_cfg is not None and layout and layout.get("latent"):
            h, w = layout["latent"]
            dims.update(h_lat=h, w_lat=w, channels=3, height=h * vq_cfg.downsample, width=w * vq_cfg.downsample)
        return dims

    def prefill_max_seq(self, layout):
        return int((layout or {}).get("max_prompt") or DEFAULT_MAX_PROMPT)

    def default_generation(self) -> dict:
        return {}  # the Pipeline applies the family's defaults (ChameleonFamily.default_sampling)

    def config_record(self, cfg) -> dict:
        d = super().config_record(cfg)
        d.pop("vocabulary_map", None)  # 65k entries: the bundle carries the checkpoint's config.json
        return d

    def target_config(self, man):
        from ..models.families.chameleon.checkpoint import read_chameleon_config

        return read_chameleon_config(Path(man.dir) / (man.files or {}).get("config", "config.json"))

    def vq_config(self, man):
        from ..models.families.chameleon.vq import ChameleonVQConfig

        if not man.vq:
            return None
        return ChameleonVQConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in man.vq["config"].items()})

    # -- validation -----------------------------------------------------------------------

    def input_range(self, name, refs, dims):
        tc = refs["target"].config
        if name == "input_ids":
            return 0, tc.vocab_size
        if name == "position_ids":
            hi = tc.max_position_embeddings
            if refs.get("drafter") is not None:
                hi = min(hi, refs["drafter"].max_positions)
            return 0, hi
        if name == "node_tokens":
            return 0, refs["tables"].vocab_size
        if name == "image_tokens":
            return 0, refs["vq"].config.n_embed
        return super().input_range(name, refs, dims)

    def sample_inputs(self, graph, spec, dims, refs, *, precision="fp32", seed=0, batch=2, seq=3, nodes=3):
        if graph is not Graph.TARGET_PREFILL:
            return super().sample_inputs(graph, spec, dims, refs, precision=precision, seed=seed, batch=batch,
                                         seq=seq, nodes=nodes)
        from ..models.layers import KVCache
        from ..models.prompts import prefill_plan

        # a left-padded prompt batch (row 0 full, the others padded: the CFG unconditional rows), its
        # slots / positions / mask made by prefill_plan, the host side of the torch target's prefill
        g = torch.Generator().manual_seed(seed)
        tc, B, T = refs["target"].config, batch, seq
        ids = torch.randint(0, tc.vocab_size, (B, T), generator=g)
        pad = torch.cat([torch.zeros(1, dtype=torch.long), torch.randint(0, T, (B - 1,), generator=g)])
        valid = torch.arange(T)[None, :] >= pad[:, None]
        plan = KVCache(replace(tc, num_hidden_layers=1), B, dims["cache_len"], torch.float32, "cpu")
        slots, pos, mask = prefill_plan(ids, plan, valid)
        x = dict(input_ids=ids, position_ids=pos, cache_slots=slots.contiguous(), attention_mask=mask)
        act = torch.float16 if precision == "fp16" else torch.float32
        for t in spec.inputs:
            if t.name.startswith("past_"):
                x[t.name] = (torch.randn(t.shape(dict(dims, batch=B)), generator=g) * 0.5).to(act)
        return x

    def target_reference(self, graph, refs, x):
        from ..models.layers import KVCache

        m = refs["target"]
        cfg = m.config
        past = past_of(x, cfg.n_layer)
        cache = KVCache(replace(cfg, num_hidden_layers=1), past[0].shape[0], past[0].shape[2], torch.float32, "cpu")
        cache.k, cache.v = past[0::2], past[1::2]
        if graph is Graph.TARGET_PREFILL:
            T = x["input_ids"].shape[1]
            valid = x["attention_mask"][:, -1, :T]  # what the last prompt position may see: the valid columns
            o = m.prefill(x["input_ids"], cache, valid, taps=True)
        else:
            o = m.forward_tokens(x["input_ids"], x["position_ids"], x["cache_slots"], x["attention_mask"], cache,
                                 taps=True)
        return dict(logits=o.logits, taps=o.taps, hidden=o.hidden, **interleave(cache.k, cache.v))

    def vq_reference(self, refs, x):
        return dict(images=refs["vq"].decode_code(x["image_tokens"]).float())


FAMILY_GRAPHS = register_export_family(ChameleonGraphs())


# ----------------------------------------------------------------------------- wrappers

class ChameleonStepGraph(_NamedGraph):
    """ChameleonTarget._run over a static cache with host-made positions / slots / mask.

    last_only: the prefill graph (outputs at the last input position only)."""

    def __init__(self, model, last_only: bool):
        super().__init__(FAMILY_GRAPHS.graph_spec(Graph.TARGET_PREFILL if last_only else Graph.TARGET_VERIFY,
                                                  model.config))
        self.model, self.last_only = model, last_only

    def compute(self, x):
        m = self.model
        cache = _ShimCache([x[n] for n in self.spec.input_names if n.startswith("past_key_values.")])
        h = m.model.embed_tokens(x["input_ids"])
        out = m._run(h, x["position_ids"], x["attention_mask"][:, None], cache, x["cache_slots"], True,
                     last_only=self.last_only)
        res = dict(logits=out.logits, taps=out.taps, hidden=out.hidden)
        res.update(zip([n for n in self.spec.output_names if n.startswith("present.")], cache.presents()))
        return res


class ChameleonVQGraph(_NamedGraph):
    """ChameleonVQGAN.decode_code without its host-side code check."""

    def __init__(self, vq, target_cfg):
        super().__init__(FAMILY_GRAPHS.graph_spec(Graph.VQ_DECODE, target_cfg))
        self.vq = vq

    def compute(self, x):
        quant = self.vq.quantize.embedding(x["image_tokens"]).permute(0, 3, 1, 2)
        return dict(images=self.vq.decoder(self.vq.post_quant_conv(quant)).float())


# ----------------------------------------------------------------------------- bundle

def _check_artifacts(target, drafter, tables, tok):
    """Drafter and tables made for this target (tables bound to the head's code rows)."""
    from ..models.families.chameleon import CHAMELEON
    from ..calibration.tables import target_hash_of
    from ..models.checkpoints import target_hash

    th = target_hash(target)
    if drafter is not None and drafter.config.target_hash not in ("", None, th):
        raise ArtifactMismatchError(f"the drafter was trained for target {drafter.config.target_hash}, not {th}")
    if tables is None:
        return None
    vocab = CHAMELEON.sub_vocab(target, tok.newline)
    if tables.target_hash not in ("", None, target_hash_of(target)) or tables.vocab_size != vocab.K:
        raise ArtifactMismatchError("the tables were calibrated for another target or code vocabulary; "
                                    "re-run `lisa-trt calibrate --model DIR` for this target")
    if tables.w_tilde is None:
        w = target.lm_head.weight.detach()
        tables = tables.bind(w[vocab.code_ids.to(w.device)])
    return tables


def _copy_checkpoint_files(target, tokenizer_dir: Path, dest: Path) -> dict:
    """config.json + the tokenizer files of the checkpoint into the bundle; {role: file}."""
    files = {}
    for name in ("config.json",) + TOKENIZER_FILES:
        src = Path(getattr(target, "source_dir", "") or tokenizer_dir) / name
        if not src.is_file():
            src = tokenizer_dir / name
        if src.is_file():
            shutil.copyfile(src, dest / name)
            files[name.split(".")[0]] = name
    if "config" not in files:
        raise InputError("the target has no source directory with config.json; load it with lisa_trt.load_target(DIR)")
    return files


def export_chameleon(target, drafter, tables, vq, tokenizer_dir, out_dir, *, image_size: int,
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
        image_size: the image size the engines serve (fixes the span length and the cache).
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
    from ..calibration.tables import save_tables
    from ..models.families.chameleon.lumina import LuminaTokenizer
    from . import manifest as M

    if opset < 23:
        raise InputError(f"opset {opset} is too old: the graphs use ONNX Attention (opset >= 23)")
    if quantize != "none":
        from .quantize import check_mode

        check_mode(quantize)
        if fp16:
            raise InputError(f"--quantize {quantize} quantizes fp32 graphs; drop --fp16")
    tokenizer_dir = Path(tokenizer_dir)
    tables = _check_artifacts(target, drafter, tables, LuminaTokenizer(tokenizer_dir))
    L = engine_cache_len(image_size, max_prompt, max_tree)
    if L > target.config.max_position_embeddings + max_tree:
        raise InputError(f"a {image_size}px image with a {max_prompt}-token prompt needs {L} cache slots; this "
                         f"checkpoint has max_position_embeddings {target.config.max_position_embeddings}")
    target, drafter = target.eval(), drafter.eval() if drafter is not None else None
    precision = "fp16" if fp16 else "fp32"
    layout = {"image_size": int(image_size), "max_prompt": int(max_prompt), "latent": list(latent_grid(image_size))}
    dims = FAMILY_GRAPHS.export_dims(target.config, max_cache_len=L, drafter_cfg=drafter.config if drafter else None,
                                     vq_cfg=vq.config if vq is not None else None,
                                     codes=tables.vocab_size if tables is not None else None, layout=layout)
    refs = dict(target=target, drafter=drafter, tables=tables, vq=vq)
    t_exp = PrecisionCopy(target, fp16)  # converted per graph, freed after each (export/sizing.py)
    d_exp = half_drafter(drafter, fp16)
    builders = [(Graph.TARGET_PREFILL, lambda: ChameleonStepGraph(t_exp.get(), True), precision),
                (Graph.TARGET_VERIFY, lambda: ChameleonStepGraph(t_exp.get(), False), precision)]
    builders += drafter_builders(drafter, d_exp, precision, commit=False)  # the Lumina loop runs project + step
    if tables is not None:
        gspec = FAMILY_GRAPHS.graph_spec(Graph.GASV, target.config)
        builders.append((Graph.GASV, lambda: GASVGraph(tables, gspec), "fp32"))
    if vq is not None:
        builders.append((Graph.VQ_DECODE, lambda: ChameleonVQGraph(vq.eval(), target.config), "fp32"))

    with staging_dir(Path(out_dir)) as tmp:
        graphs = export_graphs(builders, tmp, dims, refs, (t_exp, d_exp), opset=opset, validate=validate, lint=lint,
                               progress=progress)
        weights = None
        if quantize == "none":  # one deduplicated weights file (export/weights.py); quantized: after quantizing
            from .weights import share_weights

            graphs, weights = share_weights(tmp, graphs)
        files = _copy_checkpoint_files(target, tokenizer_dir, tmp)
        if tables is not None:
            save_tables(replace(tables, w_tilde=None), tmp / "tables.safetensors")
            files["tables"] = "tables.safetensors"
        man = M.build_manifest(target=target, drafter=drafter, tables=tables, vq=vq, graphs=graphs,
                               precision=precision, opset=opset, max_tree=max_tree, max_cache_len=L,
                               generation=generation, files=files, layout=layout, weights=weights)
        M.write_manifest(man, tmp)
        if quantize != "none":
            from .quantize import quantize_bundle
            from .weights import share_bundle

            quantize_bundle(tmp, quantize, refs, validate=validate)
            share_bundle(tmp)
    return M.read_manifest(out_dir)


def is_chameleon_engine(path) -> bool:
    """True when `path` is a Chameleon-family engine directory (export.manifest.bundle_family);
    False for a LlamaGen one and for a directory that is no engine directory at all.

    A thin wrapper kept for cli.py; new code calls bundle_family."""
    from .manifest import bundle_family

    try:
        return bundle_family(path) == FAMILY
    except InputError:
        return False


__all__ = ["DEFAULT_MAX_PROMPT", "DEFAULT_MAX_TREE", "ChameleonGraphs", "ChameleonStepGraph", "ChameleonVQGraph",
           "engine_cache_len", "export_chameleon", "is_chameleon_engine", "latent_grid", "span_length"]
