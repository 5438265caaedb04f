"""TensorRT Python plugin `lisa::gasv2`: GASV v2 per-node gates (the Triton kernel of gasv_triton.py).

`register()` defines it with `tensorrt.plugin` (TensorRT >= 10.9 for `aot_impl`):
  - register: shapes/dtypes (p like the logits, delta_eff (N,), gate (N, KW));
  - autotune: one fp32/int32 combination, linear format;
  - impl (JIT): torch views of the TensorRT buffers + a Triton JIT launch (Python at run time);
  - aot_impl: the kernel's PTX (Triton AOT, no Python at run time), launch grid (N,) x
    num_warps * 32 threads, and the int32 scalars V, H, C, KW, stride_w as symbolic expressions.

Plugin I/O order = the kernel's parameter order (TensorRT passes inputs, then the extra int32
scalars, then outputs):
  inputs   logits (N, V) fp32 | tokens (N,) int32 | parents (N,) int32 | nb (V, KW) int32 |
           w_tilde (V, H) fp32 | w_tilde_norm2 (V,) fp32 | cluster (V,) int32 | beta (C,) fp32 |
           params (P,) fp32 = GASVConfig.params() (gasv.PARAMS order; the graph's gasv_params)
  outputs  p (N, V) fp32 | delta_eff (N,) fp32 | gate (N, KW) fp32

ONNX: a node with op_type "gasv2" (= the plugin name), domain "lisa", attribute
plugin_namespace="lisa", plugin_version="1", and aot=1 (AOT) or aot=0 (JIT) (`onnx_plugin_node`).
ONNX Runtime cannot run it: only the TensorRT variant of a graph carries it.

Why version "1" and the generation in the NAME: every plugin registered through `tensorrt.plugin`
gets version "1" (`tensorrt/plugin/_lib.py`, `_TemplatePluginCreator.__init__`:
`self.plugin_version = "1"`; `_register_plugin_creator` looks it up again with
`get_creator(name, "1", namespace)`), and TensorRT's ONNX parser finds a plugin creator by the
exact (op_type, plugin_version [default "1"], plugin_namespace [else the node's domain]) triple
(onnx-tensorrt `onnxOpCheckers.cpp` FallbackPluginImporter / `importPluginCreator`: "Plugin not
found, are the plugin name, version, and namespace correct?"). So GASV v2 is told apart from the
retired v1 plugin (`lisa::gasv`, gate over the vocabulary) by its name `gasv2`, never by version.
Only the attributes the registered function declares (`num_warps`) become plugin fields: the
parser loads the creator's field names from the node (onnxOpImporters.cpp `loadFields`);
`plugin_namespace`, `plugin_version` and `aot` are read by the parser itself (`aot` selects
kSTRICT_AOT / kSTRICT_JIT, importerUtils.cpp `createPlugin`).

This module imports without TensorRT (and without triton): tensorrt is imported inside
`register()`, triton inside the PTX helpers. Note: no `from __future__ import annotations` here,
`tensorrt.plugin` reads the type annotations of the registered functions at run time.
"""

import dataclasses
from typing import Optional

from ...errors import LisaError

NAMESPACE = "lisa"
PLUGIN_NAME = "gasv2"  # GASV version 2; the generation is in the name (module docstring)
PLUGIN_ID = f"{NAMESPACE}::{PLUGIN_NAME}"
PLUGINS = (PLUGIN_NAME,)
RETIRED_PLUGINS = ("gasv", "gasv_support")  # GASV v1 (gate over the whole vocabulary): graphs must be re-made
PLUGIN_VERSION = "1"  # what tensorrt.plugin registers every plugin as (_lib.py); never anything else
INPUTS = ("logits", "tokens", "parents", "nb", "w_tilde", "w_tilde_norm2", "cluster", "beta", "params")
OUTPUTS = ("p", "delta_eff", "gate")
N_INPUTS = len(INPUTS)
N_OUTPUTS = len(OUTPUTS)
INT_SCALARS = ("V", "H", "C", "KW", "stride_w")
# PTX ISA of the shipped kernel (choice): 8.4 loads on CUDA >= 12.4 drivers (R550+); Triton 3.9
# would otherwise emit 8.8 (sm_89) / 9.x (sm_90a), needing the newest drivers.
PTX_VERSION = 84
_REGISTERED = False


