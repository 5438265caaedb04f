"""End-to-end CLI on a tiny random model: train (2 steps) -> calibrate -> generate -> bench."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from lisa_trt.cli import main
from lisa_trt.models.target_config import vq_config
from lisa_trt.models.checkpoints import save_model
from lisa_trt.families.llamagen.vq import VQModel
from lisa_trt.testing import make_target


@pytest.fixture(scope="module")
def files(tmp_path_factory, check_mal):
    d = tmp_path_factory.mktemp("pipe")
    m = make_target(std=0.3)
    save_model(m, m.config, d / "t.safetensors")
    cfg = vq_config("VQ-16", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32,
                    codebook_size=256)
    torch.manual_seed(0)
    save_model(VQModel(cfg), cfg, d / "vq.safetensors")
    r = CliRunner()
    res = r.invoke(main, ["train", "--model", str(d / "t.safetensors"), "--vq", str(d / "vq.safetensors"),
                          "--out", str(d / "run"), "--steps", "2", "--batch-size", "4", "--num-samples", "8",
                          "--ttt-steps", "2", "--eval-images", "2"])
    assert res.exit_code == 0, res.output
    ev = json.loads((d / "run" / "eval_decode.json").read_text())
    assert ev["images"] == 2
    check_mal(ev["mal"], ev["target_forwards"], m.config.block_size, rows=2)  # the held-out decode's own MAL
    res = r.invoke(main, ["calibrate", "--model", str(d / "t.safetensors"), "--vq", str(d / "vq.safetensors"),
                          "--out", str(d / "tables.safetensors"), "--rollouts", "4", "--cfg-scale", "2"])
    assert res.exit_code == 0, res.output
    return d


def test_generate_with_each_rule(files, check_mal):
    r = CliRunner()
    for verify in ["greedy", "exact", "lantern", "gasv", "sjd", "coupled", "sjd-gasv"]:  # + LISA's drafter / tables
        # combined with the Jacobi family (issue 27)
        out = files / f"g_{verify}"
        res = r.invoke(main, ["generate", "--model", str(files / "t.safetensors"), "--drafter",
                              str(files / "run" / "drafter.safetensors"), "--tables", str(files / "tables.safetensors"),
                              "--verify", verify, "--classes", "1,2", "--cfg-scale", "2", "--tree-top-k", "3",
                              "--tree-depth", "2", "--tree-tokens", "8", "--vq", str(files / "vq.safetensors"),
                              "--out", str(out)])
        assert res.exit_code == 0, (verify, res.output)
        stats = json.loads((out / "stats.json").read_text())
        assert stats["verify"] == verify
        n = np.load(out / "tokens.npy").shape[1]
        check_mal(stats["mal"], stats["target_forwards"], n, rows=2)  # the batch decode's own MAL
        assert len(list(out.glob("*.png"))) == 2


def test_bench_json_schema_and_plot(files):
    r = CliRunner()
    res = r.invoke(main, ["bench", "--model", str(files / "t.safetensors"), "--drafter",
                          str(files / "run" / "drafter.safetensors"), "--tables", str(files / "tables.safetensors"),
                          "--methods", "vanilla,exact,lantern,gasv,sjd", "--num-images", "2", "--cfg-scale", "2",
                          "--tree-top-k", "3", "--tree-depth", "2", "--tree-tokens", "8",
                          "--json", str(files / "b.json"), "--plot", str(files / "b.png")])
    assert res.exit_code == 0, res.output
    rep = json.loads((files / "b.json").read_text())
    assert set(rep["results"]) == {"vanilla", "exact", "lantern", "gasv", "sjd"}
    for m, v in rep["results"].items():
        for key in ("mal", "seconds_per_image", "speedup", "mean_tvd"):
            assert isinstance(v[key], float), (m, key)
    assert rep["results"]["vanilla"]["speedup"] == 1.0 and rep["settings"]["num_images"] == 2
    assert (files / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_sweep_and_knobs(files):
    """--sweep grids become labelled points; the lossless GASV point reproduces exact; the knobs
    reach the rule (kappa up / lambda down -> MAL and TVD up)."""
    r = CliRunner()
    res = r.invoke(main, ["bench", "--model", str(files / "t.safetensors"), "--drafter",
                          str(files / "run" / "drafter.safetensors"), "--tables", str(files / "tables.safetensors"),
                          "--methods", "exact", "--num-images", "3", "--cfg-scale", "2", "--tree-top-k", "3",
                          "--tree-depth", "2", "--tree-tokens", "8", "--neighbours", "12",
                          "--sweep", "gasv:kappa=0,4;lambda=1,0.05", "--sweep", "lantern:delta=0.2;gamma=0,1",
                          "--json", str(files / "s.json"), "--plot", str(files / "s.png")])
    assert res.exit_code == 0, res.output
    rep = json.loads((files / "s.json").read_text())["results"]
    assert set(rep) == {"vanilla", "exact", "gasv[kappa=0,lambda=1]", "gasv[kappa=0,lambda=0.05]",
                        "gasv[kappa=4,lambda=1]", "gasv[kappa=4,lambda=0.05]", "lantern[delta=0.2,gamma=0]",
                        "lantern[delta=0.2,gamma=1]"}
    lossless, loose = rep["gasv[kappa=0,lambda=1]"], rep["gasv[kappa=4,lambda=0.05]"]
    assert lossless["mal"] == rep["exact"]["mal"] and lossless["mean_tvd"] < 1e-5
    assert loose["mal"] > lossless["mal"] and loose["mean_tvd"] > 0.01
    assert loose["knobs"] == {"gasv_kappa": 4, "gasv_lambda": 0.05} and loose["method"] == "gasv"
    assert rep["lantern[delta=0.2,gamma=1]"]["knobs"] == {"lantern_delta": 0.2, "lantern_gamma": 1}
    assert (files / "s.png").read_bytes()[:4] == b"\x89PNG"
    res = r.invoke(main, ["bench", "--model", str(files / "t.safetensors"), "--methods", "exact",
                          "--sweep", "gasv:sigma=1", "--json", str(files / "x.json")])
    assert res.exit_code == 2 and "unknown sweep knob" in res.output


def test_mismatched_tables_and_drafter_refused(files, tmp_path):
    other = make_target(std=0.3, seed=5)
    save_model(other, other.config, tmp_path / "o.safetensors")
    r = CliRunner()
    res = r.invoke(main, ["generate", "--model", str(tmp_path / "o.safetensors"), "--drafter",
                          str(files / "run" / "drafter.safetensors"), "--verify", "exact", "--classes", "1"])
    assert res.exit_code == 2 and "target" in res.output and "Traceback" not in res.output
    from lisa_trt.models.drafter import Drafter

    Drafter.from_target(other).save(tmp_path / "d.safetensors")
    res = r.invoke(main, ["generate", "--model", str(tmp_path / "o.safetensors"), "--drafter",
                          str(tmp_path / "d.safetensors"), "--tables", str(files / "tables.safetensors"),
                          "--verify", "gasv", "--classes", "1"])
    assert res.exit_code == 2 and "calibrate" in res.output


def test_train_from_an_image_folder(files, tmp_path):
    import numpy as np
    from PIL import Image

    for c in ("0", "3"):
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(20):  # > eval_samples (32) sequences in all
            arr = (np.random.default_rng(i + int(c)).random((10, 12, 3)) * 255).astype("uint8")
            Image.fromarray(arr).save(tmp_path / "imgs" / c / f"{i}.png")
    r = CliRunner()
    res = r.invoke(main, ["train", "--model", str(files / "t.safetensors"), "--vq", str(files / "vq.safetensors"),
                          "--out", str(tmp_path / "run"), "--data", "images", "--image-dir", str(tmp_path / "imgs"),
                          "--steps", "2", "--batch-size", "2", "--ttt-steps", "2", "--eval-images", "0"])
    assert res.exit_code == 0, res.output
    from lisa_trt.io import load_safetensors

    t, _ = load_safetensors(tmp_path / "run" / "image_tokens.safetensors")
    assert t["tokens"].shape == (40, 16) and sorted(set(t["classes"].tolist())) == [0, 3]
    res = r.invoke(main, ["train", "--model", str(files / "t.safetensors"), "--vq", str(files / "vq.safetensors"),
                          "--out", str(tmp_path / "run2"), "--data", "images", "--image-dir", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "sub-folder" in res.output
