"""Medusa heads in an engine bundle: `lisa-trt export --drafter HEADS` -> medusa_heads.onnx in the
manifest (arch medusa, hash, validation) -> `Pipeline.from_dir` / `lisa-trt run` / `lisa-trt bench`
decode through the same speculative loop with the tokens of the PyTorch path.

One export of a tiny random target (through the CLI, lint off), shared by the module.
"""

import json
import shutil

import pytest
import torch
from click.testing import CliRunner

from lisa_trt.calibration.profile import calibrate
from lisa_trt.calibration.tables import save_tables
from lisa_trt.cli import main
from lisa_trt.config import SamplingConfig
from lisa_trt.models.target_config import vq_config
from lisa_trt.errors import ArtifactMismatchError
from lisa_trt.export.manifest import Manifest, drafter_hash, read_manifest
from lisa_trt.models.checkpoints import save_model
from lisa_trt.models.medusa import MedusaHeads, save_medusa
from lisa_trt.families.llamagen.vq import VQModel
from lisa_trt.runtime.pipeline import Pipeline
from lisa_trt.testing import make_target

pytest.importorskip("onnxruntime")
torch.set_num_threads(1)


def _heads(target, seed: int):
    torch.manual_seed(seed)
    heads = MedusaHeads.from_target(target, n_heads=2).eval()
    with torch.no_grad():  # trained-looking heads: the residual blocks move the logits
        for blk in heads.blocks:
            blk.linear.weight.normal_(std=0.05)
    return heads


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    d = tmp_path_factory.mktemp("medusa_bundle")
    t = make_target(std=0.3)
    heads = _heads(t, 0)
    cfg = vq_config("VQ-16", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32, codebook_size=256)
    torch.manual_seed(0)
    vq = VQModel(cfg).eval()
    tables = calibrate(t, vq.codebook().detach(), num_rollouts=4, sampling=SamplingConfig(cfg_scale=2.0),
                       progress=False)
    save_model(t, t.config, d / "t.safetensors")
    save_model(vq, vq.config, d / "vq.safetensors")
    save_medusa(heads, d / "heads.safetensors")
    save_tables(tables, d / "tables.safetensors")
    return dict(dir=d, target=t, heads=heads, tables=tables, vq=vq)


@pytest.fixture(scope="module")
def bundle(parts):
    d = parts["dir"]
    with pytest.MonkeyPatch.context() as mp:  # polygraphy lint: seconds per graph, covered in tests/export
        mp.setattr("lisa_trt.export.validate.lint_graph", lambda *a, **k: {"status": "skipped"})
        res = CliRunner().invoke(main, ["export", "--model", str(d / "t.safetensors"), "--drafter",
                                        str(d / "heads.safetensors"), "--tables", str(d / "tables.safetensors"),
                                        "--vq", str(d / "vq.safetensors"), "--max-tree", "16", "--cfg-scale", "2",
                                        "--out", str(d / "eng")])
    assert res.exit_code == 0, res.output
    assert "medusa_heads" in res.output
    return d / "eng"


def test_export_records_the_medusa_heads_graph(parts, bundle):
    man = read_manifest(bundle)
    assert "medusa_heads" in man.graphs and "drafter_step" not in man.graphs and "drafter_project" not in man.graphs
    g = man.graphs["medusa_heads"]
    assert g.file == "medusa_heads.onnx" and g.precision == "fp32" and len(g.sha256) == 64
    assert g.validation["ok"] and g.validation["max_error"] < 1e-4
    assert man.drafter["arch"] == "medusa" and man.drafter_arch == "medusa"
    assert man.drafter["hash"] == drafter_hash(parts["heads"])
    assert man.medusa_config == parts["heads"].config and man.drafter_config is None
    assert man.files["drafter_weights"] == "weights/medusa.safetensors"


