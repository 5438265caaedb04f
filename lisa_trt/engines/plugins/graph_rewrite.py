"""The TensorRT variant of the GASV graph: swap its plain-ONNX body for the `lisa::gasv2` plugin.

`export_bundle` writes `gasv.onnx` (GASV v2 per-node gates, `gasv.gasv_core`) as plain ONNX ops
(ONNX Runtime runs it). Its cluster-mass step is a ScatterND with reduction="add", which
TensorRT's ONNX parser refuses ("ScatterND with reduction is not supported"). This module
produces `gasv.trt.onnx`: the same graph inputs and outputs (io_spec Graph.GASV), whose p,
delta_eff and gate come from one `lisa::gasv2` plugin node (trt_plugin.onnx_plugin_node, Triton PTX
baked in with aot=1) fed by:

  guided_logits (N, V) fp32 ............................. plugin input `logits`
  Cast(node_tokens), Cast(node_parents) int32 ............ `tokens`, `parents`
  nb (V, GASV_K) int32, w_tilde (V, H), w_tilde_norm2 (V,),
  cluster (V,) int32, beta (C,) ........................... initializers (the GASV tables)
  gasv_params (P,) ........................................ `params` as is (gasv.PARAMS order)

`cand` keeps its plain-ONNX producers (a Gather of the neighbour table and a Where on the
`neighbours` knob, both TensorRT-parsable). The rewrite is an onnx-graphsurgeon subgraph
replacement: the producers of p, delta_eff and gate are disconnected, the plugin is attached,
and `cleanup()` drops what no output needs. The ORT graph file is never modified.

The tables come from the caller (`tables=`, a bound GASVTables or a dict of arrays) or are
recovered from the exported graph's initializers (`gasv_tables_from_onnx`): W~ by its name,
the others by shape and dtype. Recovered tables are verified by running the original graph in
ONNX Runtime against the PyTorch reference `gasv_gates` on random logits (`verify_tables`).
`emulate_trt_variant` is the plugin's CPU reference path: ONNX Runtime up to the plugin, then
`gasv_gates` on the plugin's own inputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from ...errors import LisaError
from ..parser_checks import node_attrs as _attrs
from . import trt_plugin as tp

TRT_SUFFIX = ".trt.onnx"
EXTERNAL_DATA_BYTES = 32 << 20  # like export/onnx.py: larger weights go to an external file
# Plugin inputs in order, with their ONNX element types (the kernel's parameter types,
# gasv_triton.signature).
PLUGIN_INPUTS = (("logits", "float32"), ("tokens", "int32"), ("parents", "int32"), ("nb", "int32"),
                 ("w_tilde", "float32"), ("w_tilde_norm2", "float32"), ("cluster", "int32"), ("beta", "float32"),
                 ("params", "float32"))
PLUGIN_OUTPUTS = ("p", "delta_eff", "gate")
GRAPH_INPUTS = ("guided_logits", "node_tokens", "node_parents", "gasv_params")  # io_spec Graph.GASV
GRAPH_OUTPUTS = ("p", "delta_eff", "cand", "gate")
TABLES = ("nb", "w_tilde", "w_tilde_norm2", "cluster", "beta")


class GraphRewriteError(LisaError):
    """The GASV graph does not have the structure the rewrite expects."""


def plugin_input_dtypes() -> list:
    """Expected ONNX element type names of the plugin inputs, in order."""
    return [dt for _, dt in PLUGIN_INPUTS]


def trt_variant_path(onnx_path) -> Path:
    """`gasv.onnx` -> `gasv.trt.onnx` (same directory)."""
    p = Path(onnx_path)
    return p.with_name(p.name[: -len(".onnx")] + TRT_SUFFIX if p.name.endswith(".onnx") else p.name + TRT_SUFFIX)


# ----------------------------------------------------------------------------- tables

def _tables_dict(tables) -> dict:
    """GASVTables (bound) or a dict -> {nb, w_tilde, w_tilde_norm2, cluster, beta} numpy arrays.

    nb is the neighbour table padded / cut to io_spec.GASV_K columns (-1 padding), as baked
    into the GASV graph."""
    from ...models.io_spec import GASV_K

    if isinstance(tables, dict):
        d = dict(tables)
    else:
        if getattr(tables, "w_tilde", None) is None:
            raise GraphRewriteError("the GASV tables are not bound to the target head (w_tilde missing); "
                                    "pass tables.bind(target.output.weight)")
        d = {k: getattr(tables, k) for k in ("w_tilde", "w_tilde_norm2", "cluster", "beta")}
        d["nb"] = tables.lantern_neighbors
    out = {}
    for k, dt in (("nb", np.int32), ("w_tilde", np.float32), ("w_tilde_norm2", np.float32), ("cluster", np.int32),
                  ("beta", np.float32)):
        v = d[k]
        v = v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
        out[k] = np.ascontiguousarray(v.astype(dt))
    nb = out["nb"][:, :GASV_K]
    if nb.shape[1] < GASV_K:
        nb = np.concatenate([nb, np.full((nb.shape[0], GASV_K - nb.shape[1]), -1, np.int32)], 1)
    out["nb"] = np.ascontiguousarray(nb)
    V, H = out["w_tilde"].shape
    if (out["w_tilde_norm2"].shape != (V,) or out["cluster"].shape != (V,) or out["beta"].ndim != 1
            or out["nb"].shape[0] != V):
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
    The neighbour table nb is the one 2-D integer initializer of shape (V, GASV_K).

    Returns:
        {"nb" (V, K) i32, "w_tilde" (V, H) f32, "w_tilde_norm2" (V,) f32, "cluster" (V,) i32,
         "beta" (C,) f32}.
    """
    from ...models.io_spec import GASV_K
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
    nb = _unique([a for a in others if a.ndim == 2 and a.dtype.kind in "iu" and a.shape == (V, GASV_K)])
    if len(nb) != 1:
        raise GraphRewriteError(f"cannot identify the neighbour table ({V}, {GASV_K}) in the GASV graph "
                                f"({len(nb)} candidates); pass the tables explicitly (tables=...)")
    return _tables_dict({"nb": nb[0], "w_tilde": w, "w_tilde_norm2": n2[0], "cluster": cluster, "beta": beta[0]})


