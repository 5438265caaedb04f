"""lisa::gasv2 checked by NVIDIA's own `tensorrt.plugin` code (10.14 and 11.x wheels).

`trt_plugin._register_one` runs against the vendor's real register / impl / aot_impl / autotune
decorators (their validators check every signature and annotation), the real plugin registry
glue (`_TemplatePluginCreator`, version "1"), the real ShapeExpr / SymInt32 / KernelLaunchParams
classes and the real `_TemplateAOTPlugin.get_launch_params`. Only TensorRT's compiled core is a
stand-in (trt_core.py). The ONNX node comes from the graph rewrite, and is imported the way
TensorRT's parser does it (creator lookup by exact name, version, namespace).

Failing on the pre-issue-25 code: plugin_version "2" -> "Plugin not found"; `_static` reading
`constant_value` as an attribute -> TypeError inside get_launch_params.
"""

import importlib.util

import pytest

from trt_core import DataType, ParserError, build_plugin_layer, import_plugin_node, load_vendor_plugin

from lisa_trt.engines.plugins import trt_plugin as tp

pytestmark = pytest.mark.contract
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton (the `kernels` extra) compiles the AOT PTX inside aot_impl")

V, H, C, KW, P = 256, 64, 32, 64, 10
F32, I32 = DataType.FLOAT, DataType.INT32
# the GASV plugin's inputs as the TensorRT variant graph declares them (N = node rows, dynamic)
INPUTS = [(F32, ("N", V)), (I32, ("N",)), (I32, ("N",)), (I32, (V, KW)), (F32, (V, H)), (F32, (V,)),
          (I32, (V,)), (F32, (C,)), (F32, (P,))]
PROFILE = {"N": (1, 16, 48)}


@pytest.fixture
def vendor(trt_bindings, monkeypatch):
    """(core, tensorrt.plugin) with lisa::gasv2 registered through the vendor's decorators."""
    core, trtp = load_vendor_plugin(trt_bindings, monkeypatch)
    tp._register_one(core, trtp, tp.PLUGIN_ID, sm=89)
    return core, trtp


def _node(**attrs):
    node = tp.onnx_plugin_node(tp.INPUTS, tp.OUTPUTS)
    for a in list(node.attribute):
        if a.name in attrs:
            node.attribute.remove(a)
    import onnx

    node.attribute.extend(onnx.helper.make_attribute(k, v) for k, v in attrs.items())
    return node


def test_vendor_registers_the_plugin_as_version_1(vendor):
    core, trtp = vendor
    reg = core.get_plugin_registry()
    assert sorted(reg.creators) == [(tp.PLUGIN_NAME, "1", tp.NAMESPACE)]   # _lib.py: plugin_version = "1"
    assert tp.PLUGIN_VERSION == "1"
    creator = reg.get_creator(tp.PLUGIN_NAME, "1", tp.NAMESPACE)
    assert [f.name for f in creator.field_names] == ["num_warps"]       # only declared attributes are fields
    pdef = trtp._lib.QDP_REGISTRY[tp.PLUGIN_ID]
    assert pdef.input_tensor_names == list(tp.INPUTS) and pdef.num_outputs == tp.N_OUTPUTS
    assert pdef.aot_impl_func is not None and pdef.impl_func is not None and pdef.autotune_func is not None


def test_parser_finds_the_plugin_from_the_onnx_node(vendor):
    core, _ = vendor
    plugin = import_plugin_node(core, tp.onnx_plugin_node(tp.INPUTS, tp.OUTPUTS))   # aot=1 -> kSTRICT_AOT
    assert type(plugin).__name__ == "_TemplateAOTPlugin" and plugin.attrs == {"num_warps": 4}
    jit = import_plugin_node(core, tp.onnx_plugin_node(tp.INPUTS, tp.OUTPUTS, aot=False))
    assert type(jit).__name__ == "_TemplateJITPlugin"                               # aot=0 -> kSTRICT_JIT
    with pytest.raises(ParserError, match="Plugin not found"):
        import_plugin_node(core, _node(plugin_version="2"))                          # what main's graphs carried
    node = _node()
    for a in list(node.attribute):
        if a.name == "aot":
            node.attribute.remove(a)
    with pytest.raises(ValueError, match="both AOT and JIT"):                      # main's JIT variant had no aot
        import_plugin_node(core, node)


