"""The progressive channel through Triton, without a server: the decoupled model 'lisa_stream'
(its config parses as decoupled; its model.py, under a stand-in pb_utils with a response sender,
sends stream_each's partials then one COMPLETE_FINAL response equal to infer_each's answer; 400 /
500 ride in `status`), and TritonImages.stream reading such a stream from a fake gRPC client.
The same channel through a real `lisa-trt serve --openai-port` is in test_openai_serve.py."""

import asyncio
import importlib
import json
import sys
import threading
import types

import numpy as np
import pytest

from lisa_trt.serve.model import OUTPUTS, STREAM_INPUTS, STREAM_MODEL_NAME, STREAM_OUTPUTS, ServeModel

FINAL = 1  # triton_python_backend_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _b(*s):
    return np.array([[x.encode()] for x in s], dtype=object)


class Tensor:  # pb_utils.Tensor / a request's input tensor
    def __init__(self, name, arr):
        self.name, self.arr = name, arr

    def as_numpy(self):
        return self.arr


class Response:  # pb_utils.InferenceResponse as the decoupled model.py builds it
    def __init__(self, output_tensors, error=None):
        self.outputs = {t.name: t.arr for t in output_tensors}
        assert error is None, "lisa_stream answers failures in `status`, never as a Triton error"

    def as_numpy(self, name):  # what tritonclient's InferResult offers the front end
        return self.outputs[name]


class Request(dict):
    """A request of the stand-in backend: its inputs, a response sender recording (response, flags),
    and pb_utils.InferenceRequest.is_cancelled() (the Python backend's, Triton >= 23.10), True once
    `cancel_after` responses were sent (None: never; the client went away after that many) and
    counting its calls in `asked`."""

    def __init__(self, cancel_after=None, **inputs):
        super().__init__({k: Tensor(k, v) for k, v in inputs.items()})
        self.sent, self.cancel_after, self.asked = [], cancel_after, 0

    def get_response_sender(self):
        return types.SimpleNamespace(send=lambda r, flags=0: self.sent.append((r, flags)))

    def is_cancelled(self):
        self.asked += 1
        return self.cancel_after is not None and len(self.sent) >= self.cancel_after


@pytest.fixture
def stream_model(pipe, tmp_path, monkeypatch):
    """repo.py's STREAM_MODEL_PY, initialised on the in-memory pipeline."""
    from lisa_trt.serve.repo import STREAM_MODEL_PY, config_pbtxt

    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except Exception:  # noqa: BLE001
        pytest.skip("tritonclient[grpc] not installed (the serve extra)")
    cfg = text_format.Parse(config_pbtxt(engine_dir="e", backend="ort", max_batch=4, max_queue_delay_ms=5,
                                         instances=3, kind="cpu", stream=True), model_config_pb2.ModelConfig())
    pb = types.SimpleNamespace(Tensor=Tensor, InferenceResponse=Response, TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL,
                               get_input_tensor_by_name=lambda req, n: req.get(n))
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    import lisa_trt.runtime.pipeline as P

    monkeypatch.setattr(P.Pipeline, "from_dir", classmethod(lambda cls, d, **kw: pipe))
    (tmp_path / "model.py").write_text(STREAM_MODEL_PY)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("model", None)
    m = importlib.import_module("model").TritonPythonModel()
    m.initialize({"model_config": json.dumps({"max_batch_size": 4, "input": [{"name": i.name} for i in cfg.input],
                                              "parameters": {"engine_dir": {"string_value": "e"}}}),
                  "model_repository": str(tmp_path), "model_version": "1"})
    yield cfg, m
    sys.modules.pop("model", None)


