"""The TensorRT variant of the GASV graph: swap its plain-ONNX body for the `lisa::gasv` plugin.

`export_bundle` writes `gasv.onnx` as plain ONNX ops (ONNX Runtime runs it). Its cluster-mass
step is a ScatterND with reduction="add", which TensorRT's ONNX parser refuses ("ScatterND with
reduction is not supported", onnx-tensorrt onnxOpImporters.cpp), and the dense path is several
(N, V) passes anyway. This module produces `gasv.trt.onnx`: the same graph inputs and outputs
(io_spec Graph.GASV), whose body is one `lisa::gasv` plugin node (trt_plugin.onnx_plugin_node,
Triton PTX baked in with aot=1) fed by:

  guided_logits (N, V) fp32 ............................. plugin input 0
  [ids (N, K) int32 = Cast(TopK(guided_logits, K))] ....... gasv_support only
  w_tilde (V, H), w_tilde_norm2 (V,), cluster (V,) int32,
  beta (C,) ............................................... initializers (the GASV tables)
  params (8,) = gasv_triton.PARAM_NAMES from gasv_params (7,) (io_spec.GASV_PARAMS order):
      Concat(1/log V, kappa, Log(lam), gamma_kappa, gamma_lambda, theta_geo, theta_clu, eps)

The rewrite is an onnx-graphsurgeon subgraph replacement: the producers of the three outputs
are disconnected, the plugin subgraph is attached, and `cleanup()` drops the old body and its
initializers. The ORT graph file is never modified.

The tables come from the caller (`tables=`, a bound GASVTables or a dict of arrays) or are
recovered from the exported graph's initializers (`gasv_tables_from_onnx`): W~ by its name,
the others by shape and dtype. Recovered tables are verified by running the original graph in
ONNX Runtime against the PyTorch reference `gasv_gate` on random logits (`verify_tables`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import numpy as np

from ...errors import LisaError
from . import trt_plugin as tp

TRT_SUFFIX = ".trt.onnx"
EXTERNAL_DATA_BYTES = 32 << 20  # like export/onnx.py: larger weights go to an external file
MAX_TOPK = 3840  # TensorRT's TopK limit (onnx-tensorrt docs/operators.md: "K input must be less than 3840")
# Plugin inputs in order, with their ONNX element types (the kernel's parameter types,
# gasv_triton.signature): the dense plugin has no `ids`.
PLUGIN_INPUTS = (("logits", "float32"), ("ids", "int32"), ("w_tilde", "float32"),
                 ("w_tilde_norm2", "float32"), ("cluster", "int32"), ("beta", "float32"),
                 ("params", "float32"))
PLUGIN_OUTPUTS = ("gate", "p_raw", "p_soft", "pi")
GRAPH_INPUTS = ("guided_logits", "gasv_params")  # io_spec Graph.GASV
GRAPH_OUTPUTS = ("gate", "p_raw", "p_soft")


class GraphRewriteError(LisaError):
    """The GASV graph does not have the structure the rewrite expects."""


def plugin_input_dtypes(support: bool) -> list:
    """Expected ONNX element type names of the plugin inputs, in order."""
    return [dt for name, dt in PLUGIN_INPUTS if support or name != "ids"]


def trt_variant_path(onnx_path) -> Path:
    """`gasv.onnx` -> `gasv.trt.onnx` (same directory)."""
    p = Path(onnx_path)
    return p.with_name(p.name[: -len(".onnx")] + TRT_SUFFIX if p.name.endswith(".onnx") else p.name + TRT_SUFFIX)


# ----------------------------------------------------------------------------- tables

def _tables_dict(tables) -> dict:
    """GASVTables (bound) or a dict -> {w_tilde, w_tilde_norm2, cluster, beta} numpy arrays."""
    if isinstance(tables, dict):
        d = tables
    else:
        if getattr(tables, "w_tilde", None) is None:
            raise GraphRewriteError("the GASV tables are not bound to the target head (w_tilde missing); "
                                    "pass tables.bind(target.output.weight)")
        d = {k: getattr(tables, k) for k in ("w_tilde", "w_tilde_norm2", "cluster", "beta")}
    out = {}
    for k, dt in (("w_tilde", np.float32), ("w_tilde_norm2", np.float32), ("cluster", np.int32),
                  ("beta", np.float32)):
        v = d[k]
        v = v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
        out[k] = np.ascontiguousarray(v.astype(dt))
    V, H = out["w_tilde"].shape
    if out["w_tilde_norm2"].shape != (V,) or out["cluster"].shape != (V,) or out["beta"].ndim != 1:
        shapes = {k: v.shape for k, v in out.items()}
        raise GraphRewriteError(f"inconsistent GASV tables: shapes {shapes}")
    if V and (out["cluster"].min() < 0 or out["cluster"].max() >= out["beta"].shape[0]):
        raise GraphRewriteError("GASV cluster ids outside [0, C)")
    return out


def _unique(arrays: list) -> list:
    out = []
    for a in arrays:
        if not any(a.shape == b.shape and np.array_equal(a, b) for b in out):
            out.append(a)
    return out


def gasv_tables_from_onnx(model) -> dict:
    """Recover the GASV tables baked into an exported gasv.onnx as initializers.

    W~ is the initializer named `w_tilde` (the GASVGraph buffer name); the exporter folds the
    other buffers into constants, so they are found by role: the one float vector of V values
    (w_tilde_norm2), the one integer vector of V values (cluster) and the one float vector of
    C >= max(cluster) + 1 values (beta). Ambiguity raises: pass the tables explicitly then.

    Args:
        model: onnx.ModelProto of the exported (plain) GASV graph.
    Returns:
        {"w_tilde" (V, H) f32, "w_tilde_norm2" (V,) f32, "cluster" (V,) i32, "beta" (C,) f32}.
    """
    from onnx import numpy_helper

    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    if "w_tilde" not in inits or inits["w_tilde"].ndim != 2:
        raise GraphRewriteError("the GASV graph has no 2-D `w_tilde` initializer; it was not written by "
                                "lisa-trt export, or pass the tables explicitly (tables=...)")
    w = inits["w_tilde"]
    V = w.shape[0]
    others = [a for n, a in inits.items() if n != "w_tilde" and a.ndim >= 1]
    vec_v = [a.reshape(-1) for a in others if a.size == V and max(a.shape) == V]
    n2 = _unique([a for a in vec_v if a.dtype.kind == "f"])
    cl = _unique([a for a in vec_v if a.dtype.kind in "iu"])
    if len(n2) != 1 or len(cl) != 1:
        raise GraphRewriteError(f"cannot identify w_tilde_norm2 / cluster in the GASV graph ({len(n2)} / {len(cl)} "
                                "candidates); pass the tables explicitly (tables=...)")
    cluster = cl[0].astype(np.int32)
    need = int(cluster.max()) + 1 if V else 1
    cands = _unique([a.reshape(-1) for a in others if a.dtype.kind == "f" and a.size != V
                     and a.size >= need and max(a.shape) == a.size])
    exact = [a for a in cands if a.size == need]
    beta = exact if len(exact) == 1 else cands
    if len(beta) != 1:
        raise GraphRewriteError(f"cannot identify beta (C >= {need}) in the GASV graph ({len(beta)} candidates); "
                                "pass the tables explicitly (tables=...)")
    return _tables_dict({"w_tilde": w, "w_tilde_norm2": n2[0], "cluster": cluster, "beta": beta[0]})


def verify_tables(model, tables: dict, *, rows: int = 3, seed: int = 0, tol: float = 1e-4) -> float:
    """Run the plain GASV graph in ONNX Runtime and compare with `gasv_gate` on `tables`.

    Returns the largest |difference| over gate and p_soft; raises GraphRewriteError above `tol`.
    """
    import onnxruntime as ort
    import torch

    from ...speculative.gasv import GASVConfig, gasv_gate

    V = tables["w_tilde"].shape[0]
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, V, generator=g) * 3.0
    if V > 4:  # filtered rows: keep the top half of each row
        kth = torch.topk(logits, V // 2, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    cfg = GASVConfig(kappa=1.1, lam=0.5, gamma_kappa=0.7, gamma_lambda=1.3, theta_clu=6.0, theta_geo=2.5)
    from ...export.io_spec import GASV_PARAMS

    params = np.array([getattr(cfg, n) for n in GASV_PARAMS], dtype=np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    gate, _, p_soft = sess.run(list(GRAPH_OUTPUTS), {"guided_logits": logits.numpy(), "gasv_params": params})
    t = {k: torch.from_numpy(v) for k, v in tables.items()}
    ns = type("T", (), dict(t, theta_geo=cfg.theta_geo, config=cfg))
    ref = gasv_gate(logits, ns, cfg)
    err = max(float(np.abs(gate - ref.gate.numpy()).max()), float(np.abs(p_soft - ref.p_soft.numpy()).max()))
    if not err <= tol:
        raise GraphRewriteError(f"the GASV tables recovered from the graph do not reproduce it (max error {err:.3g}); "
                                "pass the tables explicitly (tables=...)")
    return err


# ----------------------------------------------------------------------------- rewrite

def _load(model_or_path):
    import onnx

    if isinstance(model_or_path, (str, Path)):
        return onnx.load(str(model_or_path))
    return model_or_path


def rewrite_gasv(model_or_path, *, tables=None, support_k: Optional[int] = None, aot: bool = True,
                 num_warps: int = 4, verify: bool = True):
    """The TensorRT variant of a GASV graph: one `lisa::gasv` (or `gasv_support`) plugin node.

    Args:
        model_or_path: the exported plain gasv.onnx (path or ModelProto); not modified.
        tables: bound GASVTables or {w_tilde, w_tilde_norm2, cluster, beta}; None -> recovered
            from the graph's initializers (and checked with `verify_tables` when verify=True).
        support_k: None -> dense `lisa::gasv`; K -> `lisa::gasv_support` over TopK(K) ids per row
            (equal to the dense result when each row has at most K finite logits).
        aot: mark the node for the AOT implementation (Triton PTX, no Python at run time).
        num_warps: kernel launch width (a plugin attribute).
        verify: when the tables are recovered from the graph, check them against the reference.
    Returns:
        onnx.ModelProto with the io-spec inputs/outputs of the GASV graph and opset import lisa:1.
    """
    import onnx
    import onnx_graphsurgeon as gs

    src = _load(model_or_path)
    names_in = [i.name for i in src.graph.input]
    names_out = [o.name for o in src.graph.output]
    if tuple(names_in) != GRAPH_INPUTS or tuple(names_out) != GRAPH_OUTPUTS:
        raise GraphRewriteError(f"not a lisa-trt GASV graph: inputs {names_in}, outputs {names_out}; expected "
                                f"{list(GRAPH_INPUTS)} -> {list(GRAPH_OUTPUTS)} (io_spec Graph.GASV)")
    if tables is None:
        tab = gasv_tables_from_onnx(src)
        if verify:
            verify_tables(src, tab)
    else:
        tab = _tables_dict(tables)
    V, H = tab["w_tilde"].shape
    C = tab["beta"].shape[0]
    if support_k is not None and not 1 <= support_k <= min(V, MAX_TOPK - 1):
        raise GraphRewriteError(f"support_k must be in 1..{min(V, MAX_TOPK - 1)} (TensorRT TopK K < {MAX_TOPK}), "
                                f"got {support_k}")

    graph = gs.import_onnx(src)
    tensors = graph.tensors()
    logits, gp = tensors["guided_logits"], tensors["gasv_params"]
    outs = [tensors[n] for n in GRAPH_OUTPUTS]
    for o in outs:
        o.inputs.clear()  # disconnect the plain-ONNX body; cleanup() removes it

    params = _params_subgraph(graph, gp, V)
    ids = None
    if support_k is not None:
        k = gs.Constant("gasv_trt.k", np.array([support_k], dtype=np.int64))
        vals = gs.Variable("gasv_trt.topk_values", dtype=np.float32)
        idx64 = gs.Variable("gasv_trt.topk_ids", dtype=np.int64)
        graph.nodes.append(gs.Node("TopK", "gasv_trt.topk", attrs=dict(axis=-1, largest=1, sorted=1),
                                   inputs=[logits, k], outputs=[vals, idx64]))
        ids = gs.Variable("gasv_trt.ids", dtype=np.int32)
        graph.nodes.append(gs.Node("Cast", "gasv_trt.ids_int32", attrs=dict(to=onnx.TensorProto.INT32),
                                   inputs=[idx64], outputs=[ids]))
    consts = [gs.Constant(f"gasv_trt.{k}", tab[k]) for k in ("w_tilde", "w_tilde_norm2", "cluster", "beta")]
    ins = [logits] + ([ids] if ids is not None else []) + consts + [params]
    pi = gs.Variable("gasv_trt.pi", dtype=np.float32)
    proto = tp.onnx_plugin_node([t.name for t in ins], [o.name for o in outs] + [pi.name],
                                support=support_k is not None, aot=aot, num_warps=num_warps,
                                name="lisa_gasv_support" if support_k is not None else "lisa_gasv")
    graph.nodes.append(gs.Node(proto.op_type, proto.name, attrs=_attrs(proto), inputs=ins,
                               outputs=outs + [pi], domain=proto.domain))
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    model = gs.export_onnx(graph)
    _fix_opsets(model, src)
    model.doc_string = (f"TensorRT variant of {src.graph.name or 'gasv'}: lisa::{proto.op_type} plugin "
                        f"(V={V}, H={H}, C={C}, aot={int(aot)}); not runnable by ONNX Runtime")
    return model


def _params_subgraph(graph, gp, V: int):
    """gasv_params (7,) in io_spec.GASV_PARAMS order -> kernel params (8,) in PARAM_NAMES order."""
    import onnx_graphsurgeon as gs

    from ...export.io_spec import GASV_PARAMS
    from .gasv_triton import PARAM_NAMES  # the kernel's params order (imports triton)

    parts = []
    for j, name in enumerate(PARAM_NAMES):
        if name == "inv_log_v":
            parts.append(gs.Constant("gasv_trt.inv_log_v",
                                     np.array([1.0 / math.log(V) if V > 1 else 0.0], dtype=np.float32)))
            continue
        src = "lam" if name == "log_lambda" else name
        if src not in GASV_PARAMS:
            raise GraphRewriteError(f"kernel parameter {name!r} has no source in io_spec.GASV_PARAMS {GASV_PARAMS}")
        out = gs.Variable(f"gasv_trt.p{j}_{src}", dtype=np.float32)
        graph.nodes.append(gs.Node("Gather", f"gasv_trt.gather_{src}", attrs=dict(axis=0),
                                   inputs=[gp, gs.Constant(f"gasv_trt.idx_{src}",
                                                           np.array([GASV_PARAMS.index(src)], dtype=np.int64))],
                                   outputs=[out]))
        if name == "log_lambda":
            log = gs.Variable("gasv_trt.p_log_lambda", dtype=np.float32)
            graph.nodes.append(gs.Node("Log", "gasv_trt.log_lambda", inputs=[out], outputs=[log]))
            out = log
        parts.append(out)
    params = gs.Variable("gasv_trt.params", dtype=np.float32, shape=[len(PARAM_NAMES)])
    graph.nodes.append(gs.Node("Concat", "gasv_trt.params", attrs=dict(axis=0), inputs=parts, outputs=[params]))
    return params


def _attrs(node) -> dict:
    import onnx

    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _fix_opsets(model, src) -> None:
    """Keep the source's default-domain opset and import the plugin domain."""
    import onnx

    default = next((o.version for o in src.opset_import if o.domain in ("", "ai.onnx")), 17)
    keep = [o for o in model.opset_import if o.domain not in ("", "ai.onnx", tp.NAMESPACE)]
    del model.opset_import[:]
    model.opset_import.extend([onnx.helper.make_opsetid("", default), onnx.helper.make_opsetid(tp.NAMESPACE, 1)]
                              + keep)
    model.ir_version = src.ir_version