@pytest.fixture(scope="module")
def rewritten_node(tmp_path_factory):
    """The plugin node of a real gasv.trt.onnx (graph_rewrite on an exported gasv.onnx); made before
    the stand-in `tensorrt` module is installed (torch.export probes the real one)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
    from export_artifacts import make_tables

    from lisa_trt.engines.plugins import graph_rewrite as gr
    from lisa_trt.models.io_spec import Graph, export_dims
    from lisa_trt.export.onnx import GASVGraph, onnx_from_torch
    from lisa_trt.export.validate import sample_inputs
    from lisa_trt.testing import make_target

    target = make_target()
    tables = make_tables(target, C=5)
    module = GASVGraph(tables)
    dims = export_dims(target.config, max_cache_len=40)
    example = sample_inputs(Graph.GASV, module.spec, dims, dict(target=target, tables=tables), nodes=4)
    path = tmp_path_factory.mktemp("gasv") / "gasv.onnx"
    onnx_from_torch(module, example, path)
    (node,) = gr.plugin_nodes(gr.rewrite_gasv(path, tables=tables))
    return node


def test_the_rewritten_graph_node_imports(rewritten_node, vendor):
    plugin = import_plugin_node(vendor[0], rewritten_node)
    assert plugin.plugin_version == "1" and plugin.plugin_namespace == tp.NAMESPACE
    assert type(plugin).__name__ == "_TemplateAOTPlugin" and plugin.attrs == {"num_warps": 4}


@needs_triton
def test_build_phase_and_aot_launch_params(vendor):
    """NVIDIA's get_output_data_types / get_output_shapes / format combinations / get_launch_params."""
    core, _ = vendor
    plugin = import_plugin_node(core, tp.onnx_plugin_node(tp.INPUTS, tp.OUTPUTS))
    r = build_plugin_layer(plugin, INPUTS, "opt", PROFILE)
    assert r["output_types"] == [F32, F32, F32]
    assert r["output_shapes"] == [[16, V], [16], [16, KW]]                          # p, delta_eff, gate at N=16
    assert r["combination"] == ["FLOAT", "INT32", "INT32", "INT32", "FLOAT", "FLOAT", "INT32", "FLOAT", "FLOAT",
                                "FLOAT", "FLOAT", "FLOAT"]
    assert r["launch"]["grid_x"] == 16 and r["launch"]["block_x"] == 128           # one program per node row
    assert r["extra_args"] == [V, H, C, KW, H] and set(r["extra_arg_types"]) == {"INT32"}  # V, H, C, KW, stride_w
    name, ptx = r["kernel"]
    assert name == b"gasv_kernel" and b".target sm_89" in ptx
    r_max = build_plugin_layer(plugin, INPUTS, "max", PROFILE)
    assert r_max["launch"]["grid_x"] == 48 and r_max["output_shapes"][0] == [48, V]


def test_static_follows_shape_expr_semantics(vendor):
    """`_static` on the vendor's ShapeExpr: fake -> default; constant -> constant_value(); else error."""
    core, trtp = vendor
    from lisa_trt.errors import LisaError

    fake = trtp.ShapeExpr()                                 # what shape inference hands register()
    assert fake.is_fake and tp._static(fake, 7) == 7
    with pytest.raises(RuntimeError, match="is_fake"):
        fake.is_constant                                    # noqa: B018 - the vendor raises; _static must not
    eb = core.IExprBuilder()
    trtp._tensor.SymIntExpr._exprBuilder = eb
    try:
        assert tp._static(trtp.ShapeExpr(eb.constant(256)), 7) == 256
        with pytest.raises(LisaError, match="not a build-time constant"):
            tp._static(trtp.ShapeExpr(core.IDimensionExpr(symbol="N")), 7, "V")
    finally:
        trtp._tensor.SymIntExpr._exprBuilder = None


def test_vendor_validators_refuse_a_wrong_aot_signature(trt_bindings, monkeypatch):
    """The validators are live: an aot_impl whose parameters do not follow register() is refused."""
    core, trtp = load_vendor_plugin(trt_bindings, monkeypatch)
    tp._register_one(core, trtp, tp.PLUGIN_ID, sm=89)
    with pytest.raises(ValueError):
        @trtp.aot_impl(tp.PLUGIN_ID)
        def _bad(logits: trtp.TensorDesc, outputs, tactic: int):  # skips 8 inputs
            return None
