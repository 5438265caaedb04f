"""Export at size (issue 26 item 3): fp16 copies made tensor by tensor, per graph and gone before
the graph's validation; the export's peak RSS in the manifest; bf16 checkpoints exported as they
are; old manifests (no `export` record) still read."""

import copy
import gc
import weakref

import pytest
import torch

from lisa_trt.export import sizing
from lisa_trt.export.manifest import Manifest, read_manifest
from lisa_trt.progress import WorkEta, fmt_seconds
from lisa_trt.testing import make_target


def _old_half(module):
    m = copy.deepcopy(module).half()
    for name in sizing.FP32_BUFFERS:
        if hasattr(m, name):
            setattr(m, name, getattr(module, name).float().clone())
    return m


def test_half_copy_is_the_old_deepcopy_half():
    t = make_target().eval()
    old, new = _old_half(t), sizing.half_copy(t)
    so, sn = old.state_dict(), new.state_dict()
    assert so.keys() == sn.keys()
    for k in so:
        assert so[k].dtype == sn[k].dtype and torch.equal(so[k], sn[k]), k
    assert new.freqs_cis.dtype == torch.float32 and torch.equal(new.freqs_cis, t.freqs_cis.float())
    assert all(p.dtype == torch.float32 for p in t.parameters()), "the source model is left fp32"
    lazy = dict(sizing.PrecisionCopy(t, True).state_items())  # what the torch index reads
    for k in so:
        assert lazy[k].dtype == so[k].dtype and torch.equal(lazy[k], so[k]), k


def test_fp16_copy_made_per_graph_and_freed_before_validation(tmp_path, monkeypatch):
    from lisa_trt.export import onnx as O

    made, seen_alive = [], []
    real = sizing.half_copy

    def counting(module):
        m = real(module)
        made.append(weakref.ref(m))
        return m

    def check_softmax(path):  # runs after the graph is written, before validation
        gc.collect()
        seen_alive.append([r() is not None for r in made])
        return real_softmax(path)

    real_softmax = O.set_softmax_fp32
    monkeypatch.setattr(sizing, "half_copy", counting)
    monkeypatch.setattr(O, "set_softmax_fp32", check_softmax)
    t = make_target().eval()
    man = O.export_bundle(t, None, None, None, tmp_path / "b", fp16=True, max_tree=8, lint=False, validate=True,
                          progress=False)
    assert len(made) == 2, "one fp16 copy per target graph (prefill, verify)"
    assert seen_alive == [[False], [False, False]], "each copy is dropped once its graph is written"
    assert all(g.validation["ok"] for g in man.graphs.values())
    assert man.weights["tensors"]["target"], "the torch index still finds every fp16 tensor"


def test_manifest_records_the_export_peak_rss(tmp_path):
    from lisa_trt.export.onnx import export_bundle

    t = make_target().eval()
    man = export_bundle(t, None, None, None, tmp_path / "b", max_tree=8, lint=False, validate=False, progress=False)
    rec = man.export
    assert rec["peak_rss_bytes"] >= max(g.peak_rss_bytes for g in man.graphs.values()) > 0
    assert rec["peak_rss_bytes"] <= sizing.peak_rss_bytes()
    assert rec["fp32_parameter_bytes"] == sum(p.numel() * 4 for p in t.parameters())
    assert rec["peak_rss_over_fp32_parameters"] == round(rec["peak_rss_bytes"] / rec["fp32_parameter_bytes"], 3)
    again = read_manifest(tmp_path / "b")
    assert again.export == rec
    # the lint subprocesses' peak is not the process's own: recorded apart (RUSAGE_CHILDREN)
    assert 0 <= rec["children_peak_rss_bytes"] <= sizing.children_peak_rss_bytes()


def test_old_manifest_without_export_record_still_reads():
    m = Manifest.from_dict({"precision": "fp32", "opset": 23, "max_tree": 8, "max_cache_len": 32,
                            "target": {"hash": "x", "config": {}},
                            "graphs": {"target_prefill": {"name": "target_prefill", "kind": "prefill",
                                                          "file": "target_prefill.onnx", "precision": "fp32",
                                                          "sha256": "0"}}})
    assert m.export == {} and m.graphs["target_prefill"].peak_rss_bytes is None


def test_bf16_checkpoint_exported_as_it_is(tmp_path):
    """A bf16 LlamaGen checkpoint (official layout) loads into the fp32 model value for value and
    exports a validated fp16 bundle whose weights are the bf16 values."""
    from lisa_trt.export.onnx import export_bundle
    from lisa_trt.export.weights import model_from_bundle
    from lisa_trt.models.checkpoints import load_target, target_hash

    t = make_target().eval()
    sd = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in t.state_dict().items()}
    ck = tmp_path / "bf16.pt"
    torch.save({"model": sd}, ck)
    m = load_target(ck, t.config)
    for k, v in m.state_dict().items():
        assert v.dtype == t.state_dict()[k].dtype, k
        assert torch.equal(v, sd[k].to(v.dtype)), k
    man = export_bundle(m, None, None, None, tmp_path / "b", fp16=True, max_tree=8, lint=False, validate=True,
                        progress=False)
    assert man.target_hash == target_hash(m) and all(g.validation["ok"] for g in man.graphs.values())
    back = model_from_bundle(man, "target")
    w = sd["layers.0.attention.wqkv.weight"]
    assert torch.equal(back.state_dict()["layers.0.attention.wqkv.weight"], w.to(torch.float16).float())


def test_work_eta_weights_by_work():
    eta = WorkEta([100, 100, 1], floor=1)
    assert eta.eta() is None and eta.step_eta(0) is None
    eta.finish(0, 50.0)
    assert eta.step_eta(1) == pytest.approx(50.0)
    assert eta.eta() == pytest.approx(50.5)
    assert eta.eta(running=1, running_s=20.0) == pytest.approx(30.5)
    eta.finish(0, 999.0)  # counted once
    assert eta.eta() == pytest.approx(50.5)
    assert [fmt_seconds(x) for x in (None, 5, 185, 3720)] == ["?", "5s", "3m05s", "1h02m"]
