"""Generic engines over any backend's graph runners (engines/base.py), and `load_engines`.

`GraphTarget` / `GraphDrafter` are drop-in replacements for the torch `Transformer` / `Drafter`
(same methods, shapes, KVCache / DrafterCache objects), `GraphGASV` for `gasv_gates`, `GraphVQ`
for `VQModel.decode_code` and `tokens_to_pixels`. They speak tensor names from models/io_spec.py
only; everything backend-specific (sessions, contexts, address binding) lives in the runner.

    engines = load_engines("engines/demo", "ort", threads=1)
    cache = engines.target.new_cache(2, extra=32)
    out = engines.target.prefill(cond, cache, taps=True)
    engines.close()                                   # or: with load_engines(...) as engines:

KV caches are preallocated at the engines' static length (`new_cache`) and updated in place: each
layer's buffer is a read-only `past_key_values.{i}.*` input, the graph returns the call's new rows
as `present.{i}.*`, and `_KVEngine._run_kv` commits them at the call's slots (one path for every
backend; no step writes a slot it did not change).

Thread safety: runners keep per-graph bindings, so one engine set must not be called from two
threads at once; serialise calls or open one set per worker.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import NamedTuple, Optional

import torch

from ..config import find_multiple
from ..errors import InputError
from ..models.io_spec import Graph
from ..models.family import family_of
from .base import GraphRunner, StaticTensors, check_static_len, get_backend, torch_dtype


def check_tokens(tokens: torch.Tensor, vocab: int) -> None:
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise InputError(f"image token ids must lie in [0, {vocab}); got {int(tokens.min())}..{int(tokens.max())}")


def check_positions(positions: torch.Tensor, seq_len: int) -> None:
    if positions.numel() and int(positions.max()) >= seq_len:
        raise InputError(f"position {int(positions.max())} is past the end of the image (sequence length {seq_len})")


def check_step(tokens, positions, slots, mask, batch: int, max_len: int, vocab: int, seq_len: int) -> None:
    """Shapes, then the torch models' value checks (token ids, positions) plus slot bounds."""
    B, S = tokens.shape
    if positions.shape != (B, S) or slots.shape != (B, S) or tuple(mask.shape) != (B, S, max_len):
        raise InputError(f"tokens {tuple(tokens.shape)}, positions {tuple(positions.shape)}, slots "
                         f"{tuple(slots.shape)} and mask {tuple(mask.shape)} do not fit (B, S), (B, S), (B, S), "
                         f"(B, S, Lmax={max_len})")
    if B != batch:
        raise InputError(f"batch {B} does not match the cache batch {batch}")
    if not tokens.numel():
        return
    t_lo, t_hi, p_hi, s_lo, s_hi = torch.stack([tokens.min(), tokens.max(), positions.max(), slots.min(),
                                                slots.max()]).tolist()  # one host sync
    if t_lo < 0 or t_hi >= vocab:
        check_tokens(tokens, vocab)
    if p_hi >= seq_len:
        check_positions(positions, seq_len)
    if s_lo < 0 or s_hi >= max_len:
        raise InputError(f"cache slots must lie in [0, {max_len}); got {s_lo}..{s_hi}")


def _contig(t: torch.Tensor, dtype, device) -> torch.Tensor:
    return t.to(device=device, dtype=dtype).contiguous()


