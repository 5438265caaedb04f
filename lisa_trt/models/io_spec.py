"""The one table of every exported graph's inputs and outputs (docs/design.md principle 1).

The exporter names graph inputs/outputs from here, the ONNX Runtime (and TensorRT) runners bind
tensors by these names, validation draws random inputs from the declared axes, TensorRT
profiles are derived from the dynamic axes, and docs print the table (`describe()`).

Names follow Optimum / onnxruntime-genai (`input_ids`, `position_ids`, `attention_mask`,
`past_key_values.{i}.key|value` -> `present.{i}.key|value`, `logits`), plus lisa-trt's own:
`cache_slots` (the cache slot of each new token's K/V row), `taps` (EAGLE-3 residual-stream taps),
`hidden` (final normed hidden state, or the drafter's output hidden), `class_ids` /
`caption_features` + `caption_mask` (conditions), `prefix_valid` (which prefix columns hold a
real condition token).

KV caches are static: `past_key_values.{i}.*` are (batch, kv_heads, cache_len, head_dim) buffers
the graph only reads; it returns the step's new K/V rows alone as `present.{i}.*` (batch,
kv_heads, seq, head_dim) -- for the prefill the prefix rows -- and the runner commits them into
its one cache at `cache_slots` (prefill: slots 0..T-1; models/layers.commit_rows). No output
aliases an input, so the cache is updated in place on every backend, S rows per layer per step.

dtype codes: "int64", "bool", "float32" (always fp32, e.g. logits), "act" (the export precision:
float32, or float16 for `--fp16`).

Axes: "batch", "seq" (new tokens / tree nodes) and "nodes" (GASV rows) are dynamic; every other
axis is fixed per export and resolved from the configs by `export_dims`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from ..errors import SpecError, UnknownTensorError
from .family import family_of


IO_SPEC_VERSION = 2  # 2: present.* are the new rows, not the whole cache

DYNAMIC_AXES = ("batch", "seq", "nodes", "taps_seq", "hidden_seq")
# axes that may be 0 long (drafter_fused: a commit passes no hidden rows, an expansion no taps)
EMPTY_AXES = ("taps_seq", "hidden_seq")
DTYPES = ("int64", "bool", "float32", "act")

# Order of the GASV graph's `gasv_params` input: GASVConfig's numeric fields (`lam` is lambda
# itself). The one definition; speculative/gasv.py reads it as PARAMS.
GASV_PARAMS = ("kappa", "lam", "delta", "neighbours", "gamma_kappa", "gamma_lambda", "gamma_delta",
               "theta_clu", "theta_geo", "eps")

# Candidate columns of the GASV graph (the first GASV_K codebook neighbours of each drafted
# token, baked in at export; the run-time `neighbours` knob masks the rest, <= GASV_K).
GASV_K = 64


class GraphKind(enum.Enum):
    """What a graph does (one entry point each, DESIGN.md principle 4)."""

    PREFILL = "prefill"  # condition prefix -> cache, logits of the last prefix position
    VERIFY_TREE = "verify_tree"  # S new tokens (a tree) at given positions/slots/mask
    DRAFT_STEP = "draft_step"  # drafter: K beam nodes (or committed tokens) -> logits, hidden
    GASV = "gasv"  # guided logits + node tokens / parents -> p, delta_eff, cand, gate
    VQ_DECODE = "vq_decode"  # token ids -> pixels


class Graph(enum.Enum):
    """Exported graphs; the value is the file stem (`<value>.onnx`)."""

    TARGET_PREFILL = "target_prefill"
    TARGET_VERIFY = "target_verify"
    DRAFTER_PROJECT = "drafter_project"
    DRAFTER_STEP = "drafter_step"
    DRAFTER_COMMIT = "drafter_commit"  # optional: drafter_project + drafter_step in one call
    DRAFTER_FUSED = "drafter_fused"  # every drafter call of the loop: fc on taps rows + one step
    GASV = "gasv"
    VQ_DECODE = "vq_decode"
    MEDUSA_HEADS = "medusa_heads"  # the drafter of a Medusa bundle (in place of the two drafter graphs)

    @property
    def kind(self) -> GraphKind:
        return _KINDS[self]

    @property
    def filename(self) -> str:
        return f"{self.value}.onnx"


_KINDS = {
    Graph.TARGET_PREFILL: GraphKind.PREFILL,
    Graph.TARGET_VERIFY: GraphKind.VERIFY_TREE,
    # fc on the taps is the first half of a drafter step (a separate graph for the callers of
    # project_taps; the decode loop's commits use drafter_commit when the bundle has it).
    Graph.DRAFTER_PROJECT: GraphKind.DRAFT_STEP,
    Graph.DRAFTER_STEP: GraphKind.DRAFT_STEP,
    # the decode loop's commit of accepted tokens: fc on their taps, then the step (one call
    # instead of two; bundles without it run project + step)
    Graph.DRAFTER_COMMIT: GraphKind.DRAFT_STEP,
    # the decode loop's every drafter call in one graph (commits: fc on the taps inside; expansions:
    # the previous hidden), so a commit is one call and the drafter's weights sit in one engine
    Graph.DRAFTER_FUSED: GraphKind.DRAFT_STEP,
    Graph.GASV: GraphKind.GASV,
    Graph.VQ_DECODE: GraphKind.VQ_DECODE,
    Graph.MEDUSA_HEADS: GraphKind.DRAFT_STEP,
}


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: name, dtype code, named axes, what it holds."""

    name: str
    dtype: str
    axes: tuple
    doc: str = ""

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise SpecError(f"dtype {self.dtype!r} of {self.name} is not one of {DTYPES}")

    def shape(self, dims: dict) -> tuple:
        """Concrete shape with every axis looked up in `dims`."""
        return tuple(dims[a] for a in self.axes)

    def dynamic_axes(self) -> dict:
        """{position: axis name} of the dynamic axes."""
        return {i: a for i, a in enumerate(self.axes) if a in DYNAMIC_AXES}


