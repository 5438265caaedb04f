"""An Emu3 deployment through the generic exporter and engines: fp32 / fp16 / int8 bundles
validated against the torch model, ONNX Runtime engines decoding exactly as torch (CFG's
transformers fallback included), tree speculation and ZipAR over the engines, and the TensorRT
dry run (compatibility check, profiles, plan) of the bundle."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from emu3_fixtures import image_prompt, save_model_dir  # noqa: E402

import lisa_trt  # noqa: E402
from lisa_trt.config import SamplingConfig  # noqa: E402
from lisa_trt.models.family import family_of  # noqa: E402
from lisa_trt.speculative.methods import SpecConfig  # noqa: E402
from lisa_trt.speculative.run import run_method  # noqa: E402
from lisa_trt.speculative.methods import get_method

pytestmark = pytest.mark.slow
SIZE, GRID = 8, 4  # the tiny VQ: 2 px per code


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from lisa_trt.models.drafter import Drafter

    root = tmp_path_factory.mktemp("emu3x")
    _, path = save_model_dir(root / "m", seed=0)
    target, vq = lisa_trt.load_target(path), lisa_trt.load_vq(path)
    torch.manual_seed(0)
    drafter = Drafter.from_target(target).eval()
    return root, path, target, vq, drafter


def _export(models, name, **kw):
    from lisa_trt.export.bundle import export_bundle

    root, path, target, vq, drafter = models
    return export_bundle(target, drafter, None, vq, root / name, source=path, image_size=SIZE, max_prompt=16,
                         max_tree=8, lint=False, progress=False, **kw)


@pytest.fixture(scope="module")
def fp32(models):
    return _export(models, "fp32")


def _prompts():
    return torch.tensor([image_prompt([40, 41, 42], GRID, GRID), image_prompt([43, 44, 45], GRID, GRID)])


def test_fp32_bundle_decodes_on_ort_exactly_as_torch(fp32, models, check_stats):
    from lisa_trt.engines.graph import load_engines

    _, _, target, vq, drafter = models
    assert fp32.family == "emu3" and all(g.validation["ok"] for g in fp32.graphs.values())
    eng = load_engines(fp32.dir, backend="ort")
    ids = _prompts()
    ref = lisa_trt.generate(target, ids, cfg_scale=3.0, greedy=True)  # the fallback CFG rows
    assert torch.equal(lisa_trt.generate(eng.target, ids, cfg_scale=3.0, greedy=True), ref)
    codes = family_of(target.config).tokens_to_codes(target, ref, None)
    torch.testing.assert_close(eng.vq.decode_code(codes), vq.decode_code(codes), atol=1e-4, rtol=0)
    cond, _, layout = family_of(target.config).generation_inputs(eng.target, ids)
    s = SamplingConfig(cfg_scale=3.0, greedy=True)
    tree, st = run_method(get_method("greedy"), eng.target, eng.drafter, None, cond, sampling=s,
                          spec=SpecConfig.make("greedy", top_k=2, depth=2, total_tokens=6), seed=0, layout=layout)
    assert torch.equal(tree, ref)  # lossless speculation on ORT
    check_stats(st, tree)  # its counts add up (forced tokens included)
    zip_, zs = run_method(get_method("zipar"), eng.target, None, None, cond, sampling=s, spec=SpecConfig.make("gasv", zipar_window=1),
                          seed=0, layout=layout)
    assert zs.target_forwards < layout.n_tokens and torch.equal(zip_[:, layout.forced >= 0], ref[:, layout.forced >= 0])


def test_build_dry_run_checks_and_plans_every_graph(fp32):
    from lisa_trt.deploy import build as B

    rec = B.build_engines(fp32.dir, dry_run=True, max_batch=2, progress=False)
    assert rec["dry_run"] and {"target_verify", "drafter_step", "vq_decode"} <= set(rec["graphs"])
    (v,) = rec["graphs"]["vq_decode"]["profiles"]
    assert v["shapes"]["image_tokens"][2][1:] == [GRID, GRID]


@pytest.mark.parametrize("name,kw", [("fp16", {"fp16": True}), ("int8", {"quantize": "int8"})])
def test_fp16_and_int8_bundles_are_validated(models, name, kw):
    man = _export(models, name, **kw)
    assert man.family == "emu3" and all(g.validation["ok"] for g in man.graphs.values()), \
        {n: g.validation for n, g in man.graphs.items()}
