"""`lisa-trt serve --openai-port` end to end on the demo engines, driven by the official `openai`
client: real Triton (PyTriton's tritonserver) behind the OpenAI front end, 127.0.0.1 only,
bounded waits, the server always stopped. Skipped without the `serve` extra."""

import base64
import io
import urllib.request
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

try:
    import openai
    import pytriton.triton  # noqa: F401
    import tritonclient.http as http
except Exception as e:  # noqa: BLE001 - ImportError, or pytriton broken by the numpy in this env
    pytest.skip(f"these tests need the serve and dev extras (nvidia-pytriton, tritonclient, openai): {e}",
                allow_module_level=True)

from lisa_trt.demo.registry import assets_present
from lisa_trt.models.artifact_sets import bundled_file
from lisa_trt.runtime.prompts import Prompt
from lisa_trt.serve.process import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (assets_present() and bundled_file("demo-lisa", "drafters") is not None
         and bundled_file("demo", "tables") is not None),
    reason="bundled demo assets not built (scripts/demo/*)")]

TIMEOUT = 300


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    from lisa_trt.runtime.demo import ensure_demo_bundle

    return ensure_demo_bundle(tmp_path_factory.mktemp("openai") / "engines", echo=lambda *a: None)


@pytest.fixture(scope="module")
def server(engine_dir, tmp_path_factory):
    s = ServerProcess(engine_dir, tmp_path_factory.mktemp("log") / "server.log", backend="ort", threads=1,
                      window_ms=20, max_batch=16, stop_timeout=120, openai=True, progressive=True)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def pipe(engine_dir):
    from lisa_trt.runtime.pipeline import Pipeline

    with Pipeline.from_dir(engine_dir, backend="ort", threads=1) as p:
        yield p


def _client(server):
    return openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=TIMEOUT)


def _png(b64: str) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))))


def test_images_through_triton_equal_the_pipeline(server, pipe):
    c = _client(server)
    r = c.images.generate(prompt="coffee", n=2, size="64x64", extra_body={"seed": 21})
    # no verify sent: the server runs the bundle's recorded choice, as Pipeline does by default
    ref = pipe.generate([Prompt(0, class_id=1, seed=21), Prompt(1, class_id=1, seed=22)], verify="auto",
                        batch=True)
    for d, want in zip(r.data, ref.images):
        img = _png(d.b64_json)
        assert img.shape == (64, 64, 3) and np.array_equal(img, np.asarray(want))
    assert r.usage.output_tokens == 2 * 256 and r.usage.model_extra["batch"] >= 2
    assert r.usage.model_extra["mal"] == pytest.approx(sum(s["mal"] for s in ref.stats) / 2, abs=1e-3)
    assert r.usage.model_extra["forwards"] == sum(s["forwards"] for s in ref.stats)  # Triton's `forwards` output
    health = urllib.request.urlopen(server.openai_url.replace("/v1", "/health"), timeout=30)
    assert health.status == 200
    c.close()


def _stream_executions(server, above: int = -1, wait: float = 30.0) -> int:
    """Triton's execution count of model 'lisa_stream', once it exceeds `above` (Triton records a
    decoupled request's statistics when it releases the request, which may follow its final
    response) or `wait` seconds passed."""
    import time

    tc = http.InferenceServerClient(server.url)
    t0 = time.monotonic()
    try:
        while True:
            n = int(tc.get_inference_statistics("lisa_stream")["model_stats"][0].get("execution_count", 0))
            if n > above or time.monotonic() - t0 > wait:
                return n
            time.sleep(0.2)
    finally:
        tc.close()