def tables_from_bundle(manifest) -> Optional[dict]:
    """The GASV tables of an engine directory from its own `tables.safetensors` (None if it has none).

    A bundle made by `lisa-trt export` carries the calibration tables it baked into gasv.onnx;
    they are used as they are instead of recovering them from the graph by role (which can be
    ambiguous, e.g. two float vectors that could be beta). W~ is not stored in the tables file
    (it is the target head times invstd): it is the graph's initializer named `w_tilde` (or, where the
    exporter's optimizer renamed a small one, the one (V, H) float matrix, possibly copied once per
    use, whose squared row norms are the tables' w_tilde_norm2).
    The result is still checked against the plain graph (`verify_tables`) by the caller.

    Raises:
        ArtifactMismatchError: the tables were calibrated for another target than the bundle's.
    """
    import onnx
    from onnx import numpy_helper

    from ...calibration.tables import load_tables
    from ...errors import ArtifactMismatchError
    from ...models.io_spec import Graph

    if "tables" not in (manifest.files or {}) or not manifest.has(Graph.GASV):
        return None
    path = Path(manifest.dir) / manifest.files["tables"]
    if not path.is_file():
        return None
    tables = load_tables(path)
    if manifest.target_hash and tables.target_hash != manifest.target_hash:
        raise ArtifactMismatchError(f"{path} was calibrated for target {tables.target_hash}, the bundle is for "
                                    f"{manifest.target_hash}; re-export the bundle")
    model = onnx.load(str(manifest.graph_path(Graph.GASV)))
    w = next((numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "w_tilde"), None)
    if w is None:  # the exporter's optimizer may rename a small W~: the (V, H) float matrix whose row norms are the tables'
        n2 = np.asarray(tables.w_tilde_norm2, np.float64)
        cands = [a for a in (numpy_helper.to_array(t) for t in model.graph.initializer)
                 if a.ndim == 2 and a.dtype == np.float32 and a.shape[0] == n2.shape[0]
                 and np.allclose((a.astype(np.float64) ** 2).sum(1), n2, rtol=1e-4, atol=1e-5)]
        distinct = [a for i, a in enumerate(cands) if not any(np.array_equal(a, b) for b in cands[:i])]
        w = distinct[0] if len(distinct) == 1 else None  # the optimizer may also copy W~ once per use
    if w is None or w.ndim != 2:
        raise GraphRewriteError(f"{manifest.graph_path(Graph.GASV)} has no 2-D `w_tilde` initializer; re-export "
                                "the bundle with this lisa-trt, or pass the tables explicitly (tables=...)")
    return _tables_dict({"nb": tables.lantern_neighbors, "w_tilde": w, "w_tilde_norm2": tables.w_tilde_norm2,
                         "cluster": tables.cluster, "beta": tables.beta})