@dataclass(frozen=True)
class GraphSpec:
    """A graph's inputs and outputs, in order."""

    graph: Graph
    inputs: tuple
    outputs: tuple
    doc: str = ""

    @property
    def input_names(self) -> list:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list:
        return [t.name for t in self.outputs]

    def input(self, name: str) -> TensorSpec:
        return _by_name(self.inputs, name, self.graph)

    def output(self, name: str) -> TensorSpec:
        return _by_name(self.outputs, name, self.graph)


def _by_name(specs, name, graph):
    for t in specs:
        if t.name == name:
            return t
    raise UnknownTensorError(f"{graph.value} has no tensor {name!r}; it has {[t.name for t in specs]}")


# ----------------------------------------------------------------------------- the table

def _kv(prefix: str, n_layer: int, heads: str, head_dim: str, rows: str = "") -> tuple:
    """The K/V caches (`rows` empty) or a graph's new rows of them along the axis `rows`."""
    out = []
    for i in range(n_layer):
        for part in ("key", "value"):
            if rows:
                out.append(TensorSpec(f"{prefix}.{i}.{part}", "act", ("batch", heads, rows, head_dim),
                                      f"layer {i} new {part} rows (the runner commits them at their cache slots)"))
            else:
                out.append(TensorSpec(f"{prefix}.{i}.{part}", "act", ("batch", heads, "cache_len", head_dim),
                                      f"layer {i} {part} cache (static, read only, slot == absolute position)"))
    return tuple(out)


def past_names(n_layer: int) -> list:
    return [f"past_key_values.{i}.{p}" for i in range(n_layer) for p in ("key", "value")]


def present_names(n_layer: int) -> list:
    return [f"present.{i}.{p}" for i in range(n_layer) for p in ("key", "value")]


def _new_tokens(mask_axis: str = "cache_len") -> tuple:
    return (
        TensorSpec("input_ids", "int64", ("batch", "seq"), "image token ids of the new entries"),
        TensorSpec("position_ids", "int64", ("batch", "seq"), "absolute sequence positions (prefix included) -> 2D RoPE rows"),
        TensorSpec("cache_slots", "int64", ("batch", "seq"), "cache slot each new K/V row is written to (distinct per row)"),
        TensorSpec("attention_mask", "bool", ("batch", "seq", mask_axis), "True = may attend (KVCache.attention_mask)"),
    )


