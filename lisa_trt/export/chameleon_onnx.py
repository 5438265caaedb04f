"""ONNX export of a Chameleon-family (Lumina-mGPT) deployment: target, drafter, GASV, VQGAN.

`export_chameleon(target, drafter, tables, vq, tokenizer_dir, out_dir, image_size=...)` writes
one self-contained engine directory:

    target_prefill.onnx   text prompt (any length, left-padded) -> static KV cache; outputs at
                          the last prompt position
    target_verify.onnx    S new tokens / a draft tree over the static cache (taps + hidden)
    drafter_project.onnx  drafter fc on the target taps          (with a drafter)
    drafter_step.onnx     one drafter step over its static cache  (with a drafter)
    gasv.onnx             GASV v2 per-node gates over the image-code sub-vocabulary (with
                          tables): code logits, node tokens / parents -> p, delta_eff, cand, gate
    vq_decode.onnx        Chameleon VQGAN: code grid -> pixels    (with a VQGAN)
    tables.safetensors    the image-code tables (GASV version 2: LANTERN / candidate neighbours,
                          drift budgets, GASV constants)
    config.json, tokenizer.json, tokenizer_config.json   the checkpoint's, for the runtime
    chameleon_engine.json manifest: graphs, hashes, static sizes, validation, settings

Both target graphs share the LlamaGen verify graph's I/O names (io_spec TARGET_VERIFY): the
host computes per-row RoPE positions (left padding, the CFG unconditional half from position
0), cache slots and the attention mask, exactly as `ChameleonTarget.prefill` / `forward_tokens`
do, so the graphs carry no family logic beyond the model itself. K/V caches are inputs AND
outputs updated in place (ScatterElements into the bound buffer, see export/onnx.py).
Every graph is validated against the torch module on random inputs before the directory is
published (atomically, via export.onnx.staging_dir).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..config import find_multiple
from ..errors import ArtifactMismatchError, InputError
from .io_spec import Graph, GraphSpec, TensorSpec, graph_spec
from .manifest import CHAMELEON_ENGINE_FILE as ENGINE_FILE
from .onnx import (DEFAULT_OPSET, DrafterProjectGraph, DrafterStepGraph, ExportError, GASVGraph, _export_mode,
                   _NamedGraph, _ShimCache, onnx_from_torch, staging_dir)

ENGINE_KIND = "lisa-trt/chameleon-engine"
SCHEMA_VERSION = 1
DEFAULT_MAX_PROMPT = 128
DEFAULT_MAX_TREE = 64
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# fp32 tolerance of ORT vs torch (max abs difference, relative to the reference's max abs)
_TOL = 1e-3


def latent_grid(image_size: int) -> tuple[int, int]:
    """(h_lat, w_lat) code grid of a square Lumina image."""
    from ..speculative.lumina import LATENT_PER_GRID, grids

    hg, wg = grids(image_size, image_size)
    return hg * LATENT_PER_GRID, wg * LATENT_PER_GRID


def span_length(image_size: int) -> int:
    """Tokens of one Lumina image span after its prefix: h_lat rows of (w_lat codes + row end)."""
    h, w = latent_grid(image_size)
    return h * (w + 1)


def engine_cache_len(image_size: int, max_prompt: int, max_tree: int) -> int:
    """Static cache length: prompt + span prefix (3) + span + tree scratch, rounded to 8."""
    return find_multiple(max_prompt + 3 + span_length(image_size) + max_tree, 8)


# ----------------------------------------------------------------------------- graphs

class ChameleonStepGraph(_NamedGraph):
    """ChameleonTarget._run over a static cache with host-made positions / slots / mask.

    last_only: the prefill variant (outputs at the last input position only)."""

    def __init__(self, model, last_only: bool):
        super().__init__(graph_spec(Graph.TARGET_VERIFY, n_layer=model.config.n_layer))
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


def _vq_spec() -> GraphSpec:
    return GraphSpec(Graph.VQ_DECODE, (TensorSpec("image_tokens", "int64", ("batch", "h_lat", "w_lat"),
                                                  "VQ codes of each latent cell"),),
                     (TensorSpec("images", "float32", ("batch", "three", "height", "width"), "pixels in about [-1, 1]"),),
                     doc="Chameleon VQGAN decoder")


class ChameleonVQGraph(_NamedGraph):
    """ChameleonVQGAN.decode_code without its host-side code check."""

    def __init__(self, vq, latent: tuple):
        super().__init__(_vq_spec())
        self.vq, self.latent = vq, tuple(latent)  # (h_lat, w_lat): fixed per export

    def compute(self, x):
        quant = self.vq.quantize.embedding(x["image_tokens"]).permute(0, 3, 1, 2)
        return dict(images=self.vq.decoder(self.vq.post_quant_conv(quant)).float())


# ----------------------------------------------------------------------------- examples

def _kv_example(B, heads, L, hd, gen):
    return torch.randn(B, heads, L, hd, generator=gen)


def _step_example(vocab, n_layer, heads, hd, L, B, S, gen, prefill: bool, start: int = 5) -> dict:
    ids = torch.randint(0, vocab, (B, S), generator=gen)
    if prefill:
        slots = torch.arange(S)[None].expand(B, S).contiguous()
        pad = torch.tensor([0] + [1] * (B - 1))
        pos = (slots - pad[:, None]).clamp(min=0)
        causal = torch.tril(torch.ones(S, S, dtype=torch.bool))
        valid = slots >= pad[:, None]
        m = (causal[None] & valid[:, None, :]) | torch.eye(S, dtype=torch.bool)[None]
        mask = torch.cat([m, torch.zeros(B, S, L - S, dtype=torch.bool)], -1)
    else:
        slots = (start + torch.arange(S))[None].expand(B, S).contiguous()
        pos = slots.clone()
        mask = torch.zeros(B, S, L, dtype=torch.bool)
        mask[:, :, :start] = True
        mask[:, :, start:start + S] = torch.tril(torch.ones(S, S, dtype=torch.bool))
    ex = dict(input_ids=ids, position_ids=pos, cache_slots=slots, attention_mask=mask)
    for i in range(n_layer):
        ex[f"past_key_values.{i}.key"] = _kv_example(B, heads, L, hd, gen)
        ex[f"past_key_values.{i}.value"] = _kv_example(B, heads, L, hd, gen)
    return ex


def _examples(graph: Graph, module, target, drafter, L: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    tc = target.config
    if graph in (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY):
        return _step_example(tc.vocab_size, tc.n_layer, tc.kv_heads, tc.head_dim, L, 2, 3, g,
                             prefill=graph is Graph.TARGET_PREFILL)
    if graph is Graph.DRAFTER_PROJECT:
        return dict(taps=torch.randn(2, 3, 3 * tc.dim, generator=g))
    if graph is Graph.DRAFTER_STEP:
        dc = drafter.config
        ex = _step_example(tc.vocab_size, 1, dc.n_head, dc.head_dim, L, 2, 3, g, prefill=False)
        ex["hidden_in"] = torch.randn(2, 3, dc.hidden, generator=g)
        return {n: ex[n] for n in module.spec.input_names}
    if graph is Graph.GASV:
        from .onnx import gasv_params

        K, N = module.w_tilde.shape[0], 5
        logits = 3 * torch.randn(N, K, generator=g)
        kth = torch.topk(logits[2], max(1, K // 2)).values[-1]   # one top-k filtered row (-inf off support)
        logits[2] = logits[2].masked_fill(logits[2] < kth, float("-inf"))
        # a tree: node 0 is the root (parent -1), every other node's parent comes before it
        parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, N)])
        return dict(guided_logits=logits, node_tokens=torch.randint(0, K, (N,), generator=g),
                    node_parents=parents, gasv_params=gasv_params(module._cfg))
    if graph is Graph.VQ_DECODE:
        n = module.vq.config.n_embed
        return dict(image_tokens=torch.randint(0, n, (2,) + module.latent, generator=g))
    raise KeyError(graph)


def validate_onnx(module: _NamedGraph, path: Path, example: dict, tol: float = _TOL) -> dict:
    """Run the graph with ONNX Runtime (CPU) and compare every output with the torch module.

    Returns {"max_abs": .., "max_rel": .., "outputs": {name: max abs diff}}; raises ExportError
    when an output differs by more than `tol` relative to the reference's largest magnitude."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = {n: example[n].numpy() for n in module.spec.input_names}
    got = sess.run(module.spec.output_names, feeds)
    with torch.no_grad():
        ref = module(*[example[n].clone() for n in module.spec.input_names])
    report, worst = {}, 0.0
    for name, a, b in zip(module.spec.output_names, got, ref):
        b = b.detach().float().numpy()
        if a.shape != b.shape:
            raise ExportError(f"{path.name}: output {name} has shape {a.shape}, torch gives {b.shape}")
        d = float(np.abs(a.astype(np.float32) - b).max()) if a.size else 0.0
        rel = d / max(1.0, float(np.abs(b).max()) if b.size else 1.0)
        report[name] = d
        worst = max(worst, rel)
    if worst > tol:
        bad = max(report, key=report.get)
        raise ExportError(f"{path.name} does not match PyTorch: {bad} differs by {report[bad]:.3g} (tolerance {tol})")
    return {"max_abs": max(report.values()), "max_rel": worst, "outputs": report}


