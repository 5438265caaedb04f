"""What an int8 ONNX graph computes on each kind of x86 CPU.

ONNX Runtime's dynamic int8 graphs multiply uint8 activations A by int8 weights B in
`MatMulInteger` (fused by ORT into `DynamicQuantizeMatMul`). ORT's MLAS library computes the u8 x s8
dot products with different instructions depending on the CPU (facts from MLAS's kernels,
onnxruntime/core/mlas/lib: `QgemmU8X8KernelAvx2Common`, `QgemmU8S8KernelAvx512Core`,
`SymQgemmU8KernelAvx512`; ORT's `quantize_dynamic` docstring on `reduce_range`):

- **vnni** (AVX512-VNNI or AVX-VNNI: Cascade Lake and newer Xeons, Zen 4+, Alder Lake+):
  `vpdpbusd(s)` adds four u8*s8 products straight into int32: the exact integer dot product.
- **avx2** (AVX2, or AVX-512 without VNNI: Zen 1-3, Haswell-Skylake): `vpmaddubsw` adds each pair of
  neighbouring products (k = 2i, 2i+1) into a *saturating int16*, then `vpmaddwd` with ones adds
  those into int32. A pair sum a0*b0 + a1*b1 can reach 2 * 255 * 127 = 64,770 > 32,767: it clips.
  The A zero point is applied afterwards from the column sums of B, so the clipped products are
  those of the raw uint8 activations.
- uint8 x uint8 (`QUInt8` weights) runs on 16-bit multiplies with 32-bit sums (`vpmaddwd`): exact
  everywhere.

So a graph whose int8 weights use the full range [-127, 127] computes something else on an
AVX2-only CPU than on a VNNI one. This module gives

- `cpu_kind()`: the kind of this CPU ("vnni", "avx2", or "other" for non-x86 / pre-AVX2);
- `saturation_bound(model)`: a static proof: the largest pair sum any uint8 activation can make
  with each MatMulInteger's constant weights; when it is <= 32,767 for every node the integer
  results are identical on every x86 kind (weights in [-64, 63], i.e. `reduce_range`, guarantee it);
- `emulate(model, kind)`: the same graph with every MatMulInteger replaced by float64 ops that
  compute what `kind` computes ("exact" = vnni, "avx2" = with the int16 pair saturation), so the
  export can validate what *any* x86 CPU will compute on whichever CPU it runs on.

The emulation is checked against the real ORT kernels of the machine the tests run on: an AVX2
machine's ORT output equals `emulate(..., "avx2")`, a VNNI machine's equals `emulate(..., "exact")`
(tests/export/test_int8_isa.py).
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path
from typing import Union

import numpy as np

INT16_MAX, INT16_MIN = 32767, -32768
CPU_KINDS = ("vnni", "avx2", "other")
EMULATIONS = ("exact", "avx2")


@functools.lru_cache(maxsize=1)
def cpu_kind() -> str:
    """"vnni" | "avx2" | "other": which MLAS u8 x s8 path ONNX Runtime takes on this CPU."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return "other"
    try:
        flags = set()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return "other"
    if "avx512_vnni" in flags or "avx_vnni" in flags:
        return "vnni"
    if "avx2" in flags:
        return "avx2"
    return "other"


def _load(model):
    import onnx

    if isinstance(model, (str, Path)):
        return onnx.load(str(model))
    return model


def _matmul_integer_weights(model):
    """[(node index, B as int array, b_zero_point array or None)] for MatMulInteger nodes with constant B."""
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    out = []
    for i, n in enumerate(model.graph.node):
        if n.op_type != "MatMulInteger" or len(n.input) < 2 or n.input[1] not in inits:
            continue
        b = numpy_helper.to_array(inits[n.input[1]])
        zp = numpy_helper.to_array(inits[n.input[3]]) if len(n.input) > 3 and n.input[3] in inits else None
        out.append((i, b, zp))
    return out


