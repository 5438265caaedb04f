"""The OpenAI Images front end (serve/openai_api.py) driven by the official `openai` client over
real HTTP on 127.0.0.1 (uvicorn on a thread).

The app is the one `lisa-trt serve --openai-port` runs; here its backend runs the served model's
own request handling (ServeModel.infer_each, what Triton's model.py executes) on the tiny
in-memory pipeline of conftest.py, so no export and no Triton are needed: PNGs equal to
Pipeline.generate, streaming row prefixes, and every error status through the client's exception
types. The same requests through a real `lisa-trt serve` (Triton) are in test_openai_serve.py.
"""

import asyncio
import base64
import io
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from lisa_trt.runtime.prompts import Prompt  # noqa: E402
from lisa_trt.serve.model import ServeModel, inputs  # noqa: E402
from lisa_trt.serve.openai_api import FrontEnd, TritonImages, create_app, triton_error  # noqa: E402
from lisa_trt.serve.openai_request import ModelInfo, knob_kinds  # noqa: E402
from lisa_trt.serve.process import free_ports  # noqa: E402

MAX_BATCH = 4


class _Result:
    """ServeModel's output dict behind tritonclient's InferResult.as_numpy."""

    def __init__(self, out: dict):
        self.as_numpy = out.__getitem__


class LocalModel:
    """The TritonImages interface over ServeModel.infer_each in this process (Triton's model.py
    execute, without Triton): one request of n (n, 1) input rows; `gate` holds requests back."""

    def __init__(self, pipe):
        self.model = ServeModel(pipe, max_batch=MAX_BATCH)
        self.gate, self.entered = threading.Event(), threading.Event()
        self.gate.set()
        self.fault = False

    async def ready(self):
        return True

    @staticmethod
    def _request(call) -> dict:
        cols = {"prompt": [call.prompt] * call.n, "seed": list(call.seeds), **{k: [v] * call.n
                                                                            for k, v in call.inputs.items()}}
        req = {}
        for name, col in cols.items():
            dt, kind = inputs()[name]
            req[name] = (np.array([[str(v).encode()] for v in col], dtype=object) if kind == "str"
                         else np.array([[v] for v in col], dtype=dt))
        return req

    @staticmethod
    def _rows(err, out):
        from lisa_trt.serve.client import parse_rows

        if err is not None:
            raise triton_error(str(err), "500" if err.internal else "400", knob_kinds())
        return parse_rows(_Result(out))

    def _infer(self, call):
        self.entered.set()
        assert self.gate.wait(60), "the test never opened the gate"
        if self.fault:
            raise RuntimeError("boom: /secret/path.py")
        (err, out), = self.model.infer_each([self._request(call)])
        return self._rows(err, out)

    async def generate(self, call):
        return await asyncio.to_thread(self._infer, call)

    async def close(self):
        pass


class StreamingModel(LocalModel):
    """LocalModel with the progressive channel (`stream`): ServeModel.stream_each on a thread, each
    partial handed to the event loop as it is emitted. The first partial holds the decode until
    the test sets `hold` (after its client has received that partial), so the decode provably
    finishes after the client saw it; `decoded` is set when the decode has returned. A stream
    closed before its final item sets `closed`, which the decode checks after every step
    (stream_each's `cancelled`); `outcome` is what the decode ended with (DecodeCancelled when
    it stopped there), `emitted` the partial indices it sent."""

    def __init__(self, pipe):
        super().__init__(pipe)
        self.hold, self.decoded, self.closed = threading.Event(), threading.Event(), threading.Event()
        self.held = None  # True when the first partial's hold was released by the test
        self.outcome, self.emitted = None, []

    async def stream(self, call):
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()

        def emit(k, tokens, images):
            self.emitted.append(k)
            loop.call_soon_threadsafe(queue.put_nowait, ("partial", k, tokens, images))
            if k == 0:
                self.held = self.hold.wait(30)

        def run():
            try:
                got = self.model.stream_each(self._request(call), call.partial_images, emit, self.closed.is_set)
                self.outcome = got
                item = ("done", self._rows(*got))
            except Exception as e:  # noqa: BLE001 - handed to the stream
                self.outcome, item = e, ("fail", e)
            self.decoded.set()
            loop.call_soon_threadsafe(queue.put_nowait, item)

        self.decoded.clear()
        self.closed.clear()
        self.emitted = []
        threading.Thread(target=run, daemon=True).start()
        finished = False
        try:
            while True:
                item = await queue.get()
                if item[0] == "fail":
                    raise item[1]
                yield item
                if item[0] == "done":
                    finished = True
                    return
        finally:
            if not finished:  # closed or cancelled by the front end before the final item
                self.closed.set()


