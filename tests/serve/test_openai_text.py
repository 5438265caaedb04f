"""A text-prompt family (Chameleon / Lumina-mGPT, the tiny bundle of tests/export/chameleon_bundle.py)
through the OpenAI Images front end, driven by the official `openai` client: prompt text in, PNG out,
byte-identical to `lisa-trt run` and to Pipeline.generate for the same prompt and seed; `usage`
reports the decode loop's forwards for a sequence that is not a plain token grid (row ends); the
streamed partial images are row prefixes of the final image. The front end reads the bundle's
manifest (ModelInfo.from_dir), as `lisa-trt serve --openai-port` does."""

import sys
from pathlib import Path

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))

from chameleon_bundle import export_cli, export_kwargs, make_chameleon_artifacts  # noqa: E402
from test_openai import LocalModel, _png, _serve  # noqa: E402

pytestmark = pytest.mark.slow  # the Chameleon export
CAPTION = "a red fox"


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("openai_text")
    art = make_chameleon_artifacts(root / "art")
    export_cli(art["model_dir"], root / "eng", **export_kwargs(art))
    return root / "eng"


@pytest.fixture(scope="module")
def served(engine_dir):
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.serve.openai_request import ModelInfo

    with Pipeline.from_dir(engine_dir, backend="ort", threads=1) as pipe:
        info = ModelInfo.from_dir(engine_dir, max_batch=4)
        front, base = _serve(LocalModel(pipe), info)
        client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=300)
        yield pipe, info, client
        client.close()
        front.stop(10)


def test_text_prompt_in_png_out_equal_to_run_and_the_pipeline(served, engine_dir, tmp_path):
    from click.testing import CliRunner
    from PIL import Image

    from lisa_trt.cli import main
    from lisa_trt.runtime.prompts import Prompt

    pipe, info, client = served
    assert info.prompt == "text" and info.family == pipe.family.name
    r = client.images.generate(prompt=CAPTION, n=2, size=info.size, extra_body={"seed": 5, "verify": "vanilla"})
    ref = pipe.generate([Prompt(0, caption=CAPTION, seed=5), Prompt(1, caption=CAPTION, seed=6)], verify="vanilla",
                        batch=True)
    got = [_png(d.b64_json) for d in r.data]
    for img, want in zip(got, ref.images):
        assert img.shape == (info.height, info.width, 3) and np.array_equal(img, np.asarray(want))
    assert not np.array_equal(got[0], got[1])  # seeds 5 and 6
    prompts = tmp_path / "p.txt"
    prompts.write_text(f"{CAPTION}\n{CAPTION}\n")
    res = CliRunner().invoke(main, ["run", str(engine_dir), str(prompts), "--out", str(tmp_path / "o"), "--backend",
                                    "ort", "--seed", "5", "--verify", "vanilla"])
    assert res.exit_code == 0, res.output
    for i in range(2):
        ran = np.asarray(Image.open(tmp_path / "o" / f"img_{i:04d}_line{i + 1}.png"))
        assert np.array_equal(ran, got[i]), f"image {i}: lisa-trt run differs from the OpenAI API"
    # plain decoding: one target forward per generated token (row ends included), counted by the loop
    n_tokens = ref.tokens.shape[1]
    assert r.usage.model_extra["forwards"] == 2 * n_tokens == sum(st["forwards"] for st in ref.stats)


def test_text_prompt_streams_row_prefixes_of_the_final_image(served):
    _, info, client = served
    events = list(client.images.generate(prompt=CAPTION, stream=True, partial_images=2, extra_body={"seed": 5}))
    assert [e.type for e in events] == ["image_generation.partial_image"] * 2 + ["image_generation.completed"]
    final = _png(events[-1].b64_json)
    plain = client.images.generate(prompt=CAPTION, extra_body={"seed": 5})
    assert np.array_equal(final, _png(plain.data[0].b64_json))
    for e in events[:2]:
        px = e.model_extra["pixel_rows"]
        assert 0 < px < info.height and np.array_equal(_png(e.b64_json)[:px, :, :3], final[:px])


def test_text_prompt_errors_reach_the_client(served):
    _, _, client = served
    with pytest.raises(openai.BadRequestError) as e:
        client.images.generate(prompt=" ".join(["tok70"] * 40))
    assert "--max-prompt" in e.value.body["message"] and e.value.body["param"] == "prompt", e.value.body


def test_negative_prompt_is_the_cfg_rows_text_equal_to_the_pipeline(served, engine_dir, tmp_path):
    """`negative_prompt` (an extra body field of the openai client) reaches the family's prompter as
    the text of CFG's unconditional rows: the PNG is Pipeline.generate(negative_prompt=...)'s image
    for the same seed and `lisa-trt run --negative-prompt`'s, and not the image without it; one too
    long for the bundle is a 400 naming it."""
    from click.testing import CliRunner
    from PIL import Image

    from lisa_trt.cli import main
    from lisa_trt.runtime.prompts import Prompt

    pipe, _, client = served
    assert client.models.retrieve("lisa").model_extra["negative_prompt"] is True
    extra = {"seed": 5, "verify": "vanilla", "cfg_scale": 3.0}
    neg = "tok71 tok72"
    r = client.images.generate(prompt=CAPTION, extra_body={**extra, "negative_prompt": neg})
    ref = pipe.generate([Prompt(0, caption=CAPTION, seed=5)], verify="vanilla", cfg_scale=3.0, batch=True,
                        negative_prompt=neg)
    got = _png(r.data[0].b64_json)
    assert np.array_equal(got, np.asarray(ref.images[0]))
    plain = client.images.generate(prompt=CAPTION, extra_body=extra)
    assert not np.array_equal(got, _png(plain.data[0].b64_json))  # the negative text changed CFG's rows
    (tmp_path / "p.txt").write_text(f"{CAPTION}\n")
    res = CliRunner().invoke(main, ["run", str(engine_dir), str(tmp_path / "p.txt"), "--out", str(tmp_path / "o"),
                                    "--backend", "ort", "--seed", "5", "--verify", "vanilla", "--cfg-scale", "3",
                                    "--negative-prompt", neg])
    assert res.exit_code == 0, res.output
    assert np.array_equal(np.asarray(Image.open(tmp_path / "o" / "img_0000_line1.png")), got)
    blank = client.images.generate(prompt=CAPTION, extra_body={**extra, "negative_prompt": "  "})
    assert np.array_equal(_png(blank.data[0].b64_json), _png(plain.data[0].b64_json))  # blank: none
    with pytest.raises(openai.BadRequestError) as e:
        client.images.generate(prompt=CAPTION, extra_body={**extra, "negative_prompt": " ".join(["tok70"] * 40)})
    assert "--max-prompt" in e.value.body["message"] and e.value.body["param"] == "negative_prompt", e.value.body