class TensorRTUnavailableError(LisaError):
    """tensorrt (>= 10.9 with tensorrt.plugin) cannot be imported here."""


def tensorrt_available() -> bool:
    """True when `tensorrt.plugin` imports (TensorRT >= 10.6 Python bindings)."""
    try:
        import tensorrt.plugin  # noqa: F401
    except Exception:  # ImportError, or a broken stub wheel raising something else
        return False
    return True


def require_tensorrt():
    """Import tensorrt and tensorrt.plugin or raise TensorRTUnavailableError saying what to do."""
    try:
        import tensorrt as trt
        import tensorrt.plugin as trtp
    except Exception as e:
        raise TensorRTUnavailableError(
            f"TensorRT is not importable here ({type(e).__name__}: {e}). The lisa::gasv2 plugin needs "
            "the TensorRT >= 10.9 Python bindings (pip install tensorrt from NVIDIA's index) and a "
            "GPU. Without them use the ONNX Runtime backend (`--backend ort`), which runs GASV as "
            "plain ONNX ops / PyTorch.") from e
    return trt, trtp


@dataclasses.dataclass(frozen=True)
class AotKernel:
    """What aot_impl hands TensorRT: entry name, PTX text, threads per block, shared memory."""

    name: str
    ptx: str
    block_x: int
    shared_mem: int
    n_params: int
    sm: int


def aot_kernel(V: int, H: int, C: int, KW: int = 64, *, sm: int = 89, num_warps: int = 4,
               ptx_version: Optional[int] = PTX_VERSION) -> AotKernel:
    """The plugin's AOT kernel: Triton PTX for `sm` with the scratch parameters stripped.

    Works without a GPU and without TensorRT (this is what CI tests). V, H, C, KW pick the tiles.
    """
    from . import gasv_triton as gt

    k = gt.compile_ptx(V, H, C, KW, sm=sm, num_warps=num_warps, ptx_version=ptx_version)
    keep = gt.n_launch_params()
    ptx = gt.strip_scratch_params(k.asm["ptx"], k.metadata.name, keep)
    return AotKernel(name=k.metadata.name, ptx=ptx, block_x=k.metadata.num_warps * 32,
                     shared_mem=int(k.metadata.shared), n_params=keep, sm=sm)


def onnx_plugin_node(inputs, outputs, *, aot: bool = True, name: str = "lisa_gasv", num_warps: int = 4):
    """An onnx NodeProto that TensorRT's parser maps to the plugin (TensorRT variant only).

    Args:
        inputs/outputs: tensor names in the plugin's I/O order (module docstring).
    """
    import onnx

    if len(inputs) != N_INPUTS or len(outputs) != N_OUTPUTS:
        raise LisaError(f"{PLUGIN_ID} takes {N_INPUTS} inputs and {N_OUTPUTS} outputs, "
                        f"got {len(inputs)} / {len(outputs)}")
    # aot is always set: with both a JIT and an AOT implementation registered, a node without it
    # makes tensorrt.plugin refuse to create the plugin unless the network carries a PREFER_* flag
    # (_lib.py `_TemplatePluginCreator.create_plugin`); the parser maps aot=1 / 0 to kSTRICT_AOT / JIT.
    attrs = dict(plugin_namespace=NAMESPACE, plugin_version=PLUGIN_VERSION, num_warps=num_warps, aot=int(bool(aot)))
    return onnx.helper.make_node(PLUGIN_NAME, list(inputs), list(outputs), name=name, domain=NAMESPACE, **attrs)


def _device_sm() -> int:
    import torch
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return 10 * major + minor
    return 89


def register(sm: Optional[int] = None) -> None:
    """Register lisa::gasv2 with TensorRT (idempotent).

    Args:
        sm: SM the AOT PTX is compiled for; default the current CUDA device's (89 without one).
    Raises:
        TensorRTUnavailableError when tensorrt.plugin is missing.
    """
    global _REGISTERED
    if _REGISTERED:
        return
    trt, trtp = require_tensorrt()
    _register_one(trt, trtp, PLUGIN_ID, sm)
    _REGISTERED = True