def write_trt_variant(onnx_path, out_path=None, **kwargs) -> Path:
    """Write the TensorRT variant of a GASV graph next to it (atomic); returns its path.

    Args:
        onnx_path: the exported gasv.onnx.
        out_path: destination (default gasv.trt.onnx beside the source).
        **kwargs: `rewrite_gasv` options (tables, support_k, aot, num_warps, verify).
    """
    import onnx

    from ...io import atomic_write

    out = Path(out_path) if out_path is not None else trt_variant_path(onnx_path)
    model = rewrite_gasv(onnx_path, **kwargs)
    big = sum(t.ByteSize() for t in model.graph.initializer) > EXTERNAL_DATA_BYTES
    data = out.with_name(out.name + ".data")
    if data.exists():
        data.unlink()
    with atomic_write(out) as tmp:  # weights (W~ of a 16k x 1280 head: 84 MB) go to <out>.data
        onnx.save(model, str(tmp), save_as_external_data=big, location=data.name if big else None)
    return out


def plugin_nodes(model) -> list:
    """The lisa plugin nodes of a model (TensorRT variant graphs have exactly one)."""
    return [n for n in model.graph.node if n.domain == tp.NAMESPACE or n.op_type in tp.PLUGINS]


__all__ = ["GraphRewriteError", "MAX_TOPK", "PLUGIN_INPUTS", "PLUGIN_OUTPUTS", "TRT_SUFFIX",
           "gasv_tables_from_onnx", "plugin_input_dtypes", "plugin_nodes", "rewrite_gasv",
           "trt_variant_path", "verify_tables", "write_trt_variant"]