def _info(pipe, probe=0, **over) -> ModelInfo:
    from lisa_trt.runtime.conditions import run_conditions

    img = np.asarray(pipe.generate([probe], seed=0, batch=True).images[0])
    n = pipe.config.block_size
    rows = int(round(n ** 0.5))
    return ModelInfo(id="lisa", family="llamagen", width=img.shape[1], height=img.shape[0], max_batch=MAX_BATCH,
                     class_names=tuple(pipe.class_names or ()), num_classes=pipe.config.num_classes,
                     token_rows=rows, tokens_per_image=n,
                     no_negative=run_conditions(pipe.family, pipe.config).no_negative(), **{"prompt_tokens": 1, **over})


def _serve(backend, info, **kw):
    (port,) = free_ports(1)
    front = FrontEnd(create_app(backend, info, **kw), host="127.0.0.1", port=port, drain_timeout=5)
    front.start()
    return front, f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def info(pipe):
    return _info(pipe)


@pytest.fixture(scope="module")
def url(pipe, info):
    front, base = _serve(LocalModel(pipe), info)
    yield base
    front.stop(10)


@pytest.fixture()
def client(url):
    c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
    yield c
    c.close()


def _png(b64: str) -> np.ndarray:
    from PIL import Image

    raw = base64.b64decode(b64)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    return np.asarray(Image.open(io.BytesIO(raw)))


def test_images_equal_the_pipeline_with_the_same_seed(client, pipe, info):
    r = client.images.generate(prompt="c3", n=2, size=info.size, response_format="b64_json",
                               extra_body={"seed": 7})
    ref = pipe.generate([Prompt(0, class_id=3, seed=7), Prompt(1, class_id=3, seed=8)], verify="auto", batch=True)
    assert len(r.data) == 2 and isinstance(r.created, int) and r.created > 0
    for d, want, seed in zip(r.data, ref.images, (7, 8)):
        img = _png(d.b64_json)
        assert img.shape == (info.height, info.width, 3) and img.dtype == np.uint8
        assert np.array_equal(img, np.asarray(want))
        assert d.model_extra["seed"] == seed
    assert not np.array_equal(_png(r.data[0].b64_json), _png(r.data[1].b64_json))  # seed + i per image
    # one decode per prompt (what `lisa-trt run` does) gives the same image as the served batch
    alone = pipe.generate([Prompt(0, class_id=3, seed=8)], verify="auto").images[0]
    assert np.array_equal(_png(r.data[1].b64_json), np.asarray(alone))
    u = r.usage
    mal = [st["mal"] for st in ref.stats]
    assert u.output_tokens == 2 * pipe.config.block_size and u.input_tokens == 2
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.model_extra["mal"] == pytest.approx(sum(mal) / 2, abs=1e-3)
    assert u.model_extra["forwards"] == sum(st["forwards"] for st in ref.stats)  # the decoder's own count
    assert u.model_extra["batch"] == 2
    assert u.model_extra["seconds"] >= u.model_extra["decode_seconds"] > 0  # the request's wall time covers its decode
    # a class id (JSON number or string) is the same class as its name; the knobs reach the decode
    by_id = client.images.generate(prompt="3", extra_body={"seed": 7, "verify": "gasv", "top_k": 5})
    want = pipe.generate([Prompt(0, class_id=3, seed=7)], verify="gasv", top_k=5, batch=True).images[0]
    assert np.array_equal(_png(by_id.data[0].b64_json), np.asarray(want))


