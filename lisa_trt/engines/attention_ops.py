"""ONNX Attention for TensorRT: one-node probe graphs, and attention as plain standard ops.

A TensorRT that parses an opset-23 Attention node may still fail to build it (NVIDIA/TensorRT
#4705: a strongly typed Attention on sm_89), and only after the whole graph was optimised.
`lisa-trt build` therefore first builds a one-node graph of each distinct Attention of a graph
(`probe_specs` / `probe_model`: the node's attributes, input dtypes, mask kind, head counts
and shapes, symbolic dims kept dynamic); where TensorRT refuses one, the graph can be built
with `plain_attention` applied: every Attention node replaced by

    Q, K, V (4-D, or 3-D with q_num_heads / kv_num_heads: Reshape + Transpose)
    K, V heads repeated to Q's (GQA: Unsqueeze / Expand / Reshape, each KV head used by
        q_num_heads / kv_num_heads consecutive Q heads)
    S = MatMul(Q, Transpose(K))  ->  Cast fp32  ->  Mul scale (default 1/sqrt(head size))
        ->  softcap (Div / Tanh / Mul, when set)  ->  mask (bool: Where(mask, S, -inf);
        float: Add)  ->  causal (Trilu, when is_causal)  ->  Softmax fp32  ->  Cast back
        ->  MatMul(P, V)  (->  Transpose + Reshape back to 3-D)

which is the ONNX Attention semantics (onnx/reference/ops/op_attention.py: scale, softcap
before the mask, mask, softmax) with the softmax in fp32 whatever the graph's dtype (the
export's softmax_precision = FLOAT). The rewrite is generic over the Attention node: it
reads only the node's inputs, attributes and the inferred shapes of Q/K/V/mask, not how the
cache around it is built. Attention with past_key / past_value, more than one output or an
attn_mask shorter than the keys is refused (TensorRT refuses the first two anyway).
"""

from __future__ import annotations

import math
from typing import Optional

from ..errors import InputError
from .parser_checks import node_attrs

ATTENTION_MODES = ("auto", "op", "plain")
_STANDARD = ("", "ai.onnx")
_FLOAT = 1


def attention_nodes(model) -> list:
    """The standard-domain Attention nodes of a model's main graph."""
    return [n for n in model.graph.node if n.op_type == "Attention" and n.domain in _STANDARD]


