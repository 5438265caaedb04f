"""Generic engines over any backend's graph runners (engines/base.py), and `load_engines`.

`GraphTarget` is the graph target every family's engines build on (runners, cache checks, one
forward); `GraphDrafter` and `GraphGASV` are the drafter and the GASV graph of every family. They
are drop-in replacements for the torch target / `Drafter` (same methods, shapes, KVCache /
DrafterCache objects) and for `gasv_gates`, and speak tensor names from models/io_spec.py only;
everything backend-specific (sessions, contexts, address binding) lives in the runner.
`load_engines` opens a directory through the module its family's ExportFamily names
(`engines_module`: the family's GraphTarget subclass and decoder engine, `open_family_engines`).

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

from typing import NamedTuple, Optional

import torch

from ..config import find_multiple
from ..errors import InputError
from ..models.io_spec import Graph
from .base import GraphRunner, StaticTensors, check_static_len, get_backend, torch_dtype


def check_tokens(tokens: torch.Tensor, vocab: int) -> None:
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise InputError(f"image token ids must lie in [0, {vocab}); got {int(tokens.min())}..{int(tokens.max())}")


def check_positions(positions: torch.Tensor, seq_len: int) -> None:
    if positions.numel() and int(positions.max()) >= seq_len:
        raise InputError(f"position {int(positions.max())} is past the end of the image (sequence length {seq_len})")


def check_step(tokens, positions, slots, mask, batch: int, max_len: int, vocab: int, seq_len: int,
               values: bool = True) -> None:
    """Shapes, then (values=True) the torch models' value checks (token ids, positions) plus slot
    bounds: one host read, so the engines ask for them only where data enters (`_KVEngine._entry`)."""
    B, S = tokens.shape
    if positions.shape != (B, S) or slots.shape != (B, S) or tuple(mask.shape) != (B, S, max_len):
        raise InputError(f"tokens {tuple(tokens.shape)}, positions {tuple(positions.shape)}, slots "
                         f"{tuple(slots.shape)} and mask {tuple(mask.shape)} do not fit (B, S), (B, S), (B, S), "
                         f"(B, S, Lmax={max_len})")
    if B != batch:
        raise InputError(f"batch {B} does not match the cache batch {batch}")
    if not values or not tokens.numel():
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
        self._entered: dict = {}  # id(runner) -> the cache buffer whose values it has checked

    def close(self) -> None:
        for r in self.runners.values():
            r.close()

    def _release(self) -> None:
        """Forget the bound / checked cache buffers (a new cache is about to be made), so that an
        old cache is not kept alive by its binding; a cache still in use is rebound on its next call."""
        self._static.clear()
        self._checked.clear()
        self._entered.clear()
        for r in self.runners.values():
            release = getattr(r, "release_static", None)
            if release is not None:
                release()

    def _entry(self, runner, cache) -> bool:
        """Whether this call checks its values (token ids, positions, slots; one host read): the
        first call of `runner` on a cache (where a decode's data enters: its prefill, its first
        step, a cache whose rows changed), and every call under the debug switch
        (validation.debug_checks, LISA_TRT_DEBUG_CHECKS=1). A call that fails its check stays the
        first: the next call on that cache is checked again."""
        from ..validation import debug_checks

        return debug_checks() or self._entered.get(id(runner)) is not cache.k[0]

    def _entered_ok(self, runner, cache) -> None:
        self._entered[id(runner)] = cache.k[0]

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
        of every layer in one write (models/layers.KVCache.commit): the only cache write of a call, on
        every backend.

        The cache buffers travel as one StaticTensors per (runner, cache buffers), so a backend
        binds them once per cache and then only the per-step tensors."""
        bufs = cache.k + cache.v
        st = self._static.get(id(runner))
        if st is None or len(st.key) != len(bufs) or any(a is not b for a, b in zip(st.key, bufs)):
            past = {f"past_key_values.{i}.{part}": b[i] for i in range(n_layer)
                    for part, b in (("key", cache.k), ("value", cache.v))}
            st = self._static[id(runner)] = StaticTensors(past, {}, key=tuple(bufs))
        out = runner.run_static(inputs, outputs, st)
        slots = inputs.get("cache_slots")
        k_rows = [out[f"present.{i}.key"] for i in range(n_layer)]
        if slots is None:
            B, _, T, _ = k_rows[0].shape
            slots = torch.arange(T, device=k_rows[0].device)[None, :].expand(B, T)
        cache.commit(k_rows, [out[f"present.{i}.value"] for i in range(n_layer)], slots.to(cache.k[0].device))
        return out


