"""ONNX export of target, drafter, GASV and VQ decoder (io_spec, onnx, validate, manifest).

Heavy modules (torch.onnx, onnxruntime, polygraphy) load only when their functions are used.
"""

from ..models.io_spec import IO_SPEC_VERSION, Graph, GraphSpec, TensorSpec, graph_spec  # noqa: F401


def export_bundle(*args, **kwargs):
    """`lisa-trt export` for any family: see `lisa_trt.export.bundle.export_bundle`."""
    from .bundle import export_bundle as _export

    return _export(*args, **kwargs)
