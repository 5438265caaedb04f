"""ONNX Runtime runners over an exported engine directory (engines/base.py protocols).

`OrtTarget` and `OrtDrafter` are drop-in replacements for the torch `Transformer` / `Drafter`:
same methods, same shapes, same KVCache / DrafterCache objects, so the decode loop runs
unchanged. Torch tensors are the array type: inputs and outputs are bound to ONNX Runtime by
address (IO binding), and each layer's K/V buffer is bound as BOTH `past_key_values.{i}.*` and
`present.{i}.*`. The graphs scatter the new rows into that buffer (ScatterElements, which skips
its input->output copy when the two are the same memory), so the caches are preallocated once
(`new_cache`) and updated in place: no per-step cache copy.

Sessions: intra-op threads = physical cores, sequential execution, every graph optimisation,
no thread spinning (several sessions alternate; see `session_options`).
The host-side input checks of the torch models (token ids, positions, condition validity) run
here before each call, with the torch models' own messages.

    engines = load_ort_engines("engines/demo")
    cache = engines.target.new_cache(2, extra=32)
    out = engines.target.prefill(cond, cache, taps=True)

Thread safety: a runner owns one IO binding per graph, so one OrtTarget / OrtDrafter must not be
called from two threads at once. A service loads the engines once and either serialises calls
(a lock around each generation) or opens one set of engines per worker thread.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np
import torch

from ..errors import InputError
from ..export.io_spec import Graph, graph_spec
from ..export.manifest import Manifest, read_manifest
from .base import GraphGASV, GraphVQDecoder, StaticCacheDrafter, StaticCacheTarget

_NP = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.bool: np.bool_}


# ----------------------------------------------------------------------------- sessions

def physical_cores() -> int:
    """Physical cores available to this process (hyper-threads do not help GEMMs)."""
    avail = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        cores, cur = set(), {}
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, v = (s.strip() for s in line.split(":", 1))
                    cur[k] = v
                elif cur:
                    cores.add((cur.get("physical id"), cur.get("core id")))
                    cur = {}
        if cur:
            cores.add((cur.get("physical id"), cur.get("core id")))
        n = len(cores) if None not in {c[1] for c in cores} else avail
    except OSError:
        n = avail
    return max(1, min(n, avail))


def session_options(threads: Optional[int] = None, spin: bool = False, profile: Optional[str] = None):
    """Tuned ORT options: intra-op = physical cores, sequential, graph optimisation ALL.

    Args:
        threads: intra-op threads (default: physical cores).
        spin: let idle intra-op threads spin after each op. Off by default: the runtime
            alternates several sessions (drafter, target) and host torch code on few cores,
            and spinning pools steal the CPU from each other (measured on the 2-core dev box:
            drafter step + verify 7.2 ms without spinning vs 23 ms with it; see
            bench/ort_cost_curve.json "alternating_sessions").
        profile: a file prefix: write ORT's per-node profile (JSON) there (`end_profiling`).
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or physical_cores()
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    so.log_severity_level = 3
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile)
    return so


