"""The backend seam: a toy backend in this one file runs the decode loop through load_engines, and
every backend (ort, torch graph wrappers, the toy) gives the eager models' tokens."""

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.engines.base import Backend, GraphRunner, backend_names, get_backend, register_backend
from lisa_trt.engines.graph import load_engines
from lisa_trt.errors import ConfigError
from lisa_trt.models.io_spec import Graph
from lisa_trt.speculative.methods import SpecConfig
from lisa_trt.speculative.run import run_method
from lisa_trt.speculative.methods import resolve_method


class ToyRunner(GraphRunner):
    """Runs one export wrapper module eagerly and counts its calls (a backend in ~15 lines)."""

    calls: dict = {}

    def __init__(self, module, spec, dims, precision):
        super().__init__(spec, dims, precision, "cpu")
        self.module = module

    def _execute(self, inputs, outputs):
        ToyRunner.calls[self.name] = ToyRunner.calls.get(self.name, 0) + 1
        with torch.no_grad():
            res = self.module.compute(dict(inputs))
        for n, dst in outputs.items():
            if res[n].data_ptr() != dst.data_ptr():
                dst.copy_(res[n])


class ToyBackend(Backend):
    name = "toy"
    models: dict = {}

    def open(self, graph, spec, dims):
        from lisa_trt.export import onnx as X
        from lisa_trt.families.llamagen import export as L

        a = ToyBackend.models
        module = {Graph.TARGET_PREFILL: lambda: L.TargetPrefillGraph(a["target"], self.manifest.max_cache_len),
                  Graph.TARGET_VERIFY: lambda: L.TargetVerifyGraph(a["target"]),
                  Graph.DRAFTER_PROJECT: lambda: X.DrafterProjectGraph(a["drafter"]),
                  Graph.DRAFTER_STEP: lambda: X.DrafterStepGraph(a["drafter"]),
                  Graph.GASV: lambda: X.GASVGraph(a["tables"]),
                  Graph.VQ_DECODE: lambda: L.VQDecodeGraph(a["vq"], self.manifest.target_config.grid_size)}[graph]()
        return ToyRunner(module, spec, dims, self.manifest.precision)


def _decode(engines_or_models, method, cond, tables):
    t, d, gasv = engines_or_models
    s = SamplingConfig(cfg_scale=2.0, temperature=1.0)
    spec = SpecConfig.make(method, top_k=3, depth=3, total_tokens=10)
    window = 4 if method == "sjd-pac" else 16  # SJD-PAC's window tree must fit the bundle's max_tree
    toks, st = run_method(resolve_method(method), t, d, tables, cond, sampling=s, spec=spec, seed=7, gasv=gasv, sjd_window=window)
    return toks.cpu(), st


def test_a_toy_backend_registered_in_a_test_runs_the_decode_loop(bundle, artifacts):
    ToyBackend.models = artifacts
    register_backend("toy", ToyBackend)
    assert "toy" in backend_names() and get_backend("toy") is ToyBackend
    ToyRunner.calls.clear()
    with load_engines(bundle, "toy") as eng:
        assert eng.backend == "toy"
        cond = torch.tensor([2, 5])
        a = artifacts
        for method in ("exact", "gasv"):
            got, _ = _decode((eng.target, eng.drafter, eng.gasv if method == "gasv" else None), method, cond,
                             a["tables"])
            want, _ = _decode((a["target"], a["drafter"], None), method, cond, a["tables"])
            assert torch.equal(got, want), method
        img = eng.vq.decode_code(got)
        assert img.shape[:2] == (2, 3) and img.dtype == torch.float32
    assert ToyRunner.calls["target_verify"] > 1 and ToyRunner.calls["drafter_step"] > 1 and ToyRunner.calls["gasv"] >= 1
    assert eng.target._verify.closed and eng.vq._run.closed


def test_unknown_backend_lists_the_valid_names(bundle):
    with pytest.raises(ConfigError, match="unknown backend 'nope'.*ort.*torch.*trt"):
        load_engines(bundle, "nope")


@pytest.mark.parametrize("method", ["vanilla", "greedy", "exact", "lantern", "gasv", "sjd", "mcsjd", "gsd", "sjd-pac",
                                    "zipar", "coupled", "sjd-gasv"])
def test_every_method_gives_the_eager_tokens_on_every_graph_backend(bundle, artifacts, method, check_stats):
    """Token identity pinned for each method on ORT and on the torch graph runner."""
    a = artifacts
    cond = torch.tensor([1, 4])
    want, wst = _decode((a["target"], a["drafter"], None), method, cond, a["tables"])
    check_stats(wst, want, ar=method == "vanilla")
    for backend, opts in (("ort", dict(threads=1)), ("torch", {})):
        with load_engines(bundle, backend, **opts) as eng:
            got, st = _decode((eng.target, eng.drafter, eng.gasv), method, cond, a["tables"])
        assert torch.equal(got, want), (backend, method)
        # the same decode step for step: the eager models' accept lengths and target forwards
        assert [c.tolist() for c in st.committed] == [c.tolist() for c in wst.committed], (backend, method)
        assert st.target_forwards == wst.target_forwards, (backend, method)


def test_torch_backend_needs_the_bundled_weights(artifacts, tmp_path):
    from lisa_trt.errors import InputError
    from lisa_trt.export import export_bundle

    a = artifacts
    # without the shared weights file's index (share=False) there is nothing to rebuild the models from
    export_bundle(a["target"], None, None, None, tmp_path / "e", max_tree=8, lint=False, progress=False,
                  validate=False, share=False)
    with pytest.raises(InputError, match="no PyTorch weights"):
        load_engines(tmp_path / "e", "torch")
    # the default export indexes the models into its one weights file: the torch backend reads it
    export_bundle(a["target"], None, None, None, tmp_path / "s", max_tree=8, lint=False, progress=False,
                  validate=False)
    load_engines(tmp_path / "s", "torch").close()
