"""export --quantize: the quantized graphs hold the quantized ops, run through the unchanged ORT
runners (in-place KV caches, external data) close to torch, and the manifest records and guards them."""

import shutil

import pytest
import torch

from lisa_trt.errors import ArtifactMismatchError, InputError
from lisa_trt.models.io_spec import Graph
from lisa_trt.export.quantize import QUANT_THRESHOLDS, float_matmuls, op_counts, quantize_bundle, quantize_graph


@pytest.fixture(scope="module")
def fp32_dir(artifacts, tmp_path_factory):
    from lisa_trt.export import export_bundle

    out = tmp_path_factory.mktemp("qsrc") / "fp32"
    export_bundle(artifacts["target"], artifacts["drafter"], artifacts["tables"], artifacts["vq"], out,
                  max_tree=16, lint=False, validate=False, progress=False)
    return out


def _quantized(fp32_dir, tmp_path_factory, artifacts, mode, **kw):
    out = tmp_path_factory.mktemp(f"q{mode}") / mode
    shutil.copytree(fp32_dir, out)
    return quantize_bundle(out, mode, artifacts, **kw)


@pytest.fixture(scope="module")
def int8(fp32_dir, tmp_path_factory, artifacts):
    return _quantized(fp32_dir, tmp_path_factory, artifacts, "int8")


@pytest.fixture(scope="module")
def int4(fp32_dir, tmp_path_factory, artifacts):
    # external_bytes=0: every quantized graph keeps its weights in external data (the large-model layout)
    # the tiny random model is int4's worst case (random weights, random inputs): looser threshold
    return _quantized(fp32_dir, tmp_path_factory, artifacts, "int4", block_size=16, external_bytes=0, threshold=0.6)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantized_graphs_hold_the_quantized_ops_and_no_float_matmul(mode, int8, int4, fp32_dir):
    man = int8 if mode == "int8" else int4
    op = "MatMulInteger" if mode == "int8" else "MatMulNBits"
    for g in (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY, Graph.DRAFTER_PROJECT, Graph.DRAFTER_STEP):
        path = man.graph_path(g)
        n_src = float_matmuls(fp32_dir / path.name)
        assert n_src > 0
        assert op_counts(path).get(op) == n_src, g  # every weight MatMul was replaced
        assert float_matmuls(path) == 0
        assert man.graphs[g.value].quantization["mode"] == mode
    for g in (Graph.GASV, Graph.VQ_DECODE):  # stay fp32, untouched
        assert man.graphs[g.value].quantization is None
        assert op_counts(man.graph_path(g)).get(op) is None


def test_manifest_records_precision_hashes_and_validation(int8, int4):
    for mode, man in (("int8", int8), ("int4", int4)):
        assert man.quantization == mode and man.precision == "fp32"  # fp32 activations, quantized weights
        e = man.graphs["target_verify"]
        assert e.quantization["source_sha256"] != e.sha256
        v = e.validation
        assert v["ok"] and v["precision"] == mode and v["threshold"] == (QUANT_THRESHOLDS[mode] if mode == "int8" else 0.6)
        assert 0 < v["max_abs_logit_diff"] < 5 and v["top1_agreement"] > 0.5
    # the quantized weights live in the bundle's one shared weights file, its sha256 in the manifest
    assert int4.graphs["target_verify"].external_data == int4.weights["file"] and int4.weights["sha256"]
    assert int4.graphs["target_verify"].quantization["block_size"] == 16


