"""t2i end to end on a tiny random target + tiny random T5 (saved locally, no downloads):
encode captions -> train a drafter (and resume) -> calibrate -> export -> run with every
verification rule through ONNX Runtime from caption strings -> images; plus bench --captions."""

import json

import pytest
import torch
from click.testing import CliRunner

pytest.importorskip("transformers")

from lisa_trt.cli import main  # noqa: E402
from lisa_trt.models.target_config import vq_config  # noqa: E402
from lisa_trt.models.checkpoints import save_model  # noqa: E402
from lisa_trt.families.llamagen.vq import VQModel  # noqa: E402
from lisa_trt.testing import make_target  # noqa: E402
from lisa_trt.families.llamagen.tiny_t5 import make_tiny_t5  # noqa: E402

CAPTIONS = ["a photo of a red car", "a small dog on the street", "blue sky over the sea",
            "a painting of an old house", "a big tree in the city at night", "a white bird"]
RULES = ["vanilla", "greedy", "exact", "lantern", "gasv", "sjd"]


def _ok(res):
    assert res.exit_code == 0, res.output
    return res


@pytest.fixture(scope="module")
def t2i(tmp_path_factory):
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("t2i")
    make_tiny_t5(d / "t5", d_model=12)
    m = make_target("t2i", std=0.3)  # 6 caption slots, 12-wide features
    save_model(m, m.config, d / "t.safetensors")
    cfg = vq_config("VQ-16", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32, codebook_size=256)
    torch.manual_seed(0)
    save_model(VQModel(cfg), cfg, d / "vq.safetensors")
    (d / "captions.txt").write_text("\n".join(CAPTIONS) + "\n")
    return d