def saturation_bound(model: Union[str, Path, "object"]) -> dict:
    """Largest |pair sum| of uint8 activations x each MatMulInteger's constant int8 weights.

    For a pair (b0, b1) of neighbouring weights along K, uint8 activations in [0, 255] reach at most
    255 * (max(b0, 0) + max(b1, 0)) and at least -255 * (max(-b0, 0) + max(-b1, 0)). When every pair
    stays within int16 for every node, the AVX2 path cannot saturate and every x86 CPU computes the
    same integers. uint8 weights take the exact u8 x u8 path.

    Returns:
        {"nodes": int, "int8_nodes": int, "worst_pair": int, "limit": 32767, "exact_on_every_x86": bool}
    """
    model = _load(model)
    worst, n8, nodes = 0, 0, 0
    for _, b, _ in _matmul_integer_weights(model):
        nodes += 1
        if b.dtype != np.int8:
            continue  # u8 x u8: exact on every path
        n8 += 1
        w = b.astype(np.int64).reshape(b.shape[0], -1)  # (K, N)
        if w.shape[0] % 2:
            w = np.concatenate([w, np.zeros((1, w.shape[1]), np.int64)])
        pos = np.maximum(w, 0)[0::2] + np.maximum(w, 0)[1::2]
        neg = np.maximum(-w, 0)[0::2] + np.maximum(-w, 0)[1::2]
        worst = max(worst, int(255 * max(pos.max(initial=0), neg.max(initial=0))))
    return {"nodes": nodes, "int8_nodes": n8, "worst_pair": worst, "limit": INT16_MAX,
            "exact_on_every_x86": worst <= INT16_MAX}


# ----------------------------------------------------------------------------- emulation

def emulate(model, kind: str):
    """A copy of `model` whose MatMulInteger nodes compute, in float64, what `kind` computes.

    kind: "exact" (VNNI, and u8 x u8 everywhere) or "avx2" (u8 x s8 pair sums clipped to int16).
    Only MatMulInteger nodes with a constant B are replaced (the ones quantize_dynamic writes).
    """
    import onnx

    if kind not in EMULATIONS:
        raise ValueError(f"unknown emulation {kind!r}; valid: {', '.join(EMULATIONS)}")
    model = onnx.ModelProto.FromString(_load(model).SerializeToString())
    weights = {i: (b, zp) for i, b, zp in _matmul_integer_weights(model)}
    out = _Graph()
    for idx, node in enumerate(model.graph.node):
        n = onnx.NodeProto()
        n.CopyFrom(node)  # detached: the graph's node list is rebuilt below
        if idx in weights:
            _emulate_node(out, n, f"_isa{idx}_", *weights[idx], saturating=kind == "avx2")
        else:
            out.nodes.append(n)
    out.install(model.graph)
    return model


class _Graph:
    """The nodes and float64 constants of the emulated graph, in the order they are made."""

    def __init__(self):
        self.nodes, self.inits = [], []

    def const(self, name, arr) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def add(self, op, inputs, outputs, **attrs) -> None:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, outputs, **attrs))

    def install(self, g) -> None:
        """Replace `g`'s nodes and keep only the initializers some node still reads."""
        del g.node[:]
        g.node.extend(self.nodes)
        used = {i for n in self.nodes for i in n.input}
        keep = [t for t in g.initializer if t.name in used]  # the int weights now live as float64 constants
        del g.initializer[:]
        g.initializer.extend(keep + [t for t in self.inits if t.name in used])


def _emulate_node(out: _Graph, n, p: str, b, bzp, *, saturating: bool) -> None:
    """Float64 nodes (names prefixed `p`) computing MatMulInteger `n` with constant B `b`."""
    from onnx import TensorProto

    a_raw = p + "a"
    out.add("Cast", [n.input[0]], [a_raw], to=TensorProto.DOUBLE)
    has_azp = len(n.input) > 2 and n.input[2] != ""
    if saturating and b.dtype == np.int8:
        cur = _saturating_matmul(out, n, p, a_raw, b, bzp, has_azp)
    else:
        cur = _exact_matmul(out, n, p, a_raw, b, bzp, has_azp)
    out.add("Cast", [cur], [n.output[0]], to=TensorProto.INT32)


