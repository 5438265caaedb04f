"""Issue 52 item 11: an interrupted `lisa-trt run` keeps the images it finished (each written as
it finishes) and `--resume` decodes only the rest, giving the images the uninterrupted run gives;
a resume of another run is refused naming what differs."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lisa_trt.errors import InputError
from lisa_trt.runtime.commands.run import _decode_each, _seeded
from lisa_trt.runtime.prompts import Prompt
from lisa_trt.runtime.run_progress import RunProgress, run_key


@pytest.fixture(scope="module")
def pipe():
    import lisa_trt
    from lisa_trt.families.llamagen.vq import VQModel
    from lisa_trt.models.target_config import vq_config
    from lisa_trt.testing import make_target

    torch.manual_seed(0)
    cfg = vq_config("VQ-16", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32, codebook_size=256)
    return lisa_trt.Pipeline.from_models(make_target(std=0.3), vq=VQModel(cfg).eval(),
                                         class_names=[f"c{i}" for i in range(10)])


class _Interrupting:
    """The pipeline, with Ctrl-C arriving during the `after`-th decode."""

    def __init__(self, pipe, after):
        self.pipe, self.after, self.calls = pipe, after, 0

    def generate(self, *a, **kw):
        self.calls += 1
        if self.calls == self.after:
            raise KeyboardInterrupt
        return self.pipe.generate(*a, **kw)


def _rc(seed=5):
    return SimpleNamespace(seed=seed)  # what the test reads of the run's RunContext


def _prompts(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("1\n2\n3\n")
    return f, [Prompt(1, class_id=1), Prompt(2, class_id=2), Prompt(3, class_id=3, seed=40)]


def test_an_interrupted_run_keeps_its_images_and_resume_finishes_it(pipe, tmp_path, capsys):
    f, raw = _prompts(tmp_path)
    rc, out = _rc(), tmp_path / "out"
    key = run_key(tmp_path, f, rc.seed, {"verify": "vanilla"})
    ps = _seeded(raw, rc.seed)
    assert [p.seed for p in ps] == [5, 6, 40]  # base + index, a prompt's own seed wins
    prog = RunProgress(out, key, resume=False, overwrite=False)
    plan = pipe.plan("vanilla", seed=rc.seed)  # the run's one plan (RunContext.settle)
    with pytest.raises(KeyboardInterrupt):
        _decode_each(_Interrupting(pipe, 2), ps, [0, 1, 2], prog, plan, None, print, out)
    assert "interrupted: 1 of 3 images kept" in capsys.readouterr().err
    assert [p.name for p in out.glob("*.png")] == ["img_0000_line1.png"]  # written as it finished
    with pytest.raises(InputError, match="not empty"):  # not resumed: OUT is refused as before
        RunProgress(out, key, resume=False, overwrite=False)
    again = RunProgress(out, key, resume=True, overwrite=False)
    assert again.done == {0}
    counting = _Interrupting(pipe, 0)
    _decode_each(counting, ps, [1, 2], again, plan, None, print, out)
    assert counting.calls == 2  # only the two missing images were decoded
    again.finish(3, {"verify": "vanilla"})
    stats = json.loads((out / "stats.json").read_text())
    assert [s["seed"] for s in stats["images"]] == [5, 6, 40] and not (out / ".partial").exists()
    whole = pipe.generate(raw, seed=rc.seed, verify="vanilla")  # the uninterrupted run, one request
    assert np.array_equal(np.load(out / "tokens.npy"), whole.tokens.cpu().numpy())
    assert len(list(out.glob("*.png"))) == 3


def test_resume_of_another_run_is_refused(tmp_path):
    f, _ = _prompts(tmp_path)
    out = tmp_path / "out"
    RunProgress(out, run_key(tmp_path, f, 5, {"verify": "gasv"}), resume=False, overwrite=False)
    with pytest.raises(InputError, match=r"another seed, settings"):
        RunProgress(out, run_key(tmp_path, f, 6, {"verify": "exact"}), resume=True, overwrite=False)
    f.write_text("1\n")
    with pytest.raises(InputError, match="another prompts_sha256"):
        RunProgress(out, run_key(tmp_path, f, 5, {"verify": "gasv"}), resume=True, overwrite=False)
    (out / "stats.json").write_text("{}")
    import shutil

    shutil.rmtree(out / ".partial")
    with pytest.raises(InputError, match="finished run"):
        RunProgress(out, run_key(tmp_path, f, 5, {}), resume=True, overwrite=False)
