"""export_bundle: every graph validated against PyTorch, names from io_spec, manifest, atomicity."""

import json
import os

import onnx
import pytest
import torch

from lisa_trt.errors import ArtifactMismatchError, CheckpointError, InputError
from lisa_trt.export import bundle as E
from lisa_trt.export import onnx as O
from lisa_trt.models.io_spec import IO_SPEC_VERSION, Graph, graph_spec
from lisa_trt.export.manifest import drafter_hash, read_manifest, tables_hash
from lisa_trt.export.weights import SHARED_DATA
from lisa_trt.export.validate import THRESHOLDS, lint_graph, run_onnx, sample_inputs
from lisa_trt.models.checkpoints import target_hash

from export_artifacts import make_artifacts, make_tables


EAGLE_BUNDLE = [g for g in Graph if g not in (Graph.MEDUSA_HEADS, Graph.DRAFTER_COMMIT)]  # medusa_heads: tests/drafters/test_medusa_bundle.py;
# drafter_commit: only in bundles exported before drafter_fused (tests/engines/test_ort.py)


def test_bundle_has_every_graph_validated_fp32(bundle):
    assert set(bundle.graphs) == {g.value for g in EAGLE_BUNDLE}
    for name, g in bundle.graphs.items():
        v = g.validation
        assert v["ok"] and v["threshold"] == THRESHOLDS["fp32"], (name, v)
        assert v["max_error"] < 1e-4, (name, v)
        assert (bundle.dir / g.file).is_file()