class GraphTarget(_KVEngine):
    """The graph target every family's engines build on: the prefill + verify runners, the cache
    checks and one forward through `_KVEngine._run_kv` (TargetEngine protocol, with the family's
    subclass answering the condition protocol, `new_cache` and `prefill`).

    Args:
        manifest: the engine directory's Manifest.
        runners: {Graph.TARGET_PREFILL: runner, Graph.TARGET_VERIFY: runner}, or the verify
            runner alone when the bundle's verify graph embeds the condition / prompt ids
            (ExportFamily.bundle_prefill_ids): the prefill is then one verify call.
    Raises:
        `prefill_error` (with `prefill_fix`) when the prefill runner is missing and the verify
        graph cannot run the prefill.
    """

    prefill_error = InputError
    prefill_fix = "open it with the target_prefill graph, or re-export it with `lisa-trt export`"
    max_positions: int = 0  # positions the target's RoPE covers (a subclass sets it from its config)

    def __init__(self, manifest, runners: dict):
        super().__init__(manifest, runners)
        self.config = manifest.target_config
        self.hash = manifest.target_hash
        self._prefill = runners.get(Graph.TARGET_PREFILL)  # None: the prefill is a verify call (prefill_ids)
        self._verify = runners[Graph.TARGET_VERIFY]
        self._xf = manifest.export_family
        self._prefill_ids = None if self._prefill is not None else self._xf.bundle_prefill_ids(manifest)
        if self._prefill is None and self._prefill_ids is None:
            raise self.prefill_error(f"{manifest.dir}: its verify graph cannot run the prefill (exported before one "
                                     f"target graph served both); {self.prefill_fix}")

    def _kv_cache(self, batch: int, dtype=None):
        """A KVCache of the engines' static length (the caller has checked that its slots fit)."""
        from ..models.layers import KVCache

        if dtype is not None and dtype != self.dtype:
            raise InputError(f"the engines' KV cache is {self.dtype}; cannot make a {dtype} cache")
        self._release()
        return KVCache(self.config, batch, self.max_cache_len, self.dtype, self.device)

    def _cache_ok(self, cache) -> None:
        cfg = self.config
        self._check_cache(cache, (cache.batch, cfg.kv_heads, self.max_cache_len, cfg.head_dim), "target")

    def _step(self, runner, tokens, positions, slots, mask, cache, taps: bool, vocab: Optional[int] = None,
              offset: int = 0, last: bool = False):
        """One graph call; `tokens` are checked against `vocab` (default: the head's), then passed as
        offset + id; last: the outputs of the last position only (a prefill through the verify graph)."""
        from ..models.layers import TargetOutput

        cfg = self.config
        entry = self._entry(runner, cache)
        check_step(tokens, positions, slots, mask, cache.batch, self.max_cache_len, vocab or cfg.vocab_size,
                   self.max_positions, values=entry)
        self._cache_ok(cache)
        ids = tokens + offset if offset else tokens
        out = self._run_kv(runner, cache, cfg.n_layer, self._step_inputs(ids, positions, slots, mask), {})
        if entry:  # only a call that ran: one the runner refused (no profile) leaves the next call checked
            self._entered_ok(runner, cache)
        if last and tokens.shape[1] > 1:
            out = {k: out[k][:, -1:] for k in ("logits", "taps", "hidden")}
        return TargetOutput(out["logits"], out["taps"] if taps else None, out["hidden"])

    def forward_tokens(self, tokens, positions, slots, mask, cache, taps: bool = False):
        """New tokens at absolute `positions`, K/V written at cache `slots` (the torch target's protocol)."""
        return self._step(self._verify, tokens, positions, slots, mask, cache, taps)


