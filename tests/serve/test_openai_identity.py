"""Issue 52 item 10, serving as a vLLM / trtllm-serve user expects: `--served-model-name` (the
OpenAI model name), `--api-key` (401 without `Authorization: Bearer KEY`, /health open), and a
streaming answer that says whether its partials were decoded progressively or cut from the
finished image. Driven by the official `openai` client over real HTTP, on the in-process backend
of test_openai.py (no Triton, no network beyond 127.0.0.1)."""

import dataclasses
import json
import urllib.request

import pytest
from click.testing import CliRunner

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from test_openai import LocalModel, StreamingModel, _info, _serve  # noqa: E402  (tests/serve/test_openai.py)

from lisa_trt.errors import InputError  # noqa: E402

KEY = "sk-test-123"


@pytest.fixture(scope="module")
def served(pipe):
    """An app serving the pipe as 'my-images' behind KEY."""
    info = dataclasses.replace(_info(pipe), id="my-images")
    front, base = _serve(LocalModel(pipe), info, api_key=KEY)
    yield info, base
    front.stop(10)


def _client(base, key):
    return openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)


def test_the_served_model_name_is_the_openai_model(served):
    info, base = served
    with _client(base, KEY) as c:
        assert [m.id for m in c.models.list()] == ["my-images"]
        r = c.images.generate(model="my-images", prompt="c1", extra_body={"seed": 3})
        assert len(r.data) == 1
        with pytest.raises(openai.NotFoundError) as e:
            c.images.generate(model="lisa", prompt="c1")
        assert "serves 'my-images'" in e.value.body["message"]


@pytest.mark.parametrize("key", ["wrong", ""])
def test_requests_without_the_key_get_401(served, key):
    _, base = served
    with _client(base, key or "x") as c:
        if not key:  # no Authorization header at all
            c._custom_headers["Authorization"] = ""
        with pytest.raises(openai.AuthenticationError) as e:
            c.images.generate(prompt="c1")
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
        assert "--api-key" in e.value.body["message"]
        with pytest.raises(openai.AuthenticationError):
            c.models.list()


def test_health_needs_no_key(served):
    _, base = served
    with urllib.request.urlopen(base.removesuffix("/v1") + "/health", timeout=30) as r:
        assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}


def test_without_a_key_every_request_is_served(pipe):
    front, base = _serve(LocalModel(pipe), _info(pipe))
    try:
        with _client(base, "anything") as c:
            assert [m.id for m in c.models.list()] == ["lisa"]
    finally:
        front.stop(10)


@pytest.mark.parametrize("model,progressive", [(LocalModel, False), (StreamingModel, True)])
def test_stream_partials_say_whether_they_were_decoded_progressively(pipe, model, progressive):
    """Without --progressive the partials are cut from the finished image and all sent after the
    decode: each partial event says so (`progressive: false`); decoded ones say `true`."""
    backend = model(pipe)
    if progressive:
        backend.hold.set()
    front, base = _serve(backend, _info(pipe))
    try:
        with _client(base, "x") as c:
            events = list(c.images.generate(prompt="c2", stream=True, partial_images=2, extra_body={"seed": 1}))
    finally:
        front.stop(10)
    partial = [e for e in events if e.type == "image_generation.partial_image"]
    assert partial and all(e.model_extra["progressive"] is progressive for e in partial)


def test_for_triton_names_the_model_and_takes_the_key(tmp_path, monkeypatch):
    from lisa_trt.serve import openai_api

    seen = {}
    monkeypatch.setattr(openai_api.ModelInfo, "from_dir",
                        classmethod(lambda cls, d, mb, model_id="lisa": seen.setdefault("id", model_id) and
                                    cls(id=model_id, family="llamagen", width=8, height=8, max_batch=mb)))
    monkeypatch.setattr(openai_api, "create_app", lambda backend, info, **kw: seen.update(kw) or object())
    monkeypatch.setattr(openai_api.FrontEnd, "__init__", lambda self, app, **kw: None)
    front = openai_api.FrontEnd.for_triton(tmp_path, triton_url="127.0.0.1:1", host="127.0.0.1", port=1,
                                           max_batch=2, served_model_name="x-1", api_key=KEY)
    assert front.info.id == "x-1" and seen["id"] == "x-1" and seen["api_key"] == KEY


def test_identity_options_are_checked_before_any_work(tmp_path):
    from lisa_trt.cli import main
    from lisa_trt.serve.server import check_openai_identity

    with pytest.raises(InputError, match="without spaces"):
        check_openai_identity("my model", None)
    with pytest.raises(InputError, match="--api-key is empty"):
        check_openai_identity("m", " ")
    r = CliRunner().invoke(main, ["serve", str(tmp_path), "--api-key", KEY])
    assert r.exit_code == 2 and "give --openai-port too" in r.output
    r = CliRunner().invoke(main, ["openai-api", str(tmp_path), "--served-model-name", ""])
    assert r.exit_code == 2 and "--served-model-name" in r.output
    r = CliRunner().invoke(main, ["serve", "-h"])
    assert r.exit_code == 0 and "--served-model-name" in r.output and "--api-key" in r.output
