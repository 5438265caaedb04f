"""`lisa-trt serve` end to end on the demo engines: real Triton (PyTriton's tritonserver),
127.0.0.1 only, bounded waits, servers always stopped. Skipped without the `serve` extra."""

import json
import signal
import socket
import subprocess
import sys
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
from lisa_trt.serve.client import LisaClient, ServeError, make_inputs
from lisa_trt.serve.process import ServerProcess, alive, descendants, free_ports
from lisa_trt.serve.server import ready_status

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (assets_present() and bundled_file("demo-lisa", "drafters") is not None
         and bundled_file("demo", "tables") is not None),
    reason="bundled demo assets not built (scripts/demo/*)")]

REQUEST_TIMEOUT, STOP_TIMEOUT = 300, 120


def Server(engine_dir, log_path, window_ms=20, max_batch=16, **kw):
    return ServerProcess(engine_dir, log_path, backend="ort", threads=1, window_ms=window_ms, max_batch=max_batch,
                         stop_timeout=STOP_TIMEOUT, **kw)


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
    # no verify in the requests: the server runs the bundle's recorded choice, as Pipeline does by default
    ref = pipe.generate([Prompt(i, class_id=int(c), seed=s) for i, (c, s) in enumerate(jobs)], verify="auto",
                        batch=True)
    for i, ((img, st), want, rs) in enumerate(zip(res, ref.images, ref.stats)):
        assert np.array_equal(img, np.asarray(want)), f"request {i} differs from Pipeline.generate"
        # per-row seeds: the row's decode is its own whatever its batch, so are its forwards and MAL
        assert st["forwards"] == rs["forwards"] and st["mal"] == pytest.approx(rs["mal"], rel=1e-6), (i, st, rs)
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


def _one_line_client_error(e, status=400):
    msg = e.message() if isinstance(e, Exception) and hasattr(e, "message") else str(e)
    assert getattr(e, "status", lambda: None)() == str(status), (e.status(), msg)
    assert "\n" not in msg.strip() and "Traceback" not in msg and ".py" not in msg and "/lisa_trt/" not in msg, msg
    return msg


def test_malformed_requests_get_400_with_one_line_message_and_server_keeps_serving(server):
    from tritonclient.utils import InferenceServerException

    c = LisaClient(server.url, timeout=REQUEST_TIMEOUT)
    for kw, msg in [(dict(prompt="nope"), "unknown class 'nope' (use ids 0..7 or names"),
                    (dict(prompt="1", top_p=2.0), "top_p=2.0 is out of range"),
                    (dict(prompt="1", verify="bogus"), "unknown verify rule 'bogus'; valid:"),
                    (dict(prompt="1", cfg_scale=-3.0), "cfg_scale=-3.0 is out of range")]:
        with pytest.raises(ServeError, match=msg.replace("(", "\\(").replace(")", "\\)")) as got:
            c.generate(**kw)
        assert got.value.status == 400 and "\n" not in str(got.value) and "Traceback" not in str(got.value)
        raw = http.InferenceServerClient(server.url, network_timeout=REQUEST_TIMEOUT)
        try:
            with pytest.raises(InferenceServerException) as e:
                raw.infer("lisa", make_inputs(http, **kw))
            _one_line_client_error(e.value)
        finally:
            raw.close()
    p = np.array([[b"1"]], dtype=object)
    bad = [
        ([_inp("prompt", p, "BYTES"), _inp("seed", np.array([[1.5]], np.float32), "FP32")], "seed"),  # dtype
        ([_inp("prompt", np.array([[b"1", b"2"]], dtype=object), "BYTES")], "prompt"),  # shape
        ([_inp("prompt", np.array([[b"1"]] * 17, dtype=object), "BYTES")], "batch"),  # > --max-batch 16
        ([_inp("seed", np.array([[1]], np.int64), "INT64")], "prompt"),  # no prompt
    ]
    for inputs, field in bad:
        with pytest.raises(InferenceServerException) as e:
            _raw_infer(server.url, inputs)
        assert field in _one_line_client_error(e.value)
    import tritonclient.grpc as grpc  # gRPC: the same message with INVALID_ARGUMENT

    g = grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    try:
        assert g.is_server_ready() and g.is_model_ready("lisa")
        with pytest.raises(InferenceServerException) as e:
            g.infer("lisa", make_inputs(grpc, "nope"), client_timeout=REQUEST_TIMEOUT)
        assert "INVALID_ARGUMENT" in str(e.value.status()) and "unknown class 'nope'" in e.value.message()
    finally:
        g.close()
    img, st = c.generate("coffee", seed=1)
    assert img.shape == (64, 64, 3) and st["batch"] == 1  # served after the bad requests (its stats: the test above)
    c.close()
    assert server.proc.poll() is None
    assert "Traceback" not in server.text()  # client errors are not server faults