@pytest.mark.parametrize("mode,tol", [("int8", 0.1), ("int4", 0.6)])
def test_ort_runner_loads_quantized_engines_unchanged_and_stays_close_to_torch(mode, tol, int8, int4, artifacts):
    from lisa_trt.engines.ort import load_ort_engines

    man = int8 if mode == "int8" else int4
    e = load_ort_engines(man.dir, threads=1)
    tgt, ref = e.target, artifacts["target"]
    cond = torch.tensor([3, 7])
    c_ort, c_ref = tgt.new_cache(2, extra=8), ref.new_cache(2, extra=8)
    ptrs = [t.data_ptr() for t in c_ort.k + c_ort.v]
    o, r = tgt.prefill(cond, c_ort, taps=True), ref.prefill(cond, c_ref, taps=True)
    scale = max(1.0, r.logits.abs().max().item())
    assert (o.logits - r.logits).abs().max().item() <= tol * scale
    tok = r.logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
    pos = c_ref.lengths[:, None].clone()
    slots = pos.clone()
    anc = torch.ones(2, 1, 1, dtype=torch.bool)
    o2 = tgt.forward_tokens(tok, pos, slots, c_ort.attention_mask(slots, anc), c_ort)
    L = c_ref.max_len
    r2 = ref.forward_tokens(tok, pos, slots, c_ref.attention_mask(slots, anc), c_ref)
    assert (o2.logits - r2.logits).abs().max().item() <= tol * max(1.0, r2.logits.abs().max().item())
    assert [t.data_ptr() for t in c_ort.k + c_ort.v] == ptrs  # KV cache still updated in place
    assert (c_ort.k[0][:, :, :L] - c_ref.k[0]).abs().max().item() <= tol
    assert not torch.equal(c_ort.k[1][:, :, int(slots[0, 0])], torch.zeros_like(c_ort.k[1][:, :, 0]))


def test_int8_greedy_tokens_mostly_agree_with_torch(int8, artifacts):
    from lisa_trt.engines.ort import load_ort_engines
    from lisa_trt.speculative.autoregressive import generate

    e = load_ort_engines(int8.dir, threads=1)
    cond = torch.tensor([1, 4])
    a = generate(e.target, cond, cfg_scale=2.0, greedy=True, generator=torch.Generator().manual_seed(3))
    b = generate(artifacts["target"], cond, cfg_scale=2.0, greedy=True, generator=torch.Generator().manual_seed(3))
    # greedy decoding diverges after the first flipped argmax; the prefix before it must be long
    first_diff = (a != b).float().argmax(-1)
    same = torch.where((a == b).all(-1), torch.full_like(first_diff, a.shape[1]), first_diff)
    assert same.float().mean().item() >= 0.25 * a.shape[1]