def token_inputs() -> tuple:
    """The new-token inputs of the target verify and drafter step graphs (ids, positions, slots, mask)."""
    return _new_tokens()


def target_kv(n_layer: int, rows: str = "seq") -> tuple:
    """(past inputs, present outputs) of a target graph: the static K/V caches it reads and the new
    rows it returns along the axis `rows` ("seq": the new tokens; the LlamaGen prefill: "prefix")."""
    if n_layer <= 0:
        raise SpecError("target graphs need the target's n_layer")
    return (_kv("past_key_values", n_layer, "kv_heads", "head_dim"),
            _kv("present", n_layer, "kv_heads", "head_dim", rows))


def target_outputs(last: bool = False, where: str = "last prefix position") -> tuple:
    """logits / taps / hidden of a target graph: per new token, or (last) at one position only."""
    out = (
        TensorSpec("logits", "float32", ("batch", "seq", "vocab"), "next-token logits of each entry, fp32"),
        TensorSpec("taps", "act", ("batch", "seq", "tap_dim"), "EAGLE-3 taps: residual stream entering layers {2, L/2, L-3}"),
        TensorSpec("hidden", "act", ("batch", "seq", "dim"), "final normed hidden state"),
    )
    if not last:
        return out
    return tuple(TensorSpec(t.name, t.dtype, tuple("one" if a == "seq" else a for a in t.axes), f"{t.doc} ({where})")
                 for t in out)