# ----------------------------------------------------------------------------- CPU emulation

def _plugin_inputs_model(model):
    """A copy of a TensorRT-variant model without the plugin node, its inputs as graph outputs."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    nodes = plugin_nodes(m)
    if len(nodes) != 1:
        raise GraphRewriteError(f"expected exactly one lisa plugin node, found {len(nodes)}")
    node = nodes[0]
    keep = [n for n in m.graph.node if n is not node]
    del m.graph.node[:]
    m.graph.node.extend(keep)
    del m.graph.output[:]
    m.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in node.input)
    del m.opset_import[:]
    m.opset_import.extend([o for o in model.opset_import if o.domain != tp.NAMESPACE])
    return m, node


def emulate_trt_variant(model, guided_logits, gasv_params) -> dict:
    """Run a TensorRT-variant GASV graph on CPU: ONNX Runtime up to the plugin, then the
    PyTorch reference (`gasv_gate`) with the plugin's own inputs (params decoded).

    This checks the rewrite's wiring (tables, parameter order, TopK ids) without TensorRT; the
    kernel itself is checked against the same reference in tests/plugins.
    Returns:
        {"gate", "p_raw", "p_soft", "params"} numpy arrays.
    """
    import onnxruntime as ort
    import torch

    from ...speculative.gasv import GASVConfig, gasv_gate

    sub, node = _plugin_inputs_model(model)
    sess = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"])
    vals = dict(zip(node.input, sess.run(list(node.input), {"guided_logits": np.asarray(guided_logits, np.float32),
                                                            "gasv_params": np.asarray(gasv_params, np.float32)})))
    support = node.op_type == "gasv_support"
    names = [n for n, _ in PLUGIN_INPUTS if support or n != "ids"]
    x = dict(zip(names, (vals[i] for i in node.input)))
    p = x["params"]
    V = x["logits"].shape[1]
    if V > 1 and abs(float(p[0]) - 1.0 / math.log(V)) > 1e-6:
        raise GraphRewriteError(f"params[0] = {p[0]} is not 1/log V")
    cfg = GASVConfig(kappa=float(p[1]), lam=float(math.exp(p[2])), gamma_kappa=float(p[3]),
                     gamma_lambda=float(p[4]), theta_geo=float(p[5]), theta_clu=float(p[6]), eps=float(p[7]))
    tables = type("T", (), {k: torch.from_numpy(np.asarray(x[k])) for k in
                            ("w_tilde", "w_tilde_norm2", "cluster", "beta")})
    logits = torch.from_numpy(np.asarray(x["logits"]))
    support_k = None
    if support:
        ids = torch.from_numpy(x["ids"]).long()
        want = torch.topk(logits, ids.shape[1], dim=-1).values  # values: ties may pick other ids
        if not torch.equal(logits.gather(1, ids).sort(-1).values, want.sort(-1).values):
            raise GraphRewriteError("the plugin's ids input is not the top-K support of the logits")
        support_k = ids.shape[1]
    out = gasv_gate(logits, tables, cfg, support_k=support_k)
    return {"gate": out.gate.numpy(), "p_raw": out.p_raw.numpy(), "p_soft": out.p_soft.numpy(), "params": p}