def _static(expr, default: int, what: str = "dimension") -> int:
    """The value of a `tensorrt.plugin.ShapeExpr` that must be a build-time constant.

    `tensorrt.plugin` semantics (`_tensor.py`, ShapeExpr): `is_fake` is True for the placeholder
    expressions of shape inference (`get_output_data_types`), and `is_constant` RAISES
    RuntimeError on those, so `is_fake` is tested first; `constant_value` is a METHOD. A fake
    expression gives `default`; a real one that is not constant is an error (the kernel's tiles
    are compiled for these sizes), naming the dimension.
    """
    if expr.is_fake:
        return default
    if not expr.is_constant:
        raise LisaError(f"{PLUGIN_ID}: {what} is not a build-time constant; the GASV tables are initializers "
                        "of the TensorRT graph, so their sizes must be static (re-run the graph rewrite)")
    return int(expr.constant_value())


def _register_one(trt, trtp, plugin_id: str, sm: Optional[int]) -> None:
    """Define register / autotune / impl / aot_impl for the plugin id.

    tensorrt.plugin matches the impl / aot_impl parameters to the register function's names,
    so the parameters are spelled out (no *args).
    """
    from typing import List, Tuple, Union

    Desc, Tensor = trtp.TensorDesc, trtp.Tensor
    Out3 = Tuple[Desc, Desc, Desc]
    AotRet = Tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams, trtp.SymExprs]
    Combo = trtp.AutoTuneCombination
    types = "FP32, INT32, INT32, INT32, FP32, FP32, INT32, FP32, FP32, FP32, FP32, FP32"

    @trtp.register(plugin_id)
    def _desc(logits: Desc, tokens: Desc, parents: Desc, nb: Desc, w_tilde: Desc, w_tilde_norm2: Desc,
              cluster: Desc, beta: Desc, params: Desc, num_warps: int) -> Out3:
        n = logits.shape_expr[0]
        delta = trtp.from_shape_expr((n,), dtype=trt.float32)
        gate = trtp.from_shape_expr((n, nb.shape_expr[1]), dtype=trt.float32)
        return logits.like(), delta, gate

    @trtp.impl(plugin_id)
    def _impl(logits: Tensor, tokens: Tensor, parents: Tensor, nb: Tensor, w_tilde: Tensor,
              w_tilde_norm2: Tensor, cluster: Tensor, beta: Tensor, params: Tensor, num_warps: int,
              outputs: Tuple[Tensor], stream: int) -> None:
        import torch

        from . import gasv_triton as gt

        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            t = [torch.as_tensor(a, device="cuda") for a in (logits, tokens, parents, nb, w_tilde, w_tilde_norm2,
                                                              cluster, beta, params)]
            o = [torch.as_tensor(x, device="cuda") for x in outputs]
            gt.launch_kernel(*t, *o, num_warps=num_warps)

    @trtp.aot_impl(plugin_id)
    def _aot(logits: Desc, tokens: Desc, parents: Desc, nb: Desc, w_tilde: Desc, w_tilde_norm2: Desc,
             cluster: Desc, beta: Desc, params: Desc, num_warps: int, outputs: Tuple[Desc],
             tactic: int) -> AotRet:
        V, H, C, KW = logits.shape_expr[1], w_tilde.shape_expr[1], beta.shape_expr[0], nb.shape_expr[1]
        k = aot_kernel(_static(V, 16384, "V (logits.shape[1])"), _static(H, 1280, "H (w_tilde.shape[1])"),
                       _static(C, 256, "C (beta.shape[0])"), _static(KW, 64, "KW (nb.shape[1])"),
                       sm=sm or _device_sm(), num_warps=num_warps)
        launch = trtp.KernelLaunchParams()
        launch.grid_x = logits.shape_expr[0]
        launch.block_x = k.block_x
        launch.shared_mem = k.shared_mem
        extra = trtp.SymIntExprs.from_tuple([trtp.SymInt32(e) for e in (V, H, C, KW, H)])
        return k.name.encode(), k.ptx.encode(), launch, extra

    @trtp.autotune(plugin_id)
    def _autotune(logits: Desc, tokens: Desc, parents: Desc, nb: Desc, w_tilde: Desc, w_tilde_norm2: Desc,
                  cluster: Desc, beta: Desc, params: Desc, outputs: Tuple[Desc]) -> List[Combo]:
        return [trtp.AutoTuneCombination(types, "LINEAR")]
