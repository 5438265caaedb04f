"""Memory plan of a deployment: will these engines, at these settings, fit this GPU?

    p = make_plan("Lumina-mGPT-7B", gpu="rtx4090", precision="fp16", batch=2, tree=64, image_size=768)
    p.fits, p.total, p.table()          # bytes per engine and part, the total against the device
    check_plan(engine_dir, memory_gib=24, batch=1, tree=64)   # PlanError (an InputError) with the table

Pure arithmetic over configs: the shapes of known names (GPT-B ... GPT-3B, Lumina-mGPT-7B,
Janus-Pro-7B), checkpoints (metadata only) and engine directories (manifest only) come from
deploy/model_shapes.py. No weights are read and no model is built.

What is counted (docs/deployment.md explains each formula and which numbers are estimates):
  weights      parameters x bytes: matmul weights at the precision (int8 / fp8: 1 byte + an fp32
               scale per output channel; int4: 0.5 byte + an fp16 scale per block of 32 inputs,
               export/quantize.py's MatMulNBits blocks), embeddings and norms at the activation
               precision (fp16, fp32 for an fp32 plan). ONE copy of the target weights: the verify
               engine runs the prefill too (its "prefill" profile; engines/build.default_build_graphs);
               an engine directory exported before that (separate prefill and verify engines) plans
               two (ModelShape.target_copies), as does `weight_copies=2`.
  KV cache     the target's: models/layers.kv_cache_shape, the function the runtime's KVCache allocates
               with; the drafter's: its step graph's past_key_values.* at their io-spec shapes
               (engines/allocation.kv_cache_bytes): 2 x layers x kv_heads x head_dim x max_cache_len x rows x kv bytes,
               rows = batch x 2 with CFG; kv bytes 2 (fp16) for every precision but fp32 (4): int8 /
               fp8 / int4 quantize weights, the cache stays fp16. max_cache_len = round_up(prompt + span
               prefix + image tokens + tree, 8), the exporters' rule (export/onnx.max_cache_len,
               families/chameleon/export.engine_cache_len).
  drafter      EAGLE-3 (models/drafter.py): fc 3H -> H, one decoder layer at the target's width
               (q/k/v read embedding + hidden, 2H wide), own head over the image codes, plus the copy
               of the target's input embedding its exported step graph carries; its one-layer cache.
  tables       the GASV graph's baked tensors (export/onnx.GASVGraph): W~ (codes x H fp32), row
               norms, cluster ids (int64), betas, GASV_K neighbours per code (int64).
  vq decoder   decoder + post_quant_conv + codebook in fp16 (parameter counts of the project's
               VQ models, pinned by tests/engines/test_plan.py; an engine directory: the size of
               its vq_decode graph files).
  activations  an engine directory built by `lisa-trt build`: each engine's recorded per-profile device
               memory, as TrtRunner allocates it (one shared buffer of the largest profile,
               allocation.context_memory_bytes). Otherwise an ESTIMATE, per engine, its largest call:
               rows x S x (6 H + 2 F) x act bytes (residual, norm, q, k, v, attention out; gate and
               up of the MLP), attention scores rows x heads x S x max_cache_len x 4 (fp32, as if not
               fused); S = max(prompt, tree) (the prefill runs through the verify engine).
               VQ decoder: batch x 4 feature maps of pixels x ch x 2 bytes at full resolution.
  io           the engines' output buffers, which TensorRT's context memory excludes: TrtRunner pools
               allocation.pool_depth buffers per output (2; 1 for the new K/V rows) at the output's
               largest shape over the engine's profiles, so the full-vocabulary fp32 logits of the
               prefill and of a tree step share one pool. A built directory: exact (allocation.io_bytes
               at the recorded profiles); otherwise the same rule at S = max(prompt, tree): 2 x (fp32
               logits rows x S x vocab + taps and hidden 4H x act) + the new rows 2 x layers x kv_heads x
               head_dim per token (the drafter: its head, 2 Hd, its one layer; GASV: p / delta / gate
               per node; VQ: pixels).
  loop temps   ESTIMATE: the decode loop's own tensors per step (loop_temporaries): four fp32
               (batch, tree, vocab) tensors and the tree mask.
  overhead     ESTIMATE: CUDA context + cuBLAS / cuDNN / TensorRT runtime (CONTEXT_BYTES).
  builder      ESTIMATE: during `lisa-trt build` the builder holds the engine being built plus its
               workspace (WORKSPACE_BYTES, `build`'s default too, unless --workspace is given): the build
               peak is the largest engine's weights + activations + workspace + overhead.
  host at load host memory loading takes (host_load_bytes): the largest plan file's pages, mapped
               while TensorRT deserializes it (trt_plans.map_plan, no copy), + one hash slice.
fits = the run total and the build peak are both within the device's usable memory.
bandwidth floor per step = the bytes one target call / one drafter step must move (weights, one
read of the cache, step_bytes; the new rows a call commits are negligible beside them) / the GPU's
peak memory bandwidth (GPUS): the least time a step can take there. The same plan holds for
TensorRT and ONNX Runtime: both hold one KV cache, updated in place (engines/graph.py `_run_kv`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from pathlib import Path

from ..config import SamplingConfig
from ..errors import InputError
from ..engines.allocation import HELD, OUTPUT_POOL, PLAN_BACKENDS, context_memory_bytes, io_bytes, kv_cache_bytes
from ..models.io_spec import GASV_K, Graph, graph_spec  # GASV_K: neighbour columns baked into the GASV graph
from ..models.layers import kv_cache_shape  # the one shape the runtime's KVCache allocates
from ..export.quantize import DEFAULT_BLOCK_SIZE as INT4_BLOCK  # int4 weights: one fp16 scale per block
from ..models.family import family_named
from .gpus import DEFAULT_GPU, GIB, GPU, GPUS, MIB, gpu_name, resolve_gpu  # noqa: F401 (re-exported)
from .model_shapes import ModelShape, Weights, known_names, known_shape, lin, repeat, resolve_model

CONTEXT_BYTES = 1 * GIB  # CUDA context + library handles + TensorRT runtime (estimate)
WORKSPACE_BYTES = 1 * GIB  # planned builder workspace (pass `lisa-trt build --workspace 1024` to hold it)
MAX_BATCH_SEARCH = 4096  # largest batch the search tries
MAX_TREE_SEARCH = 1024  # largest tree the search tries (TensorRT-Edge-LLM verifies <= 128 draft tokens)
MARGIN = 0.9  # a plan that fits above this share of the usable memory warns


class PlanError(InputError):
    """The deployment does not fit the device; the message carries the plan's table."""