def test_stream_model_config_is_decoupled_with_its_own_batcher(stream_model):
    """'lisa_stream' holds the engines: decoupled, its own dynamic batcher and the instance groups
    ('lisa''s, when it held them), no model_warmup (its initialize decodes once)."""
    from tritonclient.grpc import model_config_pb2

    cfg, _ = stream_model
    assert cfg.name == STREAM_MODEL_NAME and cfg.model_transaction_policy.decoupled
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 5000 and not cfg.model_warmup
    assert cfg.instance_group[0].count == 3 and cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    k = next(i for i in cfg.input if i.name == "partial_images")
    assert k.optional and model_config_pb2.DataType.Name(k.data_type) == "TYPE_INT32"
    assert {o.name for o in cfg.output} == set(OUTPUTS) | set(STREAM_OUTPUTS)
    assert cfg.parameters["engine_dir"].string_value == "e"


def test_stream_model_decodes_the_plain_requests_of_an_execution_together(stream_model, pipe):
    """One execution of 'lisa_stream' (what its dynamic batcher hands over) with two requests without
    partials (what the proxy 'lisa' forwards) and one streaming request: the plain requests' rows are
    decoded as one batch (`batch` 3, images equal to infer_each of both together) and answered
    first; the streaming one then gets its partials and its final answer."""
    _, m = stream_model
    order = []

    def req(name, **inputs):
        r = Request(**inputs)
        r.get_response_sender = lambda: types.SimpleNamespace(
            send=lambda resp, flags=0: (r.sent.append((resp, flags)), order.append((name, flags))))
        return r

    a = req("a", prompt=_b("c2", "c3"), seed=np.array([[4], [5]]))
    s = req("s", prompt=_b("c1"), seed=np.array([[6]]), partial_images=np.array([[2]], np.int32))
    b = req("b", prompt=_b("c4"), seed=np.array([[7]]), partial_images=np.array([[0]], np.int32))
    assert m.execute([a, s, b]) is None
    out = ServeModel(pipe, max_batch=4).infer_each([{"prompt": _b("c2", "c3"), "seed": np.array([[4], [5]])},
                                                   {"prompt": _b("c4"), "seed": np.array([[7]])}])
    for r, (err, want) in zip((a, b), out):
        ((final, flags),) = r.sent
        assert err is None and flags == FINAL and (final.as_numpy("status") == 0).all()
        assert (final.as_numpy("batch") == 3).all(), final.as_numpy("batch")  # one decode for both requests
        assert np.array_equal(final.as_numpy("image"), want["image"])
    assert order == [("a", FINAL), ("b", FINAL), ("s", 0), ("s", 0), ("s", FINAL)], order
    assert s.sent[-1][0].as_numpy("batch")[0, 0] == 1


