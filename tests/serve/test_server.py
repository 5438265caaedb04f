"""`lisa-trt serve` end to end on the demo engines: real Triton (PyTriton), 127.0.0.1 only,
bounded waits, servers always stopped. Skipped without the `serve` extra."""

import json
import signal
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

try:
    import pytriton.triton  # noqa: F401
    import tritonclient.http as http
except Exception as e:  # noqa: BLE001 - ImportError, or pytriton broken by the numpy in this env
    pytest.skip(f"serving tests need the serve extra (nvidia-pytriton, tritonclient): {e}", allow_module_level=True)

from lisa_trt.models.artifact_sets import bundled_file
from lisa_trt.demo.registry import assets_present
from lisa_trt.runtime.prompts import Prompt
from lisa_trt.serve.client import LisaClient, ServeError
from lisa_trt.serve.process import ServerProcess, alive, descendants

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (assets_present() and bundled_file("demo-lisa", "drafters") is not None
         and bundled_file("demo", "tables") is not None),
    reason="bundled demo assets not built (scripts/demo/*)")]

REQUEST_TIMEOUT, STOP_TIMEOUT = 300, 120


def Server(engine_dir, log_path, window_ms=20, max_batch=16):
    return ServerProcess(engine_dir, log_path, backend="ort", threads=1, window_ms=window_ms, max_batch=max_batch,
                         stop_timeout=STOP_TIMEOUT)


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    from lisa_trt.runtime.demo import ensure_demo_bundle

    return ensure_demo_bundle(tmp_path_factory.mktemp("serve") / "engines", echo=lambda *a: None)


@pytest.fixture(scope="module")
def server(engine_dir, tmp_path_factory):
    s = Server(engine_dir, tmp_path_factory.mktemp("log") / "server.log")
    yield s
    s.stop()


def _generate_many(url, jobs):
    def one(job):
        c = LisaClient(url, timeout=REQUEST_TIMEOUT)
        try:
            return c.generate(job[0], seed=job[1])
        finally:
            c.close()

    with ThreadPoolExecutor(len(jobs)) as ex:
        return list(ex.map(one, jobs))


def test_16_concurrent_requests_batched_and_equal_to_pipeline(server, engine_dir):
    from lisa_trt.runtime.pipeline import Pipeline

    jobs = [(str(i % 8), 100 + i) for i in range(16)]
    res = _generate_many(server.url, jobs)
    assert len(res) == 16 and all(img.shape == (64, 64, 3) and img.dtype == np.uint8 for img, _ in res)
    batches = [st["batch"] for _, st in res]
    assert max(batches) > 1, batches
    pipe = Pipeline.from_dir(engine_dir, backend="ort", threads=1)
    ref = pipe.generate([Prompt(i, class_id=int(c), seed=s) for i, (c, s) in enumerate(jobs)], verify="gasv",
                        batch=True)
    for i, ((img, st), want) in enumerate(zip(res, ref.images)):
        assert np.array_equal(img, np.asarray(want)), f"request {i} differs from Pipeline.generate"
        assert st["mal"] >= 1.0 and st["seconds"] > 0
    ready = urllib.request.urlopen(f"http://{server.url}/v2/health/ready", timeout=10)
    assert ready.status == 200
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics}/metrics", timeout=10).read().decode()
    assert 'nv_inference_request_success{model="lisa"' in metrics


def _raw_infer(url, inputs):
    c = http.InferenceServerClient(url, network_timeout=REQUEST_TIMEOUT)
    try:
        return c.infer("lisa", inputs)
    finally:
        c.close()


def _inp(name, arr, dt):
    i = http.InferInput(name, list(arr.shape), dt)
    i.set_data_from_numpy(arr)
    return i


def test_malformed_requests_get_errors_and_server_keeps_serving(server):
    from tritonclient.utils import InferenceServerException

    c = LisaClient(server.url, timeout=REQUEST_TIMEOUT)
    for kw, msg in [(dict(prompt="nope"), "unknown class"), (dict(prompt="1", top_p=2.0), "top_p"),
                    (dict(prompt="1", verify="bogus"), "unknown verify"), (dict(prompt="1", cfg_scale=-3.0), "cfg")]:
        with pytest.raises(ServeError, match=msg):
            c.generate(**kw)
    p = np.array([[b"1"]], dtype=object)
    bad = [
        [_inp("prompt", p, "BYTES"), _inp("seed", np.array([[1.5]], np.float32), "FP32")],  # dtype
        [_inp("prompt", np.array([[b"1", b"2"]], dtype=object), "BYTES")],  # shape
        [_inp("prompt", np.array([[b"1"]] * 17, dtype=object), "BYTES")],  # batch > --max-batch 16
        [_inp("seed", np.array([[1]], np.int64), "INT64")],  # no prompt
    ]
    for inputs in bad:
        with pytest.raises(InferenceServerException):
            _raw_infer(server.url, inputs)
    img, st = c.generate("coffee", seed=1)
    assert img.shape == (64, 64, 3) and st["mal"] >= 1.0
    c.close()
    assert server.proc.poll() is None


def test_client_disconnecting_mid_request_does_not_break_the_next(server):
    body = json.dumps({"inputs": [{"name": "prompt", "shape": [1, 1], "datatype": "BYTES", "data": ["2"]},
                                  {"name": "seed", "shape": [1, 1], "datatype": "INT64", "data": [5]}]}).encode()
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", server.http), timeout=10)
        s.sendall(b"POST /v2/models/lisa/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.3)
        s.close()  # gone before the image is ready
    res = _generate_many(server.url, [("cat", 1), ("rocket", 2)])
    assert all(img.shape == (64, 64, 3) for img, _ in res)
    assert server.proc.poll() is None


def test_sigterm_completes_in_flight_requests_and_leaves_no_process(engine_dir, tmp_path):
    srv = Server(engine_dir, tmp_path / "server.log", window_ms=5)
    try:
        kids = descendants(srv.proc.pid)
        assert kids, "tritonserver should run as a child"
        box = {}
        th = threading.Thread(target=lambda: box.setdefault("r", _generate_many(srv.url, [(str(i), i) for i in range(4)])))
        th.start()
        time.sleep(2.0)  # requests are in Triton / being decoded
        srv.proc.send_signal(signal.SIGTERM)
        th.join(REQUEST_TIMEOUT)
        assert not th.is_alive() and len(box.get("r", [])) == 4
        assert all(img.shape == (64, 64, 3) for img, _ in box["r"])
        assert srv.proc.wait(STOP_TIMEOUT) == 0, srv.text()[-3000:]
        time.sleep(1.0)
        left = [p for p in kids + descendants(srv.proc.pid) if alive(p)]
        assert not left, f"processes left after SIGTERM: {left}"
    finally:
        srv.stop()
