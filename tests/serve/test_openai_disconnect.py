"""A streaming client that goes away: what the front end (serve/openai_api.py `_progressive`)
releases, and when. The ASGI app is driven directly (no socket), with `receive` / `send` scripted
as uvicorn's HTTP protocol behaves for a client that disconnects (ASGI spec 2.3, what uvicorn's
HTTP protocols declare: `receive` answers `http.disconnect` and Starlette cancels the send loop;
spec 2.4: `send` raises OSError). The backend is a progressive channel whose decode never ends by
itself: only a close of its stream stops it.

Python's own clean-up of an abandoned async generator would close the backend's stream too, but
later (the event loop's finalizer hook schedules `aclose()` once the generator is collected). So
these tests hold every async generator the app starts (`_started_generators`: none can be
collected) and check right after the app returns, before the event loop runs anything else: what
is closed then, the front end closed, and no generator is left open.
"""

import asyncio
import json
import sys
from contextlib import contextmanager

import numpy as np
import pytest

pytest.importorskip("fastapi")

from lisa_trt.serve.openai_api import create_app  # noqa: E402
from lisa_trt.serve.openai_request import ModelInfo  # noqa: E402

INFO = ModelInfo(id="lisa", family="llamagen", width=16, height=16, max_batch=2, num_classes=4,
                 token_rows=4, tokens_per_image=16, prompt_tokens=1)


class EndlessStream:
    """A progressive channel: `stream(call)` yields `partial_images` partials, then waits for a
    decode step that never comes; `closed` counts the streams whose `finally` ran (a close or a
    cancellation: TritonImages.stream cancels its gRPC call there). `streams` holds every stream
    it made (strong references: only an explicit close can end one)."""

    def __init__(self):
        self.streams, self.closed = [], 0

    async def ready(self):
        return True

    async def close(self):
        pass

    def stream(self, call):
        gen = self._decode(call)
        self.streams.append(gen)
        return gen

    async def _decode(self, call):
        try:
            for k in range(call.partial_images):
                yield "partial", k, 4 * (k + 1), np.zeros((call.n, INFO.height, INFO.width, 3), np.uint8)
            await asyncio.Event().wait()  # the decode goes on until its stream is closed
        finally:
            self.closed += 1


@contextmanager
def _started_generators():
    """Every async generator first iterated inside this block, held (strong references: none of
    them can be collected, so none is closed by Python's clean-up); `open(gens)` lists those not
    finished (suspended or running)."""
    started, old = [], sys.get_asyncgen_hooks()

    def firstiter(gen):
        started.append(gen)
        if old.firstiter is not None:
            old.firstiter(gen)

    sys.set_asyncgen_hooks(firstiter, old.finalizer)
    try:
        yield started
    finally:
        sys.set_asyncgen_hooks(*old)


def _open(gens) -> list:
    return [g.__qualname__ for g in gens if g.ag_frame is not None]


def _scope(spec: str, body: bytes) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": spec}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/v1/images/generations",
            "raw_path": b"/v1/images/generations", "query_string": b"", "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080)}


