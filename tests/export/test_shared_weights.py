"""One copy of every weight per bundle (export/weights.py): the graphs share one deduplicated
external-data file, the torch backend rebuilds the models from it, and sharing changes no output."""

import shutil

import onnx
import torch

from lisa_trt.models.io_spec import Graph
from lisa_trt.export.manifest import read_manifest
from lisa_trt.export.validate import run_onnx, sample_inputs
from lisa_trt.export.weights import SHARED_DATA, model_from_bundle, share_bundle
from lisa_trt.speculative.methods import get_method


def _locations(path):
    m = onnx.load(str(path), load_external_data=False)
    return {tuple((e.key, e.value) for e in t.external_data) for t in m.graph.initializer if t.external_data}


def test_every_graph_points_into_one_file_once(bundle):
    man = bundle
    rec = man.weights
    assert rec["file"] == SHARED_DATA and (man.dir / SHARED_DATA).stat().st_size == rec["bytes"]
    assert all(g.external_data == SHARED_DATA for g in man.graphs.values())
    assert not list(man.dir.glob("*.onnx.data"))[1:], "one data file only"
    # prefill and verify read the target's layers at the same offsets; the drafter step + fused graph share theirs
    pre, ver = _locations(man.graph_path(Graph.TARGET_PREFILL)), _locations(man.graph_path(Graph.TARGET_VERIFY))
    step, commit = _locations(man.graph_path(Graph.DRAFTER_STEP)), _locations(man.graph_path(Graph.DRAFTER_FUSED))
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
    from lisa_trt.export import export_bundle

    a = artifacts
    man = export_bundle(a["target"], a["drafter"], None, None, tmp_path / "own", max_tree=8, lint=False,
                        validate=False, progress=False, share=False)
    assert not man.weights
    shutil.copytree(man.dir, tmp_path / "shared")
    shared = share_bundle(tmp_path / "shared")
    refs = dict(target=a["target"], drafter=a["drafter"], tables=None, vq=None)
    for g in (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY, Graph.DRAFTER_STEP, Graph.DRAFTER_FUSED):
        spec = man.spec(g)
        x = sample_inputs(g, spec, man.dims, refs, precision="fp32", seed=3, batch=2, seq=3, nodes=3)
        want, have = run_onnx(man.graph_path(g), x), run_onnx(shared.graph_path(g), x)
        for n in spec.output_names:
            assert torch.equal(want[n], have[n]), (g, n)
    assert (shared.dir / SHARED_DATA).stat().st_size < 0.6 * sum(
        (man.dir / g.file).stat().st_size for g in man.graphs.values())
    read_manifest(shared.dir)  # checks the recorded files


def test_torch_backend_on_an_fp16_bundle_runs_the_fp16_values(artifacts, tmp_path):
    """An fp16 bundle carries no fp32 copy: the torch backend rebuilds the target from the fp16
    values (exactly the rounded weights) and runs it in half precision; greedy tokens equal a
    decode of the fp32 target whose weights were rounded to fp16 (the tiny model's logits are
    peaky, so half-precision arithmetic flips no argmax), and the whole draft-tree loop is
    lossless against the same backend's plain decoding (the random drafter
    is rejected often; exactness, not acceptance, is the point)."""
    from lisa_trt.config import SamplingConfig
    from lisa_trt.engines.graph import load_engines
    from lisa_trt.export import export_bundle
    from lisa_trt.speculative.autoregressive import generate
    from lisa_trt.speculative.methods import SpecConfig
    from lisa_trt.speculative.run import run_method

    a = artifacts
    man = export_bundle(a["target"], a["drafter"], None, None, tmp_path / "h", fp16=True, max_tree=8, lint=False,
                        validate=False, progress=False)
    assert man.precision == "fp16" and "target_weights" not in (man.files or {})
    rebuilt = model_from_bundle(man, "target")
    for name, t in a["target"].state_dict().items():
        assert torch.equal(rebuilt.state_dict()[name].float(), t.half().float()), name
    rounded = type(a["target"])(a["target"].config)
    rounded.load_state_dict({k: v.half().float() for k, v in a["target"].state_dict().items()})
    cond = torch.tensor([1, 3])
    want = generate(rounded.eval(), cond, greedy=True, cfg_scale=1.0, seed=0)
    s = SamplingConfig(greedy=True, cfg_scale=1.0)
    with load_engines(man.dir, "torch") as e:
        assert next(e.target.runners[Graph.TARGET_VERIFY].module.parameters()).dtype == torch.float16
        plain, _ = run_method(get_method("vanilla"), e.target, None, None, cond, sampling=s, spec=SpecConfig(), seed=0)
        tree, _ = run_method(get_method("exact"), e.target, e.drafter, None, cond, sampling=s,
                              spec=SpecConfig.make("exact", top_k=2, depth=2, total_tokens=6), seed=0)
    assert torch.equal(plain.cpu(), want) and torch.equal(tree.cpu(), want)