class GraphDrafter(_KVEngine):
    """The EAGLE-3 drafter over a backend's project + step runners (DrafterEngine protocol)."""

    def __init__(self, manifest, runners: dict, open_project=None):
        super().__init__(manifest, runners)
        self._open_project = open_project  # () -> the drafter_project runner, opened at the first project_taps
        self.config = manifest.drafter_config
        if self.config is None:
            raise InputError(f"{manifest.dir} has no drafter graphs; export with a drafter")
        self.hash = manifest.drafter["hash"]
        self.max_positions = self.config.n_positions  # rows of its RoPE table (1-D: the target's positions)
        self._project = runners.get(Graph.DRAFTER_PROJECT)  # project_taps (drafter_fused's commits do not call it)
        # drafter_fused runs every call (forward and commit, one engine: the drafter's layer once);
        # a bundle exported before it: drafter_step, and drafter_commit when the backend opened it
        self._fused = runners.get(Graph.DRAFTER_FUSED)
        self._step = self._fused if self._fused is not None else runners[Graph.DRAFTER_STEP]
        self._commit = None if self._fused is not None else runners.get(Graph.DRAFTER_COMMIT)
        self._empty: dict = {}  # (batch, width) -> a 0-row input of drafter_fused

    @property
    def fused_commit(self) -> bool:
        """True when `commit` runs fc + step as one engine call (drafter_fused, or an older
        bundle's drafter_commit); False: two calls (drafter_project, drafter_step)."""
        return self._fused is not None or self._commit is not None

    def _no_rows(self, batch: int, width: int) -> torch.Tensor:
        """(batch, 0, width): drafter_fused's input that a call does not use (the taps of an
        expansion, the hidden rows of a commit), a view of a real buffer (a non-null address)."""
        t = self._empty.get((batch, width))
        if t is None:
            t = self._empty[(batch, width)] = torch.zeros(batch, 1, width, dtype=self.dtype, device=self.device)[:, :0]
        return t

    def new_cache(self, batch: int, max_len: int, dtype=None):
        from ..models.drafter import DrafterCache

        check_static_len(find_multiple(max_len, 8), self.max_cache_len, f"a drafter cache of {max_len} slots")
        if dtype is not None and dtype != self.dtype:
            raise InputError(f"the engines' drafter cache is {self.dtype}; cannot make a {dtype} cache")
        self._release()
        return DrafterCache(self.config, batch, self.max_cache_len, self.dtype, self.device)

    def project_taps(self, taps: torch.Tensor) -> torch.Tensor:
        """fc on the target taps: (B, S, 3H_t) -> (B, S, hidden)."""
        if self._project is None and self._open_project is not None:  # beside drafter_fused: only when asked
            self._project = self.runners[Graph.DRAFTER_PROJECT] = self._open_project()
        if self._project is None:
            raise InputError(f"{self.manifest.dir}: the drafter was opened without its drafter_project engine; "
                             "build it (`lisa-trt build --graphs ...,drafter_project`) to project taps on their own")
        return self._project.run(dict(taps=_contig(taps, self.dtype, self.device)), ["hidden"])["hidden"]

    def _check_step(self, runner, tokens, positions, slots, mask, cache) -> bool:
        """check_step of a drafter call; True when it was an entry call (mark it once the call ran)."""
        cfg = self.config
        entry = self._entry(runner, cache)
        check_step(tokens, positions, slots, mask, cache.batch, self.max_cache_len, cfg.vocab_size, self.max_positions,
                   values=entry)
        self._check_cache(cache, (cache.batch, cfg.n_head, self.max_cache_len, cfg.head_dim), "drafter")
        return entry

    def forward(self, hidden_in, tokens, positions, slots, mask, cache):
        """One drafter step; returns (logits (B, S, V) fp32, hidden_out (B, S, hidden))."""
        h = _contig(hidden_in, self.dtype, self.device)
        if self._fused is None:
            return self._call(self._step, dict(hidden_in=h), tokens, positions, slots, mask, cache)
        taps = self._no_rows(h.shape[0], self.manifest.dims["tap_dim"])
        return self._call(self._fused, dict(taps=taps, hidden_in=h), tokens, positions, slots, mask, cache)

    __call__ = forward

    def commit(self, taps, tokens, positions, slots, mask, cache):
        """`forward(project_taps(taps), ...)`: one engine call with drafter_fused (or an older
        bundle's drafter_commit), two (project, step) without them. Returns (logits (B, S, V)
        fp32, hidden_out (B, S, hidden))."""
        runner = self._fused if self._fused is not None else self._commit
        if runner is None:
            return self.forward(self.project_taps(taps), tokens, positions, slots, mask, cache)
        t = _contig(taps, self.dtype, self.device)
        extra = dict(taps=t)
        if runner is self._fused:
            extra["hidden_in"] = self._no_rows(t.shape[0], self.config.hidden)
        return self._call(runner, extra, tokens, positions, slots, mask, cache)

    def _call(self, runner, extra: dict, tokens, positions, slots, mask, cache):
        """One checked drafter call of `runner` with its own inputs `extra` (hidden_in / taps)."""
        entry = self._check_step(runner, tokens, positions, slots, mask, cache)
        out = self._run_kv(runner, cache, 1, dict(extra, **self._step_inputs(tokens, positions, slots, mask)), {})
        if entry:
            self._entered_ok(runner, cache)
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

    _entry = True  # the first call checks its logits (NaN / +inf / empty rows); later calls under debug_checks()

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
        from ..validation import debug_checks

        if self._entry or debug_checks():  # first call, or the debug switch: one host read
            if not bool(torch.isfinite(logits.amax(-1)).all()):  # NaN / +inf / an empty row: say which
                check_logits(logits)
            self._entry = False
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