def test_tampered_quantized_graph_or_weights_are_refused(int4, tmp_path):
    from lisa_trt.export.manifest import read_manifest

    for victim in ("target_verify.onnx", int4.graphs["target_verify"].external_data):
        d = tmp_path / victim.replace(".", "_")
        shutil.copytree(int4.dir, d)
        data = bytearray((d / victim).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (d / victim).write_bytes(bytes(data))
        with pytest.raises(ArtifactMismatchError, match="sha256|differs"):
            read_manifest(d)


def test_bad_requests_are_refused(fp32_dir, tmp_path, artifacts):
    from lisa_trt.export.quantize import check_mode

    with pytest.raises(InputError, match="valid: none, int8, int4"):
        check_mode("int2")
    with pytest.raises(InputError, match="nothing to quantize"):
        quantize_graph(fp32_dir / "gasv.onnx", tmp_path / "g.onnx", "int8")
    d = tmp_path / "none"
    shutil.copytree(fp32_dir, d)
    assert quantize_bundle(d, "none", artifacts).quantization == "none"


def test_export_refuses_quantize_with_fp16_before_exporting(artifacts, tmp_path):
    from lisa_trt.export import export_bundle

    a = artifacts
    with pytest.raises(InputError, match="drop --fp16"):
        export_bundle(a["target"], a["drafter"], a["tables"], a["vq"], tmp_path / "x", fp16=True, quantize="int8")
    with pytest.raises(InputError, match="valid: none, int8, int4"):
        export_bundle(a["target"], a["drafter"], a["tables"], a["vq"], tmp_path / "x", quantize="fp4")
    assert not (tmp_path / "x").exists()


def test_int8_graphs_are_validated_for_every_x86_kind_and_old_bundles_warn_where_it_matters(int8, tmp_path,
                                                                                           monkeypatch):
    import json
    import warnings

    from lisa_trt.engines import ort as ort_mod
    from lisa_trt.engines.ort import load_ort_engines
    from lisa_trt.export import int8_isa

    for g in (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY, Graph.DRAFTER_PROJECT, Graph.DRAFTER_STEP):
        e = int8.graphs[g.value]
        assert e.quantization["reduce_range"] and e.quantization["bound"]["exact_on_every_x86"]
        assert set(e.validation["isa"]["covered"]) == {"vnni", "avx2"}
    # a bundle made before issue 23: no CPU-kind record, full-range weights unknown
    old = tmp_path / "old"
    shutil.copytree(int8.dir, old)
    mj = json.loads((old / "manifest.json").read_text())
    for g in mj["graphs"].values():
        if g.get("quantization"):
            g["quantization"].pop("bound", None)
            g["quantization"].pop("reduce_range", None)
            (g.get("validation") or {}).pop("isa", None)
    (old / "manifest.json").write_text(json.dumps(mj))
    for kind, warns in (("avx2", True), ("vnni", False)):
        monkeypatch.setattr(int8_isa, "cpu_kind", lambda: kind)
        ort_mod._WARNED.clear()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            load_ort_engines(old, threads=1)
            load_ort_engines(int8.dir, threads=1)  # validated for every kind: never warns
        got = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
        assert bool(got) == warns, (kind, got)
        if warns:
            assert len(got) == 1 and "target_verify" in got[0] and "Re-export" in got[0] and str(old) in got[0]


def test_quantize_a_graph_whose_fp32_weights_are_external_data(artifacts, tmp_path):
    """Large models export their weights as <graph>.onnx.data: quantizing them must work (the fp32
    graph is moved aside, not hard-linked: onnx refuses hard-linked external data)."""
    from lisa_trt.export import export_bundle

    out = tmp_path / "ext"
    export_bundle(artifacts["target"], None, None, None, out, max_tree=16, lint=False, validate=False,
                  progress=False, external_data=True)
    assert (out / "weights.onnx.data").is_file()  # the one shared weights file (export/weights.py)
    man = quantize_bundle(out, "int8", artifacts, external_bytes=0)
    for g in (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY):
        e = man.graphs[g.value]
        assert e.validation["ok"] and e.external_data and (out / e.external_data).is_file()
        assert op_counts(man.graph_path(g)).get("MatMulInteger")
    assert not list(out.glob("lisa-fp32-*"))  # the moved fp32 graphs are gone


def test_quantized_bundle_holds_its_weights_once_and_the_fp32_copy_is_opt_in(artifacts, tmp_path):
    """Issue 26: an int8 bundle is its quantized weights file (+ the fp32 GASV / VQ graphs' share), not
    also a second fp32 copy for the torch backend; that copy is `--torch-weights`, and without it the
    torch backend refuses the bundle naming the flag, while ONNX Runtime runs it."""
    from lisa_trt.engines.graph import load_engines
    from lisa_trt.export import export_bundle
    from lisa_trt.runtime.bundle import open_bundle

    a = artifacts
    kw = dict(max_tree=8, lint=False, validate=False, progress=False, quantize="int8")
    man = export_bundle(a["target"], a["drafter"], a["tables"], a["vq"], tmp_path / "q", **kw)
    assert not {"target_weights", "drafter_weights", "vq_weights"} & set(man.files)
    assert not any(p.name in ("target.safetensors", "drafter.safetensors", "vq.safetensors")
                   for p in (tmp_path / "q").rglob("*"))
    data = [p for p in (tmp_path / "q").iterdir() if p.name.endswith(".onnx.data")]
    assert [p.name for p in data] == [man.weights["file"]]  # one weights file for every graph
    with pytest.raises(InputError, match=r"an int8 bundle exported without `--torch-weights`.*--backend ort.*"
                                         r"--quantize int8 --torch-weights"):
        open_bundle(tmp_path / "q", "torch")
    with pytest.raises(InputError, match="--torch-weights"):
        load_engines(tmp_path / "q", "torch")
    load_engines(tmp_path / "q", "ort", threads=1).close()
    man_t = export_bundle(a["target"], a["drafter"], a["tables"], a["vq"], tmp_path / "t", torch_weights=True,
                               **kw)
    assert {"target_weights", "drafter_weights", "vq_weights"} <= set(man_t.files)
    b = open_bundle(tmp_path / "t", "torch")
    assert torch.equal(b.target.output.weight, a["target"].output.weight)