def _exact_matmul(out: _Graph, n, p: str, a_raw: str, b, bzp, has_azp: bool) -> str:
    """(A - a_zp) @ (B - b_zp) in float64: the exact integer result."""
    from onnx import TensorProto

    a = a_raw
    if has_azp:
        azp, a = p + "azp", p + "ac"
        out.add("Cast", [n.input[2]], [azp], to=TensorProto.DOUBLE)
        out.add("Sub", [a_raw, azp], [a])
    bc = b.astype(np.float64) - (bzp.astype(np.float64) if bzp is not None else 0.0)
    out.add("MatMul", [a, out.const(p + "b", bc)], [p + "mm"])
    return p + "mm"


def _saturating_matmul(out: _Graph, n, p: str, a_raw: str, b, bzp, has_azp: bool) -> str:
    """The AVX2 path: raw products of uint8 A with int8 B, neighbouring pairs along K clipped to
    int16, then the zero points applied from column / row sums (as MLAS does)."""
    K = b.shape[0]
    bd = b.astype(np.float64)
    if K % 2:
        bd = np.concatenate([bd, np.zeros((1,) + bd.shape[1:])])
        a_raw = _pad_last_axis(out, p, a_raw)
    acc = _clipped_pair_sums(out, p, a_raw, bd)
    return _zero_point_terms(out, n, p, acc, a_raw, bd, bzp, K, has_azp)


def _pad_last_axis(out: _Graph, p: str, a_raw: str) -> str:
    """A with one zero column appended along K (made from A's last column so shapes stay symbolic)."""
    zero_col, mul0, padded = p + "zc", p + "z0", p + "ap"
    out.add("Slice", [a_raw, out.const(p + "s0", [0]), out.const(p + "s1", [1]), out.const(p + "s2", [-1])],
            [zero_col])
    out.add("Mul", [zero_col, out.const(p + "zero", np.zeros((), np.float64))], [mul0])
    out.add("Concat", [a_raw, mul0], [padded], axis=-1)
    return padded


def _clipped_pair_sums(out: _Graph, p: str, a_raw: str, bd) -> str:
    """sum over pairs of clip(a[2i] * b[2i] + a[2i+1] * b[2i+1], int16) along K (even K)."""
    a_even, a_odd = p + "ae", p + "ao"
    big = np.iinfo(np.int64).max
    out.add("Slice", [a_raw, out.const(p + "e0", [0]), out.const(p + "e1", [big]), out.const(p + "ax", [-1]),
                      out.const(p + "st", [2])], [a_even])
    out.add("Slice", [a_raw, out.const(p + "o0", [1]), out.const(p + "o1", [big]), p + "ax", p + "st"], [a_odd])
    ue, uo = p + "ue", p + "uo"
    out.add("Unsqueeze", [a_even, out.const(p + "m1", [-1])], [ue])
    out.add("Unsqueeze", [a_odd, p + "m1"], [uo])
    pe, po, pair, clip = p + "pe", p + "po", p + "pair", p + "clip"
    out.add("Mul", [ue, out.const(p + "be", bd[0::2])], [pe])  # (..., M, K/2, N)
    out.add("Mul", [uo, out.const(p + "bo", bd[1::2])], [po])
    out.add("Add", [pe, po], [pair])
    out.add("Clip", [pair, out.const(p + "lo", np.array(INT16_MIN, np.float64)),
                     out.const(p + "hi", np.array(INT16_MAX, np.float64))], [clip])
    out.add("ReduceSum", [clip, out.const(p + "rax", [-2])], [p + "acc"], keepdims=0)
    return p + "acc"