class GraphDecoder:
    """The base of every family's decoder engine (its VQ decode graph: codes -> images in about
    [-1, 1]): the runner, `close`, and the one checked call `_decode(codes, n_codes)`; a subclass
    shapes the codes (a flat grid, a latent grid) and names its `tokens_to_pixels` / `decode_code`."""

    def __init__(self, manifest, runner: GraphRunner):
        self.config = manifest.vq_config
        self.runners = {Graph.VQ_DECODE: runner}
        self._run = runner
        self.device = runner.device

    def close(self) -> None:
        self._run.close()

    def _decode(self, codes: torch.Tensor, n_codes: int) -> torch.Tensor:
        check_tokens(codes, n_codes)
        return self._run.run(dict(image_tokens=_contig(codes, torch.int64, self.device)), ["images"])["images"]


class Engines(NamedTuple):
    """Every engine of one directory for one backend (None where the graph was not exported).

    `target` / `vq`: the family's classes (a GraphTarget subclass, its decoder's graph engine);
    `tables`: the bundle's GASVTables (unbound: LANTERN neighbours, GASV constants) when the family's
    engines module opens them with the graphs; None otherwise."""

    target: GraphTarget
    drafter: Optional[GraphDrafter]
    gasv: Optional[GraphGASV]
    vq: Optional[object]
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
        Engines(target, drafter | None, gasv | None, vq | None, manifest, backend[, tables]), opened
        by the module the directory's ExportFamily names (`engines_module`: its target and decoder
        classes, open_family_engines); the drafter is a GraphDrafter, or GraphMedusaHeads for a
        bundle exported with Medusa heads.
    Raises:
        ConfigError (unknown backend, a family without an engines module), ArtifactMismatchError /
        CheckpointError (read_manifest),
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
    return man.export_family.open_engines(man, backend, **options)


def open_family_engines(man, backend: str, target_cls, vq_cls, *, tables=None, **options) -> Engines:
    """The Engines of a read Manifest with a family's target and decoder classes: every family's
    engines module (its ExportFamily.engines_module) opens its directories through this.

    Args:
        man: the directory's checked Manifest.
        backend, **options: as for load_engines.
        target_cls: a GraphTarget subclass, built over the backend's target graphs (the verify
            graph alone when it runs the prefill too: Backend.target_graphs).
        vq_cls: the decoder's graph engine, built as vq_cls(man, runner) when the bundle has one.
        tables: the bundle's GASVTables to hand on in Engines.tables (None: the runtime reads them).
    """
    be, open_ = open_graphs(man, backend, **options)
    target = target_cls(man, open_(*be.target_graphs()))
    drafter = open_drafter(man, be, open_)  # the EAGLE-3 drafter graphs or Medusa heads
    gasv = GraphGASV(man, open_(Graph.GASV)[Graph.GASV]) if man.has(Graph.GASV) else None
    vq = vq_cls(man, open_(Graph.VQ_DECODE)[Graph.VQ_DECODE]) if man.has(Graph.VQ_DECODE) else None
    return Engines(target, drafter, gasv, vq, man, backend, tables)


def open_drafter(man, be, open_):
    """The drafter of a bundle (every family): a GraphDrafter over the EAGLE-3 drafter graphs
    (drafter_fused when the backend opens it: every call one engine, drafter_project opened at the
    first `project_taps` only; else
    drafter_project + drafter_step, with an older bundle's drafter_commit when the backend opens
    it), GraphMedusaHeads for a Medusa bundle, or None.

    be, open_: what `open_graphs(man, backend, ...)` returned."""
    if man.has(Graph.DRAFTER_STEP):
        if be.can_open(Graph.DRAFTER_FUSED):  # drafter_fused replaces drafter_step (one copy of the layer)
            optional = Graph.DRAFTER_PROJECT in be.optional_graphs  # TensorRT: only when its engine was built
            lazy = None  # drafter_project (a second copy of the fc) opens at the first project_taps only
            if (be.can_open if optional else man.has)(Graph.DRAFTER_PROJECT):
                def lazy():
                    return open_(Graph.DRAFTER_PROJECT)[Graph.DRAFTER_PROJECT]
            return GraphDrafter(man, open_(Graph.DRAFTER_FUSED), open_project=lazy)
        optional = [g for g in (Graph.DRAFTER_COMMIT,) if be.can_open(g)]
        return GraphDrafter(man, open_(Graph.DRAFTER_PROJECT, Graph.DRAFTER_STEP, *optional))
    if man.has(Graph.MEDUSA_HEADS):  # a Medusa bundle: its heads are the drafter (engines/medusa_graph.py)
        from .medusa_graph import GraphMedusaHeads

        return GraphMedusaHeads(man, open_(Graph.MEDUSA_HEADS)[Graph.MEDUSA_HEADS])
    return None


__all__ = ["REMOVED_OPTIONS", "Engines", "GraphDecoder", "GraphDrafter", "GraphGASV", "GraphTarget", "check_positions", "check_step",
           "check_tokens", "load_engines", "open_drafter", "open_family_engines", "open_graphs",
           "refuse_removed_options"]
