"""The lisa::gasv TensorRT plugin module: lazy imports, AOT PTX, ONNX node, registration schema.

TensorRT cannot be installed on these machines; what needs it skips with the reason. The AOT
PTX, the ONNX node and the registration signatures (against a recording stand-in for
tensorrt.plugin) are tested without it.
"""

import importlib.util
import inspect
import os
import re
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest

from lisa_trt.engines.plugins import trt_plugin as tp

ROOT = Path(__file__).resolve().parents[2]
HAS_TRT = tp.tensorrt_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (the `kernels` extra: "
                                  "pip install -e '.[kernels]'); the AOT PTX is compiled with Triton")


def test_module_imports_without_tensorrt_or_triton():
    code = ("import sys; import lisa_trt.engines.plugins.trt_plugin as m; "
            "assert 'tensorrt' not in sys.modules, 'tensorrt imported eagerly'; "
            "assert 'triton' not in sys.modules, 'triton imported eagerly'; print('ok')")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.skipif(HAS_TRT, reason="tensorrt is installed here")
def test_register_without_tensorrt_says_what_to_do():
    with pytest.raises(tp.TensorRTUnavailableError, match="ONNX Runtime backend"):
        tp.register()


@pytest.mark.trt
@pytest.mark.skipif(not HAS_TRT, reason="tensorrt (>= 10.9, tensorrt.plugin) is not installable on "
                    "these machines (docs/spec/deploy.md); the plugin is registered only where it is")
def test_register_with_real_tensorrt():
    tp.register()
    tp.register()  # idempotent


@needs_triton
@pytest.mark.parametrize("sm,target", [(89, "sm_89"), (90, "sm_90a")])
def test_aot_kernel_ptx(sm, target):
    k = tp.aot_kernel(16384, 1280, 256, 64, sm=sm)
    assert re.search(rf"^\.target {target}\b", k.ptx, re.M)
    assert re.search(r"^\.version 8\.4\b", k.ptx, re.M)      # PTX_VERSION
    params = re.findall(rf"\.param [^\n]*{k.name}_param_(\d+)", k.ptx)
    # 9 inputs + 5 int32 scalars + 3 outputs; Triton's scratch pointers stripped
    assert len(params) == k.n_params == 17
    # the kernel's cross-warp reductions go through shared memory: the launch must reserve it (at
    # least one fp32 partial per warp), or TensorRT runs it with none
    assert k.block_x == 128 and "st.shared" in k.ptx and k.shared_mem >= 4 * (k.block_x // 32), k.shared_mem


def test_onnx_plugin_node_is_valid_onnx():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    node = tp.onnx_plugin_node(tp.INPUTS, tp.OUTPUTS)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert node.op_type == "gasv2" and node.domain == "lisa"     # GASV v2: the generation is in the name
    # tensorrt.plugin registers every plugin as version "1" (_lib.py); the parser matches it exactly
    assert attrs["plugin_namespace"] == b"lisa" and attrs["plugin_version"] == b"1" and attrs["aot"] == 1
    f32, i32 = TensorProto.FLOAT, TensorProto.INT32
    shapes = {"logits": (f32, ["N", 256]), "tokens": (i32, ["N"]), "parents": (i32, ["N"]), "nb": (i32, [256, 64]),
              "w_tilde": (f32, [256, 64]), "w_tilde_norm2": (f32, [256]), "cluster": (i32, [256]),
              "beta": (f32, [32]), "params": (f32, [10])}
    outs = {"p": ["N", 256], "delta_eff": ["N"], "gate": ["N", 64]}
    graph = helper.make_graph([node], "gasv_trt",
                              [helper.make_tensor_value_info(n, *shapes[n]) for n in tp.INPUTS],
                              [helper.make_tensor_value_info(n, f32, outs[n]) for n in tp.OUTPUTS])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("lisa", 1)])
    onnx.checker.check_model(model)
    with pytest.raises(Exception, match="takes 9 inputs"):
        tp.onnx_plugin_node(tp.INPUTS[:-1], tp.OUTPUTS)


# --- registration against a stand-in for tensorrt.plugin -------------------------------------

