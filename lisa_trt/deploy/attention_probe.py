"""`lisa-trt build --attention auto|op|plain`: which attention each engine is built with, decided in
seconds by one-node probe builds before any real build.

    per graph with Attention: export ─▶ strip_for_trt ─▶ attention_ops.probe_specs (one per
        distinct node: dtype, mask kind, heads, shapes)
    per probe: attention_ops.probe_model ─▶ trt_lint.check_model (the op table and the parser's
        static checks, onnxOpCheckers.cpp) ─▶ with TensorRT: the same build_plan as the engines
        (Polygraphy, strongly typed), profiles from the graph's by dim name

    mode "op":    a refused probe stops the build, naming the node and `--attention plain`;
    mode "auto":  a graph with a refused probe is built with attention as plain ops (warning);
    mode "plain": no probe; every graph with Attention is built with plain ops.

A graph whose attention is written with primitive ops (every lisa-trt export since io spec v2:
models/layers.rows_attention) holds no Attention node; its attentions are probed as they are:
`attention_ops.fused_attention_report` finds each (Softmax -> BMM2) and checks it against NVIDIA's
fused-attention pattern, and `pattern_probe` cuts each distinct one out (the scale Mul to BMM2)
for the same static checks and build. Such a graph is recorded as "fused" when every probe passes, else "unfused".
A refused pattern probe stops `--attention op`; under `auto` it warns (there is no other form to
fall back to: the engine is built as exported, attention likely unfused, docs/tensorrt.md).

In a dry run (no TensorRT) only the static checks (and the pattern check) answer. The per-graph choice and the probe
results go to the engines record (manifest.json["engines"]["graphs"][g]["attention"]).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, Optional

from ..engines.attention_ops import (ATTENTION_MODES, fused_attention_report, pattern_probe, probe_model,
                                     probe_profiles, probe_specs)
from ..engines.profiles import ProfileSpec, trt_copy
from ..engines.trt_plans import EngineBuildError
from ..errors import InputError
from ..models.io_spec import Graph

_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16", 9: "bool"}


class AttentionRefusedError(EngineBuildError):
    """TensorRT refused a bundle's Attention node (`--attention op`)."""


def describe(spec: dict) -> str:
    """'float16, bool mask, 8 query / 8 kv heads, Q [batch, 8, seq, 32]' of a probe spec."""
    q, k, _, mask = spec["inputs"]
    rank4 = len(q[1]) == 4
    hq = q[1][1] if rank4 else spec["attrs"].get("q_num_heads")
    hkv = k[1][1] if rank4 else spec["attrs"].get("kv_num_heads")
    kind = "no mask" if mask is None else f"{_DTYPES.get(mask[0], mask[0])} mask {mask[1]}"
    causal = ", causal" if int(spec["attrs"].get("is_causal", 0)) else ""
    return (f"{_DTYPES.get(q[0], q[0])}, {kind}{causal}, {hq} query / {hkv} kv heads, Q {q[1]}, K {k[1]} "
            f"({spec['nodes']} node(s) alike)")


def _static_errors(probe, profiles: list) -> list:
    from .trt_lint import check_model

    if not any(n.op_type == "Attention" for n in probe.graph.node):  # a primitive-op attention
        bad = [v for r in fused_attention_report(probe) for v in r["violations"]]
        if bad:
            return [f"not TensorRT's fused-attention pattern: {'; '.join(bad)}"]
    gc = check_model(probe, graph="attention probe", profiles=[ProfileSpec(f"p{i}", p) for i, p in
                                                               enumerate(profiles)])
    return gc.violations


def _probe_one(probe, profiles: list, build: Optional[Callable], workdir: Path) -> Optional[str]:
    """None when the probe builds (dry run: passes the static checks), else the refusal."""
    import onnx

    errors = _static_errors(probe, profiles)
    if errors:
        return "; ".join(errors)
    if build is None:
        return None
    path = workdir / f"{probe.graph.name}.onnx"
    onnx.save(probe, str(path))
    try:
        build(path, [ProfileSpec(f"p{i}", p) for i, p in enumerate(profiles)], workdir / f"{probe.graph.name}.plan")
    except EngineBuildError as e:
        return str(e)
    return None


