"""The torch backend: the export wrappers (export/onnx.py's *Graph modules, the family's target and VQ
wrappers from its ExportFamily.graph_module, the ones its bundle traced) run eagerly, for every family.

Each runner calls the same `compute(named inputs) -> named outputs` the ONNX exporter traces,
over the PyTorch models rebuilt from the bundle's shared weights file (export/weights.py; or its
`weights/*.safetensors` where an older or `--torch-weights` export wrote them).
It is the reference a new backend is compared with, and the backend to debug a graph-level
problem in plain PyTorch (breakpoints, hooks). As in the exported graphs, the caches are only
read (`present.*` are the new rows, committed by engines/graph.py `_run_kv`).

    engines = load_engines("engines/demo", "torch")

Options: device (default "cpu"); compile (default off): torch.compile the per-step graphs (target
verify, drafter step / commit) -- "default" is Inductor (C++ kernels on a CPU, Triton on a GPU),
"cuda-graphs" adds CUDA-graph capture ("reduce-overhead", CUDA only; the KV buffers are marked as
static addresses so a captured graph replays on the same cache), True picks "cuda-graphs" on CUDA
and "default" elsewhere. Shapes that change (tree size, rows that finish) recompile once each
(dynamic shapes after the first change). fp16 bundles run the models in half precision.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import ArtifactMismatchError, InputError
from ..models.io_spec import Graph
from .base import Backend, GraphRunner, register_backend


COMPILED_GRAPHS = ("target_verify", "drafter_step", "drafter_commit", "drafter_fused")  # the per-step hot path
COMPILE_MODES = {"default": "default", "cuda-graphs": "reduce-overhead"}


def compile_mode(option, device: torch.device):
    """The torch.compile mode for a `compile` option, or None (eager); errors name the fix."""
    if option in (None, False, "off", "none"):
        return None
    if option is True or option == "auto":
        option = "cuda-graphs" if device.type == "cuda" else "default"
    if option not in COMPILE_MODES:
        raise InputError(f"compile={option!r}: use one of off, auto, {', '.join(COMPILE_MODES)}")
    if option == "cuda-graphs" and device.type != "cuda":
        raise InputError("compile='cuda-graphs' captures CUDA graphs and needs device='cuda'; on a CPU use "
                         "compile='default' (Inductor)")
    return COMPILE_MODES[option]


class TorchRunner(GraphRunner):
    """One export wrapper module run eagerly (no_grad) or torch.compile'd; results land in the
    given outputs."""

    def __init__(self, module, spec, dims, precision, device, mode=None):
        super().__init__(spec, dims, precision, device)
        self.module = module
        self.mode = mode
        self._fn = module.compute
        if mode is not None:
            self._fn = torch.compile(module.compute, mode=mode, fullgraph=False)
        self._static: set = set()

    def _execute(self, inputs: dict, outputs: dict) -> None:
        if self.mode == "reduce-overhead":  # captured graphs replay on the same cache buffers
            for name, t in inputs.items():
                if name.startswith("past_key_values.") and t.data_ptr() not in self._static:
                    torch._dynamo.mark_static_address(t)
                    self._static.add(t.data_ptr())
        with torch.no_grad():
            res = self._fn(dict(inputs))
        for name, dst in outputs.items():
            src = res[name]
            if src.data_ptr() != dst.data_ptr():
                dst.copy_(src.reshape(dst.shape))

    def _close(self) -> None:
        self.module = None


class TorchBackend(Backend):
    """Loads the bundle's PyTorch weights once; opens one export wrapper per graph."""

    name = "torch"
    optional_graphs = (Graph.DRAFTER_COMMIT, Graph.DRAFTER_FUSED)  # drafter_fused: every drafter call one

    def __init__(self, manifest, *, device="cpu", compile=None):
        super().__init__(manifest)
        self._device = torch.device(device)
        self._mode = compile_mode(compile, self._device)
        self._models: dict = {}

    @property
    def device(self) -> torch.device:
        return self._device

    def check(self) -> None:
        from ..export.weights import has_index, no_torch_weights

        if "target_weights" not in (self.manifest.files or {}) and not has_index(self.manifest, "target"):
            raise InputError(no_torch_weights(self.manifest))

    def _file(self, key: str) -> Path:
        return Path(self.manifest.dir) / self.manifest.files[key]

    def _prepare(self, m):
        from ..export.memory import half_in_place  # the fp16 graphs' tensors: RoPE tables stay fp32

        m = m.to(self._device).eval()
        return half_in_place(m) if self.manifest.precision == "fp16" else m

    def _model(self, what: str):
        if what in self._models:
            return self._models[what]
        man = self.manifest
        if what == "target":  # weights/ when the bundle has them, else its shared weights file (hash checked)
            from ..export.weights import model_from_bundle

            m = self._prepare(model_from_bundle(man, "target"))
        elif what == "drafter":
            from ..export.weights import model_from_bundle

            m = self._prepare(model_from_bundle(man, "drafter", self._model("target")))
        elif what == "medusa":  # fp32 like its graph (MedusaHeadsGraph)
            from ..models.medusa import load_medusa

            m = load_medusa(self._file("drafter_weights"), self._model("target"), check_target=False)
            if m.config.target_hash != man.target_hash:
                raise ArtifactMismatchError(f"{self._file('drafter_weights')} holds Medusa heads for target "
                                            f"{m.config.target_hash}, the bundle's is {man.target_hash}; re-export it")
            m = m.float().to(self._device).eval()
        elif what == "vq":
            from ..export.weights import model_from_bundle

            m = model_from_bundle(man, "vq").to(self._device).eval()
        else:  # tables, bound to the head rows they cover (the family's sub-vocabulary, or the whole head)
            from ..calibration.tables import load_tables

            m = man.export_family.bind_tables(load_tables(self._file("tables")), self._model("target"))
        self._models[what] = m
        return m

    def open(self, graph, spec, dims):
        from ..export import onnx as X

        man = self.manifest
        module = None
        if graph in (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY, Graph.VQ_DECODE):  # the family's wrappers
            model = self._model("vq" if graph is Graph.VQ_DECODE else "target")
            module = man.export_family.graph_module(graph, model, man.target_config, man.max_cache_len)
        elif graph is Graph.DRAFTER_PROJECT:
            module = X.DrafterProjectGraph(self._model("drafter"))
        elif graph is Graph.DRAFTER_STEP:
            module = X.DrafterStepGraph(self._model("drafter"))
        elif graph is Graph.MEDUSA_HEADS:
            module = X.MedusaHeadsGraph(self._model("medusa"))
        elif graph is Graph.DRAFTER_COMMIT:
            module = X.DrafterCommitGraph(self._model("drafter"))
        elif graph is Graph.DRAFTER_FUSED:
            module = X.DrafterFusedGraph(self._model("drafter"))
        elif graph is Graph.GASV:
            module = X.GASVGraph(self._model("tables"), spec).to(self._device)
        if module is None:
            raise InputError(f"the torch backend has no wrapper for {graph.value}")
        mode = self._mode if graph.value in COMPILED_GRAPHS else None
        return TorchRunner(module, spec, dims, self.manifest.precision, self._device, mode=mode)


register_backend("torch", TorchBackend)

__all__ = ["COMPILE_MODES", "TorchBackend", "TorchRunner", "compile_mode"]