def test_manifest_without_arch_reads_as_an_eagle3_drafter(bundle):
    """Bundles written before Medusa bundles existed record no arch: they stay EAGLE-3 bundles."""
    from lisa_trt.models.drafter import DrafterConfig

    d = json.loads((bundle / "manifest.json").read_text())
    dcfg = DrafterConfig.for_target(Manifest.from_dict(d).target_config)
    d["drafter"] = {"hash": "0" * 16, "config": dcfg.to_dict()}
    old = Manifest.from_dict(d)
    assert old.drafter_arch == "eagle3" and old.drafter_config == dcfg and old.medusa_config is None


@pytest.mark.parametrize("backend", ["ort", "torch"])
@pytest.mark.parametrize("verify", ["exact", "lantern", "gasv"])
def test_bundle_decodes_the_tokens_of_the_pytorch_path(parts, bundle, backend, verify):
    from lisa_trt.engines.medusa_graph import GraphMedusaHeads

    man = read_manifest(bundle)
    ref = Pipeline.from_models(parts["target"], parts["heads"], parts["tables"], parts["vq"],
                               generation=man.generation)
    pipe = Pipeline.from_dir(bundle, backend=backend, threads=1)
    assert isinstance(pipe._e.drafter, GraphMedusaHeads if backend == "ort" else MedusaHeads)
    a = pipe.generate([1, 3], seed=5, verify=verify, decode=False)
    b = ref.generate([1, 3], seed=5, verify=verify, decode=False)
    assert torch.equal(a.tokens, b.tokens)
    assert [s["mal"] for s in a.stats] == pytest.approx([s["mal"] for s in b.stats])
    if verify == "gasv":  # the batched (serving) path too, and some drafts are accepted
        assert torch.equal(pipe.generate([1, 3], seed=5, verify=verify, batch=True, decode=False).tokens,
                           ref.generate([1, 3], seed=5, verify=verify, batch=True, decode=False).tokens)
        assert max(s["mal"] for s in a.stats) > 1.0
    pipe.close()


def test_every_graph_backend_loads_the_heads(parts, bundle):
    """load_engines(torch) runs the export wrapper over weights/medusa.safetensors: == ORT."""
    from lisa_trt.engines.graph import load_engines

    h, depth = torch.randn(2, 5, parts["target"].config.dim), torch.tensor([[0, 1, 2, 0, 1], [1, 0, 0, 2, 1]])
    want = parts["heads"].head_logits(h, depth)
    for backend in ("ort", "torch"):
        with load_engines(bundle, backend, drafter_hash=drafter_hash(parts["heads"])) as e:
            assert e.drafter.is_medusa and e.drafter.config == parts["heads"].config
            assert torch.allclose(e.drafter.head_logits(h, depth), want, atol=1e-5)
    with pytest.raises(ArtifactMismatchError, match="drafter hash"):
        load_engines(bundle, "ort", drafter_hash=drafter_hash(_heads(parts["target"], 1)))


def test_tampered_heads_are_refused(parts, bundle, tmp_path):
    import onnx
    from onnx import numpy_helper

    bad = tmp_path / "graph"
    shutil.copytree(bundle, bad)
    model = onnx.load(str(bad / "medusa_heads.onnx"))
    init = max(model.graph.initializer, key=lambda x: len(x.raw_data) or len(x.float_data))
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.01, init.name))
    onnx.save(model, str(bad / "medusa_heads.onnx"))
    with pytest.raises(ArtifactMismatchError, match="medusa_heads.onnx"):
        Pipeline.from_dir(bad, backend="ort")
    swapped = tmp_path / "weights"  # other heads for the same target in weights/: the torch backend refuses
    shutil.copytree(bundle, swapped)
    save_medusa(_heads(parts["target"], 1), swapped / "weights" / "medusa.safetensors")
    with pytest.raises(ArtifactMismatchError, match="not the Medusa heads"):
        Pipeline.from_dir(swapped, backend="torch")