def test_usage_forwards_are_the_decoders_count(client, pipe):
    """Plain decoding runs the target once per token (the prefill gives the first): n * N forwards
    for n images of N tokens; a tree decode reports the forwards its loop ran (prefill + steps)."""
    n = pipe.config.block_size
    plain = client.images.generate(prompt="c2", n=2, extra_body={"seed": 1, "verify": "vanilla"})
    assert plain.usage.model_extra["forwards"] == 2 * n and plain.usage.model_extra["mal"] == 1.0
    tree = client.images.generate(prompt="c2", extra_body={"seed": 1, "verify": "exact"})
    ref = pipe.generate([Prompt(0, class_id=2, seed=1)], verify="exact", batch=True, decode=False)
    steps = ref.stats[0]["steps"]
    assert tree.usage.model_extra["forwards"] == steps + 1 == ref.stats[0]["forwards"], steps


def test_stream_sends_row_prefixes_of_the_final_image_then_completed(client, info):
    events = list(client.images.generate(prompt="c5", stream=True, partial_images=3, extra_body={"seed": 4}))
    assert [e.type for e in events] == ["image_generation.partial_image"] * 3 + ["image_generation.completed"]
    final = _png(events[-1].b64_json)
    plain = client.images.generate(prompt="c5", extra_body={"seed": 4})
    assert np.array_equal(final, _png(plain.data[0].b64_json))
    assert events[-1].size == info.size and events[-1].usage.output_tokens == info.tokens_per_image
    shown = []
    for k, e in enumerate(events[:3]):
        assert e.partial_image_index == k and e.output_format == "png" and e.size == info.size
        part = _png(e.b64_json)
        px = e.model_extra["pixel_rows"]
        assert part.shape == (info.height, info.width, 4)
        assert px == e.model_extra["rows"] * info.height // info.token_rows
        assert np.array_equal(part[:px, :, :3], final[:px]) and (part[:px, :, 3] == 255).all()
        assert (part[px:] == 0).all()  # rows not shown yet are transparent
        shown.append(px)
    assert 0 < shown[0] < shown[1] < shown[2] < info.height, shown


def test_progressive_partials_arrive_while_decoding_then_the_non_streaming_image(pipe, info, client):
    """Partials come from the decode itself: the first reaches the openai client while the decode
    is held (it cannot have finished), indices 0..K-1 in order, each from more committed tokens,
    and the completed image equals the non-streaming one for the same seed."""
    backend = StreamingModel(pipe)
    front, base = _serve(backend, info)
    try:
        with openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120) as c:
            events, first_seen_decoding = [], None
            for e in c.images.generate(prompt="c5", stream=True, partial_images=3, extra_body={"seed": 4}):
                if not events:
                    first_seen_decoding = not backend.decoded.is_set()
                    backend.hold.set()
                events.append(e)
    finally:
        backend.hold.set()
        front.stop(10)
    assert first_seen_decoding is True and backend.held is True
    assert [e.type for e in events] == ["image_generation.partial_image"] * 3 + ["image_generation.completed"]
    assert [e.partial_image_index for e in events[:3]] == [0, 1, 2]
    tokens = [e.model_extra["tokens"] for e in events[:3]]
    assert 0 < tokens[0] < tokens[1] < tokens[2] < info.tokens_per_image, tokens
    for e in events[:3]:
        assert _png(e.b64_json).shape == (info.height, info.width, 3)
        assert e.model_extra["rows"] == e.model_extra["tokens"] * info.token_rows // info.tokens_per_image
    plain = client.images.generate(prompt="c5", extra_body={"seed": 4})
    assert np.array_equal(_png(events[-1].b64_json), _png(plain.data[0].b64_json))
    assert events[-1].usage.output_tokens == info.tokens_per_image


