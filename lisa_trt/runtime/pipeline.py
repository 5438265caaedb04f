"""The embeddable API: load an engine directory once, generate many times.

    pipe = lisa_trt.Pipeline.from_dir("engines/demo", backend="auto")
    result = pipe.generate(["coffee", 3], seed=0, verify="gasv")
    result.images[0].save("coffee.png"); result.stats[0]["mal"]

Thread safety: a Pipeline owns its engines (ORT sessions / TensorRT contexts) and decodes one
request at a time; `generate` takes an internal lock, so one Pipeline may be shared by the
threads of a service (calls are serialised). For parallel decoding create one Pipeline per
worker (ORT sessions are then independent; on one GPU, prefer batching prompts in one call).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import torch

from ..config import SamplingConfig
from ..errors import InputError
from ..speculative.decode import METHODS, SpecConfig, SpeculativeDecoder
from .prompts import Prompt

BACKENDS = ("auto", "trt", "ort", "torch")
VERIFY = ("vanilla", "greedy", "exact", "lantern", "gasv", "sjd")


@dataclass
class GenerationResult:
    """images: PIL images (one per prompt); tokens (B, N); stats: one dict per prompt."""

    images: list
    tokens: torch.Tensor
    stats: list = field(default_factory=list)


@dataclass
class _Engines:
    target: object
    drafter: object = None
    gasv: object = None  # GASV engine (ORT/TRT graph) or None for the torch reference
    tables: object = None  # GASVTables (torch GASV and LANTERN neighbours)
    vq: object = None  # has decode_code(indices, shape)
    class_names: Optional[list] = None
    generation: dict = field(default_factory=dict)
    backend: str = "torch"
    manifest: object = None


def _tree_budget(generation: dict, backend: str) -> dict:
    """Per-backend tree defaults recorded at export (from the measured cost curve)."""
    trees = generation.get("tree", {})
    return trees.get(backend, trees.get("default", {}))


class Pipeline:
    """Tree speculation + GASV over one set of engines (see module docstring)."""

    def __init__(self, engines: _Engines):
        self._e = engines
        self._lock = threading.Lock()

    # -- construction --------------------------------------------------------------------

    @classmethod
    def from_dir(cls, engine_dir, backend: str = "auto", *, threads: Optional[int] = None) -> "Pipeline":
        """Open an exported engine directory (`lisa-trt export`).

        Args:
            backend: "trt" (built engines, TensorRT + GPU), "ort" (ONNX Runtime), "torch"
                (the bundle's PyTorch weights), or "auto": trt when engines are built and
                TensorRT is usable, else ort.
            threads: intra-op threads for ORT sessions (default: physical cores).
        """
        from .bundle import open_bundle

        if backend not in BACKENDS:
            raise InputError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
        return cls(open_bundle(Path(engine_dir), backend, threads=threads))

    @classmethod
    def from_models(cls, target, drafter=None, tables=None, vq=None, *, class_names=None,
                    generation: Optional[dict] = None) -> "Pipeline":
        """A torch-backend pipeline over in-memory models (no export needed)."""
        return cls(_Engines(target=target, drafter=drafter, tables=tables, vq=vq, class_names=class_names,
                            generation=dict(generation or {}), backend="torch"))

    @property
    def backend(self) -> str:
        return self._e.backend

    @property
    def config(self):
        return self._e.target.config

    @property
    def class_names(self):
        return self._e.class_names

    # -- generation ----------------------------------------------------------------------

    def _cond(self, prompts) -> tuple[torch.Tensor, list]:
        """Class ids / names / Prompt objects -> (class ids (B,), per-prompt overrides)."""
        from .prompts import _class_id

        cfg = self.config
        if cfg.model_type != "c2i":
            raise InputError("t2i pipelines take prompts via `generate_t2i(features, mask)`")
        ids, overrides = [], []
        for p in prompts:
            if isinstance(p, Prompt):
                ids.append(p.class_id)
                overrides.append(dict(seed=p.seed, cfg=p.cfg))
                continue
            cid, err = _class_id(p, cfg.num_classes, self._e.class_names)
            if err:
                raise InputError(err)
            ids.append(cid)
            overrides.append({})
        if not ids:
            raise InputError("no prompts given")
        return torch.tensor(ids, dtype=torch.long), overrides

    def sampling(self, **over) -> SamplingConfig:
        base = {k: v for k, v in self._e.generation.get("sampling", {}).items()
                if k in {f.name for f in dataclasses.fields(SamplingConfig)}}
        base.update({k: v for k, v in over.items() if v is not None})
        return SamplingConfig(**base)

    def spec(self, verify: str, **over) -> SpecConfig:
        tree = _tree_budget(self._e.generation, self._e.backend)
        kw = {**{k: v for k, v in tree.items() if k in ("top_k", "depth", "total_tokens")},
              **{k: v for k, v in over.items() if v is not None}}
        return SpecConfig(method=verify if verify in METHODS else "exact", **kw)

    def generate(self, prompts: Sequence[Union[int, str, Prompt]], *, seed: int = 0, verify: str = "gasv",
                 cfg_scale: Optional[float] = None, temperature: Optional[float] = None,
                 top_k: Optional[int] = None, top_p: Optional[float] = None, greedy: bool = False,
                 batch: bool = False, decode: bool = True, **tree) -> GenerationResult:
        """Generate one image per prompt.

        Args:
            prompts: class ids, class names, or Prompt objects (per-prompt seed / cfg).
            seed: base seed; prompt i uses its own seed or seed + i.
            verify: vanilla | greedy | exact | lantern | gasv | sjd.
            cfg_scale, temperature, top_k, top_p, greedy: override the bundle's defaults.
            batch: decode all prompts in one batched call (same seed stream) instead of one call
                per prompt (per-prompt seeds, reproducible one by one).
            decode: decode tokens to PIL images (needs the VQ decoder).
            tree: top_k / depth / total_tokens overrides of the tree budget (e.g. depth=3), and
                verification knobs (SpecConfig fields): gasv_kappa, gasv_lambda, gasv_delta,
                gasv_neighbours, gasv_scope (None: the tables' values), lantern_delta, lantern_gamma.
        Returns:
            GenerationResult(images, tokens (B, N), stats).
        """
        if verify not in VERIFY:
            raise InputError(f"unknown verification {verify!r}; valid: {', '.join(VERIFY)}")
        cond, overrides = self._cond(prompts)
        tree_kw = {"top_k": tree.pop("tree_top_k", None), "depth": tree.pop("tree_depth", None),
                   "total_tokens": tree.pop("tree_tokens", None), **tree}
        with self._lock:
            if batch:
                s = self.sampling(cfg_scale=cfg_scale, temperature=temperature, top_k=top_k, top_p=top_p,
                                  greedy=greedy or None)
                toks, st = self._run(verify, cond, s, self.spec(verify, **tree_kw), seed)
                tokens, stats = toks, [st] * len(cond)
            else:
                outs, stats = [], []
                for i, (c, ov) in enumerate(zip(cond, overrides)):
                    s = self.sampling(cfg_scale=ov.get("cfg") if ov.get("cfg") is not None else cfg_scale,
                                      temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy or None)
                    sd = ov.get("seed") if ov.get("seed") is not None else seed + i
                    toks, st = self._run(verify, c[None], s, self.spec(verify, **tree_kw), sd)
                    outs.append(toks)
                    stats.append({**st, "seed": sd, "class": int(c)})
                tokens = torch.cat(outs)
            images = self.decode(tokens) if decode else []
        return GenerationResult(images=images, tokens=tokens, stats=stats)

    def _run(self, verify, cond, sampling, spec, seed) -> tuple[torch.Tensor, dict]:
        from ..speculative.autoregressive import generate
        from ..speculative.sjd import sjd_generate

        e = self._e
        t0 = time.perf_counter()
        if verify == "vanilla":
            toks = generate(e.target, cond, seed=seed, **dataclasses.asdict(sampling))
            st = {"mal": 1.0, "target_forwards": e.target.config.block_size, "mean_tvd": 0.0}
        elif verify == "sjd":
            toks, s = sjd_generate(e.target, cond, sampling=sampling, seed=seed)
            st = s.as_dict()
        else:
            if e.drafter is None:
                raise InputError(f"--verify {verify} needs a drafter; this bundle has none (export with --drafter)")
            if verify == "greedy":
                sampling = dataclasses.replace(sampling, greedy=True)
            dec = SpeculativeDecoder(e.target, e.drafter, e.tables, gasv=e.gasv)
            toks, s = dec.generate(cond, sampling=sampling, spec=spec, seed=seed)
            st = s.as_dict()
        st["seconds"] = time.perf_counter() - t0
        st["verify"] = verify
        return toks.cpu(), st

    def decode(self, tokens: torch.Tensor) -> list:
        """Token ids (B, N) -> PIL images."""
        from PIL import Image

        from ..imaging import to_uint8

        vq = self._e.vq
        if vq is None:
            raise InputError("this bundle has no VQ decoder; export with the VQ (or pass decode=False)")
        g = self.config.grid_size
        with torch.no_grad():
            imgs = vq.decode_code(tokens, (tokens.shape[0], vq.config.codebook_embed_dim, g, g))
        return [Image.fromarray(a) for a in to_uint8(imgs.float().cpu())]
