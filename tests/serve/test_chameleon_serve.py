"""`serve` on a Chameleon-family (Lumina-mGPT) engine directory, end to end without a server: the
serve model (what each Triton / HTTP batch runs) over the ORT bundle answers text prompts, row by
row equal to the Pipeline on the same prompts and seeds; a bad row gets its own error while its
batch-mates are served; a prompt longer than the export's budget is refused naming the fix."""

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))

from chameleon_bundle import export_cli, export_kwargs, make_chameleon_artifacts  # noqa: E402

pytestmark = pytest.mark.slow
CAPTIONS = ["a red fox", "tok70 tok71 tok72 tok73 tok74"]


def _b(*s):
    return np.array([[x.encode()] for x in s], dtype=object)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.serve.model import ServeModel

    root = tmp_path_factory.mktemp("cham_serve")
    art = make_chameleon_artifacts(root / "art")
    export_cli(art["model_dir"], root / "eng", **export_kwargs(art))
    pipe = Pipeline.from_dir(root / "eng", backend="ort", threads=1)
    return pipe, ServeModel(pipe, max_batch=4)


def test_rows_equal_the_pipeline(served):
    from lisa_trt.runtime.prompts import Prompt

    pipe, model = served
    (err, out), = model.infer_each([{"prompt": _b(*CAPTIONS), "seed": np.array([[7], [8]])}])
    assert err is None, err
    assert out["image"].shape[0] == 2 and out["image"].shape[3] == 3 and out["image"].dtype == np.uint8
    assert (out["error"] == b"").all()
    ref = pipe.generate([Prompt(0, caption=CAPTIONS[0], seed=7), Prompt(1, caption=CAPTIONS[1], seed=8)],
                        verify="gasv", batch=True)
    assert all(np.asarray(a).shape == b.shape and np.array_equal(np.asarray(a), b)
               for a, b in zip(ref.images, out["image"]))


def test_a_bad_request_does_not_fail_its_batch_mates(served):
    _, model = served
    long = " ".join(["tok70"] * 40)
    out = model.infer_each([{"prompt": _b(CAPTIONS[0]), "seed": np.array([[1]])},
                            {"prompt": _b(long), "seed": np.array([[2]])},
                            {"prompt": _b(CAPTIONS[0]), "top_p": np.array([[2.0]], np.float32)}])
    (e0, o0), (e1, _), (e2, _) = out
    assert e0 is None and o0["image"].shape[0] == 1
    assert e1 is not None and "--max-prompt" in str(e1) and "takes at most 32" in str(e1)
    assert e2 is not None and "top_p" in str(e2)


def test_serve_command_answers_captions(served, tmp_path):
    """`lisa-trt serve DIR` (a real server process) on the Chameleon bundle: a caption request
    returns the Pipeline's image for the same prompt and seed."""
    from served import serve_one_caption

    pipe, _ = served
    img, st, want = serve_one_caption(pipe._e.manifest.dir, tmp_path / "server.log", CAPTIONS[1], seed=8)
    assert img.dtype == np.uint8 and np.array_equal(img, want)  # (and its stats: served.py)