# ----------------------------------------------------------------------------- precisions

@dataclass(frozen=True)
class Precision:
    name: str
    weight: float  # bytes per matmul weight
    scale_per_row: int  # extra bytes per output channel (int8 / fp8 per-channel scales)
    scale_per_block: float  # extra bytes per weight (int4 block scales)
    act: int  # activations, embeddings, norms
    kv: int  # KV cache


PRECISIONS = {p.name: p for p in (
    Precision("fp32", 4, 0, 0.0, 4, 4),
    Precision("fp16", 2, 0, 0.0, 2, 2),
    Precision("bf16", 2, 0, 0.0, 2, 2),
    Precision("int8", 1, 4, 0.0, 2, 2),
    Precision("fp8", 1, 4, 0.0, 2, 2),
    Precision("int4", 0.5, 0, 2 / INT4_BLOCK, 2, 2),
)}


def resolve_precision(name: str) -> Precision:
    if name not in PRECISIONS:
        raise InputError(f"unknown precision {name!r}; valid: {', '.join(PRECISIONS)}")
    return PRECISIONS[name]


# ----------------------------------------------------------------------------- the plan

def drafter_weights(s: ModelShape) -> Weights:
    """EAGLE-3 drafter (models/drafter.Drafter) + the embedding its step graph carries."""
    H, Hd = s.dim, s.draft_hidden or s.dim
    F = s.draft_ffn or s.ffn
    layer = lin(3 * H, Hd) + repeat(lin(H + Hd, Hd), 3) + lin(Hd, Hd) + repeat(lin(Hd, F), 2) + lin(F, Hd)
    norms = Weights(other=3 * Hd + H)  # hidden_norm, post_attention_layernorm, norm; input_layernorm (target width)
    return layer + norms + lin(Hd, s.draft_head or s.codes) + s.image_embed


def table_bytes(s: ModelShape) -> int:
    """GASV graph initializers: W~ fp32, row norms fp32, cluster int64, betas fp32, neighbours int64."""
    K = s.codes
    clusters = round(2 * math.sqrt(K))  # calibration's default round(2 sqrt(V))
    return K * s.dim * 4 + K * 4 + K * 8 + clusters * 4 + K * GASV_K * 8


def _step_act(rows: int, S: int, H: int, F: int, heads: int, L: int, act: int) -> int:
    """An engine call's intermediate tensors (ESTIMATE of TensorRT's context memory; its I/O apart)."""
    hidden = rows * S * (6 * H + 2 * F) * act
    scores = rows * heads * S * L * 4
    return hidden + scores