def _canonical(probe) -> bytes:
    """The probe's bytes with node / tensor names left out (layers alike probe once)."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(probe)
    names = {}
    for n in m.graph.node:
        n.name = ""
        for i, x in enumerate(n.input):
            n.input[i] = names.setdefault(x, f"t{len(names)}") if x else x
        for i, x in enumerate(n.output):
            n.output[i] = names.setdefault(x, f"t{len(names)}")
    for vi in list(m.graph.input) + list(m.graph.output):
        vi.name = names.setdefault(vi.name, f"t{len(names)}")
    for t in m.graph.initializer:
        t.name = names.setdefault(t.name, f"t{len(names)}")
    return m.SerializeToString()


def _describe_pattern(probe, report: dict) -> str:
    ins = {vi.name: [d.dim_value or d.dim_param for d in vi.type.tensor_type.shape.dim] for vi in probe.graph.input}
    return (f"attention as primitive ops (scale on {report['scale'] or 'neither Q nor K'}, mask {report['mask']}, "
            f"softmax {'fp32' if report['softmax_dtype'] == 1 else 'in the graph dtype'}), inputs "
            + ", ".join(f"{n} {s}" for n, s in ins.items()))


def probe_graphs(man, names: list, profiles: dict, *, build: Optional[Callable] = None) -> dict:
    """{graph: [{"node", "what", "ok", "error"}]} for every graph of `names` with Attention.

    build: (onnx path, [ProfileSpec], plan path) -> anything, raising EngineBuildError on a
    refusal (deploy/build.build_plan); None: the static checks only (dry run)."""
    out, seen = {}, {}
    with tempfile.TemporaryDirectory(prefix="lisa-trt-probe-") as tmp:
        for name in names:
            if name == Graph.GASV.value:
                continue
            model = trt_copy(man.graph_path(Graph(name)))
            opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=23)
            results = []
            cases = [(spec["node"], describe(spec), probe_model(spec, opset)) for spec in probe_specs(model)]
            if not cases:  # attention as primitive ops: probe the pattern the graph holds
                for r in fused_attention_report(model):
                    probe = pattern_probe(model, r)
                    cases.append((r["softmax"], _describe_pattern(probe, r), probe))
            for node, what, probe in cases:
                probe_profs = probe_profiles(probe, model, profiles[name])
                key = repr((_canonical(probe), probe_profs))
                if key not in seen:
                    seen[key] = _probe_one(probe, probe_profs, build, Path(tmp))
                results.append({"node": node, "what": what, "ok": seen[key] is None, "error": seen[key],
                                "kind": "op" if probe.graph.node[-1].op_type == "Attention" and
                                len(probe.graph.node) == 1 else "pattern"})
            if results:
                out[name] = results
    return out


def choose_attention(man, names: list, profiles: dict, mode: str, *, build: Optional[Callable] = None,
                     warn: Callable = print) -> tuple:
    """({graph: "op" | "plain" | "fused" | "unfused"} for the graphs with attention, probe results)
    under `mode`: "op" / "plain" for a graph with ONNX Attention nodes (IAttention, or the plain-ops
    rewrite where a probe was refused); "fused" / "unfused" for attention written as primitive ops
    (its pattern probes passed / one was refused: built as exported either way).

    Raises AttentionRefusedError (mode "op") naming the refused node and the fix."""
    if mode not in ATTENTION_MODES:
        raise InputError(f"--attention {mode!r}: choose one of {', '.join(ATTENTION_MODES)}")
    if mode == "plain":
        with_attention = [n for n in names if n != Graph.GASV.value and _has_attention(man, n)]
        return {n: "plain" for n in with_attention}, {}
    results = probe_graphs(man, names, profiles, build=build)
    refused = {g: next(r for r in rs if not r["ok"]) for g, rs in results.items() if not all(r["ok"] for r in rs)}
    if refused and mode == "op":
        what = "; ".join(f"node {r['node']} of {g} ({r['what']}): {r['error']}" for g, r in refused.items())
        raise AttentionRefusedError(
            f"TensorRT refused Attention in a one-node probe build: {what}. Build with `lisa-trt build ... "
            "--attention plain` (attention as MatMul / Softmax ops, no IAttention) or `--attention auto` "
            "(plain only where refused)")
    for g, r in refused.items():
        if r.get("kind") == "pattern":
            warn(f"warning: TensorRT refused the attention of {g} (softmax {r['node']}, {r['what']}) in a probe "
                 f"build: {r['error']}; building {g} as exported (its attention likely unfused)")
        else:
            warn(f"warning: TensorRT refused Attention node {r['node']} of {g} ({r['what']}): {r['error']}; "
                 f"building {g} with attention as plain ops (--attention auto)")
    kinds = {g: {r.get("kind") for r in rs} for g, rs in results.items()}
    return {g: ("unfused" if g in refused else "fused") if kinds[g] == {"pattern"} else
            "plain" if g in refused else "op" for g in results}, results


def _has_attention(man, name: str) -> bool:
    from ..engines.attention_ops import attention_nodes

    return bool(attention_nodes(trt_copy(man.graph_path(Graph(name)))))


__all__ = ["AttentionRefusedError", "choose_attention", "describe", "probe_graphs"]