def default_providers() -> list:
    """CUDA when onnxruntime-gpu and a GPU are present, else CPU."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers() and torch.cuda.is_available():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def make_session(path, providers=None, threads: Optional[int] = None, spin: bool = False,
                 profile: Optional[str] = None):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), session_options(threads, spin, profile),
                                providers=providers or default_providers())


class GraphRunner:
    """One ORT session + a reusable IO binding; torch tensors are bound by address.

    `bind_cache(pairs)` binds each cache buffer as both its past input and its present output
    (in place; rebound only when the buffers change); `run(inputs, outputs)` binds the per-call
    tensors and runs. Outputs are preallocated by the caller, so ORT allocates nothing.
    """

    def __init__(self, path, providers=None, threads: Optional[int] = None, spin: bool = False,
                 profile: Optional[str] = None):
        self.path = Path(path)
        self.session = make_session(path, providers, threads, spin, profile)
        self.device = torch.device("cuda", 0) if self.session.get_providers()[0] == "CUDAExecutionProvider" \
            else torch.device("cpu")
        self._io = self.session.io_binding()
        # The public IOBinding.bind_* rebuild an OrtDevice per call (~10 us each); bind through
        # the underlying C binding with a cached device when this onnxruntime exposes it.
        self._raw = getattr(self._io, "_iobinding", None)
        self._devices: dict = {}
        self._cache_key = None
        self._cache_names: set = set()  # names bound to long-lived buffers (caches, manual binds)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._all_names = set(self.input_names) | set(self.output_names)

    def _bind(self, name: str, t: torch.Tensor, output: bool) -> None:
        dev = t.device
        if self._raw is None:
            args = (name, dev.type, dev.index or 0, _NP[t.dtype], tuple(t.shape), t.data_ptr())
            (self._io.bind_output if output else self._io.bind_input)(*args)
            return
        key = (dev.type, dev.index or 0)
        cdev = self._devices.get(key)
        if cdev is None:
            from onnxruntime.capi.onnxruntime_inference_collection import OrtDevice

            cdev = self._devices[key] = OrtDevice.make(*key)._get_c_device()
        (self._raw.bind_output if output else self._raw.bind_input)(name, cdev, _NP[t.dtype], tuple(t.shape),
                                                                    t.data_ptr())

    def bind(self, name: str, t: torch.Tensor, *, output: bool) -> None:
        """Bind one tensor by address (the caller keeps it alive until the next run returns)."""
        self._bind(name, t, output)
        self._cache_names.add(name)
        self._cache_key = None  # a manual binding may have replaced a cache binding

    def bind_cache(self, pairs: list, check=None) -> None:
        """pairs: [(past name, present name, buffer)]; rebinds only when the buffers changed.

        `check()` (validating the buffers) runs only when they changed.
        """
        key = tuple((b.data_ptr(), b.shape) for _, _, b in pairs)
        if key == self._cache_key:
            return
        if check is not None:
            check()
        for past, present, buf in pairs:
            self._bind(past, buf, output=False)
            self._bind(present, buf, output=True)  # same memory: updated in place
            self._cache_names.update((past, present))
        self._cache_key = key

    def run(self, inputs: dict, outputs: dict) -> None:
        """Bind `inputs` / `outputs` (torch tensors, kept alive by the caller) and run.

        Every graph input and output must be bound now or be a cache/manual binding: a name
        left over from an earlier call would point at memory that may have been freed.
        """
        if set(inputs).union(outputs, self._cache_names) != self._all_names:
            missing = sorted(self._all_names - set(inputs).union(outputs, self._cache_names))
            extra = sorted(set(inputs).union(outputs) - self._all_names)
            raise ValueError(f"{self.path.name}: unbound {missing}, unknown {extra}")
        for name, t in inputs.items():
            self._bind(name, t, output=False)
        for name, t in outputs.items():
            self._bind(name, t, output=True)
        if self.device.type == "cuda":  # ORT runs on its own stream: inputs must be ready
            torch.cuda.current_stream().synchronize()
        self.session.run_with_iobinding(self._io)


def _contig(t: torch.Tensor, dtype, device) -> torch.Tensor:
    return t.to(device=device, dtype=dtype).contiguous()


def check_tokens(tokens: torch.Tensor, vocab: int) -> None:
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise InputError(f"image token ids must lie in [0, {vocab}); got {int(tokens.min())}..{int(tokens.max())}")


def check_positions(positions: torch.Tensor, seq_len: int) -> None:
    if positions.numel() and int(positions.max()) >= seq_len:
        raise InputError(f"position {int(positions.max())} is past the end of the image (sequence length {seq_len})")


def _check_step(tokens, positions, slots, mask, batch: int, max_len: int, vocab: int, seq_len: int) -> None:
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


def _check_cache(cache, shape: tuple, dtype, device, what: str) -> None:
    for buf in cache.k + cache.v:
        if tuple(buf.shape) != shape or buf.dtype != dtype or buf.device != device or not buf.is_contiguous():
            raise InputError(f"{what} cache buffer {tuple(buf.shape)} {buf.dtype} on {buf.device} does not fit the "
                             f"engine ({shape} {dtype} on {device}, contiguous); make it with the engine's new_cache")


# ----------------------------------------------------------------------------- target

class OrtTarget(StaticCacheTarget):
    """The target through ONNX Runtime (TargetEngine protocol; drop-in for `Transformer`).

    Args:
        manifest: the engine directory's Manifest (read_manifest / load_ort_engines).
        providers: ORT execution providers (default: CUDA if available, else CPU).
        threads: intra-op threads per session (default: physical cores).
        spin: allow intra-op thread spinning.
    """

    def __init__(self, manifest: Manifest, *, providers=None, threads: Optional[int] = None, spin: bool = False):
        self.manifest = manifest
        self.config = cfg = manifest.target_config
        self.hash = manifest.target_hash
        self.max_cache_len = manifest.max_cache_len
        self.dtype = torch.float16 if manifest.precision == "fp16" else torch.float32
        self._prefill = GraphRunner(manifest.graph_path(Graph.TARGET_PREFILL), providers, threads, spin)
        self._verify = GraphRunner(manifest.graph_path(Graph.TARGET_VERIFY), providers, threads, spin)
        self.device = self._verify.device
        spec = graph_spec(Graph.TARGET_VERIFY, n_layer=cfg.n_layer)
        self._aliases = list(spec.aliases.items())  # [(present, past)]
        self.load_conditions(manifest)

    def _cache_pairs(self, cache) -> list:
        bufs = []
        for k, v in zip(cache.k, cache.v):
            bufs += [k, v]
        if len(bufs) != len(self._aliases):
            raise InputError(f"the cache has {len(bufs) // 2} layers; the engine has {len(self._aliases) // 2}")
        return [(past, present, buf) for (present, past), buf in zip(self._aliases, bufs)]

    def _bind_cache(self, runner: GraphRunner, cache) -> None:
        cfg = self.config
        shape = (cache.batch, cfg.kv_heads, self.max_cache_len, cfg.head_dim)
        runner.bind_cache(self._cache_pairs(cache),
                          check=lambda: _check_cache(cache, shape, self.dtype, self.device, "target"))

    # -- entry points ---------------------------------------------------------------------

    def _outputs(self, B: int, S: int) -> dict:
        cfg, dev = self.config, self.device
        return dict(logits=torch.empty(B, S, cfg.vocab_size, dtype=torch.float32, device=dev),
                    taps=torch.empty(B, S, 3 * cfg.dim, dtype=self.dtype, device=dev),
                    hidden=torch.empty(B, S, cfg.dim, dtype=self.dtype, device=dev))

    def prefill(self, cond, cache, taps: bool = False):
        """Write the condition prefix into the cache; logits of the last prefix position."""
        inputs, out = self._prefill_io(cond, cache)
        self._bind_cache(self._prefill, cache)
        self._prefill.run(inputs, out)
        return self._prefill_done(cache, out, taps)

    def forward_tokens(self, tokens, positions, slots, mask, cache, taps: bool = False):
        """New tokens at absolute `positions`, K/V written at cache `slots` (see Transformer)."""
        from ..models.llamagen import TargetOutput

        _check_step(tokens, positions, slots, mask, cache.batch, self.max_cache_len, self.config.vocab_size,
                    self.config.seq_len)
        dev = self.device
        inputs = dict(input_ids=_contig(tokens, torch.int64, dev), position_ids=_contig(positions, torch.int64, dev),
                      cache_slots=_contig(slots, torch.int64, dev), attention_mask=_contig(mask, torch.bool, dev))
        B, S = tokens.shape
        out = self._outputs(B, S)
        self._bind_cache(self._verify, cache)
        self._verify.run(inputs, out)
        return TargetOutput(out["logits"], out["taps"] if taps else None, out["hidden"])


# ----------------------------------------------------------------------------- drafter

class OrtDrafter(StaticCacheDrafter):
    """The EAGLE-3 drafter through ONNX Runtime (DrafterEngine protocol; drop-in for `Drafter`).

    Args: as OrtTarget.
    """

    def __init__(self, manifest: Manifest, *, providers=None, threads: Optional[int] = None, spin: bool = False):
        self.manifest = manifest
        self.config = manifest.drafter_config
        if self.config is None:
            raise InputError(f"{manifest.dir} has no drafter graphs; export with a drafter")
        self.hash = manifest.drafter["hash"]
        self.max_cache_len = manifest.max_cache_len
        self.dtype = torch.float16 if manifest.precision == "fp16" else torch.float32
        self._project = GraphRunner(manifest.graph_path(Graph.DRAFTER_PROJECT), providers, threads, spin)
        self._step = GraphRunner(manifest.graph_path(Graph.DRAFTER_STEP), providers, threads, spin)
        self.device = self._step.device

    def project_taps(self, taps: torch.Tensor) -> torch.Tensor:
        """fc on the target taps: (B, S, 3H_t) -> (B, S, hidden)."""
        B, S, _ = taps.shape
        out = torch.empty(B, S, self.config.hidden, dtype=self.dtype, device=self.device)
        self._project.run(dict(taps=_contig(taps, self.dtype, self.device)), dict(hidden=out))
        return out

    def forward(self, hidden_in, tokens, positions, slots, mask, cache):
        """One drafter step; returns (logits (B, S, V) fp32, hidden_out (B, S, hidden))."""
        cfg, dev = self.config, self.device
        _check_step(tokens, positions, slots, mask, cache.batch, self.max_cache_len, cfg.vocab_size, cfg.seq_len)
        B, S = tokens.shape
        inputs = dict(hidden_in=_contig(hidden_in, self.dtype, dev), input_ids=_contig(tokens, torch.int64, dev),
                      position_ids=_contig(positions, torch.int64, dev), cache_slots=_contig(slots, torch.int64, dev),
                      attention_mask=_contig(mask, torch.bool, dev))
        out = dict(logits=torch.empty(B, S, cfg.vocab_size, dtype=torch.float32, device=dev),
                   hidden=torch.empty(B, S, cfg.hidden, dtype=self.dtype, device=dev))
        shape = (cache.batch, cfg.n_head, self.max_cache_len, cfg.head_dim)
        self._step.bind_cache([("past_key_values.0.key", "present.0.key", cache.k[0]),
                               ("past_key_values.0.value", "present.0.value", cache.v[0])],
                              check=lambda: _check_cache(cache, shape, self.dtype, dev, "drafter"))
        self._step.run(inputs, out)
        return out["logits"], out["hidden"]

    __call__ = forward


# ----------------------------------------------------------------------------- GASV, VQ

class OrtGASV(GraphGASV):
    """The GASV graph: (guided logits (N, V), node tokens, node parents) -> GASVGates (v2).

    `cfg` (GASVConfig) defaults to the constants recorded at export; any may be overridden
    per call (they are a graph input).
    """

    def __init__(self, manifest: Manifest, *, providers=None, threads: Optional[int] = None, spin: bool = False):
        self.config = manifest.gasv_config
        if self.config is None:
            raise InputError(f"{manifest.dir} has no GASV graph; export with --tables")
        self._run = GraphRunner(manifest.graph_path(Graph.GASV), providers, threads, spin)
        self.device = self._run.device
        self.vocab_size = manifest.tables["vocab_size"]


class OrtVQDecoder(GraphVQDecoder):
    """The VQ decoder graph: token ids (B, h*w) -> images (B, 3, H, W) in about [-1, 1]."""

    def __init__(self, manifest: Manifest, *, providers=None, threads: Optional[int] = None, spin: bool = False):
        self.config = manifest.vq_config
        self.grid = manifest.target_config.grid_size
        self._run = GraphRunner(manifest.graph_path(Graph.VQ_DECODE), providers, threads, spin)
        self.device = self._run.device


class OrtEngines(NamedTuple):
    target: OrtTarget
    drafter: Optional[OrtDrafter]
    gasv: Optional[OrtGASV]
    vq: Optional[OrtVQDecoder]
    manifest: Manifest


def load_ort_engines(engine_dir, providers=None, threads: Optional[int] = None, *, spin: bool = False,
                     target_hash: Optional[str] = None, drafter_hash: Optional[str] = None,
                     tables_hash: Optional[str] = None) -> OrtEngines:
    """Open every graph of an engine directory with ONNX Runtime.

    Args:
        engine_dir: directory written by `export_bundle`.
        providers: ORT providers (default: CUDA if available, else CPU).
        threads: intra-op threads per session (default: physical cores).
        target_hash / drafter_hash / tables_hash: refuse engines made for other artifacts.
    Returns:
        OrtEngines(target, drafter | None, gasv | None, vq | None, manifest).
    Raises:
        ArtifactMismatchError / CheckpointError from read_manifest.
    """
    man = read_manifest(engine_dir, target_hash=target_hash, drafter_hash=drafter_hash, tables_hash=tables_hash)
    kw = dict(providers=providers, threads=threads, spin=spin)
    return OrtEngines(
        target=OrtTarget(man, **kw),
        drafter=OrtDrafter(man, **kw) if man.has(Graph.DRAFTER_STEP) else None,
        gasv=OrtGASV(man, **kw) if man.has(Graph.GASV) else None,
        vq=OrtVQDecoder(man, **kw) if man.has(Graph.VQ_DECODE) else None,
        manifest=man)


__all__ = ["GraphRunner", "OrtDrafter", "OrtEngines", "OrtGASV", "OrtTarget", "OrtVQDecoder",
           "load_ort_engines", "make_session", "physical_cores", "session_options"]