def graph_spec(graph: Graph, *, n_layer: int = 0, model_type: str = "c2i") -> GraphSpec:
    """The I/O spec of one graph (LlamaGen's prefill and VQ decoder; the other graphs are shared by
    the families, whose own specs come from export/families.py).

    Args:
        graph: which graph.
        n_layer: the target's layer count (target graphs have one K/V pair per layer).
        model_type: "c2i" (prefill takes class_ids) or "t2i" (caption_features + caption_mask).
    """
    if graph in (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY) and n_layer <= 0:
        raise SpecError(f"{graph.value} needs the target's n_layer")
    if graph in (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY):
        past, present = target_kv(n_layer, "prefix" if graph is Graph.TARGET_PREFILL else "seq")
    if graph is Graph.TARGET_PREFILL:
        cond = tuple(TensorSpec(*c) for c in family_of(model_type).cond_specs(model_type))
        outs = target_outputs(last=True)
        outs += (TensorSpec("prefix_valid", "bool", ("batch", "prefix"), "valid prefix columns after the condition's left padding"),)
        return GraphSpec(graph, cond + past, outs + present,
                         doc="condition prefix -> K/V rows of cache slots [0, prefix); logits at the last prefix position")
    if graph is Graph.TARGET_VERIFY:
        return GraphSpec(graph, _new_tokens() + past, target_outputs() + present,
                         doc="S new tokens (a draft tree in topological order) over the static cache")
    if graph is Graph.DRAFTER_PROJECT:
        return GraphSpec(graph, (TensorSpec("taps", "act", ("batch", "seq", "tap_dim"), "target taps"),),
                         (TensorSpec("hidden", "act", ("batch", "seq", "draft_hidden"), "fc(taps)"),),
                         doc="drafter fc on the target taps (Drafter.project_taps)")
    if graph in (Graph.DRAFTER_STEP, Graph.DRAFTER_COMMIT, Graph.DRAFTER_FUSED):
        dpast = _kv("past_key_values", 1, "draft_heads", "draft_head_dim")
        dpresent = _kv("present", 1, "draft_heads", "draft_head_dim", "seq")
        if graph is Graph.DRAFTER_FUSED:
            ins = (TensorSpec("taps", "act", ("batch", "taps_seq", "tap_dim"),
                              "target taps of the first taps_seq entries (a commit: all; an expansion: none, 0 rows)"),
                   TensorSpec("hidden_in", "act", ("batch", "hidden_seq", "draft_hidden"),
                              "the drafter's previous hidden of the entries after them (a commit: 0 rows)"))
            doc = ("one drafter step whose entry j takes fc(taps[:, j]) for j < taps_seq, else "
                   "hidden_in[:, j - taps_seq] (taps_seq + hidden_seq >= seq): commits and expansions in one engine")
        elif graph is Graph.DRAFTER_COMMIT:
            ins = (TensorSpec("taps", "act", ("batch", "seq", "tap_dim"), "target taps of the tokens before the new ones"),)
            doc = "drafter commit: fc on the taps, then one drafter step (Drafter.project_taps + Drafter.forward)"
        else:
            ins = (TensorSpec("hidden_in", "act", ("batch", "seq", "draft_hidden"), "projected taps or the drafter's previous hidden"),)
            doc = "one drafter step (Drafter.forward)"
        outs = (TensorSpec("logits", "float32", ("batch", "seq", "vocab"), "drafter logits, fp32"),
                TensorSpec("hidden", "act", ("batch", "seq", "draft_hidden"), "drafter output hidden (next step's hidden_in)"))
        return GraphSpec(graph, ins + _new_tokens() + dpast, outs + dpresent, doc=doc)
    if graph is Graph.GASV:
        return gasv_spec()
    if graph is Graph.VQ_DECODE:
        return GraphSpec(graph, (TensorSpec("image_tokens", "int64", ("batch", "block"), "token ids, row-major grid"),),
                         (TensorSpec("images", "float32", ("batch", "channels", "height", "width"), "pixels in about [-1, 1]"),),
                         doc="VQ decoder (VQModel.decode_code)")
    if graph is Graph.MEDUSA_HEADS:
        return GraphSpec(graph, (
            TensorSpec("hidden", "float32", ("batch", "seq", "dim"), "the target's final hidden state of the last committed token, fp32"),
            TensorSpec("depth", "int64", ("batch", "seq"), "which head each row reads (tree depth - 1); >= n_heads: flat logits"),
        ), (TensorSpec("logits", "float32", ("batch", "seq", "vocab"), "logits of head `depth`, fp32"),),
            doc="Medusa heads (MedusaHeads.head_logits): k heads on the target's last hidden state, head `depth` selected")
    raise SpecError(f"unknown graph {graph}")


def gasv_spec(vocab_axis: str = "vocab") -> GraphSpec:
    """The GASV graph over a vocabulary axis (LlamaGen: the whole vocabulary; a family whose GASV
    tables cover a sub-vocabulary names its own axis, e.g. Chameleon's image "codes")."""
    return GraphSpec(Graph.GASV, (
        TensorSpec("guided_logits", "float32", ("nodes", vocab_axis), "CFG-combined, filtered logits (-inf outside the support), one row per tree node"),
        TensorSpec("node_tokens", "int64", ("nodes",), "each node's token d (the drafted token)"),
        TensorSpec("node_parents", "int64", ("nodes",), "row of each node's parent, -1 for roots"),
        TensorSpec("gasv_params", "float32", ("n_gasv_params",), f"GASV knobs in the order {GASV_PARAMS}"),
    ), (
        TensorSpec("p", "float32", ("nodes", vocab_axis), "softmax of each row"),
        TensorSpec("delta_eff", "float32", ("nodes",), "modulated mass budget of each row as a parent"),
        TensorSpec("cand", "int64", ("nodes", "gasv_k"), "candidates N(d) of each node's token, -1 padded"),
        TensorSpec("gate", "float32", ("nodes", "gasv_k"), "gates g(v|d) at the node's parent, 0 on padding / off support"),
    ), doc="GASV v2 gates (docs/spec/lisa.md steps 1-4, gasv.gasv_core), tables baked in as initializers")


def gasv_params(cfg):
    """The GASV graph's `gasv_params` vector (io_spec.GASV_PARAMS order) from a GASVConfig (torch fp32)."""
    return cfg.params()