class _Tables:
    """A GASVTables stand-in over numpy table arrays (for `gasv_gates`)."""

    def __init__(self, tab: dict, cfg):
        import torch

        self.w_tilde = torch.from_numpy(np.asarray(tab["w_tilde"], np.float32))
        self.w_tilde_norm2 = torch.from_numpy(np.asarray(tab["w_tilde_norm2"], np.float32))
        self.cluster = torch.from_numpy(np.asarray(tab["cluster"])).long()
        self.beta = torch.from_numpy(np.asarray(tab["beta"], np.float32))
        self.lantern_neighbors = torch.from_numpy(np.asarray(tab["nb"])).long()
        self.vocab_size = self.w_tilde.shape[0]
        self.config, self.theta_geo = cfg, cfg.theta_geo


def _random_nodes(V: int, rows: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, V, generator=g) * 3.0
    if V > 4:  # filtered rows: keep the top half of each row
        kth = torch.topk(logits, V // 2, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    tokens = torch.randint(0, V, (rows,), generator=g)
    parents = torch.arange(rows) - 1                                     # a chain
    return logits, tokens, parents


def verify_tables(model, tables: dict, *, rows: int = 4, seed: int = 0, tol: float = 1e-4) -> float:
    """Run the plain GASV graph in ONNX Runtime and compare with `gasv_gates` on `tables`.

    Returns the largest |difference| over p, delta_eff and gate; raises GraphRewriteError above
    `tol` (or when the candidates differ).
    """
    import onnxruntime as ort

    from ...speculative.gasv import GASVConfig, gasv_gates

    nbw = int((np.asarray(tables["nb"]) >= 0).all(0).sum())
    cfg = GASVConfig(kappa=1.1, lam=0.5, delta=0.5, neighbours=max(1, min(16, nbw)), gamma_kappa=0.7,
                     gamma_lambda=1.3, gamma_delta=0.5, theta_clu=6.0, theta_geo=2.5)
    logits, tokens, parents = _random_nodes(tables["w_tilde"].shape[0], rows, seed)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    p, delta_eff, cand, gate = sess.run(list(GRAPH_OUTPUTS), {
        "guided_logits": logits.numpy(), "node_tokens": tokens.numpy(), "node_parents": parents.numpy(),
        "gasv_params": cfg.params().numpy()})
    ref = gasv_gates(logits, tokens, parents, _Tables(tables, cfg), cfg)
    k = cfg.neighbours
    if not np.array_equal(cand[:, :k], ref.cand.numpy()):
        raise GraphRewriteError("the neighbour table recovered from the GASV graph does not reproduce its "
                                "candidates; pass the tables explicitly (tables=...)")
    err = max(float(np.abs(p - ref.p.numpy()).max()), float(np.abs(delta_eff - ref.delta_eff.numpy()).max()),
              float(np.abs(gate[:, :k] - ref.gate.numpy()).max()))
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


def rewrite_gasv(model_or_path, *, tables=None, aot: bool = True, num_warps: int = 4, verify: bool = True):
    """The TensorRT variant of a GASV graph: p, delta_eff and gate from one `lisa::gasv2` plugin node.

    Args:
        model_or_path: the exported plain gasv.onnx (path or ModelProto); not modified.
        tables: bound GASVTables or {nb, w_tilde, w_tilde_norm2, cluster, beta}; None -> recovered
            from the graph's initializers (and checked with `verify_tables` when verify=True).
        aot: mark the node for the AOT implementation (Triton PTX, no Python at run time).
        num_warps: kernel launch width (a plugin attribute).
        verify: check the tables (recovered or given) against the plain graph in ONNX Runtime.
    Returns:
        onnx.ModelProto with the io-spec inputs/outputs of the GASV graph and opset import lisa:1.
    """
    import onnx
    import onnx_graphsurgeon as gs

    src = _load(model_or_path)
    names_in = [i.name for i in src.graph.input]
    names_out = [o.name for o in src.graph.output]
    if tuple(names_in) != GRAPH_INPUTS or tuple(names_out) != GRAPH_OUTPUTS:
        raise GraphRewriteError(f"not a lisa-trt GASV v2 graph: inputs {names_in}, outputs {names_out}; expected "
                                f"{list(GRAPH_INPUTS)} -> {list(GRAPH_OUTPUTS)} (io_spec Graph.GASV); re-export "
                                "with this lisa-trt")
    tab = gasv_tables_from_onnx(src) if tables is None else _tables_dict(tables)
    if verify:  # recovered or given: they must reproduce the plain graph (ONNX Runtime vs gasv_gates)
        verify_tables(src, tab)
    V, H = tab["w_tilde"].shape
    C = tab["beta"].shape[0]

    graph = gs.import_onnx(src)
    tensors = graph.tensors()
    outs = [tensors[n] for n in PLUGIN_OUTPUTS]
    for o in outs:
        o.inputs.clear()  # disconnect the plain-ONNX body; cleanup() removes what cand does not need
    ints = []
    for name in ("node_tokens", "node_parents"):
        v = gs.Variable(f"gasv_trt.{name}_int32", dtype=np.int32)
        graph.nodes.append(gs.Node("Cast", f"gasv_trt.cast_{name}", attrs=dict(to=onnx.TensorProto.INT32),
                                   inputs=[tensors[name]], outputs=[v]))
        ints.append(v)
    consts = [gs.Constant(f"gasv_trt.{k}", tab[k]) for k in TABLES]
    ins = [tensors["guided_logits"]] + ints + consts + [tensors["gasv_params"]]
    proto = tp.onnx_plugin_node([t.name for t in ins], [o.name for o in outs], aot=aot, num_warps=num_warps)
    graph.nodes.append(gs.Node(proto.op_type, proto.name, attrs=_attrs(proto), inputs=ins, outputs=outs,
                               domain=proto.domain))
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    model = gs.export_onnx(graph)
    _fix_opsets(model, src)
    model.doc_string = (f"TensorRT variant of {src.graph.name or 'gasv'}: lisa::{proto.op_type} plugin "
                        f"(GASV v2, V={V}, H={H}, C={C}, aot={int(aot)}); not runnable by ONNX Runtime")
    return model


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
        **kwargs: `rewrite_gasv` options (tables, aot, num_warps, verify).
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


__all__ = ["GraphRewriteError", "emulate_trt_variant", "PLUGIN_INPUTS", "PLUGIN_OUTPUTS", "TRT_SUFFIX",
           "gasv_tables_from_onnx", "plugin_input_dtypes", "plugin_nodes", "rewrite_gasv",
           "trt_variant_path", "verify_tables", "write_trt_variant"]



# ----------------------------------------------------------------------------- CPU emulation

def _plugin_inputs_model(model):
    """A copy of a TensorRT-variant model without the plugin node; its inputs (and cand) as graph outputs."""
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
    m.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in list(node.input) + ["cand"])
    del m.opset_import[:]
    m.opset_import.extend([o for o in model.opset_import if o.domain != tp.NAMESPACE])
    return m, node


