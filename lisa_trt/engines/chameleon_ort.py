"""Graph engines over a Chameleon-family engine directory (export/chameleon_onnx.py), any backend.

The family's part of engines/graph.py: `GraphChameleonTarget` is a drop-in replacement for
`ChameleonTarget` in the generic decode loops (same `new_cache`, `prefill`, `forward_tokens`,
same ChameleonCache objects), and `GraphChameleonVQ` decodes code grids to
pixels. The drafter and the GASV graph are the generic `GraphDrafter` and `GraphGASV`. Runners
come from the backend registry (engines/base.py; ONNX Runtime by default) with the family's io
specs and static axes, and the KV caches are bound in place exactly as for LlamaGen
(`_KVEngine._run_kv`): the cache dtype is the bundle's precision (fp16 bundles: fp16 caches).

    Pipeline.from_dir("engines/lumina", backend="ort").generate(["a red fox"])   # opens these engines
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Optional

import torch

from ..errors import ArtifactMismatchError, CheckpointError, InputError
from ..export.io_spec import Graph
from ..models.prompts import PromptTarget
from .graph import GraphDrafter, GraphGASV, _contig, _KVEngine, check_step, check_tokens, open_graphs

FAMILY = "chameleon"


def read_chameleon_manifest(engine_dir):
    """The Manifest of a Chameleon engine directory, graph files and hashes checked."""
    from ..export.manifest import CHAMELEON_ENGINE_FILE, MANIFEST_NAME, read_manifest

    d = Path(engine_dir)
    if not (d / MANIFEST_NAME).is_file():
        if (d / CHAMELEON_ENGINE_FILE).is_file():
            raise ArtifactMismatchError(f"{d} was exported by an older lisa-trt ({CHAMELEON_ENGINE_FILE}); engine "
                                        f"directories of every family now carry {MANIFEST_NAME}: re-export it with "
                                        "`lisa-trt export --model DIR ...`")
        raise CheckpointError(f"{d} is not a Chameleon engine directory (no {MANIFEST_NAME}); make one with "
                              "`lisa-trt export --model DIR ...` or lisa_trt.export.chameleon_onnx.export_chameleon")
    man = read_manifest(d)
    if man.family != FAMILY:
        raise InputError(f"{d} is a {man.family} engine directory, not a Chameleon-family one; open it with "
                         "lisa_trt.engines.graph.load_engines or Pipeline.from_dir")
    return man


class GraphChameleonTarget(PromptTarget, _KVEngine):
    """The Chameleon target over a backend's prefill + verify runners (drop-in for ChameleonTarget
    in the decode loops: the same condition protocol, models/prompts.PromptTarget)."""

    family = FAMILY

    def __init__(self, manifest, runners: dict):
        super().__init__(manifest, runners)
        self.config = manifest.target_config
        self.hash = manifest.target_hash
        self._prefill = runners[Graph.TARGET_PREFILL]
        self._verify = runners[Graph.TARGET_VERIFY]

    def new_cache(self, batch: int, max_len: Optional[int] = None, dtype=None, *, extra: int = 0,
                  prompt_len: Optional[int] = None, n_tokens: Optional[int] = None):
        """A ChameleonCache of the engines' static length (`max_len`, or prompt_len + n_tokens +
        extra as the generic loops pass them, must fit it)."""
        from ..models.families.chameleon.model import ChameleonCache

        if max_len is None:
            if prompt_len is None or n_tokens is None:
                raise InputError("new_cache needs max_len, or prompt_len and n_tokens")
            max_len = int(prompt_len) + int(n_tokens) + int(extra)
        if max_len > self.max_cache_len:
            raise InputError(f"{max_len} cache slots do not fit the engines' static length {self.max_cache_len}; "
                             "re-export with a larger --max-prompt / --max-tree or a smaller image")
        if dtype is not None and dtype != self.dtype:
            raise InputError(f"the engines' KV cache is {self.dtype}; cannot make a {dtype} cache")
        self._release()
        return ChameleonCache(self.config, batch, self.max_cache_len, self.dtype, self.device)

    def _step(self, runner, tokens, positions, slots, mask, cache, taps: bool):
        from ..models.layers import TargetOutput

        cfg = self.config
        check_step(tokens, positions, slots, mask, cache.batch, self.max_cache_len, cfg.vocab_size,
                   cfg.max_position_embeddings)
        self._check_cache(cache, (cache.batch, cfg.kv_heads, self.max_cache_len, cfg.head_dim), "target")
        out = self._run_kv(runner, cache, cfg.n_layer, self._step_inputs(tokens, positions, slots, mask), {})
        return TargetOutput(out["logits"], out["taps"] if taps else None, out["hidden"])

    def prefill(self, cond, cache, valid: Optional[torch.Tensor] = None, taps: bool = False):
        """A left-padded prompt (B, T) into slots 0..T-1; outputs of its last position.

        cond: the prompt ids (B, T), or the condition forms of `Prompts.of` ((ids, valid), Prompts)."""
        from ..models.prompts import Prompts, prefill_plan

        p = Prompts.of(cond, valid)
        ids, valid = p.ids, p.valid
        slots, pos, mask = prefill_plan(ids, cache, valid)
        out = self._step(self._prefill, ids, pos, slots, mask, cache, taps)
        cache.lengths.fill_(ids.shape[1])
        return out

    def forward_tokens(self, tokens, positions, slots, mask, cache, taps: bool = False):
        """New tokens at RoPE `positions`, K/V written at cache `slots` (see ChameleonTarget)."""
        return self._step(self._verify, tokens, positions, slots, mask, cache, taps)


class GraphChameleonVQ:
    """The VQGAN decoder graph: codes (B, h, w) -> images (B, 3, h*ds, w*ds) in about [-1, 1]."""

    def __init__(self, manifest, runner):
        self.config = manifest.vq_config
        self.n_embed, self.downsample = self.config.n_embed, self.config.downsample
        self.latent = tuple(manifest.layout["latent"])
        self.runners = {Graph.VQ_DECODE: runner}
        self._run = runner
        self.device = runner.device

    def close(self) -> None:
        self._run.close()

    def decode_code(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.dim() != 3 or tuple(codes.shape[1:]) != self.latent:
            raise InputError(f"codes must be (B, {self.latent[0]}, {self.latent[1]}) (the exported latent grid); "
                             f"got shape {tuple(codes.shape)}")
        check_tokens(codes, self.n_embed)
        return self._run.run(dict(image_tokens=_contig(codes, torch.int64, self.device)), ["images"])["images"]


class ChameleonEngines(NamedTuple):
    """Every engine of a Chameleon directory for one backend (engines/graph.Engines' fields first)."""

    target: GraphChameleonTarget
    drafter: Optional[GraphDrafter]
    gasv: Optional[GraphGASV]
    vq: Optional[GraphChameleonVQ]
    manifest: object
    backend: str
    tables: Optional[object]  # GASVTables (unbound: LANTERN neighbours, GASV constants)
    tokenizer: object  # LuminaTokenizer

    def close(self) -> None:
        for e in (self.target, self.drafter, self.gasv, self.vq):
            if e is not None:
                e.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_engines(man, backend: str = "ort", **options) -> ChameleonEngines:
    """The engines of a read Chameleon Manifest (engines/graph.load_engines calls this for the family)."""
    from ..calibration.tables import load_tables
    from ..models.families.chameleon.lumina import LuminaTokenizer

    d = Path(man.dir)
    tables = load_tables(d / man.files["tables"]) if "tables" in (man.files or {}) else None
    if tables is not None and tables.target_hash != man.target_hash:
        raise ArtifactMismatchError(f"{d}/tables.safetensors was made for target {tables.target_hash}, not "
                                    f"{man.target_hash}; re-export the directory")
    _, open_ = open_graphs(man, backend, **options)
    target = GraphChameleonTarget(man, open_(Graph.TARGET_PREFILL, Graph.TARGET_VERIFY))
    drafter = GraphDrafter(man, open_(Graph.DRAFTER_PROJECT, Graph.DRAFTER_STEP)) if man.has(Graph.DRAFTER_STEP) \
        else None
    gasv = GraphGASV(man, open_(Graph.GASV)[Graph.GASV]) if man.has(Graph.GASV) else None
    vq = GraphChameleonVQ(man, open_(Graph.VQ_DECODE)[Graph.VQ_DECODE]) if man.has(Graph.VQ_DECODE) else None
    return ChameleonEngines(target, drafter, gasv, vq, man, backend, tables, LuminaTokenizer(d))


def load_chameleon_engines(engine_dir, providers=None, threads: Optional[int] = None, *, backend: str = "ort",
                           **options) -> ChameleonEngines:
    """Open every graph of a Chameleon engine directory (ONNX Runtime unless `backend` says otherwise).

    providers / threads: ONNX Runtime options; other backends take theirs in **options."""
    man = read_chameleon_manifest(engine_dir)
    if backend == "ort":
        options = dict(options, providers=providers, threads=threads)
    return open_engines(man, backend, **options)


__all__ = ["ChameleonEngines", "GraphChameleonTarget", "GraphChameleonVQ", "load_chameleon_engines", "open_engines",
           "read_chameleon_manifest"]