class _Expr:
    """tensorrt.plugin.ShapeExpr semantics (_tensor.py): `is_constant` raises RuntimeError on a fake
    (shape-inference placeholder) expression, `constant_value()` is a method that raises on a
    non-constant one. The contract tests (tests/contract) run NVIDIA's own class instead."""

    def __init__(self, v, fake=False):
        self.v, self.is_fake = v, fake

    @property
    def is_constant(self):
        if self.is_fake:
            raise RuntimeError("Not accessible for fake 'ShapeExpr's. Check is_fake to determine accessibility.")
        return isinstance(self.v, int)

    def constant_value(self):
        if not self.is_constant:
            raise RuntimeError("Not accessible for non-constant shape expressions.")
        return self.v


class _Desc:
    def __init__(self, *shape):
        self.shape_expr = [_Expr(s) for s in shape]

    def like(self):
        return self


def _fake_trtp():
    """Records decorated functions; checks the parameter schema tensorrt.plugin enforces."""
    reg = {}

    def deco(kind):
        def outer(plugin_id):
            def inner(fn):
                reg.setdefault(plugin_id, {})[kind] = fn
                return fn
            return inner
        return outer

    class KernelLaunchParams:
        pass

    class SymExprs(tuple):
        @classmethod
        def from_tuple(cls, xs):
            return cls(xs)

    m = types.SimpleNamespace(TensorDesc=_Desc, Tensor=object, KernelLaunchParams=KernelLaunchParams,
                              SymExprs=SymExprs, SymIntExprs=SymExprs, SymInt32=lambda e: e,
                              AutoTuneCombination=lambda *a: a,
                              from_shape_expr=lambda shape, dtype: ("desc", [getattr(s, "v", s) for s in shape]),
                              register=deco("register"), impl=deco("impl"), aot_impl=deco("aot_impl"),
                              autotune=deco("autotune"))
    return m, reg


@needs_triton
def test_registration_schema_and_aot_launch():
    trtp, reg = _fake_trtp()
    trt = types.SimpleNamespace(float32="f32")
    tp._register_one(trt, trtp, "lisa::gasv", sm=89)
    fns = reg["lisa::gasv"]
    assert set(fns) == {"register", "impl", "aot_impl", "autotune"}
    sig = inspect.signature(fns["register"])
    tensors = [n for n, p in sig.parameters.items() if p.annotation is _Desc]
    attrs = [n for n, p in sig.parameters.items() if p.annotation is not _Desc]
    assert tensors == list(tp.INPUTS) and attrs == ["num_warps"]
    assert len(typing.get_args(sig.return_annotation)) == tp.N_OUTPUTS
    names = lambda k: list(inspect.signature(fns[k]).parameters)  # noqa: E731
    assert names("impl") == tensors + attrs + ["outputs", "stream"]
    assert names("aot_impl") == tensors + attrs + ["outputs", "tactic"]
    assert names("autotune") == tensors + ["outputs"]
    combos = fns["autotune"](*[None] * len(tensors), outputs=None)
    assert len(combos[0][0].split(",")) == tp.N_INPUTS + tp.N_OUTPUTS

    N, V, H, C, KW = "N", 16384, 1280, 256, 64
    descs = {"logits": _Desc(N, V), "tokens": _Desc(N), "parents": _Desc(N), "nb": _Desc(V, KW),
             "w_tilde": _Desc(V, H), "w_tilde_norm2": _Desc(V), "cluster": _Desc(V), "beta": _Desc(C),
             "params": _Desc(10)}
    args = [descs[n] for n in tensors]
    outs = fns["register"](*args, num_warps=4)
    assert outs[1] == ("desc", ["N"]) and outs[2] == ("desc", ["N", KW])
    name, ptx, launch, extra = fns["aot_impl"](*args, num_warps=4, outputs=outs, tactic=0)
    assert name == b"gasv_kernel" and b".target sm_89" in ptx
    assert launch.grid_x.v == "N" and launch.block_x == 128
    assert [e.v for e in extra] == [V, H, C, KW, H]   # V, H, C, KW, stride_w
