"""Janus-Pro's negative prompt through the OpenAI Images front end, driven by the official `openai`
client: the tiny transformers checkpoint of tests/models/test_janus.py exported to an ORT bundle
(no drafter; its VQ decoder), served by the in-process backend of test_openai.py (ServeModel.infer_each, what
Triton's model.py executes). The PNG equals Pipeline.generate(negative_prompt=...) for the same
seed and differs from the image without a negative prompt."""

import sys
from pathlib import Path

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from test_janus import make_hf, save, save_tokenizer  # noqa: E402
from test_openai import LocalModel, _png, _serve  # noqa: E402

pytestmark = pytest.mark.slow  # the Janus export
PROMPT, NEG = "w10 w11 w12", "w30 w31 w32 w33 w34"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import lisa_trt
    from lisa_trt.families.janus import load_janus_vq
    from lisa_trt.families.janus.export import export_janus
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.serve.openai_request import ModelInfo

    root = tmp_path_factory.mktemp("openai_janus")
    d = save(make_hf(seed=3), root / "model")
    save_tokenizer(d)
    export_janus(lisa_trt.load_target(str(d)), None, None, load_janus_vq(d), d, root / "eng", max_prompt=16)
    with Pipeline.from_dir(root / "eng", backend="ort", threads=1) as pipe:
        front, base = _serve(LocalModel(pipe), ModelInfo.from_dir(root / "eng", max_batch=4))
        client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=300)
        yield pipe, client
        client.close()
        front.stop(10)


def test_janus_negative_prompt_through_the_openai_api_equals_the_pipeline(served):
    from lisa_trt.runtime.prompts import Prompt

    pipe, client = served
    assert client.models.retrieve("lisa").model_extra["negative_prompt"] is True
    extra = {"seed": 5, "verify": "vanilla", "cfg_scale": 3.0}
    r = client.images.generate(prompt=PROMPT, extra_body={**extra, "negative_prompt": NEG})
    ref = pipe.generate([Prompt(0, caption=PROMPT, seed=5)], verify="vanilla", cfg_scale=3.0, batch=True,
                        negative_prompt=NEG)
    got = _png(r.data[0].b64_json)
    assert np.array_equal(got, np.asarray(ref.images[0]))
    plain = client.images.generate(prompt=PROMPT, extra_body=extra)
    assert not np.array_equal(got, _png(plain.data[0].b64_json))  # the negative text changed CFG's row
    with pytest.raises(openai.BadRequestError) as e:  # 17 tokens in the template; the bundle takes 16
        client.images.generate(prompt=PROMPT, extra_body={**extra, "negative_prompt": " ".join(
            f"w{i}" for i in range(50, 63))})
    assert "--max-prompt" in e.value.body["message"] and e.value.body["param"] == "negative_prompt", e.value.body