# ----------------------------------------------------------------------------- bundle

def export_chameleon(target, drafter, tables, vq, tokenizer_dir, out_dir, *, image_size: int,
                     max_prompt: int = DEFAULT_MAX_PROMPT, max_tree: int = DEFAULT_MAX_TREE,
                     opset: int = DEFAULT_OPSET, generation: Optional[dict] = None, validate: bool = True) -> dict:
    """Export a Chameleon-family engine directory (see module docstring); returns its manifest.

    Args:
        target: ChameleonTarget (fp32, eval) loaded from an HF directory.
        drafter: its ChameleonDrafter, or None.
        tables: image-code GASVTables (calibrate_chameleon / load_chameleon_tables), or None.
        vq: ChameleonVQGAN, or None (no pixels, tokens only at run time).
        tokenizer_dir: folder with tokenizer.json (+ tokenizer_config.json): the checkpoint dir.
        out_dir: destination (replaced atomically if it is an engine directory).
        image_size: the image size the engines serve (fixes the span length and the cache).
        max_prompt: most prompt tokens (caption template included) a run may use.
        max_tree: most draft-tree nodes verified per step.
        generation: default settings recorded for `lisa-trt run` (cfg_scale, top_k, ...).
    """
    from ..calibration.chameleon_tables import CodeVocab
    from ..calibration.tables import save_tables, target_hash_of
    from ..io import write_json
    from ..models.checkpoints import target_hash
    from ..speculative.lumina import LuminaTokenizer
    from .manifest import file_sha256

    if opset < 23:
        raise InputError(f"opset {opset} is too old: the graphs use ONNX Attention (opset >= 23)")
    tokenizer_dir = Path(tokenizer_dir)
    tok = LuminaTokenizer(tokenizer_dir)
    th = target_hash(target)
    if drafter is not None and drafter.config.target_hash not in ("", None, th):
        raise ArtifactMismatchError(f"the drafter was trained for target {drafter.config.target_hash}, not {th}")
    if tables is not None:
        vocab = CodeVocab.for_target(target, tok.newline)
        if tables.target_hash not in ("", None, target_hash_of(target)) or tables.vocab_size != vocab.K:
            raise ArtifactMismatchError("the tables were calibrated for another target or code vocabulary; "
                                        "re-run calibrate_chameleon for this target")
        if tables.w_tilde is None:
            w = target.lm_head.weight.detach()
            tables = tables.bind(w[vocab.code_ids.to(w.device)])
    L = engine_cache_len(image_size, max_prompt, max_tree)
    if L > target.config.max_position_embeddings + max_tree:
        raise InputError(f"a {image_size}px image with a {max_prompt}-token prompt needs {L} cache slots; this "
                         f"checkpoint has max_position_embeddings {target.config.max_position_embeddings}")
    target = target.eval()
    builders = [(Graph.TARGET_PREFILL, lambda: ChameleonStepGraph(target, True)),
                (Graph.TARGET_VERIFY, lambda: ChameleonStepGraph(target, False))]
    if drafter is not None:
        drafter = drafter.eval()
        builders += [(Graph.DRAFTER_PROJECT, lambda: DrafterProjectGraph(drafter)),
                     (Graph.DRAFTER_STEP, lambda: DrafterStepGraph(drafter))]
    if tables is not None:
        def gasv_module():
            m = GASVGraph(tables)
            m._cfg = tables.config
            return m
        builders.append((Graph.GASV, gasv_module))
    if vq is not None:
        lat = latent_grid(image_size)
        builders.append((Graph.VQ_DECODE, lambda: ChameleonVQGraph(vq.eval(), lat)))

    graphs = {}
    with staging_dir(Path(out_dir)) as tmp:
        for graph, build in builders:
            t0 = time.perf_counter()
            module = build()
            example = _examples(graph, module, target, drafter, L, seed=0)
            with _export_mode(target, drafter):
                onnx_from_torch(module, example, tmp / graph.filename, opset=opset)
                entry = {"file": graph.filename, "sha256": file_sha256(tmp / graph.filename),
                         "export_seconds": round(time.perf_counter() - t0, 2)}
                if validate:
                    entry["validation"] = validate_onnx(module, tmp / graph.filename,
                                                        _examples(graph, module, target, drafter, L, seed=1))
            graphs[graph.value] = entry
        for name in ("config.json",) + TOKENIZER_FILES:
            src = Path(getattr(target, "source_dir", "") or tokenizer_dir) / name
            if not src.is_file():
                src = tokenizer_dir / name
            if src.is_file():
                shutil.copyfile(src, tmp / name)
        if not (tmp / "config.json").is_file():
            raise InputError("the target has no source directory with config.json; load it with lisa_trt.load_target(DIR)")
        if tables is not None:
            save_tables(replace(tables, w_tilde=None), tmp / "tables.safetensors")
        man = {"kind": ENGINE_KIND, "schema_version": SCHEMA_VERSION, "family": "chameleon",
               "precision": "fp32", "opset": opset, "image_size": int(image_size), "max_prompt": int(max_prompt),
               "max_tree": int(max_tree), "max_cache_len": L, "target_hash": th, "graphs": graphs,
               "drafter": None if drafter is None else {"config": drafter.config.to_dict(),
                                                        "max_positions": drafter.max_positions},
               "tables": None if tables is None else {"file": "tables.safetensors", "vocab_size": tables.vocab_size,
                                                      "config": tables.config.to_dict()},
               "vq": None if vq is None else {"n_embed": vq.config.n_embed, "downsample": vq.config.downsample,
                                              "latent": list(latent_grid(image_size))},
               "generation": dict(generation or {})}
        write_json(tmp / ENGINE_FILE, man)
    return man


def is_chameleon_engine(path) -> bool:
    """True when `path` is a Chameleon-family engine directory (export.manifest.bundle_family);
    False for a LlamaGen one and for a directory that is no engine directory at all.

    A thin wrapper kept for cli.py; new code calls bundle_family."""
    from .manifest import bundle_family

    try:
        return bundle_family(path) == "chameleon"
    except InputError:
        return False