def test_progressive_partials_through_triton_are_stream_each_then_the_non_streaming_image(server, pipe):
    """stream + partial_images through Triton's decoupled model 'lisa_stream' (gRPC streaming):
    the partials are the images ServeModel.stream_each makes in-process for the same request
    (decoded from the tokens committed so far, RGB, no cut `pixel_rows`), with increasing
    `tokens`, sent before `completed`, whose PNG is the non-streaming image of the same seed."""
    from lisa_trt.serve.model import ServeModel

    c = _client(server)
    before = _stream_executions(server)
    events = list(c.images.generate(prompt="1", n=2, stream=True, partial_images=3, extra_body={"seed": 21}))
    assert _stream_executions(server, before) == before + 1  # the progressive channel answered, not the cut fallback
    types_ = [e.type for e in events]
    assert types_ == ["image_generation.partial_image"] * 6 + ["image_generation.completed"] * 2, types_
    got = {}
    (err, want), = [ServeModel(pipe, max_batch=16).stream_each(
        {"prompt": np.array([[b"1"], [b"1"]], dtype=object), "seed": np.array([[21], [22]])}, 3,
        lambda k, tokens, images: got.setdefault(k, (tokens, images.copy())))]
    assert err is None and sorted(got) == [0, 1, 2]
    for e in events[:6]:
        x, k, i = e.model_extra, e.partial_image_index, e.model_extra["image_index"]
        assert "pixel_rows" not in x and x["tokens"] == got[k][0], (k, x)
        assert np.array_equal(_png(e.b64_json), got[k][1][i]), f"partial {k} of image {i} differs from stream_each"
    tokens = [e.model_extra["tokens"] for e in events[:6:2]]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3 and tokens[-1] < 256
    plain = c.images.generate(prompt="1", n=2, extra_body={"seed": 21})
    for e, d, w in zip(events[6:], plain.data, want["image"]):
        assert np.array_equal(_png(e.b64_json), _png(d.b64_json)) and np.array_equal(_png(d.b64_json), w)
    with pytest.raises(openai.BadRequestError) as bad:  # a failure before the first event: an ordinary 400
        list(c.images.generate(prompt="nope", stream=True, partial_images=2))
    assert bad.value.body["param"] == "prompt" and "unknown class 'nope'" in bad.value.body["message"]
    c.close()


def test_a_streaming_client_that_disconnects_cancels_its_decode_in_triton(server, pipe):
    """The openai client closes a progressive stream after its first partial image: the front end
    cancels the gRPC stream, 'lisa_stream' sees request.is_cancelled() at its next decode step and
    logs how many steps it ran (fewer than the full decode of the same request), and the next
    streaming request is served in full, equal to the Pipeline."""
    import re
    import time

    c = _client(server)
    line = re.compile(r"stream request cancelled by its client: decode stopped after (\d+) step")
    before = len(line.findall(server.text()))
    kw = dict(prompt="1", stream=True, partial_images=3, extra_body={"seed": 5, "verify": "vanilla"})
    events = c.images.generate(**kw)
    first = next(iter(events))
    events.close()  # the SSE client goes away
    assert first.type == "image_generation.partial_image" and first.partial_image_index == 0
    t0 = time.monotonic()
    while len(line.findall(server.text())) == before:  # the model's own log line, bounded wait
        assert time.monotonic() - t0 < 120, server.text()[-3000:]
        time.sleep(0.2)
    ran = int(line.findall(server.text())[before])
    full = []  # one on_step call per decode step of the same request
    ref = pipe.generate([Prompt(0, class_id=1, seed=5)], verify="vanilla", batch=True,
                        on_step=lambda step: full.append(1))
    assert 0 < ran < len(full), (ran, len(full))
    again = list(c.images.generate(**kw))
    assert [e.type for e in again] == ["image_generation.partial_image"] * 3 + ["image_generation.completed"]
    assert np.array_equal(_png(again[-1].b64_json), np.asarray(ref.images[0]))
    assert server.proc.poll() is None and "Traceback" not in server.text()
    c.close()


def _stub_rss(server) -> dict:
    """{model name: [RSS in MiB of each of its Python-backend stub processes]} below the server (/proc)."""
    from lisa_trt.serve.process import descendants

    out = {}
    for pid in descendants(server.proc.pid):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            rss = [ln for ln in open(f"/proc/{pid}/status") if ln.startswith("VmRSS:")]
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"triton_python_backend_stub") and rss:
            model = Path(cmd[1].decode()).parent.parent.name  # .../repo/<model>/1/model.py
            out.setdefault(model, []).append(int(rss[0].split()[1]) / 1024)
    return out