def test_a_client_that_disconnects_after_the_first_partial_stops_the_decode(pipe, info):
    """The openai client reads the first partial and closes the stream while the decode is held
    there; the front end closes the backend's stream, the decode stops at its next step (far
    fewer steps than a full decode of the same request) and the next request is served."""
    from lisa_trt.serve.model import DecodeCancelled

    backend = StreamingModel(pipe)
    front, base = _serve(backend, info)
    try:
        with openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120) as c:
            events = c.images.generate(prompt="c5", stream=True, partial_images=3,
                                       extra_body={"seed": 4, "verify": "vanilla"})
            first = next(iter(events))
            events.close()  # the SSE client goes away after the first partial image
            assert first.type == "image_generation.partial_image"
            assert backend.closed.wait(30), "the front end never closed the backend's stream"
            backend.hold.set()
            assert backend.decoded.wait(60)
            assert isinstance(backend.outcome, DecodeCancelled), backend.outcome
            assert backend.emitted == [0]
            full = []
            pipe.generate([Prompt(0, class_id=5, seed=4)], verify="vanilla", batch=True, decode=False,
                          on_step=lambda step: full.append(1))
            # partial 0 of 3 comes a quarter of the way; the check at the next step stops the decode
            assert backend.outcome.steps < len(full) // 2, (backend.outcome.steps, len(full))
            r = c.images.generate(prompt="c5", extra_body={"seed": 4, "verify": "vanilla"})
            want = pipe.generate([Prompt(0, class_id=5, seed=4)], verify="vanilla", batch=True).images[0]
            assert np.array_equal(_png(r.data[0].b64_json), np.asarray(want))
    finally:
        backend.hold.set()
        front.stop(10)


@pytest.mark.parametrize("verify", ["vanilla", "exact", "sjd", "sjd-gasv", "zipar"])
def test_partial_codes_are_prefixes_of_the_final_codes(pipe, verify):
    """PartialDecode (Pipeline.generate's on_step): the committed tokens it decodes are a prefix of
    the final tokens, the rest is the row's first token (the documented filler), and the last
    step's images are the final images."""
    seen, last = [], []

    def hook(step):
        seen.append((step.start, step.done.clone(), step.filled()))
        last[:] = [step]

    res = pipe.generate([Prompt(0, class_id=2, seed=5), Prompt(1, class_id=6, seed=6)], verify=verify, batch=True,
                        on_step=hook)
    final = res.tokens
    assert len(seen) > 1 and int(seen[0][1].min()) < final.shape[1]
    for start, done, filled in seen:  # a decode call's rows start at `start` (sjd decodes rows one by one)
        for b, n in enumerate(done.tolist()):
            assert torch.equal(filled[b, :n], final[start + b, :n])
            assert (filled[b, n:] == final[start + b, 0]).all()
    s = last[0]
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(s.images(), res.images[s.start:]))


def _raises(client, exc, status, param, text, **kw):
    with pytest.raises(exc) as e:
        client.images.generate(**kw)
    assert e.value.status_code == status
    body = e.value.body
    assert set(body) == {"message", "type", "param", "code"} and body["param"] == param, body
    assert text in body["message"], body["message"]
    assert "Traceback" not in body["message"] and ".py" not in body["message"] and "\n" not in body["message"]
    return body