def _zero_point_terms(out: _Graph, n, p: str, cur: str, a_raw: str, bd, bzp, K: int, has_azp: bool) -> str:
    """acc - a_zp * colsum(B) - rowsum(A) * b_zp + K * a_zp * b_zp, each term only where it is non-zero."""
    from onnx import TensorProto

    azp = p + "azp"
    if has_azp:
        out.add("Cast", [n.input[2]], [azp], to=TensorProto.DOUBLE)
        out.add("Mul", [azp, out.const(p + "colsum", bd.sum(0))], [p + "azpcol"])
        out.add("Sub", [cur, p + "azpcol"], [p + "c1"])
        cur = p + "c1"
    if bzp is None or not np.any(bzp != 0):
        return cur
    out.add("ReduceSum", [a_raw, out.const(p + "rax2", [-1])], [p + "rowsum"], keepdims=1)
    out.add("Mul", [p + "rowsum", out.const(p + "bzp", bzp.astype(np.float64))], [p + "bzprow"])
    out.add("Sub", [cur, p + "bzprow"], [p + "c2"])
    cur = p + "c2"
    if has_azp:
        out.add("Mul", [azp, out.const(p + "kbzp", K * bzp.astype(np.float64))], [p + "kab"])
        out.add("Add", [cur, p + "kab"], [p + "c3"])
        cur = p + "c3"
    return cur


def run_emulated(path, inputs: dict, kind: str) -> dict:
    """Run graph `path` with its MatMulInteger nodes emulated for `kind`: {output name: torch tensor}."""
    import onnxruntime as ort
    import torch

    from .validate import to_numpy

    model = emulate(path, kind)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # no re-fusion into int kernels
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    res = sess.run(names, {k: to_numpy(v) for k, v in inputs.items()})
    return {n: torch.from_numpy(np.ascontiguousarray(r)) for n, r in zip(names, res)}


# ----------------------------------------------------------------------------- at run time

def unvalidated_graphs(manifest, kind: str | None = None) -> list[str]:
    """int8 (MatMulInteger) graphs of a bundle whose validation does not cover CPU kind `kind`.

    A graph is covered when its manifest records `validation.isa.covered` with `kind` (written at
    export: by the static bound, or by emulating each kind). Int8 bundles without that record count
    as covered where their recorded bound proves that no pair sum saturates, and on VNNI CPUs (the
    exact path), and as uncovered on AVX2-type CPUs, where their full-range weights can saturate.
    Non-x86 CPUs are not judged here ("other": never warned).
    """
    kind = kind or cpu_kind()
    if kind == "other":
        return []
    out = []
    for name, g in sorted(manifest.graphs.items()):
        q = getattr(g, "quantization", None) or {}
        if q.get("mode") != "int8":
            continue
        isa = (g.validation or {}).get("isa")
        if isa is None:
            bound = q.get("bound") or {}
            if bound.get("exact_on_every_x86") or kind == "vnni":
                continue
            out.append(name)
        elif kind not in isa.get("covered", ()):
            out.append(name)
    return out


def isa_warning(manifest, kind: str | None = None) -> str | None:
    """One-line warning for running an int8 bundle on a CPU kind it was not validated for, or None."""
    kind = kind or cpu_kind()
    names = unvalidated_graphs(manifest, kind)
    if not names:
        return None
    return (f"int8 graphs {', '.join(names)} of {manifest.dir} were not validated for this CPU ({kind}: "
            "no AVX512-VNNI / AVX-VNNI, so ONNX Runtime adds u8 x s8 products in saturating int16 and "
            "full-range int8 weights can overflow it). Re-export with `lisa-trt export ... --quantize int8` "
            "(7-bit weights, checked for every x86 CPU), or use the fp32 bundle.")


__all__ = ["CPU_KINDS", "EMULATIONS", "cpu_kind", "emulate", "isa_warning", "run_emulated", "saturation_bound",
           "unvalidated_graphs"]