class _KVEngine:
    """Shared state of the cache-owning engines: dtype, device, static length, the bound caches."""

    def __init__(self, manifest, runners: dict):
        self.manifest = manifest
        self.runners = runners
        self.max_cache_len = manifest.max_cache_len
        self.dtype = torch_dtype("act", manifest.precision)
        self.device = next(iter(runners.values())).device
        self._checked: dict = {}
        self._static: dict = {}  # id(runner) -> StaticTensors of the cache bound last

    def close(self) -> None:
        for r in self.runners.values():
            r.close()

    def _release(self) -> None:
        """Forget the bound / checked cache buffers (a new cache is about to be made), so that an
        old cache is not kept alive by its binding; a cache still in use is rebound on its next call."""
        self._static.clear()
        self._checked.clear()
        for r in self.runners.values():
            release = getattr(r, "release_static", None)
            if release is not None:
                release()

    def _check_cache(self, cache, shape: tuple, what: str) -> None:
        """Buffers made by this engine's new_cache (checked again only when they change)."""
        bufs = cache.k + cache.v
        seen = self._checked.get(what)  # the buffers checked last (by identity: no per-step cost)
        if seen is not None and len(seen) == len(bufs) and all(a is b for a, b in zip(seen, bufs)):
            return
        key = tuple(bufs)
        for buf in bufs:
            if tuple(buf.shape) != shape or buf.dtype != self.dtype or buf.device != self.device \
                    or not buf.is_contiguous():
                raise InputError(f"{what} cache buffer {tuple(buf.shape)} {buf.dtype} on {buf.device} does not fit "
                                 f"the engine ({shape} {self.dtype} on {self.device}, contiguous); make it with the "
                                 "engine's new_cache")
        self._checked[what] = key

    def _step_inputs(self, tokens, positions, slots, mask) -> dict:
        dev = self.device
        return dict(input_ids=_contig(tokens, torch.int64, dev), position_ids=_contig(positions, torch.int64, dev),
                    cache_slots=_contig(slots, torch.int64, dev), attention_mask=_contig(mask, torch.bool, dev))

    def _run_kv(self, runner: GraphRunner, cache, n_layer: int, inputs: dict, outputs: dict) -> dict:
        """Run with the cache as a read-only input, then commit the graph's new rows (present.*)
        into the cache at the call's slots (`cache_slots`; a prefill without them: 0..T-1), S rows
        per layer (models/layers.commit_rows): the only cache write of a call, on every backend.

        The cache buffers travel as one StaticTensors per (runner, cache buffers), so a backend
        binds them once per cache and then only the per-step tensors."""
        from ..models.layers import commit_rows

        bufs = cache.k + cache.v
        st = self._static.get(id(runner))
        if st is None or len(st.key) != len(bufs) or any(a is not b for a, b in zip(st.key, bufs)):
            past = {f"past_key_values.{i}.{part}": b[i] for i in range(n_layer)
                    for part, b in (("key", cache.k), ("value", cache.v))}
            st = self._static[id(runner)] = StaticTensors(past, {}, key=tuple(bufs))
        out = runner.run_static(inputs, outputs, st)
        slots = inputs.get("cache_slots")
        for i in range(n_layer):
            for part, b in (("key", cache.k), ("value", cache.v)):
                rows = out[f"present.{i}.{part}"]
                if slots is None:
                    B, _, T, _ = rows.shape
                    slots = torch.arange(T, device=rows.device)[None, :].expand(B, T)
                commit_rows(b[i], rows, slots.to(b[i].device))
        return out