def test_stream_model_sends_partials_then_the_final_answer(stream_model, pipe):
    _, m = stream_model
    ok = Request(prompt=_b("c2", "c3"), seed=np.array([[4], [5]]), partial_images=np.full((2, 1), 3, np.int32))
    bad = Request(prompt=_b("zzz"), partial_images=np.array([[1]], np.int32))
    far = Request(prompt=_b("c1"), partial_images=np.array([[4]], np.int32))
    assert m.execute([ok, bad, far]) is None  # decoupled: every answer goes through the senders
    *parts, (final, flags) = ok.sent
    assert flags == FINAL and all(f == 0 for _, f in parts) and len(parts) == 3
    assert [int(r.as_numpy("partial_index")[0, 0]) for r, _ in parts] == [0, 1, 2]
    tokens = [int(r.as_numpy("tokens")[0, 0]) for r, _ in parts]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3 and tokens[-1] < pipe.config.block_size
    assert all(r.as_numpy("image").shape == final.as_numpy("image").shape for r, _ in parts)
    (err, want), = ServeModel(pipe, max_batch=4).infer_each([{"prompt": _b("c2", "c3"), "seed": np.array([[4], [5]])}])
    assert err is None and np.array_equal(final.as_numpy("image"), want["image"])
    assert final.as_numpy("partial_index")[0, 0] == -1 and (final.as_numpy("status") == 0).all()
    for req, text in ((bad, "unknown class"), (far, "partial_images=4 is out of range; valid: 0..3")):
        (resp, flags), = req.sent  # no partial: only the final answer, failed with 400
        assert flags == FINAL and resp.as_numpy("status")[0, 0] == 400 and text in resp.as_numpy("error")[0, 0].decode()
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(m.model, "_decode_group", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    fault = Request(prompt=_b("c1"))
    m.execute([fault])
    monkeypatch.undo()
    (resp, _), = fault.sent
    assert resp.as_numpy("status")[0, 0] == 500 and "request id" in resp.as_numpy("error")[0, 0].decode()


def test_stream_model_stops_decoding_when_its_request_is_cancelled(stream_model, pipe, caplog):
    """A client that goes away after the first partial image: the model sees the cancellation at the
    next decode step (request.is_cancelled()), stops the decode there, answers once more (status
    499, COMPLETE_FINAL, so Triton releases the request) and serves the next request in full."""
    import logging

    from lisa_trt.runtime.prompts import Prompt
    from lisa_trt.serve.model import CANCELLED_STATUS

    _, m = stream_model
    seed, k = np.array([[4]]), np.array([[3]], np.int32)
    gone = Request(cancel_after=1, prompt=_b("c2"), seed=seed, partial_images=k, verify=_b("vanilla"))
    with caplog.at_level(logging.INFO, logger="lisa_trt.serve"):
        m.execute([gone])
    (part, f0), (final, flags) = gone.sent  # the one partial, then the final answer
    assert f0 == 0 and part.as_numpy("partial_index")[0, 0] == 0 and flags == FINAL
    assert final.as_numpy("status")[0, 0] == CANCELLED_STATUS and "cancelled" in final.as_numpy("error")[0, 0].decode()
    steps = []  # a full decode of the same request: one on_step call per step
    pipe.generate([Prompt(0, class_id=2, seed=4)], verify="vanilla", batch=True, decode=False,
                  on_step=lambda s: steps.append(1))
    ran = int([r.getMessage() for r in caplog.records if "cancelled by its client" in r.getMessage()][0]
              .split("after ")[1].split(" ")[0])
    # partial 0 of 3 comes a quarter of the way; the decode stopped at the step after it
    assert ran == gone.asked < len(steps) // 2, (ran, gone.asked, len(steps))
    assert ran >= len(steps) // 4
    again = Request(prompt=_b("c2"), seed=seed, partial_images=k, verify=_b("vanilla"))
    m.execute([again])  # the instance is free and its pipeline intact
    (err, want), = ServeModel(pipe, max_batch=4).infer_each([{"prompt": _b("c2"), "seed": seed,
                                                               "verify": _b("vanilla")}])
    assert len(again.sent) == 4 and again.sent[-1][0].as_numpy("status")[0, 0] == 0
    assert np.array_equal(again.sent[-1][0].as_numpy("image"), want["image"])


class FakeGrpc:
    """tritonclient.grpc.aio's stream_infer: records the request, answers `responses` ((result, error)
    pairs) through an async iterator with `cancel()` (as tritonclient's _ResponseIterator, which
    cancels the gRPC call); `cancelled` counts those calls."""

    def __init__(self, responses):
        self.responses, self.requests, self.cancelled = responses, [], 0

    def stream_infer(self, inputs_iterator, stream_timeout=None):
        async def gen():
            async for req in inputs_iterator:
                self.requests.append(req)
                for item in self.responses:
                    yield item
                return

        fake = self

        class Responses:
            def __init__(self):
                self.it = gen()

            def __aiter__(self):
                return self

            async def __anext__(self):
                return await self.it.__anext__()

            def cancel(self):
                fake.cancelled += 1
                return True

        return Responses()

    async def close(self):
        pass


def _call(n=2, k=3):
    from lisa_trt.serve.openai_request import ImagesCall

    return ImagesCall(prompt="c2", seeds=tuple(range(4, 4 + n)), knobs={}, stream=True, partial_images=k)


def _drain(images, call):
    async def run():
        return [item async for item in images.stream(call)]
    return asyncio.run(run())


def test_triton_images_stream_reads_partials_then_rows(stream_model):
    from lisa_trt.serve.openai_api import TritonImages

    assert TritonImages("127.0.0.1:1").stream is None  # no gRPC endpoint: the front end cuts from the final image
    _, m = stream_model
    req = Request(prompt=_b("c2", "c2"), seed=np.array([[4], [5]]), partial_images=np.full((2, 1), 3, np.int32))
    m.execute([req])
    images = TritonImages("127.0.0.1:1", grpc_url="127.0.0.1:2")
    fake = FakeGrpc([(r, None) for r, _ in req.sent])
    images._grpc = fake
    items = _drain(images, _call())
    assert [i[0] for i in items] == ["partial"] * 3 + ["done"] and [i[1] for i in items[:3]] == [0, 1, 2]
    final = req.sent[-1][0]
    assert all(np.array_equal(a[3], r.as_numpy("image")) for a, (r, _) in zip(items[:3], req.sent))
    rows = items[-1][1]
    assert len(rows) == 2 and np.array_equal(rows[1][0], final.as_numpy("image")[1])
    assert [r[1]["forwards"] for r in rows] == final.as_numpy("forwards").reshape(-1).tolist()  # the decode's own counts
    (sent,) = fake.requests
    assert sent["model_name"] == STREAM_MODEL_NAME
    k = next(i for i in sent["inputs"] if i.name() == "partial_images")
    assert k.shape() == [2, 1] and k.datatype() == "INT32"


def test_triton_images_stream_cancels_the_grpc_stream_when_closed_early(stream_model):
    """Closed after its first partial (the SSE client went away), TritonImages.stream cancels the
    gRPC call; read to its final response, it does not."""
    from lisa_trt.serve.openai_api import TritonImages

    _, m = stream_model
    req = Request(prompt=_b("c2"), seed=np.array([[4]]), partial_images=np.array([[2]], np.int32))
    m.execute([req])

    async def first_then_close(images):
        items = images.stream(_call(n=1, k=2))
        got = await items.__anext__()
        await items.aclose()
        return got

    for read_all in (False, True):
        images = TritonImages("127.0.0.1:1", grpc_url="127.0.0.1:2")
        images._grpc = fake = FakeGrpc([(r, None) for r, _ in req.sent])
        got = _drain(images, _call(n=1, k=2))[-1] if read_all else asyncio.run(first_then_close(images))
        assert got[0] == ("done" if read_all else "partial") and fake.cancelled == (0 if read_all else 1)


def test_triton_images_stream_failures_are_api_errors(stream_model):
    from tritonclient.utils import InferenceServerException

    from lisa_trt.serve.openai_api import TritonImages
    from lisa_trt.serve.openai_request import APIError

    _, m = stream_model
    bad = Request(prompt=_b("zzz"), partial_images=np.array([[2]], np.int32))
    m.execute([bad])
    cases = [([(bad.sent[0][0], None)], 400, "unknown class"),
             ([(None, InferenceServerException("[request id: 1] model 'lisa_stream' is not ready"))], 503, "not ready"),
             ([], 503, "closed the stream before its final response")]
    for responses, status, text in cases:
        images = TritonImages("127.0.0.1:1", grpc_url="127.0.0.1:2")
        images._grpc = FakeGrpc(responses)
        with pytest.raises(APIError) as e:
            _drain(images, _call(n=1))
        assert e.value.status == status and text in str(e.value), (status, str(e.value))
    assert e.value.status == 503


def test_triton_repo_stream_puts_the_engines_in_lisa_stream_and_lisa_is_its_proxy(tmp_path, monkeypatch):
    """write_triton_repo(stream=True) (`triton-repo --stream`, `serve --openai-port P --progressive`): the
    engines in 'lisa_stream' (with --copy-engines, copied under it), 'lisa' the proxy (PROXY_MODEL_PY,
    no engine_dir, no warm-up, one CPU instance per engine instance); without it 'lisa' holds the
    engines and there is no 'lisa_stream'."""
    import os

    from click.testing import CliRunner
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    import lisa_trt.export.manifest as M
    from lisa_trt.cli import main
    from lisa_trt.serve import repo as R

    monkeypatch.setattr(M, "read_manifest", lambda d: {})
    eng = tmp_path / "eng"
    eng.mkdir()
    (eng / "manifest.json").write_text("{}")
    plain = R.write_triton_repo(eng, tmp_path / "plain", backend="ort", kind="cpu")
    assert not (plain / STREAM_MODEL_NAME).exists() and (plain / "lisa" / "1" / "model.py").read_text() == R.MODEL_PY
    for copy in (False, True):
        repo = R.write_triton_repo(eng, tmp_path / f"r{copy}", backend="ort", kind="cpu", copy_engines=copy, stream=True,
                                   gpus=[0, 1], instances=2)
        assert (repo / STREAM_MODEL_NAME / "1" / "model.py").read_text() == R.STREAM_MODEL_PY
        assert (repo / "lisa" / "1" / "model.py").read_text() == R.PROXY_MODEL_PY
        assert not (repo / "lisa" / "warmup").exists() and not (repo / "lisa" / "1" / "engines").exists()
        engine = text_format.Parse((repo / STREAM_MODEL_NAME / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
        proxy = text_format.Parse((repo / "lisa" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
        assert engine.model_transaction_policy.decoupled and list(engine.instance_group[0].gpus) == [0, 1]
        assert proxy.name == "lisa" and not proxy.model_transaction_policy.decoupled and not proxy.model_warmup
        assert proxy.parameters["engine_model"].string_value == STREAM_MODEL_NAME
        assert "engine_dir" not in proxy.parameters and proxy.HasField("dynamic_batching")
        assert proxy.instance_group[0].count == 4 and not proxy.instance_group[0].gpus  # 2 per GPU x 2 GPUs
        assert proxy.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
        assert {i.name for i in proxy.input} == {i.name for i in engine.input} - set(STREAM_INPUTS)
        assert {o.name for o in proxy.output} == set(OUTPUTS)
        where = engine.parameters["engine_dir"].string_value
        got = os.path.normpath(os.path.join(repo / STREAM_MODEL_NAME, "1", where))  # as model.py joins it
        assert got == str((repo / STREAM_MODEL_NAME / "1" / "engines") if copy else eng.resolve()), (copy, where)
        assert (repo / STREAM_MODEL_NAME / "1" / "engines" / "manifest.json").is_file() is copy
    seen = {}
    monkeypatch.setattr(R, "write_triton_repo", lambda *a, **kw: seen.update(kw) or tmp_path)
    res = CliRunner().invoke(main, ["triton-repo", str(eng), str(tmp_path / "c"), "--stream"])
    assert res.exit_code == 0 and seen["stream"] is True and "'lisa_stream'" in res.output, res.output


def test_openai_api_takes_the_triton_grpc_url(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from lisa_trt.cli import main
    from lisa_trt.serve import openai_api
    from lisa_trt.serve.process import free_ports

    seen = {}

    def fake(cls, engine_dir, **kw):
        seen.update(kw)
        raise openai_api.FrontEndUnavailableError("stop here")

    monkeypatch.setattr(openai_api.FrontEnd, "for_triton", classmethod(fake))
    res = CliRunner().invoke(main, ["openai-api", str(tmp_path), "--triton-grpc-url", "127.0.0.1:8001", "--port",
                                        str(free_ports(1)[0])])
    assert "stop here" in res.output and seen["triton_grpc_url"] == "127.0.0.1:8001", res.output


def test_serve_loads_lisa_stream_only_when_asked(tmp_path, monkeypatch):
    """`serve` writes 'lisa_stream' (the engines; 'lisa' its proxy) only with --progressive;
    --progressive without --openai-port, or without tritonclient's gRPC client, is refused before Triton."""
    from click.testing import CliRunner

    from lisa_trt.cli import main
    from lisa_trt.serve import openai_api, server
    from lisa_trt.serve.process import free_ports

    res = CliRunner().invoke(main, ["serve", str(tmp_path), "--progressive"])
    assert res.exit_code == 2 and "--openai-port" in res.output and "Traceback" not in res.output, res.output

    seen = {}

    def stop_at_repo(*a, **kw):
        seen.update(kw)
        raise server.InputError("stop here")

    monkeypatch.setattr(server, "read_manifest", lambda d: {}, raising=False)
    monkeypatch.setattr("lisa_trt.export.manifest.read_manifest", lambda d: {})
    monkeypatch.setattr(server, "require_pytriton", lambda: None)
    monkeypatch.setattr(server, "_check_front_end", lambda n: None)
    monkeypatch.setattr("lisa_trt.serve.repo.write_triton_repo", stop_at_repo)
    h, g, m, o = free_ports(4)
    ports = ["--http-port", str(h), "--grpc-port", str(g), "--metrics-port", str(m), "--openai-port", str(o)]
    for flags, want in (([], False), (["--progressive"], True)):
        seen.clear()
        res = CliRunner().invoke(main, ["serve", str(tmp_path), *ports, *flags])
        assert "stop here" in res.output and seen["stream"] is want, (flags, res.output)
    monkeypatch.setattr(openai_api, "grpc_streaming_available", lambda: False)
    res = CliRunner().invoke(main, ["serve", str(tmp_path), *ports, "--progressive"])
    assert res.exit_code == 2 and "tritonclient[grpc]" in res.output and "stop here" not in res.output, res.output


class PbTensor:  # pb_utils.Tensor as BLS hands it out: name(), as_numpy()
    def __init__(self, name, arr):
        self._name, self._arr = name, arr

    def name(self):
        return self._name

    def as_numpy(self):
        return self._arr


class PbResponse:  # pb_utils.InferenceResponse: output_tensors(), has_error(), error()
    def __init__(self, output_tensors, error=None):
        self._out, self._error = output_tensors, error

    def output_tensors(self):
        return self._out

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error


class PbError:  # pb_utils.TritonError(message, code)
    INVALID_ARG, INTERNAL, UNAVAILABLE = "INVALID_ARG", "INTERNAL", "UNAVAILABLE"

    def __init__(self, message, code="INTERNAL"):
        self._msg, self._code = message, code

    def message(self):
        return self._msg

    def code(self):
        return self._code


class Bls:
    """pb_utils.InferenceRequest(...).exec(decoupled=True) onto the engine model `engine` behind
    Triton's dynamic batcher, with a deterministic arrival: the first request opens a batch that
    executes once `gather` requests have joined it (one `engine.execute`; `executions` records
    their counts), or after `timeout` seconds with what joined (requests sent one after another
    never meet: each waits alone, then runs alone). Each gets the responses its sender sent, with
    the requested outputs. `refuse`: answer every request with that error response instead (the
    engine model not ready)."""

    def __init__(self, engine, refuse=None, gather=1, timeout=30.0):
        self.engine, self.refuse, self.gather, self.timeout = engine, refuse, gather, timeout
        self.lock, self.open, self.executions, self.requests = threading.Condition(), None, [], []

    def InferenceRequest(self, model_name, inputs, requested_output_names):
        bls = self

        class Call:
            def exec(self, decoupled=False):
                assert decoupled and model_name == STREAM_MODEL_NAME
                req = Request(**{t.name(): t.as_numpy() for t in inputs})
                bls.requests.append(req)
                if bls.refuse is not None:
                    return iter([PbResponse([], PbError(bls.refuse))])
                bls.join(req)
                return iter([PbResponse([PbTensor(k, resp.outputs[k]) for k in requested_output_names])
                             for resp, _ in req.sent])

        return Call()

    def join(self, req):
        """Queue `req` in the open batch (the first opens it and, once `gather` joined, executes it)."""
        with self.lock:
            lead = self.open is None
            if lead:
                self.open = ([], threading.Event())
            batch, done = self.open
            batch.append(req)
            self.lock.notify_all()
            if lead:
                self.lock.wait_for(lambda: len(batch) >= self.gather, self.timeout)
                self.open = None
        if lead:
            self.executions.append(len(batch))
            self.engine.execute(batch)
            done.set()
        assert done.wait(60)


@pytest.fixture
def proxy(stream_model, monkeypatch, tmp_path):
    """repo.py's PROXY_MODEL_PY (model 'lisa' next to 'lisa_stream', max_batch_size 4), initialised
    under a stand-in pb_utils whose BLS reaches the stream_model fixture's engine model; -> (proxy,
    its Bls)."""
    from lisa_trt.serve.repo import PROXY_MODEL_PY

    cfg, engine = stream_model
    bls = Bls(engine)
    pb = types.SimpleNamespace(Tensor=PbTensor, InferenceResponse=PbResponse, TritonError=PbError,
                               InferenceRequest=bls.InferenceRequest, get_input_tensor_by_name=lambda req, n: req.get(n))
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    (tmp_path / "proxy_model.py").write_text(PROXY_MODEL_PY)
    sys.modules.pop("proxy_model", None)
    m = importlib.import_module("proxy_model").TritonPythonModel()
    m.initialize({"model_config": json.dumps({
        "max_batch_size": 4, "input": [{"name": i.name} for i in cfg.input if i.name not in STREAM_INPUTS],
        "output": [{"name": o} for o in OUTPUTS], "parameters": {"engine_model": {"string_value": STREAM_MODEL_NAME}}}),
        "model_instance_name": "lisa_0_0"})
    yield m, bls
    m.finalize()
    sys.modules.pop("proxy_model", None)


def _pb(**inputs):
    return {k: PbTensor(k, v) for k, v in inputs.items()}


def test_proxy_lisa_forwards_an_execution_concurrently_and_answers_as_lisa(proxy, pipe, monkeypatch):
    """Model 'lisa' as the proxy: the requests of one execution reach the engine model together (one
    engine execution, their rows one decode: `batch` 3), each answered with what 'lisa' answers
    when it holds the engines (infer_each's outputs; a bad request INVALID_ARG, a server fault
    INTERNAL with a request id, both without outputs); an engine model that refuses the BLS request
    gives UNAVAILABLE (HTTP 503) naming it."""
    m, bls = proxy
    good = [_pb(prompt=_b("c2", "c3"), seed=np.array([[4], [5]])), _pb(prompt=_b("c4"), seed=np.array([[7]]))]
    bad = _pb(prompt=_b("zzz"))
    assert len(m.pool._threads) == 4  # one running thread per request an execution can hold
    bls.gather = 3  # the engine's batcher waits for three requests (a sequential proxy never sends them together)
    res = m.execute([good[0], bad, good[1]])
    bls.gather = 1
    assert bls.executions == [3]  # forwarded concurrently: the engine's batcher saw them together
    assert all("partial_images" not in r for r in bls.requests)  # no partials: only the final response
    out = ServeModel(pipe, max_batch=4).infer_each([{k: t.as_numpy() for k, t in g.items()} for g in good])
    for r, (err, want) in zip((res[0], res[2]), out):
        got = {t.name(): t.as_numpy() for t in r.output_tensors()}
        assert err is None and not r.has_error() and set(got) == set(OUTPUTS)
        assert np.array_equal(got["image"], want["image"]) and (got["batch"] == 3).all()
    assert res[1].error().code() == "INVALID_ARG" and "unknown class 'zzz'" in res[1].error().message()
    assert res[1].output_tensors() == []
    monkeypatch.setattr(bls.engine.model, "_decode_group", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    (fault,) = m.execute([_pb(prompt=_b("c1"))])
    assert fault.error().code() == "INTERNAL" and "request id" in fault.error().message()
    assert "boom" not in fault.error().message()
    bls.refuse = "Server not ready"
    (gone,) = m.execute([_pb(prompt=_b("c1"))])
    assert gone.error().code() == "UNAVAILABLE" and gone.error().message() == "model 'lisa_stream': Server not ready"