def common_dims(cfg, *, max_cache_len: int, drafter_cfg=None) -> dict:
    """The static axes every family's export has: the head, the width, the KV cache, GASV and
    (an EAGLE-3 drafter) the draft axes. A family's `ExportFamily.export_dims` adds its own
    (its condition's, its image's).

    Args:
        cfg: a target config (models/target_config.TargetShape).
        max_cache_len: the static cache length Lmax (round_up(seq_len + max_tree, 8)).
        drafter_cfg: DrafterConfig, MedusaConfig (adds nothing: the heads graph uses dim / vocab) or None.
    """
    dims = dict(one=1, vocab=cfg.vocab_size, dim=cfg.dim, tap_dim=3 * cfg.dim, kv_heads=cfg.kv_heads,
                head_dim=cfg.head_dim, cache_len=max_cache_len, n_gasv_params=len(GASV_PARAMS), gasv_k=GASV_K)
    from .medusa import MedusaConfig

    if drafter_cfg is not None and not isinstance(drafter_cfg, MedusaConfig):  # Medusa heads: no draft axes
        dims.update(draft_hidden=drafter_cfg.hidden, draft_heads=drafter_cfg.n_head,
                    draft_head_dim=drafter_cfg.head_dim)
    return dims


def export_dims(target_cfg, *, max_cache_len: int, drafter_cfg=None, vq_cfg=None) -> dict:
    """Sizes of every static axis of one export of a target with a fixed condition prefix and
    image length (dynamic axes are left out): `common_dims`, the condition's axes and the image's.

    Args:
        target_cfg: a target config with a fixed image length (models/target_config.TargetShape
            and `block_size`); its `cond_dims()` sizes the condition's axes ("prefix", ...).
        max_cache_len: the static cache length Lmax (round_up(seq_len + max_tree, 8)).
        drafter_cfg: DrafterConfig, MedusaConfig or None (`common_dims`).
        vq_cfg: VQConfig or None (then the config answers `grid_hw` too: the decoded image's axes).
    """
    t = target_cfg
    dims = common_dims(t, max_cache_len=max_cache_len, drafter_cfg=drafter_cfg)
    dims.update(**t.cond_dims(), block=t.block_size)
    if vq_cfg is not None:
        h, w = t.grid_hw
        dims.update(channels=3, height=h * vq_cfg.downsample, width=w * vq_cfg.downsample)
    return dims


def shape_ranges(spec: GraphSpec, dims: dict, ranges: dict) -> dict:
    """(min, opt, max) shapes of every input, for TensorRT optimisation profiles.

    Args:
        spec: the graph's spec.
        dims: static axis sizes (export_dims).
        ranges: {dynamic axis: (min, opt, max)}, e.g. {"batch": (1, 2, 8), "seq": (1, 16, 64)}.
    Returns:
        {input name: (min shape, opt shape, max shape)}.
    """
    out = {}
    for t in spec.inputs:
        shapes = []
        for k in range(3):
            shapes.append(tuple(ranges[a][k] if a in DYNAMIC_AXES else dims[a] for a in t.axes))
        out[t.name] = tuple(shapes)
    return out


def describe(n_layer: int = 2, model_type: str = "c2i", graphs: Optional[list] = None) -> str:
    """A plain-text table of the graphs (for docs and `--help` texts)."""
    lines = [f"lisa-trt graph I/O (io spec v{IO_SPEC_VERSION}); dynamic axes: {', '.join(DYNAMIC_AXES)}"]
    for g in graphs or list(Graph):
        spec = graph_spec(g, n_layer=n_layer, model_type=model_type)
        lines.append(f"\n{g.value}.onnx ({g.kind.value}): {spec.doc}")
        for role, ts in (("in ", spec.inputs), ("out", spec.outputs)):
            for t in ts:
                lines.append(f"  {role} {t.name:28s} {t.dtype:8s} ({', '.join(t.axes)})")
        if any(n.startswith("present.") for n in spec.output_names):
            lines.append("  present.* are the new K/V rows; the runner commits them into past_key_values.* at cache_slots")
    return "\n".join(lines)