def test_graph_io_matches_io_spec_with_dynamic_axes(bundle, artifacts):
    n_layer = artifacts["target"].config.n_layer
    for g in EAGLE_BUNDLE:
        model = onnx.load(str(bundle.graph_path(g)), load_external_data=False)
        spec = graph_spec(g, n_layer=n_layer)
        assert [i.name for i in model.graph.input] == spec.input_names
        assert [o.name for o in model.graph.output] == spec.output_names
        for vi, ts in zip(model.graph.input, spec.inputs):
            dims = [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
            for ax, d in zip(ts.axes, dims):
                if ax in ("batch", "seq", "nodes", "taps_seq", "hidden_seq"):  # dynamic (drafter_fused: 0 rows allowed)
                    assert d == ax, (g, ts.name, dims)
                else:
                    assert isinstance(d, int), (g, ts.name, dims)  # static: cache_len, vocab, ...
    verify = onnx.load(str(bundle.graph_path(Graph.TARGET_VERIFY)), load_external_data=False)
    ops = {n.op_type for n in verify.graph.node}
    assert not ops & {"ScatterElements", "ScatterND", "TensorScatter"}  # no graph writes into the cache
    for o in verify.graph.output:  # present.*: the new rows (seq), never the cache (cache_len)
        if o.name.startswith("present."):
            assert o.type.tensor_type.shape.dim[2].dim_param == "seq", o.name


def test_manifest_records_artifacts_and_settings(bundle, artifacts):
    assert bundle.io_spec_version == IO_SPEC_VERSION and bundle.opset == E.DEFAULT_OPSET
    assert bundle.precision == "fp32" and bundle.max_tree == 16
    assert bundle.max_cache_len == 40  # round_up(1 + 16 + 16, 8)
    assert bundle.target_hash == target_hash(artifacts["target"])
    assert bundle.drafter["hash"] == drafter_hash(artifacts["drafter"])
    assert bundle.tables["hash"] == tables_hash(artifacts["tables"])
    assert bundle.target_config == artifacts["target"].config
    assert bundle.gasv_config == artifacts["tables"].config
    assert "temperature" in bundle.generation
    assert oct(os.stat(bundle.dir).st_mode & 0o777) != oct(0o700)  # readable like any export


def test_manifest_refuses_other_artifacts_naming_both_hashes(bundle):
    read_manifest(bundle.dir, target_hash=bundle.target_hash)  # the right one passes
    for kw in ("target_hash", "drafter_hash", "tables_hash"):
        with pytest.raises(ArtifactMismatchError) as e:
            read_manifest(bundle.dir, **{kw: "0123456789abcdef"})
        assert "0123456789abcdef" in str(e.value)
        what = kw.split("_")[0]
        recorded = {"target": bundle.target_hash, "drafter": bundle.drafter["hash"],
                    "tables": bundle.tables["hash"]}[what]
        assert recorded in str(e.value)


def test_manifest_refuses_changed_graphs_and_versions(bundle, tmp_path):
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(bundle.dir, d)
    with open(d / "gasv.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ArtifactMismatchError, match="changed after export"):
        read_manifest(d)
    man = json.loads((d / "manifest.json").read_text())
    man["io_spec_version"] = IO_SPEC_VERSION + 1
    (d / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ArtifactMismatchError, match="io_spec_version"):
        read_manifest(d, check_files=False)
    man["io_spec_version"] = 1  # a bundle whose graphs return the whole cache as present.*
    (d / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ArtifactMismatchError, match=r"io_spec_version 1; this lisa-trt reads io_spec_version 2\. "
                                                    r"Re-export it with `lisa-trt export`"):
        read_manifest(d, check_files=False)
    with pytest.raises(CheckpointError, match="no manifest.json"):
        read_manifest(tmp_path)


def test_export_refuses_tables_of_another_target(artifacts, tmp_path):
    other = make_artifacts(seed=5)["target"]
    with pytest.raises(ArtifactMismatchError):
        E.export_bundle(artifacts["target"], None, make_tables(other), None, tmp_path / "x", progress=False)
    assert not (tmp_path / "x").exists()


def test_export_refuses_to_overwrite_a_foreign_directory(artifacts, tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not a lisa-trt engine directory"):
        E.export_bundle(artifacts["target"], None, None, None, tmp_path / "x", progress=False)
    assert (tmp_path / "x" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("exc", [RuntimeError("injected"), KeyboardInterrupt()])
def test_interrupted_export_leaves_no_directory(artifacts, tmp_path, monkeypatch, exc):
    real, calls = O.onnx_from_torch, []

    def failing(*a, **k):
        calls.append(1)
        if len(calls) == 2:  # after the first graph was written
            raise exc
        return real(*a, **k)

    monkeypatch.setattr(O, "onnx_from_torch", failing)
    with pytest.raises(type(exc)):
        E.export_bundle(artifacts["target"], None, None, None, tmp_path / "eng", validate=False, lint=False,
                        progress=False)
    assert len(calls) == 2
    assert list(tmp_path.iterdir()) == []  # neither eng/ nor the hidden staging directory


def test_failed_reexport_keeps_the_previous_engines(bundle, tmp_path, monkeypatch):
    import shutil

    d = tmp_path / "eng"
    shutil.copytree(bundle.dir, d)
    before = (d / "manifest.json").read_text()

    def boom(*a, **k):
        raise RuntimeError("injected")

    monkeypatch.setattr(O, "onnx_from_torch", boom)
    with pytest.raises(RuntimeError):
        a = make_artifacts()
        E.export_bundle(a["target"], None, None, None, d, progress=False)
    assert (d / "manifest.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eng"]
    read_manifest(d)


def test_validation_catches_a_wrong_graph(bundle, artifacts):
    """The comparison can fail: the verify graph checked against another target's weights."""
    from lisa_trt.models.io_spec import export_dims
    from lisa_trt.export.validate import validate_graph

    other = make_artifacts(seed=7)
    refs = dict(other, target=other["target"])
    dims = export_dims(other["target"].config, max_cache_len=bundle.max_cache_len)
    spec = graph_spec(Graph.TARGET_VERIFY, n_layer=other["target"].config.n_layer)
    rep = validate_graph(Graph.TARGET_VERIFY, bundle.graph_path(Graph.TARGET_VERIFY), spec, dims, refs)
    assert not rep.ok and rep.errors["logits"] > 1e-2 and "> threshold" in rep.summary()


def test_lint_passes_on_an_exported_graph(bundle, artifacts):
    from lisa_trt.models.io_spec import export_dims

    a = artifacts
    dims = export_dims(a["target"].config, max_cache_len=bundle.max_cache_len, drafter_cfg=a["drafter"].config)
    spec = graph_spec(Graph.DRAFTER_STEP)
    res = lint_graph(bundle.graph_path(Graph.DRAFTER_STEP), sample_inputs(Graph.DRAFTER_STEP, spec, dims, a))
    assert res["status"] == "passed", res
    assert res["failing_nodes"] == 0 and res["passing_nodes"] > 10


def _external_graph(d, shape):
    """x (1, 64) @ W (64, 48), W in external data next to the graph (small tensors inline, as the
    exporter writes them); then Reshape to `shape`."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((64, 48), dtype=np.float32), "W")
    s = numpy_helper.from_array(np.array(shape, dtype=np.int64), "S")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm"),
                           helper.make_node("Reshape", ["y", "S"], ["z"], name="rs")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [w, s])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(d / "g.onnx"), save_as_external_data=True, location="g.onnx.data", size_threshold=1024)
    return d / "g.onnx"


def test_lint_reads_external_weights_in_its_graph_folder_and_reports_what_fails(tmp_path, monkeypatch):
    """The lint subprocess loads the graph's structure only (--ignore-external-data: its peak was
    5.5x the graph's weights) and ONNX Runtime reads the weights from the file, resolved in the
    graph's folder whatever the caller's working directory: a good graph passes, a graph that
    fails at run time or whose weights are missing fails, with ONNX Runtime's or the checker's
    words."""
    x = {"x": torch.ones(1, 64)}
    monkeypatch.chdir(tmp_path)  # not the graph's folder
    assert lint_graph(_external_graph(tmp_path / "ok", (6, 8)), x)["status"] == "passed"
    bad = lint_graph(_external_graph(tmp_path / "shape", (5, 8)), x)  # 48 values cannot take shape (5, 8)
    assert bad["status"] == "failed" and bad["failing_nodes"] >= 1
    assert any("reshape" in e.lower() or "shape" in e.lower() for e in bad["errors"]), bad
    gone = _external_graph(tmp_path / "gone", (6, 8))
    (gone.parent / "g.onnx.data").unlink()
    res = lint_graph(gone, x)
    assert res["status"] == "failed" and any("g.onnx.data" in e for e in res["errors"]), res


def test_lint_is_skipped_with_the_reason_when_it_would_not_fit_in_memory(bundle, artifacts, monkeypatch):
    """A lint subprocess peaks near 3x its graph's weights (5.56x, 18.8 GB for the fp32 GPT-XL target,
    before --ignore-external-data): when that exceeds the available memory it is skipped before it
    starts, saying why and how."""
    import lisa_trt.export.validate as V

    path = bundle.graph_path(Graph.TARGET_VERIFY)
    w = V.graph_weight_bytes(path)
    params = sum(p.numel() * 4 for p in artifacts["target"].parameters())
    assert 0.5 * params < w < 2 * params  # the target's weights, whether inline or external
    monkeypatch.setattr(V, "available_memory_bytes", lambda: int(w * 2))
    res = V.lint_graph(path, {})
    assert res["status"] == "skipped" and "polygraphy check lint" in res["reason"] and "available" in res["reason"]


def test_gasv_graph_calls_the_reference_on_filtered_rows(bundle, artifacts):
    import dataclasses

    from lisa_trt.models.io_spec import GASV_K
    from lisa_trt.speculative.gasv import gasv_gates

    V = artifacts["target"].config.vocab_size
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, V, generator=g) * 2
    logits[1, 40:] = float("-inf")  # a top-40 support
    logits[2, 1:] = float("-inf")  # a single token
    tokens = torch.tensor([3, 7, 0, 11, 2])
    parents = torch.tensor([-1, 0, 0, 1, 2])
    tables = artifacts["tables"]
    for cfg in (tables.config, dataclasses.replace(tables.config, neighbours=5, kappa=3.0, lam=0.1, delta=0.3,
                                                   gamma_delta=1.0)):
        have = run_onnx(bundle.graph_path(Graph.GASV), dict(guided_logits=logits, node_tokens=tokens,
                                                             node_parents=parents, gasv_params=O.gasv_params(cfg)))
        want = gasv_gates(logits, tokens, parents, tables, cfg)
        k = cfg.neighbours
        assert have["gate"].shape == (5, GASV_K)
        assert torch.allclose(have["gate"][:, :k], want.gate, atol=1e-5)
        assert (have["gate"][:, k:] == 0).all() and (have["cand"][:, k:] == -1).all()
        assert torch.equal(have["cand"][:, :k], want.cand)
        assert torch.allclose(have["p"], want.p, atol=1e-6)
        assert torch.allclose(have["delta_eff"], want.delta_eff, atol=1e-6)
        assert (want.gate > 0).any() and (want.gate[1:] == 0).any()       # teeth


@pytest.mark.slow
def test_fp16_export_validates_with_fp32_statistics(artifacts, tmp_path):
    a = artifacts
    man = E.export_bundle(a["target"], a["drafter"], None, None, tmp_path / "fp16", fp16=True, max_tree=8,
                          lint=False, progress=False, external_data=True)
    assert man.precision == "fp16"
    for g in man.graphs.values():  # weights in the one shared external file, listed and present
        assert g.external_data == SHARED_DATA and (man.dir / g.external_data).is_file()
    for name, g in man.graphs.items():
        assert g.precision == "fp16" and g.validation["ok"], (name, g.validation)
        assert g.validation["max_error"] > 1e-6  # really fp16 (not silently fp32)
    m = onnx.load(str(man.graph_path(Graph.TARGET_VERIFY)), load_external_data=False)
    types = {v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
    soft = [n for n in m.graph.node if n.op_type == "Softmax"]  # the cached attention: one softmax per layer
    assert len(soft) >= a["target"].config.n_layer and all(types[n.input[0]] == onnx.TensorProto.FLOAT for n in soft)
    out_types = {o.name: o.type.tensor_type.elem_type for o in m.graph.output}
    assert out_types["logits"] == onnx.TensorProto.FLOAT and out_types["hidden"] == onnx.TensorProto.FLOAT16
