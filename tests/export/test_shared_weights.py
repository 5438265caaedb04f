"""One copy of every weight per bundle (export/weights.py): the graphs share one deduplicated
external-data file, the torch backend rebuilds the models from it, and sharing changes no output."""

import shutil

import onnx
import torch

from lisa_trt.export.io_spec import Graph
from lisa_trt.export.manifest import read_manifest
from lisa_trt.export.validate import run_onnx, sample_inputs
from lisa_trt.export.weights import SHARED_DATA, model_from_bundle, share_bundle


def _locations(path):
    m = onnx.load(str(path), load_external_data=False)
    return {tuple((e.key, e.value) for e in t.external_data) for t in m.graph.initializer if t.external_data}


def test_every_graph_points_into_one_file_once(bundle):
    man = bundle
    rec = man.weights
    assert rec["file"] == SHARED_DATA and (man.dir / SHARED_DATA).stat().st_size == rec["bytes"]
    assert all(g.external_data == SHARED_DATA for g in man.graphs.values())
    assert not list(man.dir.glob("*.onnx.data"))[1:], "one data file only"
    # prefill and verify read the target's layers at the same offsets; the drafter step + commit share theirs
    pre, ver = _locations(man.graph_path(Graph.TARGET_PREFILL)), _locations(man.graph_path(Graph.TARGET_VERIFY))
    step, commit = _locations(man.graph_path(Graph.DRAFTER_STEP)), _locations(man.graph_path(Graph.DRAFTER_COMMIT))
    assert len(pre & ver) >= 0.8 * min(len(pre), len(ver))
    assert len(step & commit) >= 0.8 * len(step)
    assert rec["referenced_bytes"] > 1.8 * rec["bytes"] - rec["graph_bytes"]["gasv"] - rec["graph_bytes"]["vq_decode"]


def test_torch_models_rebuilt_from_the_shared_file(bundle, artifacts):
    man = bundle
    target = model_from_bundle(man, "target")
    for name, t in artifacts["target"].state_dict().items():
        assert torch.equal(target.state_dict()[name], t), name
    drafter = model_from_bundle(man, "drafter", target)
    for name, t in artifacts["drafter"].state_dict().items():
        assert torch.equal(drafter.state_dict()[name], t), name
    vq = model_from_bundle(man, "vq")
    for name, t in artifacts["vq"].state_dict().items():
        assert torch.equal(vq.state_dict()[name], t), name


def test_sharing_changes_no_output(artifacts, tmp_path):
    from lisa_trt.export.onnx import export_bundle

    a = artifacts
    man = export_bundle(a["target"], a["drafter"], None, None, tmp_path / "own", max_tree=8, lint=False,
                        validate=False, progress=False, share=False)
    assert not man.weights
    shutil.copytree(man.dir, tmp_path / "shared")
    shared = share_bundle(tmp_path / "shared")
    refs = dict(target=a["target"], drafter=a["drafter"], tables=None, vq=None)
    for g in (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY, Graph.DRAFTER_STEP, Graph.DRAFTER_COMMIT):
        spec = man.spec(g)
        x = sample_inputs(g, spec, man.dims, refs, precision="fp32", seed=3, batch=2, seq=3, nodes=3)
        want, have = run_onnx(man.graph_path(g), x), run_onnx(shared.graph_path(g), x)
        for n in spec.output_names:
            assert torch.equal(want[n], have[n]), (g, n)
    assert (shared.dir / SHARED_DATA).stat().st_size < 0.6 * sum(
        (man.dir / g.file).stat().st_size for g in man.graphs.values())
    read_manifest(shared.dir)  # checks the recorded files