def emulate_trt_variant(model, guided_logits, node_tokens, node_parents, gasv_params) -> dict:
    """The plugin's CPU reference path: run a TensorRT-variant GASV graph with ONNX Runtime up to
    the plugin, then the PyTorch reference (`gasv_gates`) on the plugin's own inputs.

    This checks the rewrite's wiring (tables, casts, parameter vector, the cand subgraph) without
    TensorRT; the kernel itself is checked against the same reference in tests/plugins.
    Returns:
        {"p", "delta_eff", "cand", "gate", "params"} numpy arrays (cand, gate: GASV_K columns).
    """
    import onnxruntime as ort
    import torch

    from ...speculative.gasv import PARAMS, GASVConfig, gasv_gates

    sub, node = _plugin_inputs_model(model)
    feeds = {"guided_logits": np.asarray(guided_logits, np.float32), "node_tokens": np.asarray(node_tokens, np.int64),
             "node_parents": np.asarray(node_parents, np.int64), "gasv_params": np.asarray(gasv_params, np.float32)}
    sess = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"])
    fetch = list(node.input) + ["cand"]
    vals = dict(zip(fetch, sess.run(fetch, feeds)))
    x = {n: vals[i] for (n, _), i in zip(PLUGIN_INPUTS, node.input)}
    for (n, dt) in PLUGIN_INPUTS:
        if x[n].dtype != np.dtype(dt):
            raise GraphRewriteError(f"plugin input {n} is {x[n].dtype}, the kernel takes {dt}")
    p = x["params"]
    cfg = GASVConfig(**{k: (int(round(float(v))) if k == "neighbours" else float(v)) for k, v in zip(PARAMS, p)})
    out = gasv_gates(torch.from_numpy(x["logits"]), torch.from_numpy(x["tokens"]).long(),
                     torch.from_numpy(x["parents"]).long(), _Tables(x, cfg), cfg)
    K = x["nb"].shape[1]
    gate = np.zeros((len(x["logits"]), K), np.float32)
    gate[:, : cfg.neighbours] = out.gate.numpy()
    cand = vals["cand"]
    if not np.array_equal(cand[:, : cfg.neighbours], out.cand.numpy()) or (cand[:, cfg.neighbours:] != -1).any():
        raise GraphRewriteError("the TensorRT variant's cand output does not match the plugin's neighbour table")
    return {"p": out.p.numpy(), "delta_eff": out.delta_eff.numpy(), "cand": cand, "gate": gate, "params": p}