class GraphTarget(_KVEngine):
    """The target over a backend's prefill + verify runners (TargetEngine protocol).

    Args:
        manifest: the engine directory's Manifest.
        runners: {Graph.TARGET_PREFILL: runner, Graph.TARGET_VERIFY: runner}, or the verify
            runner alone when the bundle's verify graph embeds the condition ids
            (ExportFamily.bundle_prefill_ids): the prefill is then one verify call (the prefill
            graph's positions, slots and mask, made here) and its last position's outputs.
    """

    def __init__(self, manifest, runners: dict):
        super().__init__(manifest, runners)
        self.config = manifest.target_config
        self.family = family_of(self.config)
        self.hash = manifest.target_hash
        self._prefill = runners.get(Graph.TARGET_PREFILL)
        self._verify = runners[Graph.TARGET_VERIFY]
        self._xf = manifest.export_family
        self._prefill_ids = None if self._prefill is not None else self._xf.bundle_prefill_ids(manifest)
        if self._prefill is None and self._prefill_ids is None:
            raise InputError(f"{manifest.dir}: its verify graph cannot run the prefill (exported before one target "
                             "graph served both); open it with the target_prefill graph, or re-export it with "
                             "`lisa-trt export`")
        # the verify engine's seq capacity (a "prefill" profile may exceed the cache's tree slots)
        self.max_tree = min(getattr(self._verify, "seq_capacity", manifest.max_tree), manifest.max_tree)
        self._uncond = None
        if "conditions" in (manifest.files or {}):  # the null caption (t2i) shipped in the bundle
            from ..io import load_safetensors

            self._uncond = load_safetensors(Path(manifest.dir) / manifest.files["conditions"])[0]["uncond_embedding"]

    def check_cond(self, cond) -> int:
        return self.family.check_cond(self.config, cond)

    def null_cond(self, cond):
        return self.family.null_cond(self.config, cond, self._uncond)

    def prompt_len(self, cond) -> int:
        return self.config.cond_dims()["prefix"]  # the fixed condition prefix (TargetShape.cond_dims)

    def new_cache(self, batch: int, extra: int = 0, dtype=None, *, prompt_len=None, n_tokens=None):
        """A KVCache of the engines' static length (>= round_up(seq_len + extra, 8)); prompt_len /
        n_tokens (the generic loops pass them) are implied by the config."""
        from ..models.layers import KVCache

        need = find_multiple(self.config.seq_len + extra, 8)
        check_static_len(need, self.max_cache_len, f"a cache with {extra} extra slots",
                         f"re-export with a larger --max-tree (exported with max_tree {self.manifest.max_tree}) "
                         "or use a smaller tree budget")
        if dtype is not None and dtype != self.dtype:
            raise InputError(f"the engines' KV cache is {self.dtype}; cannot make a {dtype} cache")
        self._release()
        return KVCache(self.config, batch, self.max_cache_len, self.dtype, self.device)

    def _cache_ok(self, cache) -> None:
        cfg = self.config
        self._check_cache(cache, (cache.batch, cfg.kv_heads, self.max_cache_len, cfg.head_dim), "target")

    def prefill(self, cond, cache, taps: bool = False):
        """Write the condition prefix into the cache; logits of the last prefix position."""
        from ..models.layers import TargetOutput

        B = self.check_cond(cond)
        if B != cache.batch:
            raise InputError(f"condition batch {B} does not match the cache batch {cache.batch}")
        self._cache_ok(cache)
        if self._prefill is None:
            return self._prefill_verify(cond, cache, taps)
        inputs = self.family.cond_inputs(self.config, cond, self.device, self.dtype)
        out = self._run_kv(self._prefill, cache, self.config.n_layer, inputs, {})
        T = self.prompt_len(cond)
        cache.col_valid[:] = True
        cache.col_valid[:, :T] = out["prefix_valid"].to(cache.col_valid.device)
        cache.lengths.fill_(T)
        return TargetOutput(out["logits"], out["taps"] if taps else None, out["hidden"])

    def _prefill_verify(self, cond, cache, taps: bool):
        """The prefill as one verify call over the condition's ids: slots and positions 0..T-1,
        the prefill graph's mask ((causal & valid) | eye, nothing past T), the outputs of the
        last prefix position."""
        from ..models.layers import TargetOutput

        ids, valid = self._xf.prefill_tokens(self.config, cond, self._prefill_ids)
        B, T = ids.shape
        ar = torch.arange(T)
        mask = torch.zeros(B, T, self.max_cache_len, dtype=torch.bool)
        mask[:, :, :T] = ((ar[None, :] <= ar[:, None])[None] & valid[:, None, :]) | (ar[None, :] == ar[:, None])[None]
        pos = ar[None, :].expand(B, T)
        out = self._run_kv(self._verify, cache, self.config.n_layer, self._step_inputs(ids, pos, pos, mask), {})
        cache.col_valid[:] = True
        cache.col_valid[:, :T] = valid.to(cache.col_valid.device)
        cache.lengths.fill_(T)
        last = {k: out[k][:, -1:] if T > 1 else out[k] for k in ("logits", "taps", "hidden")}
        return TargetOutput(last["logits"], last["taps"] if taps else None, last["hidden"])

    def forward_tokens(self, tokens, positions, slots, mask, cache, taps: bool = False):
        """New tokens at absolute `positions`, K/V written at cache `slots` (see Transformer)."""
        from ..models.layers import TargetOutput

        cfg = self.config
        check_step(tokens, positions, slots, mask, cache.batch, self.max_cache_len, cfg.vocab_size, cfg.seq_len)
        self._cache_ok(cache)
        out = self._run_kv(self._verify, cache, cfg.n_layer, self._step_inputs(tokens, positions, slots, mask), {})
        return TargetOutput(out["logits"], out["taps"] if taps else None, out["hidden"])