def test_bad_request_in_a_dynamic_batch_does_not_fail_its_neighbours(server):
    jobs = [("2", 11), ("nope", 12), ("5", 13), ("coffee", 14)]

    def one(job):
        c = LisaClient(server.url, timeout=REQUEST_TIMEOUT)
        try:
            return c.generate(job[0], seed=job[1])
        except ServeError as e:
            return e
        finally:
            c.close()

    with ThreadPoolExecutor(len(jobs)) as ex:
        res = list(ex.map(one, jobs))
    assert isinstance(res[1], ServeError) and res[1].status == 400 and "unknown class 'nope'" in str(res[1])
    for r in res[:1] + res[2:]:
        assert not isinstance(r, Exception), r
        assert r[0].shape == (64, 64, 3)
    assert max(r[1]["batch"] for r in res[:1] + res[2:]) > 1  # the valid ones were decoded together


def _cli(args):
    """Run the `lisa-trt` console script's entry point (from pyproject) with args; -> (rc, stdout + stderr)."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()  # [project.scripts] (tomllib is 3.11+)
    mod, fn = re.search(r'^lisa-trt\s*=\s*"([\w.]+):(\w+)"', text, re.M).groups()
    r = subprocess.run([sys.executable, "-c", f"import sys; from {mod} import {fn}; sys.exit({fn}())", *args],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def test_ready_means_can_serve_two_servers_side_by_side_third_refused(server, engine_dir, tmp_path):
    """A second server (2 instances) on other ports: from the first 200 of /v2/health/ready on,
    no inference request gets a 404; both servers serve; a third on a taken port is refused before
    it starts anything (one line naming the port, no Triton output)."""
    from tritonclient.utils import InferenceServerException

    b = Server(engine_dir, tmp_path / "b.log", instances=2, wait=False)
    try:
        t0, seen = time.monotonic(), set()
        while (st := ready_status("127.0.0.1", b.http, timeout=1.0)) != 200:
            seen.add(st)
            assert b.proc.poll() is None, b.text()[-3000:]
            assert time.monotonic() - t0 < 300, f"not ready after 300 s:\n{b.text()[-3000:]}"
            time.sleep(0.05)
        codes = []

        def infer(k):
            c = http.InferenceServerClient(b.url, network_timeout=REQUEST_TIMEOUT)
            try:
                c.infer("lisa", make_inputs(http, str(k), seed=k))
                codes.append(200)
            except InferenceServerException as e:
                codes.append(int(e.status()) if str(e.status()).isdigit() else e.status())
            finally:
                c.close()

        with ThreadPoolExecutor(3) as ex:  # sent the moment the server first says ready
            list(ex.map(infer, range(3)))
        assert codes == [200, 200, 200], (codes, b.text()[-3000:])
        assert 503 not in seen and seen <= {None}, seen  # before ready nothing answered at all (no early 200)
        log = b.text()
        assert "ready after" in log and "loaded and warmed up" in log
        for inst in ("lisa_0_0", "lisa_0_1"):  # both instances decoded in initialize() and answered
            # Triton's warm-up request before the server first said ready
            assert log.index(f"instance {inst} loaded and warmed up") < log.index("ready after"), log[-3000:]
            assert log.index(f"instance {inst} answered its first request (ok)") < log.index("ready after"), log[-3000:]
        assert LisaClient(server.url).generate("cat", seed=2)[0].shape == (64, 64, 3)  # side by side
        # a third server: every port it would use is taken (one at a time) -> refused at once, named
        h, g, m = free_ports(3)
        for args, taken in [(["--http-port", str(b.http), "--grpc-port", str(g), "--metrics-port", str(m)],
                             f"port {b.http} (--http-port)"),
                            (["--http-port", str(h), "--grpc-port", str(server.grpc), "--metrics-port", str(m)],
                             f"port {server.grpc} (--grpc-port)"),
                            (["--http-port", str(h), "--grpc-port", str(g), "--metrics-port", str(b.metrics)],
                             f"port {b.metrics} (--metrics-port)")]:
            rc, out = _cli(["serve", str(engine_dir), *args])
            assert rc == 2 and taken in out and "already in use" in out, out  # before Triton: no Triton log lines
            assert len(out.strip().splitlines()) == 1 and "Traceback" not in out and "libtritonserver" not in out, out
    finally:
        b.stop()


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
        from served import post_raw, read_response, wait_read_by_server

        def body(k):
            return json.dumps({"inputs": [{"name": "prompt", "shape": [1, 1], "datatype": "BYTES", "data": [str(k)]},
                                          {"name": "seed", "shape": [1, 1], "datatype": "INT64", "data": [k]}]}).encode()

        socks = [post_raw(srv.http, "/v2/models/lisa/infer", body(k)) for k in range(4)]
        wait_read_by_server(srv.http, socks)  # every request is inside Triton (it read them all)
        srv.proc.send_signal(signal.SIGTERM)
        for s in socks:
            status, raw = read_response(s)
            assert status == 200, (status, raw[:300], srv.text()[-3000:])
            outs = {o["name"]: o for o in json.loads(raw)["outputs"]}
            assert outs["image"]["shape"] == [1, 64, 64, 3] and outs["error"]["data"] == [""], outs.get("error")
        assert srv.proc.wait(STOP_TIMEOUT) == 0, srv.text()[-3000:]
        t0 = time.monotonic()  # the children exit with it: wait for that (generously), not a fixed second
        while (left := [p for p in kids if alive(p)]) and time.monotonic() - t0 < 60:
            time.sleep(0.1)
        assert not left, f"processes left 60 s after the server exited: {left}"
    finally:
        srv.stop()
