"""Operator audit: every op of every graph TensorRT would parse, against the parser's support table.

    python scripts/trt_op_audit.py DIR [DIR ...] [--json OUT] [--markdown OUT] [--docs docs/tensorrt.md]

For each engine directory (a `lisa-trt export` bundle, fp16 / quantized / Medusa ones included)
and each graph TensorRT would build from it (gasv: its TensorRT variant with the lisa::gasv2
plugin), every node (local functions and If/Loop/Scan bodies included) is listed with its
domain, the opset it is read with, the element type of the input TensorRT checks
(`trt_lint.OpSupport.type_input`) and the attributes that change how the parser imports it
(`ATTRS`). Each distinct (op, opset, dtype, attributes) row is checked against
`trt_lint.SUPPORTED_OPS` for the pinned TensorRT version (`trt_lint.TRT_MIN_VERSION`; the
table's sources are in trt_lint's docstring: onnx-tensorrt docs/operators.md and the
10.14-10.16 importers) with its restrictions, and against the parser's static checks
(engines/parser_checks.py `node_errors`), as `trt_lint.check_model` does. A row outside the
table or failing a check is a failure (`OpAuditError`); the table goes into docs/tensorrt.md.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

from ..errors import InputError, LisaError

# Attributes that decide how (or whether) TensorRT's parser imports an op (onnx-tensorrt importers).
ATTRS = {
    "Attention": ("is_causal", "softmax_precision", "q_num_heads", "kv_num_heads", "qk_matmul_output_mode"),
    "ScatterND": ("reduction",), "ScatterElements": ("reduction", "axis"), "TensorScatter": ("mode", "axis"),
    "Cast": ("to",), "Softmax": ("axis",), "LayerNormalization": ("axis", "stash_type"),
    "RMSNormalization": ("axis", "stash_type"), "Gather": ("axis",), "GatherElements": ("axis",),
    "TopK": ("largest", "sorted", "axis"), "Concat": ("axis",), "Einsum": ("equation",),
    "QuantizeLinear": ("axis", "block_size", "output_dtype"), "DequantizeLinear": ("axis", "block_size"),
    "Resize": ("mode", "coordinate_transformation_mode", "nearest_mode"), "Conv": ("group",),
    "ReduceMax": ("keepdims",), "ReduceSum": ("keepdims",), "ReduceMean": ("keepdims",),
    "CumSum": ("exclusive", "reverse"), "Trilu": ("upper",), "GroupNormalization": ("num_groups",),
    "RotaryEmbedding": ("interleaved", "num_heads"),
}


class OpAuditError(LisaError):
    """A graph uses an op (or op variant) outside TensorRT's ONNX parser support table."""


@dataclasses.dataclass
class OpRow:
    bundle: str
    graph: str
    op: str
    domain: str
    opset: int
    dtype: str
    attrs: str
    count: int = 0
    supported: bool = True
    reason: str = ""


def _attr_str(node, names) -> str:
    import onnx

    out = []
    for a in node.attribute:
        if a.name in names:
            v = onnx.helper.get_attribute_value(a)
            out.append(f"{a.name}={v.decode() if isinstance(v, bytes) else v}")
    return ",".join(sorted(out))


def audit_model(model, *, bundle: str, graph: str, trt_version=None) -> list:
    """OpRows of one ONNX model (one per distinct op variant), checked against the support table."""
    from . import trt_lint as tc

    trt_version = tuple(trt_version or tc.TRT_MIN_VERSION)
    ctx = tc._Ctx(model)
    opsets = {o.domain or "": o.version for o in model.opset_import}
    rows = {}

    def walk(nodes, where=""):
        import onnx

        for node in nodes:
            fn = ctx.functions.get((node.domain, node.op_type))
            if fn is not None:
                walk(fn.node, f"{where}{node.op_type}/")
                continue
            dom = node.domain if node.domain not in ("", "ai.onnx") else ""
            sup = tc.SUPPORTED_OPS.get(node.op_type) if not dom else None
            ti = sup.type_input if sup is not None else 0
            dt = ctx.types.get(node.input[ti]) if len(node.input) > ti and node.input[ti] else None
            key = (node.op_type, dom, opsets.get(dom, 1), tc.ONNX_DTYPE_NAMES.get(dt, "?") if dt else "-",
                   _attr_str(node, ATTRS.get(node.op_type, ())))
            r = rows.get(key)
            if r is None:
                r = rows[key] = OpRow(bundle, graph, *key)
            ok, reason = _verdict(node, dom, sup, dt, ctx, trt_version)
            if r.count == 0 or (r.supported and not ok):
                r.supported, r.reason = ok, reason
            r.count += 1
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g.node, f"{where}{node.op_type}/")
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        walk(sub.node, f"{where}{node.op_type}/")

    walk(ctx.model.graph.node)
    return sorted(rows.values(), key=lambda r: (r.graph, r.domain, r.op, r.dtype, r.attrs))