class GraphDrafter(_KVEngine):
    """The EAGLE-3 drafter over a backend's project + step runners (DrafterEngine protocol)."""

    def __init__(self, manifest, runners: dict):
        super().__init__(manifest, runners)
        self.config = manifest.drafter_config
        if self.config is None:
            raise InputError(f"{manifest.dir} has no drafter graphs; export with a drafter")
        self.hash = manifest.drafter["hash"]
        self.max_positions = self.config.n_positions  # rows of its RoPE table (1-D: the target's positions)
        self._project = runners[Graph.DRAFTER_PROJECT]
        self._step = runners[Graph.DRAFTER_STEP]
        self._commit = runners.get(Graph.DRAFTER_COMMIT)  # optional (bundles before it lack it)

    @property
    def fused_commit(self) -> bool:
        """True when `commit` runs fc + step as one engine call (the drafter_commit graph)."""
        return self._commit is not None

    def new_cache(self, batch: int, max_len: int, dtype=None):
        from ..models.drafter import DrafterCache

        check_static_len(find_multiple(max_len, 8), self.max_cache_len, f"a drafter cache of {max_len} slots")
        if dtype is not None and dtype != self.dtype:
            raise InputError(f"the engines' drafter cache is {self.dtype}; cannot make a {dtype} cache")
        self._release()
        return DrafterCache(self.config, batch, self.max_cache_len, self.dtype, self.device)

    def project_taps(self, taps: torch.Tensor) -> torch.Tensor:
        """fc on the target taps: (B, S, 3H_t) -> (B, S, hidden)."""
        return self._project.run(dict(taps=_contig(taps, self.dtype, self.device)), ["hidden"])["hidden"]

    def forward(self, hidden_in, tokens, positions, slots, mask, cache):
        """One drafter step; returns (logits (B, S, V) fp32, hidden_out (B, S, hidden))."""
        cfg = self.config
        check_step(tokens, positions, slots, mask, cache.batch, self.max_cache_len, cfg.vocab_size, self.max_positions)
        self._check_cache(cache, (cache.batch, cfg.n_head, self.max_cache_len, cfg.head_dim), "drafter")
        inputs = dict(hidden_in=_contig(hidden_in, self.dtype, self.device),
                      **self._step_inputs(tokens, positions, slots, mask))
        out = self._run_kv(self._step, cache, 1, inputs, {})
        return out["logits"], out["hidden"]

    __call__ = forward

    def commit(self, taps, tokens, positions, slots, mask, cache):
        """`forward(project_taps(taps), ...)`: one engine call with the drafter_commit graph,
        two (project, step) without it. Returns (logits (B, S, V) fp32, hidden_out (B, S, hidden))."""
        if self._commit is None:
            return self.forward(self.project_taps(taps), tokens, positions, slots, mask, cache)
        cfg = self.config
        check_step(tokens, positions, slots, mask, cache.batch, self.max_cache_len, cfg.vocab_size, self.max_positions)
        self._check_cache(cache, (cache.batch, cfg.n_head, self.max_cache_len, cfg.head_dim), "drafter")
        inputs = dict(taps=_contig(taps, self.dtype, self.device), **self._step_inputs(tokens, positions, slots, mask))
        out = self._run_kv(self._commit, cache, 1, inputs, {})
        return out["logits"], out["hidden"]


_NO_STATIC = StaticTensors({}, {})  # GASV calls go through run_static: names checked once, shapes cached