def test_progressive_serve_loads_the_engines_once_and_lisa_is_their_proxy(server, pipe):
    """With --progressive the engines are loaded once, in 'lisa_stream' (one pipeline, one warm-up
    decode in the log); 'lisa' is the proxy (no engines: its stub is a fraction of the engine
    model's memory) and answers tritonclient (`lisa-trt client`) as before: the Pipeline's image,
    a bad request a 400 with the model's message."""
    from lisa_trt.serve.client import LisaClient, ServeError

    log = server.text()
    assert log.count("loaded and warmed up (") == 1 and "instance lisa_stream_0_0 loaded and warmed up" in log, log[-3000:]
    assert log.count("proxy of model 'lisa_stream' (no engines)") == 1
    rss = _stub_rss(server)
    assert sorted(rss) == ["lisa", "lisa_stream"] and len(rss["lisa"]) == len(rss["lisa_stream"]) == 1, rss
    assert rss["lisa"][0] < rss["lisa_stream"][0] / 2, rss
    print(f"stub RSS (MiB): {rss}")
    c = LisaClient(server.url, timeout=TIMEOUT)
    try:
        img, st = c.generate("coffee", seed=13)
        ref = pipe.generate([Prompt(0, class_id=1, seed=13)], verify="auto", batch=True)
        assert np.array_equal(img, np.asarray(ref.images[0]))
        assert st["forwards"] == ref.stats[0]["forwards"]  # the proxy answers the engine model's own counts
        with pytest.raises(ServeError) as e:
            c.generate("nope")
        assert e.value.status == 400 and "unknown class 'nope'" in str(e.value)
    finally:
        c.close()
    tc = http.InferenceServerClient(server.url)
    try:
        cfg = tc.get_model_config("lisa")
    finally:
        tc.close()
    assert cfg["parameters"]["engine_model"]["string_value"] == "lisa_stream" and not cfg.get("model_warmup")


def test_triton_errors_reach_the_client_as_openai_errors(server):
    c = _client(server)
    for kw, param, text in [(dict(prompt="nope"), "prompt", "unknown class 'nope' (use ids 0..7 or names"),
                            (dict(prompt="1", extra_body={"top_p": 2.0}), "top_p", "top_p=2.0 is out of range"),
                            (dict(prompt="1", extra_body={"verify": "bogus"}), "verify", "unknown verify rule")]:
        with pytest.raises(openai.BadRequestError) as e:
            c.images.generate(**kw)
        assert e.value.body["param"] == param and text in e.value.body["message"], e.value.body
        assert "Traceback" not in e.value.body["message"] and "[request id" not in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        c.images.generate(prompt="1", model="dall-e-3")
    assert "Traceback" not in server.text()  # client errors are not server faults
    c.close()


MALFORMED = [  # (request, the client's exception type)
    (dict(prompt="nope"), openai.BadRequestError),
    (dict(prompt="1", size="512x512"), openai.BadRequestError),
    (dict(prompt="1", extra_body={"top_p": 2.0}), openai.BadRequestError),
    (dict(prompt="1", model="gpt-image-1"), openai.NotFoundError),
]