def _verdict(node, dom, sup, dt, ctx, trt_version) -> tuple:
    """(supported, reason) of one node: the table entry, its version, dtype, restrictions and the
    parser's static checks (engines/parser_checks.py)."""
    from ..engines.parser_checks import node_errors
    from . import trt_lint as tc

    if dom == "lisa":
        bad, _ = tc._check_plugin(node, ctx)
        return (not bad, "; ".join(bad) if bad else "lisa plugin (tensorrt.plugin; creator found by name, version "
                "\"1\", namespace)")
    if dom:
        return False, f"domain {dom!r} is not an ONNX domain TensorRT parses (an ONNX Runtime contrib op?)"
    if sup is None:
        return False, "; ".join(["not in TensorRT's ONNX operator support matrix", *node_errors(node, ctx.opset)])
    if sup.since > trt_version:
        return False, f"needs TensorRT >= {'.'.join(map(str, sup.since))}"
    if sup.types is not None and dt is not None and dt not in sup.types:
        return False, f"{tc.ONNX_DTYPE_NAMES.get(dt, dt)} inputs not supported"
    bad = list(sup.check(node, ctx)[0]) if sup.check is not None else []
    bad += node_errors(node, ctx.opset)  # the parser's static checks (onnxOpCheckers.cpp)
    if bad:
        return False, "; ".join(bad)
    return True, f"since TensorRT {'.'.join(map(str, sup.since))}" + (f" ({sup.note})" if sup.note else "")


def audit_bundle(engine_dir, *, name: Optional[str] = None, trt_version=None) -> list:
    """OpRows of every graph TensorRT would parse from an engine directory."""
    from ..models.io_spec import Graph
    from ..export.manifest import read_manifest
    from ..engines.profiles import trt_graph_model

    man = read_manifest(engine_dir)
    rows = []
    for g in sorted(man.graphs):
        model, _ = trt_graph_model(man, Graph(g))
        rows += audit_model(model, bundle=name or Path(engine_dir).name, graph=g, trt_version=trt_version)
    return rows


def check_rows(rows: list) -> None:
    """Raise OpAuditError listing every unsupported row."""
    bad = [r for r in rows if not r.supported]
    if bad:
        lines = [f"  {r.bundle}/{r.graph}: {r.domain + '::' if r.domain else ''}{r.op} (opset {r.opset}, {r.dtype}"
                 f"{', ' + r.attrs if r.attrs else ''}): {r.reason}" for r in bad]
        raise OpAuditError("ops outside TensorRT's ONNX parser support table:\n" + "\n".join(lines) +
                           "\nRe-export without them (or add a supported equivalent / plugin) before `lisa-trt build`.")


def markdown(rows: list) -> str:
    """One table: op variants (merged over graphs) with the bundles / graphs using them."""
    merged = {}
    for r in rows:
        k = (r.domain, r.op, r.opset, r.dtype, r.attrs, r.supported, r.reason)
        merged.setdefault(k, {}).setdefault(r.bundle, set()).add(r.graph)
    out = ["| op | opset | dtype | attributes | TensorRT | where (bundle: graphs) |", "|---|---|---|---|---|---|"]
    for (dom, op, opset, dt, attrs, ok, reason), where in sorted(merged.items()):
        w = "; ".join(f"{b}: {', '.join(sorted(gs))}" for b, gs in sorted(where.items()))
        out.append(f"| {dom + '::' if dom else ''}{op} | {opset} | {dt} | {attrs or '-'} | "
                   f"{'ok' if ok else 'NO'}: {reason} | {w} |")
    return "\n".join(out)


DOCS_BEGIN, DOCS_END = "<!-- op-audit:begin -->", "<!-- op-audit:end -->"


def with_docs_table(text: str, rows: list) -> str:
    """`text` (docs/tensorrt.md) with the table between its op-audit markers replaced by `markdown(rows)`."""
    head, sep, rest = text.partition(DOCS_BEGIN)
    _, sep2, tail = rest.partition(DOCS_END)
    if not sep or not sep2:
        raise InputError(f"no {DOCS_BEGIN} ... {DOCS_END} block to write the table into; put the two markers "
                         "(each on its own line) where the table goes")
    return f"{head}{DOCS_BEGIN}\n{markdown(rows)}\n{DOCS_END}{tail}"


def to_json(rows: list) -> dict:
    from . import trt_lint as tc

    return {"trt_version": list(tc.TRT_MIN_VERSION), "table_sources": "lisa_trt/deploy/trt_lint.py docstring",
            "rows": [dataclasses.asdict(r) for r in rows]}


__all__ = ["ATTRS", "DOCS_BEGIN", "DOCS_END", "OpAuditError", "OpRow", "audit_bundle", "audit_model", "check_rows",
           "markdown", "to_json", "with_docs_table"]


def main(argv=None) -> int:
    import argparse

    from ..io import atomic_write

    ap = argparse.ArgumentParser(description="TensorRT operator audit of lisa-trt bundles")
    ap.add_argument("dirs", nargs="+", type=Path, help="engine directories (NAME=DIR to name one)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--docs", type=Path, help="rewrite the table between the op-audit markers of this file "
                    "(docs/tensorrt.md)")
    a = ap.parse_args(argv)
    docs = a.docs.read_text() if a.docs else None  # read (and its markers checked) before any work
    if docs is not None:
        try:
            with_docs_table(docs, [])
        except InputError as e:
            print(f"{a.docs}: {e}")
            return 2
    rows = []
    for d in a.dirs:
        name, _, path = str(d).partition("=") if "=" in str(d) else (d.name, "", str(d))
        rows += audit_bundle(Path(path), name=name)
    md = markdown(rows)
    print(md)
    if a.json:
        with atomic_write(a.json) as tmp:
            Path(tmp).write_text(json.dumps(to_json(rows), indent=1) + "\n")
    if a.markdown:
        with atomic_write(a.markdown) as tmp:
            Path(tmp).write_text(md + "\n")
    if docs is not None:
        with atomic_write(a.docs) as tmp:
            Path(tmp).write_text(with_docs_table(docs, rows))
    try:
        check_rows(rows)
    except OpAuditError as e:
        print(str(e))
        return 1
    return 0