def _outputs_io(rows: int, S: int, vocab: int, width: int, act: int, present: int, held: int = 0) -> int:
    """Pooled output buffers of a call of S tokens (allocation.io_bytes's rule without a build record):
    OUTPUT_POOL of the fp32 logits and the `width`-wide act outputs (taps, hidden), `held` more buffers
    of `width` / 2 (allocation.HELD: the drafter's extra hidden state), one of the new K/V rows
    (`present` bytes per token)."""
    extra = (held - OUTPUT_POOL) * (width // 2) if held else 0
    return rows * S * (OUTPUT_POOL * (vocab * 4 + width * act) + extra * act + present)


def loop_temporaries(batch: int, rows: int, tree: int, L: int, vocab: int) -> int:
    """ESTIMATE of the decode loop's tensors beside the engines' (speculative/*): per tree step four
    fp32 (batch, tree, vocab) tensors (CFG-mixed logits, target and draft probabilities, the residual
    of verification) and the tree's attention mask (rows, tree, L) bool."""
    return 4 * batch * tree * vocab * 4 + rows * tree * L


@dataclass
class Plan:
    """Bytes per engine and part, the totals and the verdict (see the module docstring)."""

    model: str
    family: str
    gpu: str
    gpu_label: str
    usable: int
    precision: str
    batch: int
    tree: int
    cfg: bool
    image_size: int
    prompt_len: int
    rows: int
    max_cache_len: int
    engines: dict  # engine -> {part: bytes}
    overhead: int
    workspace: int
    total: int
    build_peak: int
    fits: bool
    max_batch: Optional[int] = None
    max_tree: Optional[int] = None
    fitting_precisions: list = field(default_factory=list)  # lower precisions that fit these settings
    search_limits: dict = field(default_factory=dict)  # the searches' upper ends (a result there means ">=")
    notes: list = field(default_factory=list)
    backend: str = "trt"
    bandwidth: float = 0.0  # the device's GB/s (0: unknown)
    load_transient: int = 0  # unified memory (Jetson): loading's peak above the run total (_load_transient)
    step_bytes: dict = field(default_factory=dict)  # {"target" | "drafter": bytes one call moves} (step_bytes)
    peak_tflops: float = 0.0  # the device's dense tensor-core peak at this precision (0: unknown)
    step_flops: dict = field(default_factory=dict)  # {"target" | "drafter": FLOPs of one call} (step_flops)
    temporaries: int = 0  # the decode loop's own tensors per step (loop_temporaries, estimate)
    host_load: int = 0  # host memory loading takes at its peak (host_load_bytes)

    @property
    def compute_floor_ms(self) -> dict:
        """{model: ms} the device needs at least per call to do step_flops at its peak ({} unknown)."""
        if not self.peak_tflops:
            return {}
        return {k: 1e3 * v / (self.peak_tflops * 1e12) for k, v in self.step_flops.items()}

    @property
    def compute_bound_tree(self) -> Optional[int]:
        """The largest tree (nodes per verification, at this plan's batch and cache) whose verification
        is still bandwidth-bound: beyond it the target's FLOPs / peak exceed its bytes / bandwidth, so
        each extra node costs time (None when either floor is unknown)."""
        bw, fl = self.bandwidth_floor_ms.get("target"), self.compute_floor_ms.get("target")
        if not bw or not fl or not self.tree:
            return None
        return max(1, int(bw / (fl / self.tree)))

    @property
    def floor_ms(self) -> dict:
        """{model: ms} per call: max(bytes / bandwidth, FLOPs / peak), of what is known."""
        bw, fl = self.bandwidth_floor_ms, self.compute_floor_ms
        return {k: max(bw.get(k, 0.0), fl.get(k, 0.0)) for k in set(bw) | set(fl)}

    @property
    def bandwidth_floor_ms(self) -> dict:
        """{model: ms} the device needs at least per call to move step_bytes ({} without a bandwidth)."""
        if not self.bandwidth:
            return {}
        return {k: 1e3 * v / (self.bandwidth * 1e9) for k, v in self.step_bytes.items()}

    def _bandwidth_line(self) -> str:
        if not self.bandwidth:
            return "bandwidth floor per step: unknown for this device (plan a named --gpu to see it)"
        ms = self.bandwidth_floor_ms
        parts = [f"{k} {self.step_bytes[k] / 1e9:.2f} GB -> {ms[k]:.2f} ms" for k in self.step_bytes]
        line = f"bandwidth floor per step (bytes a call must move / {self.bandwidth:g} GB/s): " + ", ".join(parts)
        fl = self.compute_floor_ms
        if not fl:
            return line + "; compute floor: unknown peak for this device"
        floor = self.floor_ms
        parts = [f"{k} {self.step_flops[k] / 1e12:.2f} TFLOP -> {fl[k]:.2f} ms" for k in self.step_flops]
        bound = [f"{k} {floor[k]:.2f} ms ({'compute' if fl.get(k, 0) > ms.get(k, 0) else 'bandwidth'}-bound)"
                 for k in sorted(floor)]
        return (line + f"\ncompute floor per step (FLOPs of a call / {self.peak_tflops:g} dense TFLOPS): "
                + ", ".join(parts) + "\nfloor per step = max of both: " + ", ".join(bound)
                + f"; verification turns compute-bound above a tree of {self.compute_bound_tree} nodes")

    @property
    def run_peak(self) -> int:
        """The run's peak: its total, or on unified memory the loading peak when that is higher."""
        return self.total + self.load_transient

    @property
    def margin_warning(self) -> str:
        """For a plan that fits above MARGIN of the usable memory: how little is left ("" otherwise)."""
        need = max(self.run_peak, self.build_peak)
        if not self.fits or need <= MARGIN * self.usable:
            return ""
        return (f"the plan uses {100 * need / self.usable:.0f} % of {self.gpu_label}'s usable memory "
                f"({(self.usable - need) / GIB:.2f} GiB left): the estimate's error, fragmentation or another "
                "process on the GPU can make the run fail; a smaller --batch / --tree or a lower --precision "
                "leaves room")

    @property
    def reason(self) -> str:
        if self.fits:
            return ""
        need = max(self.run_peak, self.build_peak)
        what = "the run" if self.run_peak >= self.build_peak else "the TensorRT build"
        return (f"{self.model} at {self.precision}, batch {self.batch}{' x 2 (CFG)' if self.cfg else ''}, tree "
                f"{self.tree} needs {need / GIB:.2f} GiB for {what}; {self.gpu_label} has {self.usable / GIB:.2f} GiB. "
                + _advice(self))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["reason"] = self.reason
        d["margin_warning"] = self.margin_warning
        d["total_gib"] = round(self.total / GIB, 3)
        d["host_load_gib"] = round(self.host_load / GIB, 3)
        d["build_peak_gib"] = round(self.build_peak / GIB, 3)
        d["usable_gib"] = round(self.usable / GIB, 3)
        d["bandwidth_floor_ms"] = {k: round(v, 3) for k, v in self.bandwidth_floor_ms.items()}
        d["compute_floor_ms"] = {k: round(v, 3) for k, v in self.compute_floor_ms.items()}
        d["floor_ms"] = {k: round(v, 3) for k, v in self.floor_ms.items()}
        d["compute_bound_tree"] = self.compute_bound_tree
        return d

    def _found(self, what: str) -> str:
        v = getattr(self, f"max_{what}")
        if not v:
            return "none"
        return f">= {v}" if v == self.search_limits.get(what) else str(v)

    def table(self) -> str:
        parts = ("weights", "kv_cache", "activations", "io")
        g = lambda b: f"{b / GIB:8.2f}"  # noqa: E731
        pad = " ".join([f"{'':8s}"] * len(parts))
        lines = [f"{self.model} ({self.family}) on {self.gpu_label}: {self.precision}, {self.image_size} px, batch "
                 f"{self.batch}{' with CFG (' + str(self.rows) + ' rows)' if self.cfg else ' (no CFG)'}, tree "
                 f"{self.tree}, prompt {self.prompt_len}, cache {self.max_cache_len} slots; "
                 f"{'TensorRT' if self.backend == 'trt' else 'ONNX Runtime'}",
                 f"{'engine':14s} {'weights':>8s} {'kv cache':>8s} {'activ.':>8s} {'io':>8s} {'total':>8s}  (GiB)"]
        for name, e in self.engines.items():
            lines.append(f"{name:14s} " + " ".join(g(e.get(p, 0)) for p in parts) + " " + g(sum(e.values())))
        lines.append(f"{'loop temps':14s} {pad} {g(self.temporaries)}  the decode loop's tensors per step (estimate)")
        lines.append(f"{'overhead':14s} {pad} {g(self.overhead)}  CUDA context + runtime (estimate)")
        lines.append(f"{'run total':14s} {pad} {g(self.total)}  of {self.usable / GIB:.2f} usable")
        if self.load_transient:
            lines.append(f"{'load peak':14s} {pad} {g(self.run_peak)}  loading: a plan file's pages resident in "
                         "unified memory beside its engine (estimate)")
        lines.append(f"{'build peak':14s} {pad} {g(self.build_peak)}  largest engine + "
                     f"{self.workspace / GIB:.2f} GiB builder workspace + overhead")
        lines.append(f"{'host at load':14s} {pad} {g(self.host_load)}  host memory: the largest plan file's mapped "
                     "pages while TensorRT deserializes it + one hash slice")
        lines.append(self._bandwidth_line())
        if self.search_limits:
            verdict = "yes" if self.fits else "NO"
            lines.append(f"fits: {verdict}; largest batch {self._found('batch')} (tree {self.tree}), "
                         f"largest tree {self._found('tree')} (batch {self.batch})")
        else:
            lines.append(f"fits: {'yes' if self.fits else 'NO'}")
        if self.margin_warning:
            lines.append(f"warning: {self.margin_warning}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _advice(p: Plan) -> str:
    """What fits instead, offering only what the searches found; a larger device when nothing does."""
    ways = []
    if p.max_batch:
        ways.append(f"--batch {p.max_batch}" + (" or less" if p.max_batch > 1 else "") + f" (at tree {p.tree})")
    if p.max_tree:
        ways.append(f"--tree {p.max_tree}" + (" or less" if p.max_tree > 1 else "") + f" (at batch {p.batch})")
    if p.fitting_precisions:
        ways.append(f"a lower precision (--precision {p.fitting_precisions[0]} fits)")
    if ways:
        return "Use " + (", ".join(ways[:-1]) + " or " if len(ways) > 1 else "") + ways[-1] + "."
    return (f"Nothing smaller fits either: no batch at tree {p.tree}, no tree at batch {p.batch}, no lower "
            "precision. Use a device with more memory (--gpu NAME, or --memory-gib N to plan for it).")


@dataclass(frozen=True)
class Runtime:
    """The runtime the plan is for: backend ("trt" | "ort") and what `lisa-trt build` recorded per
    engine (manifest["engines"]["graphs"]: per-profile device memory)."""

    backend: str = "trt"
    engines: dict = field(default_factory=dict)
    io: dict = field(default_factory=dict)  # {graph: bytes of its pooled outputs} (allocation.io_bytes)

    def device_memory(self, graphs, holder: bool = False) -> Optional[int]:
        """The TensorRT contexts' memory of these engines as TrtRunner allocates it: ONE buffer for every
        engine of the bundle (engines/trt.SharedActivations), of the largest engine's
        allocation.context_memory_bytes, counted once, in the model that holds it (`holder`: the
        target) and 0 for the others; None when not every engine recorded its sizes (not built, or
        built before the record had them) or on ORT."""
        recs = [self.engines.get(g) or {} for g in graphs]
        if self.backend != "trt" or not recs or any("device_memory" not in r for r in recs):
            return None
        if not holder:
            return 0
        return max(context_memory_bytes(r["device_memory"]) for r in self.engines.values() if "device_memory" in r)

    def io_bytes(self, graphs) -> Optional[int]:
        """The pooled output buffers TrtRunner makes for those of `graphs` that were built (exact, from
        the build record's profiles); None when nothing was built (or on ORT)."""
        if self.backend != "trt" or not self.io:
            return None
        return sum(self.io.get(g, 0) for g in graphs)


BACKENDS = PLAN_BACKENDS


def resolve_runtime(model, backend: str = "trt", manifest=None) -> Runtime:
    """The Runtime for a plan: the backend, and an engine directory's build record (`manifest`: the
    directory's Manifest when the caller has read it)."""
    from ..engines.trt_plans import built_graphs

    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r} for a memory plan; valid: {', '.join(BACKENDS)}")
    built = {}
    if isinstance(model, (str, Path)):
        built = built_graphs(_engine_record(model, manifest)[0])
    if not built or backend != "trt":
        return Runtime(backend, built)
    return Runtime(backend, built, _built_io(model, built, manifest))


def _built_io(engine_dir, built: dict, manifest=None) -> dict:
    """{graph: allocation.io_bytes} of the built engines, at their recorded profiles."""
    from ..export.manifest import read_manifest

    man = manifest if manifest is not None else read_manifest(engine_dir, check_files=False)
    act = 2 if man.precision == "fp16" else 4
    dims = man.dims
    return {g: io_bytes(man.spec(Graph(g)), dims, [p["shapes"] for p in r.get("profiles", [])], act)
            for g, r in built.items()}


def _target_graphs(copies: int) -> list:
    """The target engines the runtime opens: verify, and a prefill engine when the weights are twice."""
    return [Graph.TARGET_VERIFY.value] + ([Graph.TARGET_PREFILL.value] if copies > 1 else [])


def _target_part(s: ModelShape, prec: Precision, rows: int, tree: int, prompt: int, L: int, copies: int,
                 rt: Runtime) -> dict:
    a = prec.act
    S = max(prompt, tree)  # the prefill (the prompt through the verify engine) or a tree verification
    act = _step_act(rows, S, s.dim, s.ffn, s.n_head, L, a)
    io = _outputs_io(rows, S, s.vocab, 4 * s.dim, a, 2 * s.n_layer * s.kv_heads * s.head_dim * prec.kv)
    kv = math.prod(kv_cache_shape(s, rows, L)) * prec.kv  # one cache, any copies: what KVCache allocates
    built = rt.device_memory(_target_graphs(copies), holder=True)  # the bundle's one activation buffer
    built_io = rt.io_bytes([Graph.TARGET_PREFILL.value, Graph.TARGET_VERIFY.value])  # the built ones
    return {"weights": s.target.bytes(prec) * copies, "kv_cache": kv, "activations": act if built is None else built,
            "io": io if built_io is None else built_io}


def _drafter_graphs(rt: Runtime) -> list:
    """The drafter engines the runtime opens (engines/graph.open_drafter): drafter_fused when built
    (with drafter_project when that was built too: opened at a decoder's first project_taps, counted
    as if open), else drafter_project + drafter_step."""
    fused, project = Graph.DRAFTER_FUSED.value, Graph.DRAFTER_PROJECT.value
    if fused in rt.engines:
        return [fused] + ([project] if project in rt.engines else [])
    return [project, Graph.DRAFTER_STEP.value]


def _drafter_part(s: ModelShape, prec: Precision, rows: int, tree: int, prompt: int, L: int, rt: Runtime) -> dict:
    a = prec.act
    Hd = s.draft_hidden or s.dim
    heads = max(1, Hd // s.head_dim)
    S = max(tree, prompt)
    dact = _step_act(rows, S, Hd, s.draft_ffn or s.ffn, heads, L, a) + rows * S * 3 * s.dim * a  # + the taps it reads
    # drafter_step / drafter_fused: logits over its head, hidden, its new K/V rows; drafter_project: hidden
    io = _outputs_io(rows, S, s.draft_head or s.codes, 2 * Hd, a, 2 * Hd * prec.kv,
                     held=HELD[(Graph.DRAFTER_STEP.value, "hidden")])
    dims = {"batch": rows, "draft_heads": heads, "cache_len": L, "draft_head_dim": Hd // heads}
    kv = kv_cache_bytes(graph_spec(Graph.DRAFTER_STEP), dims, prec.kv)  # the drafter's one cache
    graphs = _drafter_graphs(rt)
    built, built_io = rt.device_memory(graphs), rt.io_bytes(graphs + [Graph.MEDUSA_HEADS.value])
    return {"weights": drafter_weights(s).bytes(prec), "kv_cache": kv, "activations": dact if built is None else built,
            "io": io if built_io is None else built_io}


def _parts(s: ModelShape, prec: Precision, batch: int, tree: int, cfg: bool, prompt: int, copies: int,
           rt: Runtime) -> tuple:
    rows = batch * (2 if cfg else 1)
    L = s.cache_len(prompt, tree)
    engines = {"target": _target_part(s, prec, rows, tree, prompt, L, copies, rt)}
    if s.has_drafter:
        engines["drafter"] = _drafter_part(s, prec, rows, tree, prompt, L, rt)
    if s.has_tables:
        nodes = batch * tree
        built, built_io = rt.device_memory([Graph.GASV.value]), rt.io_bytes([Graph.GASV.value])
        engines["gasv"] = {"weights": table_bytes(s), "activations": nodes * (3 * s.codes + GASV_K * s.dim) * 4
                           if built is None else built,
                           "io": OUTPUT_POOL * nodes * 3 * 4 if built_io is None else built_io}  # p, delta, gate
    if s.has_vq:
        built, built_io = rt.device_memory([Graph.VQ_DECODE.value]), rt.io_bytes([Graph.VQ_DECODE.value])
        engines["vq_decode"] = {"weights": s.vq_params * 2, "activations": batch * 4 * s.pixels * s.vq_ch * 2
                                if built is None else built,
                                "io": OUTPUT_POOL * batch * 3 * s.pixels * 4 if built_io is None else built_io}
    return rows, L, engines


def step_bytes(engines: dict) -> dict:
    """Bytes one call of the target / one drafter step must move at least: its weights and one read of
    its cache."""
    out = {}
    for name in ("target", "drafter"):
        e = engines.get(name)
        if e:
            out[name] = e["weights"] + e.get("kv_cache", 0)
    return out


def step_flops(s: ModelShape, rows: int, tree: int, L: int) -> dict:
    """FLOPs of one target verification of `tree` nodes over `rows` rows (CFG doubles them) and of one
    drafter step over the same nodes: 2 per matmul weight per token, plus attention's two matmuls
    (Q·Kᵀ and P·V: 4 · dim FLOPs per token per key) over the cache of L slots, per layer."""
    tokens = rows * tree
    out = {"target": 2 * s.target.linear * tokens + 4 * tokens * L * s.dim * s.n_layer}
    if s.has_drafter:
        d = drafter_weights(s)
        Hd = s.draft_hidden or s.dim
        out["drafter"] = 2 * d.linear * tokens + 4 * tokens * L * Hd
    return out


def _load_transient(engines: dict, device: GPU, overhead: int, total: int) -> int:
    """Unified memory (Jetson): how far loading goes above the run total. Engines load in the plan's
    order (target first, engines.graph.load_engines) before any cache exists; each plan file is
    mapped (trt_plans.load_plan / map_plan: no copy in process memory), but its pages (about its
    engine's weights) are resident beside the engine it becomes while TensorRT deserializes it."""
    if not device.unified:
        return 0
    loaded = peak = overhead
    for e in engines.values():
        peak = max(peak, loaded + 2 * e["weights"] + e.get("activations", 0))
        loaded += e["weights"] + e.get("activations", 0)
    return max(0, peak - total)


def host_load_bytes(engines: dict) -> int:
    """Host memory loading takes at its peak: the pages of the largest plan file (about its engine's
    weights), mapped read-only while TensorRT deserializes it (trt_plans.map_plan; file-backed pages
    the kernel may drop), plus the one slice its hash reads at a time (trt_plans.HASH_CHUNK)."""
    from ..engines.trt_plans import HASH_CHUNK

    return max(e["weights"] for e in engines.values()) + HASH_CHUNK


def _totals(engines: dict, overhead: int, workspace: int, temporaries: int = 0) -> tuple[int, int]:
    total = sum(sum(e.values()) for e in engines.values()) + overhead + temporaries
    peak = max(e["weights"] + e.get("activations", 0) for e in engines.values()) + workspace + overhead
    return total, peak


def make_plan(model, *, gpu: Optional[str] = None, memory_gib: Optional[float] = None,
              precision: Optional[str] = None, batch: int = 1, tree: Optional[int] = None,
              image_size: Optional[int] = None, prompt_len: Optional[int] = None, cfg: bool = True,
              workspace: Optional[int] = None, weight_copies: Optional[int] = None, search: bool = True,
              backend: str = "trt", manifest=None) -> Plan:
    """The memory plan of `model` on a device.

    Args:
        model: a known name, a checkpoint, a Chameleon directory, an engine directory, or a ModelShape.
        gpu / memory_gib: a name of GPUS, or the device's memory in GiB (exactly one).
        precision: fp32 | fp16 | bf16 | int8 | fp8 | int4 (default: an engine directory's own, else fp16).
        batch: images per call (prompts); with cfg the engines run 2 x batch rows.
        tree: draft-tree nodes verified per call (default: an engine directory's max_tree, else 64).
        image_size / prompt_len: for names and checkpoints (engine directories fix them).
        workspace: builder workspace in bytes (default WORKSPACE_BYTES).
        weight_copies: copies of the target weights (2: separate prefill and verify engines);
            default: what `lisa-trt build` makes (an engine directory's target_copies: 1 when its
            verify engine runs the prefill too, 2 for directories exported before; names and
            checkpoints: 1, a fresh export).
        search: also compute the largest batch and tree that fit.
        backend: the runtime planned ("trt": TensorRT, with its recorded engine memory; "ort": ONNX
            Runtime), see Runtime. Both hold one KV cache per cache-owning model.
        manifest: an engine directory's Manifest when the caller has read it (its build record).
    """
    device = resolve_gpu(gpu, memory_gib)
    rt = resolve_runtime(model, backend, manifest)
    s = resolve_model(model, image_size, prompt_len, manifest=manifest)
    prec = resolve_precision(precision or s.precision or "fp16")
    tree = (s.max_tree or 64) if tree is None else tree
    if weight_copies is None:
        weight_copies = s.target_copies
    for v, what in ((batch, "--batch"), (tree, "--tree"), (weight_copies, "weight copies")):
        if not isinstance(v, int) or v < 1:
            raise InputError(f"{what} must be a positive integer, got {v!r}")
    if s.max_tree and tree > s.max_tree:
        raise InputError(f"--tree {tree} exceeds the engine directory's max_tree {s.max_tree} (its static cache); "
                         "re-export with a larger --max-tree or plan a smaller tree")
    prompt = s.prompt_len
    ws = WORKSPACE_BYTES if workspace is None else int(workspace)

    def evaluate(b: int, t: int):
        rows, L, engines = _parts(s, prec, b, t, cfg, prompt, weight_copies, rt)
        temps = loop_temporaries(b, rows, t, L, s.vocab)
        total, peak = _totals(engines, CONTEXT_BYTES, ws, temps)
        load = _load_transient(engines, device, CONTEXT_BYTES, total)
        return rows, L, engines, total, peak, load, max(total + load, peak) <= device.usable, temps

    rows, L, engines, total, peak, load, fits, temps = evaluate(batch, tree)
    notes = []
    if s.precision and precision and precision != s.precision:
        notes.append(f"planned at {precision}; the engine directory was exported at {s.precision}")
    if s.max_positions and L - tree > s.max_positions:
        notes.append(f"the sequence spans {L - tree} positions, beyond this config's max_position_embeddings "
                     f"{s.max_positions}: the checkpoint for {s.image_size} px must allow them (the exporter checks)")
    if weight_copies > 1:
        notes.append(f"{weight_copies} copies of the target weights (separate prefill / verify engines)")
    notes += _runtime_notes(rt, engines, batch)
    plan = Plan(model=s.name, family=s.family, gpu=device.name, gpu_label=device.label, usable=device.usable,
                precision=prec.name, batch=batch, tree=tree, cfg=cfg, image_size=s.image_size, prompt_len=prompt,
                rows=rows, max_cache_len=L, engines=engines, overhead=CONTEXT_BYTES, workspace=ws, total=total,
                build_peak=peak, fits=fits, notes=notes, backend=rt.backend,
                bandwidth=device.bandwidth, load_transient=load, step_bytes=step_bytes(engines),
                peak_tflops=device.peak_tflops(prec.name), step_flops=step_flops(s, rows, tree, L),
                temporaries=temps, host_load=host_load_bytes(engines))
    if search and not fits:
        plan.fitting_precisions = [q for q in ("fp16", "int8", "int4")
                                   if PRECISIONS[q].weight < prec.weight
                                   and make_plan(model, gpu=gpu, memory_gib=memory_gib, precision=q, batch=batch,
                                                 tree=tree, image_size=image_size, prompt_len=prompt_len, cfg=cfg,
                                                 workspace=workspace, weight_copies=weight_copies, search=False,
                                                 backend=backend).fits]
    if search:
        plan.max_batch = largest(lambda b: evaluate(b, tree)[6], MAX_BATCH_SEARCH)
        plan.max_tree = largest(lambda t: evaluate(batch, t)[6], s.max_tree or MAX_TREE_SEARCH)
        plan.search_limits = {"batch": MAX_BATCH_SEARCH, "tree": s.max_tree or MAX_TREE_SEARCH}
    return plan


def _runtime_notes(rt: Runtime, engines: dict, batch: int) -> list:
    notes = []
    if rt.engines and rt.backend == "trt":
        have = "device memory recorded by `lisa-trt build`" if rt.device_memory(list(rt.engines)) is not None \
            else "activations estimated (the build record predates per-profile device memory; rebuild to record it)"
        notes.append(f"built engines: {have}")
        built_batch = _record_batch(rt)
        if built_batch and batch > built_batch:
            notes.append(f"the engines were built for --max-batch {built_batch}; rebuild for batch {batch}")
    return notes


def _record_batch(rt: Runtime) -> int:
    """Largest real batch the built target engine takes (its profiles' CFG rows / 2 at most)."""
    prof = (rt.engines.get(Graph.TARGET_VERIFY.value) or {}).get("profiles") or []
    rows = [p["shapes"]["input_ids"][2][0] for p in prof if "input_ids" in p.get("shapes", {})]
    return max(rows) // 2 if rows else 0


def largest(ok, hi: int) -> Optional[int]:
    """Largest n in 1..hi with ok(n), for ok monotone (true then false); None when ok(1) is false."""
    if not ok(1):
        return None
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_plan(model, **kw) -> Plan:
    """make_plan(model, **kw) (without the searches unless it fails); PlanError with the table when it does not fit.

    What `lisa-trt build` and `lisa-trt run` call before any work."""
    plan = make_plan(model, search=False, **kw)
    if not plan.fits:
        plan = make_plan(model, search=True, **kw)
        raise PlanError(f"{plan.reason}\n{plan.table()}")
    return plan


def _engine_record(engine_dir, manifest=None) -> tuple[dict, str]:
    """(the engine directory's manifest dict, family) without checking files; ({}, "") when the
    directory is no engine directory. `manifest`: its Manifest when the caller has read it."""
    from ..export.manifest import bundle_family, manifest_path, raw_manifest

    if manifest is not None:
        return manifest.to_dict(), manifest.family
    if manifest_path(engine_dir) is None:
        return {}, ""
    return raw_manifest(engine_dir), bundle_family(engine_dir)


def run_uses_cfg(engine_dir, cfg_scale: Optional[float] = None, manifest=None) -> bool:
    """Whether a run doubles its rows for CFG: the given scale, else the bundle's default
    (else the family's: LlamaGen's SamplingConfig 1.0 = off, Lumina-mGPT's 3.0 = on).
    `manifest`: the directory's Manifest when the caller has read it."""
    man, family = _engine_record(engine_dir, manifest)
    if cfg_scale is None:
        cfg_scale = (man.get("generation") or {}).get("cfg_scale")
    if cfg_scale is None:
        fam = manifest.model_family if manifest is not None else family_named(family) if family else None
        cfg_scale = (fam.default_sampling if fam is not None else {}).get("cfg_scale", SamplingConfig.cfg_scale)
    return float(cfg_scale) != 1.0


def preflight(engine_dir, *, gpu: Optional[str] = None, memory_gib: Optional[float] = None, gpu_backend: bool,
              batch: int = 1, tree: Optional[int] = None, cfg: Optional[bool] = None,
              cfg_scale: Optional[float] = None, workspace: Optional[int] = None,
              manifest=None) -> Optional[Plan]:
    """The memory check `lisa-trt run` / `build` make before any work (PlanError when it does not fit).

    With --gpu / --memory-gib it always checks. Without them it checks only a GPU backend
    (`gpu_backend`: TensorRT, or auto with built engines) against the visible CUDA device, and
    returns None when there is none: a CPU run is never refused by a GPU plan.
    cfg: None = from the run's CFG scale or the bundle's default (run_uses_cfg).
    The plan is TensorRT's (its recorded engine memory) for a GPU backend, ONNX Runtime's else.
    manifest: the directory's Manifest when the caller has read it (runtime/context.RunContext).
    """
    if gpu is None and memory_gib is None:
        if not gpu_backend:
            return None
        memory_gib = device_memory_gib()
        if memory_gib is None:
            return None
    if cfg is None:
        cfg = run_uses_cfg(engine_dir, cfg_scale, manifest)
    return check_plan(engine_dir, gpu=gpu, memory_gib=memory_gib, batch=batch, tree=tree, cfg=cfg,
                      workspace=workspace, backend="trt" if gpu_backend else "ort", manifest=manifest)


def device_memory_gib() -> Optional[float]:
    """Total memory of the visible CUDA device 0 in GiB, None without one (no CUDA init otherwise)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return torch.cuda.get_device_properties(0).total_memory / GIB
    except Exception:  # noqa: BLE001 - a broken CUDA setup is the backend's to report
        return None


__all__ = ["BACKENDS", "CONTEXT_BYTES", "DEFAULT_GPU", "GPU", "GPUS", "MARGIN", "ModelShape", "PRECISIONS", "Plan",
           "PlanError", "Precision", "Runtime", "WORKSPACE_BYTES", "Weights", "check_plan", "device_memory_gib",
           "drafter_weights", "gpu_name", "known_names", "known_shape", "largest", "make_plan", "preflight",
           "resolve_gpu", "resolve_model", "resolve_precision", "resolve_runtime", "run_uses_cfg", "step_bytes",
           "table_bytes"]
