"""Issue 52 item 11: `train` on a finished run does not repeat its evaluation (the recorded
eval.json / eval_decode.json are reported), and `train` samples its self-distillation data at
the deployment's temperature / top-k / top-p (not only --cfg-scale)."""

import json

import pytest

from lisa_trt.train import DataConfig, TrainConfig, train_drafter
from lisa_trt.train import trainer as T


def _cfg(**kw):
    data = DataConfig(num_samples=8, eval_samples=2, gen_batch=8, cfg_scale=2.0)
    return TrainConfig(steps=2, batch_size=4, ttt_steps=2, warmup_steps=1, checkpoint_every=1, log_every=1, data=data,
                       **kw)


def test_a_finished_run_keeps_its_recorded_evaluation(tmp_path, target, codebook, monkeypatch, capsys):
    first = train_drafter(target, codebook, _cfg(), tmp_path / "run", progress=False)
    drafter = (tmp_path / "run" / "drafter.safetensors").read_bytes()

    def no_eval(run):
        raise AssertionError("the finished run's evaluation ran again")

    monkeypatch.setattr(T, "_held_out", no_eval)
    again = train_drafter(target, codebook, _cfg(), tmp_path / "run", progress=False)
    assert again["eval"] == json.loads(json.dumps(first["eval"]))
    assert "its recorded evaluation (eval.json) is not repeated" in capsys.readouterr().err
    assert (tmp_path / "run" / "drafter.safetensors").read_bytes() == drafter


def test_the_held_out_decoding_of_a_finished_run_is_not_repeated(tmp_path, monkeypatch):
    from lisa_trt.runtime.commands.train import _held_out_decoding

    (tmp_path / "eval_decode.json").write_text(json.dumps({"mal": 2.5, "images": 4}))
    monkeypatch.setattr("lisa_trt.train.evaluate.decode_eval",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("decoded again")))
    monkeypatch.setattr("lisa_trt.artifacts.load_drafter_by_name", lambda *a, **k: None)
    said = []
    _held_out_decoding(None, {}, None, tmp_path, 4, said.append, finished=True)
    assert said == ["held-out decoding (4 images, exact verification, recorded): MAL 2.500"]
    with pytest.raises(AssertionError, match="decoded again"):  # another count of images: decoded
        _held_out_decoding(None, {"drafter": "x"}, None, tmp_path, 2, said.append, finished=True)


def test_train_samples_its_data_at_the_deployments_law(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from lisa_trt.cli import main

    seen = {}

    def fake(target, codebook, cfg, out_dir, **kw):
        seen["data"] = cfg.data
        return {"drafter": str(tmp_path / "drafter.safetensors"), "eval": {}}

    monkeypatch.setattr("lisa_trt.train.trainer.train_drafter", fake)
    r = CliRunner().invoke(main, ["train", "--model", "demo", "--out", str(tmp_path / "run"), "--steps", "2",
                                  "--eval-images", "0", "--cfg-scale", "2", "--temperature", "1.3", "--top-k", "40",
                                  "--top-p", "0.9"])
    assert r.exit_code == 0, r.output
    d = seen["data"]
    assert (d.cfg_scale, d.temperature, d.top_k, d.top_p) == (2.0, 1.3, 40, 0.9)
    r = CliRunner().invoke(main, ["train", "--model", "demo", "--out", str(tmp_path / "r2"), "--steps", "2",
                                  "--eval-images", "0"])
    assert r.exit_code == 0, r.output
    d, base = seen["data"], DataConfig()
    assert (d.temperature, d.top_k, d.top_p) == (base.temperature, base.top_k, base.top_p)  # not given: as before
    r = CliRunner().invoke(main, ["train", "--model", "demo", "--out", str(tmp_path / "r3"), "--top-p", "2"])
    assert r.exit_code == 2 and "--top-p" in r.output