@pytest.mark.slow
def test_t2i_end_to_end(t2i, monkeypatch, check_mal, check_run_stats):
    import lisa_trt.train.trainer as T

    d, r = t2i, CliRunner()
    common = ["--model", str(d / "t.safetensors")]
    _ok(r.invoke(main, ["encode-captions", str(d / "captions.txt"), "--encoder", str(d / "t5"), "--max-length", "6",
                        "--out", str(d / "feats.safetensors")]))
    train = ["train", *common, "--vq", str(d / "vq.safetensors"), "--out", str(d / "run"), "--batch-size", "4",
             "--num-samples", "8", "--ttt-steps", "2", "--eval-images", "2", "--cfg-scale", "3",
             "--captions", str(d / "captions.txt"), "--encoder", str(d / "t5")]
    train += ["--steps", "3", "--checkpoint-every", "1"]

    def kill(step):
        if step >= 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(T, "_after_step", kill)
    assert r.invoke(main, train).exit_code != 0  # killed after 2 of 3 steps
    assert not (d / "run" / "drafter.safetensors").exists()
    assert json.loads((d / "run" / "checkpoints" / "latest.json").read_text())["step"] == 2
    data_mtime = (d / "run" / "data" / "selfdistill.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(T, "_after_step", lambda step: None)
    _ok(r.invoke(main, train))  # resumes from the step-2 checkpoint, same self-distilled data
    assert (d / "run" / "data" / "selfdistill.safetensors").stat().st_mtime_ns == data_mtime
    steps = [json.loads(ln)["step"] for ln in (d / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [3], steps
    ev = json.loads((d / "run" / "eval_decode.json").read_text())
    assert ev["images"] == 2
    check_mal(ev["mal"], ev["target_forwards"], 16, rows=2)  # the held-out decode's own MAL (16 tokens per image)
    _ok(r.invoke(main, ["calibrate", *common, "--vq", str(d / "vq.safetensors"), "--out", str(d / "tables.safetensors"),
                        "--rollouts", "4", "--cfg-scale", "3", "--captions", str(d / "feats.safetensors")]))
    _ok(r.invoke(main, ["export", *common, "--drafter", str(d / "run" / "drafter.safetensors"),
                        "--tables", str(d / "tables.safetensors"), "--vq", str(d / "vq.safetensors"),
                        "--out", str(d / "engines"), "--cfg-scale", "3"]))
    prompts = d / "prompts.txt"
    prompts.write_text("a red car on the street\nan old house at night\n")
    # captions without an encoder, or an empty line: refused before any engine loads
    from lisa_trt.runtime.pipeline import Pipeline

    monkeypatch.delenv("LISA_TRT_TEXT_ENCODER", raising=False)
    with monkeypatch.context() as mp:
        mp.setattr(Pipeline, "from_dir", classmethod(lambda *a, **k: pytest.fail("engines loaded")))
        res = r.invoke(main, ["run", str(d / "engines"), str(prompts), "--backend", "ort"])
        assert res.exit_code == 2 and "--encoder" in res.output and "Traceback" not in res.output
        (d / "gap.txt").write_text("a red car\n\nblue sky\n")
        res = r.invoke(main, ["run", str(d / "engines"), str(d / "gap.txt"), "--encoder", str(d / "t5")])
        assert res.exit_code == 2 and "line(s) 2" in res.output
    for rule in RULES:
        out = d / f"out_{rule}"
        _ok(r.invoke(main, ["run", str(d / "engines"), str(prompts), "--backend", "ort", "--verify", rule,
                            "--encoder", str(d / "t5"), "--out", str(out), "--tree-top-k", "3", "--tree-depth", "2",
                            "--tree-tokens", "8"]))
        st = json.loads((out / "stats.json").read_text())
        assert st["backend"] == "ort" and len(st["images"]) == 2
        assert st["images"][0]["caption"] == "a red car on the street"
        check_run_stats(st, 16)  # each image's MAL and forwards are its decode's
        assert len(list(out.glob("*.png"))) == 2
    # bench: prompts cycled, seeds fixed, MAL / TVD / speed for every rule
    _ok(r.invoke(main, ["bench", *common, "--drafter", str(d / "run" / "drafter.safetensors"),
                        "--tables", str(d / "tables.safetensors"), "--methods", ",".join(RULES), "--num-images", "3",
                        "--captions", str(d / "captions.txt"), "--encoder", str(d / "t5"), "--cfg-scale", "3",
                        "--tree-top-k", "3", "--tree-depth", "2", "--tree-tokens", "8", "--json", str(d / "b.json")]))
    rep = json.loads((d / "b.json").read_text())
    assert set(rep["results"]) == set(RULES) and rep["settings"]["captions"] == CAPTIONS[:3]
    for m, v in rep["results"].items():
        for key in ("mal", "seconds_per_image", "speedup", "mean_tvd"):
            assert isinstance(v[key], float), (m, key)
    # the same through the exported ORT graphs
    _ok(r.invoke(main, ["bench", *common, "--drafter", str(d / "run" / "drafter.safetensors"),
                        "--tables", str(d / "tables.safetensors"), "--methods", "vanilla,gasv", "--num-images", "1",
                        "--captions", str(d / "feats.safetensors"), "--cfg-scale", "3", "--backend", "ort",
                        "--engine-dir", str(d / "engines"), "--tree-top-k", "3", "--tree-depth", "2",
                        "--tree-tokens", "8", "--json", str(d / "b_ort.json")]))
    res = json.loads((d / "b_ort.json").read_text())["results"]
    # one image per decode: GASV's MAL is the plain loop's steps over its own (the forwards the bench counted)
    assert res["gasv"]["mal"] == pytest.approx((res["vanilla"]["target_forwards_per_image"] - 1)
                                               / (res["gasv"]["target_forwards_per_image"] - 1))
    # generate: caption strings straight from a text file, images out
    _ok(r.invoke(main, ["generate", *common, "--captions", str(prompts), "--encoder", str(d / "t5"), "--verify", "gasv",
                        "--drafter", str(d / "run" / "drafter.safetensors"), "--tables", str(d / "tables.safetensors"),
                        "--cfg-scale", "3", "--vq", str(d / "vq.safetensors"), "--out", str(d / "gen")]))
    assert len(list((d / "gen").glob("*.png"))) == 2


def test_caption_errors_before_any_work(t2i, tmp_path, monkeypatch):
    monkeypatch.delenv("LISA_TRT_TEXT_ENCODER", raising=False)
    d, r = t2i, CliRunner()
    (tmp_path / "empty.txt").write_text("a red car\n\na dog\n")
    res = r.invoke(main, ["encode-captions", str(tmp_path / "empty.txt"), "--encoder", str(d / "t5"),
                          "--out", str(tmp_path / "f.safetensors")])
    assert res.exit_code == 2 and "line(s) 2" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "f.safetensors").exists()
    res = r.invoke(main, ["encode-captions", str(d / "captions.txt"), "--encoder", str(tmp_path / "nope"),
                          "--out", str(tmp_path / "f.safetensors")])
    assert res.exit_code == 2 and "encoder directory not found" in res.output
    res = r.invoke(main, ["train", "--model", str(d / "t.safetensors"), "--vq", str(d / "vq.safetensors"),
                          "--out", str(tmp_path / "run"), "--captions", str(d / "captions.txt")])
    assert res.exit_code == 2 and "--encoder" in res.output
    assert not (tmp_path / "run" / "data" / "selfdistill.safetensors").exists()