class GraphGASV:
    """The GASV graph, GASV v2 per-node gates (docs/spec/lisa.md steps 1-4):
    (guided logits (N, V), node tokens (N,), node parents (N,), cfg) -> GASVGates, as
    `speculative.gasv.gasv_gates` computes them.

    `cfg` (GASVConfig) defaults to the constants recorded at export; any may be overridden
    per call (they are a graph input). Inputs and outputs go by io_spec names: a changed GASV
    graph I/O changes this class only, never a runner.
    """

    def __init__(self, manifest, runner: GraphRunner):
        self.config = manifest.gasv_config
        if self.config is None:
            raise InputError(f"{manifest.dir} has no GASV graph; export with --tables")
        self.runners = {Graph.GASV: runner}
        self._run = runner
        self.device = runner.device
        self.vocab_size = manifest.tables["vocab_size"]
        self._param_cache: dict = {}

    def close(self) -> None:
        self._run.close()

    def _params(self, cfg) -> torch.Tensor:
        """cfg.params on the engine's device, made once per config (frozen dataclass: hashable)."""
        cache = self.__dict__.setdefault("_param_cache", {})  # (subclasses may skip __init__)
        hit = cache.get(cfg)
        if hit is None:
            if len(cache) > 64:
                cache.clear()
            hit = cache[cfg] = cfg.params(self.device)
        return hit

    def __call__(self, logits, tokens, parents, cfg=None):
        from ..models.io_spec import GASV_K
        from ..speculative.gasv import GASVGates, check_logits

        if not bool(torch.isfinite(logits.amax(-1)).all()):  # NaN / +inf / an empty row: say which
            check_logits(logits)
        cfg = cfg or self.config
        if logits.shape[1] != self.vocab_size:
            raise InputError(f"GASV tables are for vocabulary {self.vocab_size}, logits have {logits.shape[1]}")
        if cfg.scope != "neighbours" or cfg.neighbours > GASV_K:
            raise InputError(f"the GASV graph gates the first {GASV_K} codebook neighbours (scope 'neighbours'); "
                             f"got scope {cfg.scope!r}, neighbours {cfg.neighbours}: use the torch backend")
        dev = self.device
        out = self._run.run_static(dict(guided_logits=logits.to(device=dev, dtype=torch.float32).contiguous(),
                                        node_tokens=tokens.to(device=dev, dtype=torch.int64).contiguous(),
                                        node_parents=parents.to(device=dev, dtype=torch.int64).contiguous(),
                                        gasv_params=self._params(cfg)), {}, _NO_STATIC)
        k = cfg.neighbours
        return GASVGates(out["p"], out["delta_eff"], out["cand"][:, :k], out["gate"][:, :k])

class GraphVQ:
    """The VQ decoder graph: token ids (B, h*w) -> images (B, 3, H, W) in about [-1, 1]."""

    def __init__(self, manifest, runner: GraphRunner):
        self.config = manifest.vq_config
        self.grid = manifest.target_config.grid_size
        self.runners = {Graph.VQ_DECODE: runner}
        self._run = runner
        self.device = runner.device

    def close(self) -> None:
        self._run.close()

    def tokens_to_pixels(self, tokens: torch.Tensor) -> torch.Tensor:
        """Codes (B, h*w) or (B, h, w) -> images (decode_code): the family hook's decoder call."""
        if torch.is_tensor(tokens) and tokens.dim() == 3:
            tokens = tokens.reshape(tokens.shape[0], -1)
        return self.decode_code(tokens)

    def decode_code(self, indices, shape=None):
        B, N = indices.shape
        if N != self.grid * self.grid:
            raise InputError(f"expected {self.grid * self.grid} tokens per image, got {N}")
        check_tokens(indices, self.config.codebook_size)
        return self._run.run(dict(image_tokens=_contig(indices, torch.int64, self.device)), ["images"])["images"]


class Engines(NamedTuple):
    """Every engine of one directory for one backend (None where the graph was not exported).

    `tables`: the bundle's GASVTables (unbound: LANTERN neighbours, GASV constants) when a family's
    own engine module opens them with the graphs (engines/prompt_graph.py); None otherwise."""

    target: GraphTarget
    drafter: Optional[GraphDrafter]
    gasv: Optional[GraphGASV]
    vq: Optional[GraphVQ]
    manifest: object
    backend: str = "?"
    tables: Optional[object] = None

    def close(self) -> None:
        """Close every runner (sessions, contexts)."""
        for e in (self.target, self.drafter, self.gasv, self.vq):
            if e is not None:
                e.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_graphs(man, backend: str, **options):
    """(the checked Backend, open(*graphs) -> {graph: runner}) for an engine directory's Manifest:
    each graph opened with its family's io spec and the export's static axes (export/families.py)."""
    be = get_backend(backend)(man, **options)
    be.check()
    dims = man.dims

    def open_(*graphs):
        return {g: be.open(g, man.spec(g), dims) for g in graphs}

    return be, open_


