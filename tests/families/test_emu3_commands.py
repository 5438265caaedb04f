"""The lisa-trt commands on a tiny Emu3 checkpoint (tokenizer.json included): train (EAGLE-3),
calibrate, export, run on ONNX Runtime, bench with ZipAR and GASV; each step consumes the last
one's artifact."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("onnxruntime")

from emu3_fixtures import cli, save_model_dir, save_tokenizer  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("emu3cmd")
    _, d = save_model_dir(root / "m", seed=0)
    save_tokenizer(d)
    cli("train", "--model", d, "--vq", d, "--out", root / "train", "--loss", "eagle3", "--steps", 2,
        "--batch-size", 2, "--num-samples", 4, "--image-size", 8, "--cfg-scale", 3)
    cli("calibrate", "--model", d, "--vq", d, "--out", root / "tables.safetensors", "--rollouts", 2,
        "--image-size", 8, "--cfg-scale", 3)
    cli("export", "--model", d, "--drafter", root / "train" / "drafter.safetensors", "--tables",
        root / "tables.safetensors", "--vq", d, "--out", root / "eng", "--image-size", 8, "--max-prompt", 64,
        "--max-tree", 8, "--no-validate")
    return root, d


def test_train_calibrate_export_write_their_artifacts(run):
    root, _ = run
    assert (root / "train" / "drafter.safetensors").is_file() and (root / "tables.safetensors").is_file()
    man = json.loads((root / "eng" / "manifest.json").read_text())
    assert man["family"] == "emu3" and {"gasv", "vq_decode", "drafter_step"} <= set(man["graphs"])
    assert (root / "eng" / "tokenizer.json").is_file()


def test_run_on_ort_writes_images(run, tmp_path):
    root, _ = run
    caps = tmp_path / "captions.txt"
    caps.write_text("red fox\na fox\n")
    out = cli("run", root / "eng", caps, "--backend", "ort", "--verify", "gasv", "--cfg-scale", 3, "--threads", 1,
              "--out", tmp_path / "out")
    assert "2 images" in out and "gasv" in out, out
    assert len(list((tmp_path / "out").glob("img_*.png"))) == 2


def test_bench_with_zipar_and_gasv(run, tmp_path):
    root, d = run
    out = cli("bench", "--model", d, "--drafter", root / "train" / "drafter.safetensors", "--tables",
              root / "tables.safetensors", "--methods", "vanilla,greedy,gasv,zipar", "--num-images", 1,
              "--image-size", 8, "--cfg-scale", 3, "--zipar-window", 1, "--json", tmp_path / "bench.json")
    res = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert {"vanilla", "greedy", "gasv", "zipar"} <= set(res), out
    n = res["vanilla"]["target_forwards_per_image"]
    assert n == 4 * 5 + 3 and res["zipar"]["target_forwards_per_image"] < n  # ZipAR decodes rows in parallel