CASES = [
    (dict(prompt="nope"), "prompt", "unknown class 'nope' (use ids 0..9 or names c0"),
    (dict(prompt="c1", size="1024x1024"), "size", "valid: '"),
    (dict(prompt="c1", response_format="url"), "response_format", "use response_format 'b64_json'"),
    (dict(prompt="c1", n=0), "n", "n=0 is out of range; valid: 1..4"),
    (dict(prompt="c1", n=5), "n", "n=5 is out of range; valid: 1..4"),
    (dict(prompt="c1", extra_body={"top_p": 2.0}), "top_p", "top_p=2.0 is out of range"),
    (dict(prompt="c1", extra_body={"verify": "bogus"}), "verify", "unknown verify rule 'bogus'; valid:"),
    (dict(prompt="c1", extra_body={"cfg_scale": -3.0}), "cfg_scale", "cfg_scale=-3.0 is out of range"),
    (dict(prompt="c1", extra_body={"guidance_scale": "high"}), "guidance_scale", "must be a number"),
    (dict(prompt="c1", extra_body={"seed": -1}), "seed", "seed=-1 is out of range"),
    (dict(prompt="c1", extra_body={"temperature": 0.5, "steps": 3}), "steps", "Unknown parameter: 'steps'"),
    (dict(prompt="c1", extra_body={"negative_prompt": "blurry"}), "negative_prompt",
     "negative_prompt is not supported by the llamagen family (class-conditional"),
    (dict(prompt="c1", partial_images=2), "partial_images", "partial_images needs stream: true"),
    (dict(prompt="c1", stream=True, partial_images=4), "partial_images", "valid: 0..3"),
    (dict(prompt="   "), "prompt", "'prompt' is empty"),
]


@pytest.mark.parametrize("kw,param,text", CASES, ids=[c[1] + str(i) for i, c in enumerate(CASES)])
def test_bad_requests_are_400_in_openai_error_shape(client, kw, param, text):
    body = _raises(client, openai.BadRequestError, 400, param, text, **kw)
    assert body["type"] == "invalid_request_error"


def test_ignored_fields_accepted_and_unknown_model_404(client):
    r = client.images.generate(prompt="c2", quality="high", style="vivid", user="me", extra_body={"seed": 1})
    assert len(r.data) == 1
    _raises(client, openai.NotFoundError, 404, "model", "The model 'gpt-image-1' does not exist", prompt="c2",
            model="gpt-image-1")
    assert [m.id for m in client.models.list()] == ["lisa"]
    assert client.models.retrieve("lisa").model_extra["sizes"] == [r.size]
    assert client.models.retrieve("lisa").model_extra["negative_prompt"] is False  # class-conditional
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("dall-e-3")


def _post(url, raw: bytes):
    req = urllib.request.Request(url, data=raw, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_body_too_large_413_not_json_400_unknown_path_404(url, client):
    with pytest.raises(openai.APIStatusError) as e:
        client.images.generate(prompt="c1", extra_body={"user": "x" * (1 << 20)})
    assert e.value.status_code == 413 and e.value.body["code"] == "request_too_large"
    status, body = _post(f"{url}/images/generations", b"{not json")
    assert status == 400 and body["error"]["code"] == "invalid_json"
    status, body = _post(f"{url}/images/generations", b"[1, 2]")
    assert status == 400 and "JSON object" in body["error"]["message"]
    status, body = _post(f"{url}/images/edits", b"{}")
    assert status == 404 and body["error"]["message"] == "Invalid URL (POST /v1/images/edits)"


def test_429_when_max_pending_requests_are_in_flight(pipe, info):
    slow = LocalModel(pipe)
    slow.gate.clear()
    front, base = _serve(slow, info, max_pending=1)
    c = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
    try:
        first = {}
        th = threading.Thread(target=lambda: first.setdefault("r", c.images.generate(prompt="c1")))
        th.start()
        try:
            assert slow.entered.wait(60)  # the first request holds the only slot
            with pytest.raises(openai.RateLimitError) as e:
                c.images.generate(prompt="c2")
            assert e.value.status_code == 429 and e.value.response.headers["retry-after"] == "1"
            assert e.value.body["code"] == "rate_limit_exceeded" and "--openai-max-pending 1" in e.value.body["message"]
        finally:
            slow.gate.set()
            th.join(60)
        assert len(first["r"].data) == 1  # the request in flight was served
        assert len(c.images.generate(prompt="c2").data) == 1  # and the slot is free again
    finally:
        c.close()
        front.stop(10)


def test_503_while_triton_is_unreachable_and_500_hides_the_fault(pipe, info):
    (dead,) = free_ports(1)
    front, base = _serve(TritonImages(f"127.0.0.1:{dead}", timeout=5), info)
    c = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)
    try:
        with pytest.raises(openai.InternalServerError) as e:
            c.images.generate(prompt="c1")
        assert e.value.status_code == 503 and e.value.body["code"] == "service_unavailable"
        assert "not reachable" in e.value.body["message"] and "Traceback" not in e.value.body["message"]
        with pytest.raises(urllib.error.HTTPError) as h:
            urllib.request.urlopen(base.replace("/v1", "/health"), timeout=30)
        assert h.value.code == 503
    finally:
        c.close()
        front.stop(10)
    broken = LocalModel(pipe)
    broken.fault = True
    front, base = _serve(broken, info)
    c = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)
    try:
        with pytest.raises(openai.InternalServerError) as e:
            c.images.generate(prompt="c1")
        msg = e.value.body["message"]
        assert e.value.status_code == 500 and "request id" in msg and "boom" not in msg and ".py" not in msg
    finally:
        c.close()
        front.stop(10)