def _typed_shapes(model) -> dict:
    """{tensor: (elem_type, [dim value or dim_param or None])} after ONNX shape inference."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    g = inferred.graph
    out = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim] \
            if tt.HasField("shape") else None
        out[vi.name] = (tt.elem_type, dims)
    for t in g.initializer:
        out[t.name] = (t.data_type, list(t.dims))
    return out


class AttentionRewriteError(InputError):
    """An Attention node the plain-ops rewrite cannot express."""


def _io(node, shapes: dict, label: str) -> list:
    """[(elem_type, dims)] of Q, K, V and the mask ('' inputs: None); refused forms raise."""
    if len(node.input) > 4 and any(node.input[4:]):
        raise AttentionRewriteError(f"{label}: Attention with past_key / past_value / nonpad_kv_seqlen inputs; "
                                    "TensorRT takes none: export the cache as the key/value inputs")
    if len([o for o in node.output if o]) != 1 or not node.output[0]:
        raise AttentionRewriteError(f"{label}: Attention with more than the Y output (TensorRT takes one)")
    out = []
    for i in range(4):
        name = node.input[i] if i < len(node.input) else ""
        if not name:
            out.append(None)
            continue
        t = shapes.get(name)
        if t is None or t[1] is None:
            raise AttentionRewriteError(f"{label}: the shape of input {name} is unknown after ONNX shape "
                                        "inference; re-export the graph with shapes (lisa-trt export)")
        out.append(t)
    if out[0] is None or out[1] is None or out[2] is None:
        raise AttentionRewriteError(f"{label}: Attention needs Q, K and V")
    return out


def probe_specs(model) -> list:
    """One spec per distinct Attention of `model` (equal attributes, dtypes and shapes share one):
    {"node": the first such node's name, "nodes": how many, "inputs": [(elem_type, dims) or None],
    "output": (elem_type, dims), "attrs": {name: value}}."""
    shapes = _typed_shapes(model)
    specs = {}
    for node in attention_nodes(model):
        label = node.name or "Attention"
        io = _io(node, shapes, label)
        attrs = node_attrs(node)
        y = shapes.get(node.output[0]) or (io[0][0], None)
        key = repr((sorted(attrs.items()), io, y))
        if key in specs:
            specs[key]["nodes"] += 1
        else:
            specs[key] = {"node": label, "nodes": 1, "inputs": io, "output": y, "attrs": attrs}
    return list(specs.values())


def _value_info(name: str, t):
    import onnx

    return onnx.helper.make_tensor_value_info(name, t[0], t[1])


def probe_model(spec: dict, opset: int):
    """The one-node ONNX model of a probe spec: inputs q, k, v (and mask), output y."""
    import onnx

    names = [n if t is not None else "" for n, t in zip(("q", "k", "v", "mask"), spec["inputs"])]
    while names and not names[-1]:
        names.pop()
    node = onnx.helper.make_node("Attention", names, ["y"], name=spec["node"], **spec["attrs"])
    inputs = [_value_info(n, t) for n, t in zip(names, spec["inputs"]) if n]
    graph = onnx.helper.make_graph([node], f"probe_{spec['node']}", inputs, [_value_info("y", spec["output"])])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)],
                                  producer_name="lisa-trt attention probe")


def probe_profiles(probe, graph_model, graph_profiles: list) -> list:
    """[{probe input: (min, opt, max)}], one per profile of the graph: a symbolic dim of the
    probe takes the range of the graph input axis of the same name; any other is 1."""
    out = []
    graph_inputs = {i.name: [d.dim_param for d in i.type.tensor_type.shape.dim] for i in graph_model.graph.input}
    for prof in graph_profiles:
        shapes = prof.shapes if hasattr(prof, "shapes") else prof
        ranges = {}
        for name, (mn, opt, mx) in shapes.items():
            for j, p in enumerate(graph_inputs.get(name, [])):
                if p and p not in ranges:
                    ranges[p] = (mn[j], opt[j], mx[j])
        one = {}
        for vi in probe.graph.input:
            dims = [(d.dim_value,) * 3 if d.HasField("dim_value") else ranges.get(d.dim_param, (1, 1, 1))
                    for d in vi.type.tensor_type.shape.dim]
            one[vi.name] = tuple(tuple(d[k] for d in dims) for k in range(3))
        out.append(one)
    return out


# ----------------------------------------------------------------------------- plain ops

class _Builder:
    """Nodes and initializers of one rewrite, named under a prefix."""

    def __init__(self, prefix: str):
        self.prefix, self.nodes, self.inits, self.n = prefix, [], [], 0

    def name(self, what: str) -> str:
        self.n += 1
        return f"{self.prefix}/{what}_{self.n}"

    def const(self, what: str, value, dtype) -> str:
        import numpy as np
        from onnx import numpy_helper

        name = self.name(what)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list, out: Optional[str] = None, **attrs) -> str:
        import onnx

        y = out or self.name(op_type.lower())
        self.nodes.append(onnx.helper.make_node(op_type, inputs, [y], name=self.name(op_type), **attrs))
        return y


def _to_4d(b: _Builder, x: str, heads: int) -> str:
    """(B, S, heads * D) -> (B, heads, S, D)."""
    r = b.op("Reshape", [x, b.const("shape", [0, 0, heads, -1], "int64")])
    return b.op("Transpose", [r], perm=[0, 2, 1, 3])


def _repeat_heads(b: _Builder, x: str, reps: int) -> str:
    """(B, H, T, D) -> (B, H * reps, T, D), each head repeated `reps` times in a row."""
    u = b.op("Unsqueeze", [x, b.const("axes", [2], "int64")])
    lead = b.op("Shape", [x], end=2)
    tail = b.op("Shape", [x], start=2)
    expanded = b.op("Expand", [u, b.op("Concat", [lead, b.const("reps", [reps], "int64"), tail], axis=0)])
    batch = b.op("Shape", [x], end=1)
    heads = b.const("heads", [-1], "int64")
    return b.op("Reshape", [expanded, b.op("Concat", [batch, heads, tail], axis=0)])


def _heads(io: list, attrs: dict) -> Optional[tuple]:
    """(q heads, kv heads, Q's head size, rank) from the attributes (3-D) or the shapes (4-D);
    None when they are not static."""
    rank = len(io[0][1])
    if rank == 3:
        hq, hkv, hidden = attrs.get("q_num_heads"), attrs.get("kv_num_heads"), io[0][1][2]
        if not hq or not hkv or not isinstance(hidden, int):
            return None
        return int(hq), int(hkv), hidden // int(hq), 3
    if rank != 4:
        return None
    hq, hkv, d = io[0][1][1], io[1][1][1], io[0][1][3]
    return (hq, hkv, d, 4) if all(isinstance(v, int) and v > 0 for v in (hq, hkv, d)) else None


def _scores(b: _Builder, node, io: list, attrs: dict, hq: int, hkv: int, d: int, rank: int) -> tuple:
    """(fp32 masked scores, V in 4-D) of one Attention node."""
    q, k, v = node.input[:3]
    if rank == 3:
        q, k, v = _to_4d(b, q, hq), _to_4d(b, k, hkv), _to_4d(b, v, hkv)
    if hq != hkv:
        k, v = _repeat_heads(b, k, hq // hkv), _repeat_heads(b, v, hq // hkv)
    s = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
    if io[0][0] != _FLOAT:
        s = b.op("Cast", [s], to=_FLOAT)
    scale = attrs.get("scale")
    s = b.op("Mul", [s, b.const("scale", 1.0 / math.sqrt(d) if scale is None else float(scale), "float32")])
    cap = float(attrs.get("softcap", 0.0))
    if cap > 0:
        c = b.const("softcap", cap, "float32")
        s = b.op("Mul", [b.op("Tanh", [b.op("Div", [s, c])]), c])
    if io[3] is not None:
        mask = node.input[3]
        if io[3][0] == 9:  # bool: True attends
            s = b.op("Where", [mask, s, b.const("neg_inf", -math.inf, "float32")])
        else:
            s = b.op("Add", [s, mask if io[3][0] == _FLOAT else b.op("Cast", [mask], to=_FLOAT)])
    if int(attrs.get("is_causal", 0)):  # query i attends keys j <= i (no past: ONNX's top-left causal)
        ones = b.op("ConstantOfShape", [b.op("Shape", [s], start=-2)], value=_tensor_proto(1.0, "float32"))
        allowed = b.op("Cast", [b.op("Trilu", [ones], upper=0)], to=9)
        s = b.op("Where", [allowed, s, b.const("neg_inf", -math.inf, "float32")])
    return s, v


def _tensor_proto(value, dtype):
    import numpy as np
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray([value], dtype=dtype))


def _check_mask_width(label: str, io: list) -> None:
    if io[3] is None:
        return
    mw, kw = io[3][1][-1], io[1][1][-2] if len(io[1][1]) == 4 else io[1][1][1]
    if mw != kw:
        raise AttentionRewriteError(
            f"{label}: attn_mask covers {mw} keys, K has {kw}; the plain rewrite takes a mask over every key "
            "(pad the mask at export)")


def plain_nodes(node, shapes: dict):
    """(nodes, initializers) computing `node`'s output with standard ops (module docstring)."""
    label = node.name or "Attention"
    io = _io(node, shapes, label)
    attrs = node_attrs(node)
    heads = _heads(io, attrs)
    if heads is None:
        raise AttentionRewriteError(f"{label}: head counts / head size must be static (4-D Q/K/V with known "
                                    "heads and head size, or 3-D with q_num_heads / kv_num_heads)")
    hq, hkv, d, rank = heads
    if hq % hkv:
        raise AttentionRewriteError(f"{label}: {hq} query heads are not a multiple of {hkv} key/value heads")
    _check_mask_width(label, io)
    b = _Builder(label)
    s, v = _scores(b, node, io, attrs, hq, hkv, d, rank)
    p = b.op("Softmax", [s], axis=-1)
    if io[2][0] != _FLOAT:
        p = b.op("Cast", [p], to=io[2][0])
    if rank == 3:
        y = b.op("MatMul", [p, v])
        t = b.op("Transpose", [y], perm=[0, 2, 1, 3])
        b.op("Reshape", [t, b.const("shape", [0, 0, -1], "int64")], out=node.output[0])
    else:
        b.op("MatMul", [p, v], out=node.output[0])
    return b.nodes, b.inits


def plain_attention(model) -> int:
    """Replace every Attention node of `model`'s main graph by plain ops (in place, order kept);
    returns how many were replaced."""
    nodes = attention_nodes(model)
    if not nodes:
        return 0
    shapes = _typed_shapes(model)
    rewritten = {id(n): plain_nodes(n, shapes) for n in nodes}
    out = []
    for n in model.graph.node:
        if id(n) in rewritten:
            new, inits = rewritten[id(n)]
            out += new
            model.graph.initializer.extend(inits)
        else:
            out.append(n)
    del model.graph.node[:]
    model.graph.node.extend(out)
    return len(nodes)


# ----------------------------------------------------------------------------- the fused pattern

# NVIDIA's "Fused Attention" (TensorRT developer guide, inference-library/transformers-fused-attention,
# method 2: attention written with primitive layers, IMatrixMultiplyLayer and ISoftMaxLayer): TensorRT
# fuses softmax(Q * K^T (mask)) * V, the mask a bool (select) or an add mask on Q * K^T, and requires Q
# or K to be multiplied by the attention scale (or both by its square root) BEFORE the first batched
# matmul (BMM1); MHA, GQA (N_q % N_kv == 0) and MQA. So, per attention, from BMM1 to BMM2:
#     MatMul(Q', K^T) -> [Cast] -> [Where(mask) | Add(mask)] -> Softmax(last axis) -> [Cast] -> MatMul(P, V)
# with Q' (or K) = Mul(x, scalar constant) upstream of BMM1 through layout ops only. Casts are the
# strongly typed network's precision changes (fp32 scores / softmax in an fp16 graph).
LAYOUT_OPS = ("Reshape", "Transpose", "Unsqueeze", "Squeeze", "Expand", "Identity")
_BETWEEN = ("Cast", "Where", "Add")  # what may sit between BMM1 and Softmax


def _graph_index(model):
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    consts = {t.name for t in model.graph.initializer}
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return producer, consumers, consts


def _scalar_const(model, name: str, producer: dict, consts: set) -> bool:
    """Whether `name` is a one-element constant (initializer or Constant node, through Cast)."""
    import numpy as np
    from onnx import numpy_helper

    n = producer.get(name)
    while n is not None and n.op_type in ("Cast",) + LAYOUT_OPS:
        name, n = n.input[0], producer.get(n.input[0])
    for t in model.graph.initializer:
        if t.name == name:
            return int(np.prod(t.dims)) == 1 if len(t.dims) else True
    if n is not None and n.op_type == "Constant":
        for a in n.attribute:
            if a.name == "value":
                return numpy_helper.to_array(a.t).size == 1
            if a.name in ("value_float", "value_int"):
                return True
    return False


def _scaled(model, name: str, producer: dict, consts: set) -> list:
    """The nodes from Mul(x, scalar constant) to `name` through layout ops (Reshape / Transpose /
    ...), or [] when `name` is not scaled so."""
    n, path = producer.get(name), []
    while n is not None and n.op_type in LAYOUT_OPS:
        path.append(n)
        n = producer.get(n.input[0])
    if n is None or n.op_type not in ("Mul", "Div"):
        return []
    if any(_scalar_const(model, i, producer, consts) for i in n.input[1 if n.op_type == "Div" else 0:]):
        return path + [n]
    return []


def fused_attention_report(model) -> list:
    """Every attention of a graph checked against NVIDIA's fused-attention pattern (above).

    An attention is a Softmax whose probabilities reach a MatMul (through a Cast at most).
    Returns one dict per attention: softmax node, bmm1 / bmm2 names, `scale` ("q", "k" or None),
    `mask` (the mask op or None), `casts` (Cast target types between BMM1 and BMM2), `softmax_dtype`
    (the Cast target feeding the Softmax, None without one), and `violations` (empty: the pattern)."""
    producer, consumers, consts = _graph_index(model)
    out = []
    for sm in (n for n in model.graph.node if n.op_type == "Softmax"):
        after, casts_after = consumers.get(sm.output[0], []), []
        while len(after) == 1 and after[0].op_type == "Cast":
            casts_after.append(node_attrs(after[0]).get("to"))
            after = consumers.get(after[0].output[0], [])
        frontier, reach = [sm.output[0]], []
        for _ in range(4):  # the probabilities through Cast / Slice / layout ops to a MatMul
            nxt = []
            for t in frontier:
                for c in consumers.get(t, []):
                    if c.op_type == "MatMul":
                        reach.append(c)
                    elif c.op_type in ("Cast", "Slice", "Split") + LAYOUT_OPS:
                        nxt += list(c.output)
            frontier = nxt
        if not reach:
            continue  # not an attention (e.g. a softmax over logits)
        bad, mask, casts, softmax_dtype = [], None, [], None
        direct = [c for c in after if c.op_type == "MatMul"]
        bmm2 = direct[0] if direct else reach[0]
        nodes = [sm, bmm2] + [c for c in consumers.get(sm.output[0], []) if c.op_type == "Cast"]
        if len(after) != 1 or not direct or bmm2.input[0] not in (sm.output[0],) + tuple(
                o for c in nodes[2:] for o in c.output):
            bad.append(f"the probabilities feed {[c.op_type for c in after]}, not one BMM2 as its first input "
                       f"(P x V)")
        axis = node_attrs(sm).get("axis", -1)
        if axis != -1:
            bad.append(f"Softmax over axis {axis}, not the last")
        x = producer.get(sm.input[0])
        while x is not None and x.op_type in _BETWEEN:
            nodes.append(x)
            if x.op_type == "Cast":
                casts.append(node_attrs(x).get("to"))
                if softmax_dtype is None:  # the cast nearest the Softmax sets the type it runs in
                    softmax_dtype = node_attrs(x).get("to")
                nxt = x.input[0]
            elif mask is not None:
                bad.append(f"a second mask op ({x.op_type}) between BMM1 and Softmax")
                nxt = x.input[0]
            else:
                mask = x.op_type
                if x.op_type == "Where":  # Where(cond, a, b): the scores are the non-constant branch
                    nxt = next((i for i in x.input[1:] if not _scalar_const(model, i, producer, consts)), x.input[2])
                else:
                    ins = [i for i in x.input if producer.get(i) is not None and producer[i].op_type in
                           ("MatMul", "Cast")]
                    nxt = ins[0] if ins else x.input[0]
            x = producer.get(nxt)
        if x is None or x.op_type != "MatMul":
            bad.append(f"{x.op_type if x is not None else 'a graph input'} between BMM1 and Softmax "
                       "(only a Cast and one mask op may sit there)")
            out.append(dict(softmax=sm.name, bmm1=None, bmm2=bmm2.name, scale=None, mask=mask,
                            casts=casts + casts_after, softmax_dtype=softmax_dtype, violations=bad,
                            nodes=[n.name for n in nodes]))
            continue
        q_path, k_path = _scaled(model, x.input[0], producer, consts), _scaled(model, x.input[1], producer, consts)
        scale = "q" if q_path else "k" if k_path else None
        if scale is None:
            bad.append("no attention scale on Q or K before BMM1")
        nodes += [x] + q_path + k_path
        kt = producer.get(x.input[1])
        if not k_path and kt is not None and kt.op_type == "Transpose":
            nodes.append(kt)  # K^T: the probe takes K as the graph has it
        out.append(dict(softmax=sm.name, bmm1=x.name, bmm2=bmm2.name, scale=scale, mask=mask,
                        casts=casts + casts_after, softmax_dtype=softmax_dtype, violations=bad,
                        nodes=[n.name for n in nodes]))
    return out


def pattern_probe(model, report: dict):
    """A graph of one attention of `model` (a `fused_attention_report` entry): its nodes from the
    scale Mul to BMM2, fed by the tensors that feed them (graph dtypes and inferred shapes,
    symbolic dims kept), constants carried along. What `lisa-trt build --attention auto` probes
    for a graph whose attention is the primitive pattern."""
    import onnx

    producer, _, _ = _graph_index(model)
    shapes = _typed_shapes(model)
    wanted = set(report["nodes"])
    chain = [n for n in model.graph.node if n.name in wanted]
    produced = {o for n in chain for o in n.output}
    inits = {t.name: t for t in model.graph.initializer}
    extra, names, used = [], [], {}
    for n in chain:
        for i in n.input:
            if not i or i in produced or i in names:
                continue
            p = producer.get(i)
            if i in inits:
                used[i] = inits[i]
            elif p is not None and p.op_type == "Constant":
                extra.append(p)
                produced.add(i)
            else:
                names.append(i)
    order = {id(n): k for k, n in enumerate(model.graph.node)}
    nodes = sorted(chain + extra, key=lambda n: order[id(n)])
    end = next(n for n in chain if n.name == report["bmm2"])

    def vi(name):
        dt, shape = shapes[name]
        return onnx.helper.make_tensor_value_info(name, dt, shape)

    graph = onnx.helper.make_graph(nodes, "attention_probe", [vi(n) for n in names], [vi(end.output[0])],
                                   list(used.values()))
    return onnx.helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)


__all__ = ["ATTENTION_MODES", "AttentionRewriteError", "attention_nodes", "fused_attention_report",
           "pattern_probe", "plain_attention", "plain_nodes",
           "probe_model", "probe_profiles", "probe_specs"]