# Runner options that no longer exist, with why and what to do instead (refused before any work).
REMOVED_OPTIONS = {
    "kv_binding": "the v2 graphs (io spec v2) return only each call's new K/V rows and the runner commits them "
                  "into its one cache in place, so there is no KV binding to choose. Leave it out; a bundle "
                  "exported before io spec v2 must be re-exported with `lisa-trt export`.",
}


def refuse_removed_options(options: dict) -> None:
    """Raise InputError naming a removed runner option in `options` (e.g. kv_binding) and what to do."""
    for name in sorted(set(options) & set(REMOVED_OPTIONS)):
        raise InputError(f"the {name} option was removed: {REMOVED_OPTIONS[name]}")


def load_engines(engine_dir, backend: str = "ort", *, target_hash: Optional[str] = None,
                 drafter_hash: Optional[str] = None, tables_hash: Optional[str] = None, manifest=None,
                 **options) -> Engines:
    """Open every graph of an engine directory with one backend.

    Args:
        engine_dir: directory written by `export_bundle` (and `lisa-trt build` for "trt").
        backend: a name from engines.base.backend_names() ("ort", "trt", "torch", registered ones).
        target_hash / drafter_hash / tables_hash: refuse engines made for other artifacts.
        manifest: the directory's checked Manifest when the caller has read it (read once per open).
        **options: backend options (ORT: providers, threads, spin; TensorRT: device,
            share_memory).
    Returns:
        Engines(target, drafter | None, gasv | None, vq | None, manifest, backend); the drafter
        is a GraphDrafter, or GraphMedusaHeads for a bundle exported with Medusa heads. A
        token-prompt family's directory (its ExportFamily's engines_module) gives its own target
        and VQ classes and the bundle's tables (engines/prompt_graph.py).
    Raises:
        ConfigError (unknown backend), ArtifactMismatchError / CheckpointError (read_manifest),
        the backend's own errors when it cannot run here (e.g. TensorRTUnavailableError);
        InputError for a removed option (REMOVED_OPTIONS: kv_binding).
    """
    refuse_removed_options(options)
    from ..export.manifest import check_manifest, read_manifest

    if manifest is None:
        man = read_manifest(engine_dir, target_hash=target_hash, drafter_hash=drafter_hash, tables_hash=tables_hash)
    else:
        man = manifest
        check_manifest(man, target_hash=target_hash, drafter_hash=drafter_hash, tables_hash=tables_hash)
    own = man.export_family.engines_module  # a family with its own engine classes over the same runners
    if own is not None:
        return importlib.import_module(own).open_engines(man, backend, **options)
    be, open_ = open_graphs(man, backend, **options)
    gasv = vq = None
    target = GraphTarget(man, open_(*be.target_graphs()))  # (verify,) when it runs the prefill too
    drafter = open_drafter(man, be, open_)
    if man.has(Graph.GASV):
        gasv = GraphGASV(man, open_(Graph.GASV)[Graph.GASV])
    if man.has(Graph.VQ_DECODE):
        vq = GraphVQ(man, open_(Graph.VQ_DECODE)[Graph.VQ_DECODE])
    return Engines(target, drafter, gasv, vq, man, backend)


def open_drafter(man, be, open_):
    """The drafter of a bundle (every family): a GraphDrafter over the EAGLE-3 drafter graphs (with the
    fused commit graph when the backend opens it), GraphMedusaHeads for a Medusa bundle, or None.

    be, open_: what `open_graphs(man, backend, ...)` returned."""
    if man.has(Graph.DRAFTER_STEP):
        optional = [g for g in (Graph.DRAFTER_COMMIT,) if be.can_open(g)]
        return GraphDrafter(man, open_(Graph.DRAFTER_PROJECT, Graph.DRAFTER_STEP, *optional))
    if man.has(Graph.MEDUSA_HEADS):  # a Medusa bundle: its heads are the drafter (engines/medusa_graph.py)
        from .medusa_graph import GraphMedusaHeads

        return GraphMedusaHeads(man, open_(Graph.MEDUSA_HEADS)[Graph.MEDUSA_HEADS])
    return None


__all__ = ["REMOVED_OPTIONS", "Engines", "GraphDrafter", "GraphGASV", "GraphTarget", "GraphVQ", "check_positions",
           "check_step", "check_tokens", "load_engines", "open_drafter", "open_graphs", "refuse_removed_options"]