def test_32_concurrent_clients_mixed_valid_and_malformed_none_lost_and_batched(server, pipe):
    jobs = [(MALFORMED[i // 4 % 4] if i % 4 == 3 else (dict(prompt=str(i % 8), extra_body={"seed": 100 + i}), None))
            for i in range(32)]

    def one(job):
        kw, exc = job
        c = _client(server)
        try:
            return c.images.generate(**kw)
        except openai.APIStatusError as e:
            return e
        finally:
            c.close()

    with ThreadPoolExecutor(32) as ex:
        futures = [ex.submit(one, job) for job in jobs]
        # batching by the batcher's queue, not by arrival times: Triton held two requests of 'lisa' at once,
        # so its next execution takes both (the dynamic batcher's rule)
        held = _wait_pending(server, "lisa", 2, futures)
        res = [f.result() for f in futures]
    assert held >= 2, "Triton's queue of model 'lisa' never held two requests: the clients were decoded one by one"
    assert len(res) == 32
    valid = [(i, r) for i, ((kw, exc), r) in enumerate(zip(jobs, res)) if exc is None]
    for (kw, exc), r in zip(jobs, res):
        if exc is not None:
            assert type(r) is exc, (kw, r)
    assert all(not isinstance(r, Exception) and len(r.data) == 1 for _, r in valid), [r for _, r in valid]
    ref = pipe.generate([Prompt(k, class_id=i % 8, seed=100 + i) for k, (i, _) in enumerate(valid)], verify="auto",
                        batch=True)
    for (i, r), want in zip(valid, ref.images):
        assert np.array_equal(_png(r.data[0].b64_json), np.asarray(want)), f"client {i} differs from the Pipeline"
    assert max(r.usage.model_extra["batch"] for _, r in valid) > 1
    tc = http.InferenceServerClient(server.url)
    try:
        stats = tc.get_inference_statistics("lisa")["model_stats"][0]
    finally:
        tc.close()
    sizes = {int(b["batch_size"]) for b in stats["batch_stats"]}
    assert max(sizes) > 1, stats["batch_stats"]  # Triton's own count: executions of more than one row
    engine = _batch_sizes(server, "lisa_stream", above=1)  # the proxy's requests batched again in the engine model
    assert max(engine) > 1, engine
    assert server.proc.poll() is None


def _wait_pending(server, model: str, n: int, futures, timeout: float = 600.0) -> int:
    """The most requests Triton's queue of `model` held at once (its pending-request gauge), polled
    until it reaches `n`, the futures are all done, or `timeout` seconds passed."""
    import time

    url, most, t0 = f"http://127.0.0.1:{server.metrics}/metrics", 0, time.monotonic()
    while most < n and not all(f.done() for f in futures) and time.monotonic() - t0 < timeout:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        most = max([most] + [int(float(ln.rsplit(" ", 1)[1])) for ln in text.splitlines()
                             if ln.startswith("nv_inference_pending_request_count{") and f'model="{model}"' in ln])
        time.sleep(0.02)
    return most


def _batch_sizes(server, model: str, above: int, wait: float = 30.0) -> dict:
    """{batch size: executions} of `model` in Triton's statistics, once one exceeds `above` rows or
    `wait` seconds passed (a decoupled model's statistics are recorded when Triton releases the
    request, which may follow its final response)."""
    import time

    tc = http.InferenceServerClient(server.url)
    t0 = time.monotonic()
    try:
        while True:
            st = tc.get_inference_statistics(model)["model_stats"][0]
            got = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in st.get("batch_stats", [])}
            if max(got, default=0) > above or time.monotonic() - t0 > wait:
                return got
            time.sleep(0.2)
    finally:
        tc.close()


def test_openai_api_command_fronts_a_running_triton(server, engine_dir, tmp_path):
    """`lisa-trt openai-api` (the sidecar form) in front of the module's Triton: the same image as
    serve's own front end; SIGTERM exits 0."""
    import signal
    import subprocess
    import sys
    import time

    from lisa_trt.serve.process import free_ports

    (port,) = free_ports(1)
    log = open(tmp_path / "api.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "lisa_trt", "openai-api", str(engine_dir), "--triton-url",
                             server.url, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        base, t0 = f"http://127.0.0.1:{port}/v1", time.monotonic()
        while True:
            try:
                urllib.request.urlopen(f"{base}/models", timeout=5)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() - t0 < 120, (tmp_path / "api.log").read_text()
                time.sleep(0.3)
        side = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=TIMEOUT)
        a = side.images.generate(prompt="cat", extra_body={"seed": 3})
        b = _client(server).images.generate(prompt="cat", extra_body={"seed": 3})
        assert np.array_equal(_png(a.data[0].b64_json), _png(b.data[0].b64_json))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, (tmp_path / "api.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        log.close()


def test_sigterm_finishes_in_flight_openai_requests_then_exits_0(engine_dir, tmp_path):
    import json
    import signal

    srv = ServerProcess(engine_dir, tmp_path / "server.log", backend="ort", threads=1, window_ms=5,
                        stop_timeout=120, openai=True)
    try:
        from served import post_raw, read_response, wait_read_by_server

        socks = [post_raw(srv.openai, "/v1/images/generations", json.dumps({"prompt": str(i), "seed": i}).encode())
                 for i in range(4)]
        wait_read_by_server(srv.openai, socks)  # every request is inside the front end (it read them all)
        srv.proc.send_signal(signal.SIGTERM)
        for s in socks:
            status, raw = read_response(s)
            assert status == 200, (status, raw[:300], srv.text()[-3000:])
            assert len(json.loads(raw)["data"]) == 1
        assert srv.proc.wait(120) == 0, srv.text()[-3000:]
    finally:
        srv.stop()