def test_serve_refuses_a_taken_openai_port_at_once(tmp_path):
    import socket
    import subprocess
    import sys

    h, g, m, o = free_ports(4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", o))
        s.listen()
        r = subprocess.run([sys.executable, "-m", "lisa_trt", "serve", str(tmp_path), "--http-port", str(h),
                            "--grpc-port", str(g), "--metrics-port", str(m), "--openai-port", str(o)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert (r.stdout + r.stderr).strip() == (f"error: port {o} (--openai-port) on 127.0.0.1 is already in use; "
                                             "stop what holds it or pass another --openai-port")


def test_caption_bundle_takes_a_caption_through_its_t5_encoder(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.delenv("LISA_TRT_TEXT_ENCODER", raising=False)
    import torch

    from lisa_trt.models.target_config import vq_config
    from lisa_trt.families.llamagen.vq import VQModel
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.testing import make_target
    from lisa_trt.families.llamagen.tiny_t5 import make_tiny_t5

    torch.manual_seed(0)
    target = make_target("t2i", std=0.3)
    vq = VQModel(vq_config("VQ-16", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32,
                           codebook_size=256)).eval()
    t5 = make_tiny_t5(tmp_path / "t5", d_model=12)
    gen = {"sampling": {"cfg_scale": 3.0}}
    pipe = Pipeline.from_models(target, None, None, vq, generation=gen, text_encoder=t5)
    info = _info(pipe, "a dog", prompt="caption", prompt_tokens=None)
    front, base = _serve(LocalModel(pipe), info)
    c = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
    try:
        r = c.images.generate(prompt="a red car", extra_body={"seed": 5, "verify": "vanilla"})
        want = pipe.generate([Prompt(0, caption="a red car", seed=5)], verify="vanilla", batch=True).images[0]
        assert np.array_equal(_png(r.data[0].b64_json), np.asarray(want))
        # a negative prompt: its T5 features are CFG's null rows (tests/text/test_t2i_negative.py), the card says so
        assert c.models.retrieve("lisa").model_extra["negative_prompt"] is True
        n = c.images.generate(prompt="a red car", extra_body={"seed": 5, "verify": "vanilla", "negative_prompt": "blue sky"})
        neg = pipe.generate([Prompt(0, caption="a red car", seed=5)], verify="vanilla", batch=True,
                            negative_prompt="blue sky").images[0]
        assert np.array_equal(_png(n.data[0].b64_json), np.asarray(neg))
        assert not np.array_equal(np.asarray(neg), np.asarray(want))
    finally:
        c.close()
        front.stop(10)
    bare = LocalModel(Pipeline.from_models(target, None, None, vq, generation=gen))  # no encoder: the fix named
    front, base = _serve(bare, info)
    c = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
    try:
        _raises(c, openai.BadRequestError, 400, "prompt", "start it with LISA_TRT_TEXT_ENCODER=DIR",
                prompt="a red car")
    finally:
        c.close()
        front.stop(10)


def test_docs_openai_api_lines_use_existing_options():
    import shlex
    from pathlib import Path

    from lisa_trt.serve.cli import openai_api_cmd

    doc = (Path(__file__).parents[2] / "docs" / "serving.md").read_text()
    known = {o for prm in openai_api_cmd.params for o in prm.opts}
    lines = [ln.strip() for ln in doc.splitlines() if ln.strip().startswith("lisa-trt openai-api ")]
    assert lines
    for ln in lines:
        used = {a.split("=")[0] for a in shlex.split(ln)[2:] if a.startswith("--")}
        assert used <= known, (ln, used - known)


@pytest.fixture(scope="module")
def bundle(pipe, tmp_path_factory):
    """conftest's tiny models exported as an engine directory (ONNX Runtime)."""
    from lisa_trt.export import export_bundle

    import importlib.util  # this folder's conftest by path: under xdist another folder's may own the name

    spec = importlib.util.spec_from_file_location("serve_conftest", Path(__file__).with_name("conftest.py"))
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    GEN = conf.GEN

    e, out = pipe._e, tmp_path_factory.mktemp("openai-bundle") / "eng"
    export_bundle(e.target, e.drafter, e.tables, e.vq, out, generation=GEN, progress=False, lint=False)
    return out


@pytest.mark.slow  # the export: about 60 s on 2 shared cores
def test_lisa_trt_run_pngs_equal_the_openai_pngs_whatever_the_batch(bundle, tmp_path):
    """`lisa-trt run` (one decode per prompt) and the OpenAI front end (the served model: the
    request's images decoded as one batch) give byte-identical pixels for the same prompt and seed;
    an image served alone equals the same image served in a batch of two."""
    from click.testing import CliRunner
    from PIL import Image

    from lisa_trt.cli import main
    from lisa_trt.runtime.pipeline import Pipeline

    prompts = tmp_path / "p.txt"
    prompts.write_text("c3\nc3\n")
    res = CliRunner().invoke(main, ["run", str(bundle), str(prompts), "--out", str(tmp_path / "o"), "--backend",
                                    "ort", "--seed", "7"])
    assert res.exit_code == 0, res.output
    ran = [np.asarray(Image.open(tmp_path / "o" / f"img_{i:04d}_line{i + 1}.png")) for i in range(2)]
    with Pipeline.from_dir(bundle, backend="ort", threads=1) as ort:
        front, base = _serve(LocalModel(ort), _info(ort))
        c = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
        try:
            both = c.images.generate(prompt="c3", n=2, extra_body={"seed": 7})
            alone = c.images.generate(prompt="c3", extra_body={"seed": 8})
        finally:
            c.close()
            front.stop(10)
    assert both.usage.model_extra["batch"] == 2 and alone.usage.model_extra["batch"] == 1
    served = [_png(d.b64_json) for d in both.data]
    for i in range(2):
        assert np.array_equal(served[i], ran[i]), f"image {i}: lisa-trt run differs from the OpenAI API"
    assert np.array_equal(_png(alone.data[0].b64_json), served[1])  # the batch did not change the image
    assert not np.array_equal(served[0], served[1])  # seeds 7 and 8 are different images


def test_imagenet_class_names_through_the_client(pipe):
    """A 1000-class bundle without names of its own answers ImageNet's names (case-insensitive);
    an ambiguous or unknown name is a 400 naming the ids or the closest names."""
    import torch

    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.testing import make_target

    torch.manual_seed(0)
    imagenet = Pipeline.from_models(make_target(std=0.3, num_classes=1000), vq=pipe._e.vq,
                                    generation={"sampling": {"cfg_scale": 1.0}})
    info = _info(imagenet)
    assert info.num_classes == 1000 and len(info.class_names) == 1000
    front, base = _serve(LocalModel(imagenet), info)
    c = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
    try:
        assert c.models.list().data[0].model_extra["classes"][207] == "golden retriever"
        by_name = c.images.generate(prompt="Golden_Retriever", extra_body={"seed": 2, "verify": "vanilla"})
        by_id = c.images.generate(prompt="207", extra_body={"seed": 2, "verify": "vanilla"})
        assert by_name.data[0].b64_json == by_id.data[0].b64_json
        _raises(c, openai.BadRequestError, 400, "prompt", "classes 134, 517 share it", prompt="crane")
        _raises(c, openai.BadRequestError, 400, "prompt", "close matches: 'golden retriever' (207)",
                prompt="goldn retriever")
    finally:
        c.close()
        front.stop(10)



class WideImages:
    """A backend of a bundle whose image is (H, W) = (32, 64): each row's image is a function of its
    seed that tells rows from columns (what the front end must encode as given); no progressive
    channel (`stream` None: a streaming answer's partials are cut from the final image)."""

    H, W = 32, 64
    stream = None

    @classmethod
    def image(cls, seed: int) -> np.ndarray:
        y, x = np.mgrid[:cls.H, :cls.W]
        return np.stack([y * 7 % 256, x * 3 % 256, np.full_like(x, seed % 256)], -1).astype(np.uint8)

    async def ready(self):
        return True

    async def generate(self, call):
        return [(self.image(s), {"mal": 1.0, "tvd": 0.0, "seconds": 0.1, "batch": call.n, "forwards": 8})
                for s in call.seeds]

    async def close(self):
        pass


def test_a_non_square_bundle_is_served_at_its_own_width_x_height(monkeypatch):
    """A bundle whose image is wider than tall (a 2 x 4 token grid): ModelInfo.from_dir reads its
    width and height from the manifest's dims, the card and the size check say WIDTHxHEIGHT (OpenAI's
    order), a request of that size gets PNGs of (height, width) as decoded, streamed partials are row
    prefixes of height * rows / token rows pixels, and the transposed size is refused (every other
    fixture is square: a swap there goes unnoticed)."""
    from types import SimpleNamespace

    import lisa_trt.export.manifest as M
    from lisa_trt.families.llamagen.config import tiny_config

    H, W = WideImages.H, WideImages.W
    cfg = tiny_config(block_size=8, grid_shape=(2, 4))
    man = SimpleNamespace(target_config=cfg, dims={"height": H, "width": W, "block": 8}, generation={},
                          created=None)
    monkeypatch.setattr(M, "read_manifest", lambda d: man)
    info = ModelInfo.from_dir("unused", max_batch=MAX_BATCH)
    assert (info.width, info.height, info.size) == (W, H, f"{W}x{H}")
    assert info.token_rows == 2 and info.tokens_per_image == 8 and info.card()["sizes"] == [f"{W}x{H}"]
    front, base = _serve(WideImages(), info)
    try:
        with openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120) as c:
            assert c.models.retrieve("lisa").model_extra["sizes"] == [f"{W}x{H}"]
            r = c.images.generate(prompt="3", n=2, size=f"{W}x{H}", extra_body={"seed": 7})
            assert r.size == f"{W}x{H}"
            for d, seed in zip(r.data, (7, 8)):
                assert np.array_equal(_png(d.b64_json), WideImages.image(seed))
            events = list(c.images.generate(prompt="3", size=f"{W}x{H}", stream=True, partial_images=1,
                                            extra_body={"seed": 7}))
            part, final = _png(events[0].b64_json), _png(events[-1].b64_json)
            assert events[-1].size == f"{W}x{H}" and np.array_equal(final, WideImages.image(7))
            px = events[0].model_extra["pixel_rows"]
            assert part.shape == (H, W, 4) and px == events[0].model_extra["rows"] * H // 2 and 0 < px < H
            assert np.array_equal(part[:px, :, :3], final[:px]) and (part[px:] == 0).all()
            _raises(c, openai.BadRequestError, 400, "size", f"valid: '{W}x{H}'", prompt="3", size=f"{H}x{W}")
    finally:
        front.stop(10)