def test_run_cli_writes_images(bundle, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("1\n3\n")
    res = CliRunner().invoke(main, ["run", str(bundle), str(prompts), "--out", str(tmp_path / "o"),
                                    "--backend", "ort", "--verify", "exact", "--threads", "1"])
    assert res.exit_code == 0, res.output
    stats = json.loads((tmp_path / "o" / "stats.json").read_text())
    assert stats["backend"] == "ort" and len(stats["images"]) == 2
    assert len(list((tmp_path / "o").glob("*.png"))) == 2


def test_bench_on_the_bundle_matches_torch(parts, bundle, tmp_path):
    d = parts["dir"]
    common = ["bench", "--model", str(d / "t.safetensors"), "--drafter", str(d / "heads.safetensors"), "--tables",
              str(d / "tables.safetensors"), "--methods", "exact,gasv", "--num-images", "2", "--cfg-scale", "2",
              "--tree-top-k", "2", "--tree-depth", "2", "--tree-tokens", "6"]
    reps = {}
    for backend in ("torch", "ort"):
        res = CliRunner().invoke(main, common + ["--backend", backend, "--engine-dir", str(bundle),
                                                 "--json", str(tmp_path / f"{backend}.json")])
        assert res.exit_code == 0, res.output
        reps[backend] = json.loads((tmp_path / f"{backend}.json").read_text())
    for m in ("exact", "gasv"):
        assert reps["ort"]["results"][m]["mal"] == pytest.approx(reps["torch"]["results"][m]["mal"])


def test_tensorrt_path_checks_the_heads_graph_like_the_others(bundle):
    """No TensorRT here: the CPU compatibility check and the build plan cover medusa_heads."""
    from lisa_trt.deploy.trt_lint import check_trt_compat

    rep = check_trt_compat(bundle)
    assert "medusa_heads" in rep.summary()
    res = CliRunner().invoke(main, ["build", str(bundle), "--dry-run", "--json", "-"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)["graphs"]["medusa_heads"]
    assert plan["onnx"] == "medusa_heads.onnx" and plan["profiles"]
    assert all(set(p["shapes"]) == {"hidden", "depth"} for p in plan["profiles"])


@pytest.mark.slow
def test_demo_medusa_bundle_end_to_end(tmp_path):
    """The bundled demo-medusa-lisa: `lisa-trt export --model demo --drafter demo-medusa-lisa`, then
    `lisa-trt run` through ORT; exact verification gives the PyTorch path's tokens (~1.5 min)."""
    from lisa_trt.artifacts import default_tables, load_drafter_by_name, load_tables_by_name
    from lisa_trt.demo.registry import assets_present, load_demo_target
    from lisa_trt.models.artifact_sets import bundled_file

    path = bundled_file("demo-medusa-lisa", "drafters") if assets_present() else None
    if path is None or not path.is_file():
        pytest.skip("demo assets not present")
    out = tmp_path / "eng"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("lisa_trt.export.validate.lint_graph", lambda *a, **k: {"status": "skipped"})
        res = CliRunner().invoke(main, ["export", "--model", "demo", "--drafter", "demo-medusa-lisa", "--out", str(out)])
    assert res.exit_code == 0, res.output
    man = read_manifest(out)
    assert man.drafter_arch == "medusa" and man.medusa_config.n_heads == 4 and man.graphs["medusa_heads"].validation["ok"]
    prompts = tmp_path / "p.txt"
    prompts.write_text("cat\n")
    tree = ["--tree-top-k", "3", "--tree-depth", "3", "--tree-tokens", "10"]
    res = CliRunner().invoke(main, ["run", str(out), str(prompts), "--out", str(tmp_path / "o"), "--backend", "ort",
                                    "--verify", "exact", "--threads", "1", *tree])
    assert res.exit_code == 0, res.output
    assert len(list((tmp_path / "o").glob("*.png"))) == 1
    target = load_demo_target()
    ref = Pipeline.from_models(target, load_drafter_by_name("demo-medusa-lisa", target),
                               load_tables_by_name(default_tables("demo"), target), None,
                               generation=man.generation, class_names=man.generation["class_names"])
    kw = dict(seed=0, verify="exact", decode=False, tree_top_k=3, tree_depth=3, tree_tokens=10)
    a = Pipeline.from_dir(out, backend="ort", threads=1).generate(["cat"], **kw)
    b = ref.generate(["cat"], **kw)
    assert torch.equal(a.tokens, b.tokens) and a.stats[0]["mal"] > 1.0