async def _request(app, spec: str, gone_at: str) -> list:
    """One streaming request whose client goes away: `gone_at` "start" (at the response's first
    message) or "chunk" (at its first body chunk). The client's socket is stalled there: spec 2.3,
    that `send` of the event stream waits (until Starlette, told http.disconnect by `receive`,
    cancels it; the body is then left at that point: unstarted, or suspended at the chunk's
    `yield`), and any other `send` after it is dropped, as uvicorn drops them; spec 2.4, `send`
    raises OSError from that point on. -> every message the app sent."""
    raw = json.dumps({"prompt": "1", "stream": True, "partial_images": 2, "seed": 3}).encode()
    gone, asked, sent = asyncio.Event(), [], []

    async def receive():
        asked.append(1)
        if len(asked) == 1:
            return {"type": "http.request", "body": raw, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    def event_stream():
        return any(b"text/event-stream" in v for m in sent[:1] for _, v in m.get("headers", ()))

    async def send(message):
        sent.append(message)
        stall = event_stream() and not gone.is_set() and (
            message["type"] == "http.response.start" if gone_at == "start" else bool(message.get("more_body")))
        if stall:
            gone.set()
        if gone.is_set() and spec == "2.4":
            raise OSError("the client closed the connection")
        if stall:
            await asyncio.Event().wait()  # nobody reads: the send waits until it is cancelled

    await asyncio.wait_for(app(_scope(spec, raw), receive, send), 30)  # a disconnect is no error
    return sent


def _run(spec: str, gone_at: str) -> dict:
    """Two such requests on an app with one in-flight slot (max_pending=1) -> what was seen right
    after each returned, before the event loop ran anything else."""
    backend, seen = EndlessStream(), {}

    async def main():
        app = create_app(backend, INFO, max_pending=1)
        with _started_generators() as started:
            for i in range(2):
                sent = await _request(app, spec, gone_at)
                # no await since the app returned, and no generator collectable: what is closed, the app closed
                seen[i] = {"closed": backend.closed, "streams": len(backend.streams), "sent": sent,
                           "open": _open(started)}
        for g in started:
            await g.aclose()

    asyncio.run(main())
    return seen


@pytest.mark.parametrize("spec", ["2.3", "2.4"])
def test_a_client_gone_before_the_body_started_releases_its_slot_and_closes_the_backend_stream(spec, caplog):
    """The client disconnects after the backend's first partial was fetched but before the response
    body generator ever ran: the in-flight count returns to 0 (the next request on a one-slot app
    gets its stream, not a 429) and the backend's stream is closed (its decode cancelled) before the
    app returns; nothing is left for the garbage collector."""
    seen = _run(spec, "start")
    for i in (0, 1):
        assert seen[i]["streams"] == i + 1, (i, seen[i]["sent"])  # a 429 makes no stream
        assert seen[i]["closed"] == i + 1, "the backend's stream was not closed when its client went away"
        assert seen[i]["open"] == [], "generators left open"
    assert not any(m.get("status") == 429 for m in seen[1]["sent"]), seen[1]["sent"]
    assert "internal error" not in caplog.text  # a client that left is not a server fault


@pytest.mark.parametrize("spec", ["2.3", "2.4"])
def test_a_client_gone_mid_stream_has_its_body_and_backend_stream_closed_by_the_front_end(spec, caplog):
    """The client disconnects at the first partial's chunk (the body is suspended at that `yield`,
    the backend's stream at its own): by the time the app returns, the front end itself has closed
    the body and the backend's stream (its decode cancelled) and freed the slot; no generator was
    left for Python's clean-up."""
    seen = _run(spec, "chunk")
    for i in (0, 1):
        assert seen[i]["streams"] == i + 1, (i, seen[i]["sent"])
        assert seen[i]["closed"] == i + 1, "the backend's stream was not closed when its client went away"
        assert seen[i]["open"] == [], "generators left open (for the garbage collector to close)"
    starts = [m for m in seen[0]["sent"] if m["type"] == "http.response.start"]
    assert [m["status"] for m in starts] == [200]
    assert "internal error" not in caplog.text


# ----------------------------------------------------------------------------- the gRPC stream's cancel()

class _Result:
    """tritonclient's InferResult: as_numpy(name) of one response of 'lisa_stream'."""

    def __init__(self, **outputs):
        self.outputs = {k: np.asarray(v) for k, v in outputs.items()}

    def as_numpy(self, name):
        return self.outputs[name]


def _partial(k: int):
    return _Result(partial_index=[[k]], tokens=[[4 * (k + 1)]], image=np.zeros((1, INFO.height, INFO.width, 3), np.uint8))


def _final():
    return _Result(partial_index=[[-1]], status=[[0]], error=np.array([[b""]], dtype=object),
                   image=np.zeros((1, INFO.height, INFO.width, 3), np.uint8), mal=[[1.5]], tvd=[[0.0]],
                   seconds=[[0.1]], batch=[[1]], forwards=[[11]])


class _GrpcStream:
    """tritonclient.grpc.aio's stream_infer answer: (result, error) pairs, then (when `ends` is
    False) a stream that waits for responses that never come; `cancel()` counts its calls and
    ends the wait."""

    def __init__(self, results, ends: bool):
        self.results, self.ends, self.cancels = list(results), ends, 0
        self._stop = asyncio.Event()

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.results:
            return self.results.pop(0), None
        if self.ends:
            raise StopAsyncIteration
        await self._stop.wait()
        raise StopAsyncIteration

    def cancel(self):
        self.cancels += 1
        self._stop.set()


class _GrpcClient:
    def __init__(self, stream):
        self.stream = stream

    def stream_infer(self, requests, stream_timeout=None):
        return self.stream


def _triton_stream(stream, consume):
    """TritonImages.stream of a one-row call over the stand-in gRPC stream, consumed by
    `consume(items)` (an async function of the async generator) -> what it returned."""
    pytest.importorskip("tritonclient.grpc")
    from lisa_trt.serve.openai_api import TritonImages
    from lisa_trt.serve.openai_request import ImagesCall

    backend = TritonImages("127.0.0.1:1", grpc_url="127.0.0.1:2")
    backend._grpc_client = lambda: _GrpcClient(stream)
    call = ImagesCall(prompt="1", seeds=(3,), knobs={}, stream=True, partial_images=2)
    return asyncio.run(consume(backend.stream(call)))


def test_a_stream_closed_before_its_final_response_cancels_the_grpc_call():
    """The front end closes TritonImages.stream after the first partial (its client went away):
    the gRPC call is cancelled, once (Triton then marks the request cancelled and the decode stops)."""
    stream = _GrpcStream([_partial(0), _partial(1)], ends=False)

    async def first_then_close(items):
        item = await items.__anext__()
        await items.aclose()
        return item

    item = _triton_stream(stream, first_then_close)
    assert item[:3] == ("partial", 0, 4)
    assert stream.cancels == 1, "the gRPC stream was not cancelled when its consumer left"


def test_a_consumer_cancelled_while_waiting_cancels_the_grpc_call():
    """The task reading the stream is cancelled while it waits for the next response (Starlette
    cancelling the send loop): the gRPC call is cancelled too."""
    stream = _GrpcStream([_partial(0)], ends=False)

    async def cancelled_while_waiting(items):
        got = []

        async def read():
            async for it in items:
                got.append(it)

        task = asyncio.ensure_future(read())
        while not got:
            await asyncio.sleep(0)
        for _ in range(3):  # let it reach the wait for the next response
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await items.aclose()
        return got

    assert [g[0] for g in _triton_stream(stream, cancelled_while_waiting)] == ["partial"]
    assert stream.cancels == 1


def test_a_stream_that_reached_its_final_response_is_not_cancelled():
    stream = _GrpcStream([_partial(0), _partial(1), _final()], ends=True)

    async def all_items(items):
        return [it async for it in items]

    items = _triton_stream(stream, all_items)
    assert [i[0] for i in items] == ["partial", "partial", "done"]
    assert items[-1][1][0][1]["forwards"] == 11
    assert stream.cancels == 0
