"""The OpenAI Images API in front of the Triton server: `lisa-trt serve --openai-port P`.

A FastAPI app (run by uvicorn) with `POST /v1/images/generations`, `GET /v1/models`,
`GET /v1/models/{id}` and `GET /health`. It keeps no model of its own: every generation is
ONE request of n rows to Triton model 'lisa' (tritonclient's asyncio HTTP client), or, for a
streaming one when Triton's gRPC endpoint is given, to the decoupled model 'lisa_stream'
(tritonclient's asyncio gRPC `stream_infer`: its progressive images as they decode), so dynamic
batching, instances, readiness, metrics and SIGTERM draining stay Triton's. Request checks:
openai_request.py; response bodies, PNGs and the streaming events: openai_images.py.

Errors always have OpenAI's shape {"error": {"message", "type", "param", "code"}} and never a
traceback: 400 for a bad request (the served model's one-line message for a bad setting), 404 for
an unknown model or path, 413 for a body over `max_body_bytes`, 429 when `max_pending` requests
are already in flight (Retry-After: 1), 503 while Triton is not ready (starting, draining,
unreachable), 500 with a request id for a server fault (traceback in the server log).
"""

import asyncio
import json
import logging
import time
import uuid
from typing import Optional

from ..errors import LisaError
from .model import MODEL_NAME, STREAM_MODEL_NAME
from .openai_request import APIError, ImagesCall, ModelInfo, error_param, knob_kinds, parse_images_request

LOG = logging.getLogger("lisa_trt.serve.openai")
MAX_BODY_BYTES = 1 << 20  # a prompt is at most 32000 characters: 1 MiB is ample
MAX_PENDING = 256


class FrontEndUnavailableError(LisaError):
    """The OpenAI front end's packages (the `serve` extra) are missing."""


def require_openai_deps():
    """Import fastapi and uvicorn or say how to install them."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
        import tritonclient.http.aio  # noqa: F401
    except ImportError as e:
        raise FrontEndUnavailableError(f"the OpenAI front end needs fastapi, uvicorn and tritonclient[http] ({e}); "
                                    "install the extra: pip install 'lisa-trt[serve]'") from e


def grpc_streaming_available() -> bool:
    """Whether tritonclient's gRPC asyncio client (tritonclient[grpc]) imports: TritonImages.stream needs it."""
    try:
        import grpc  # noqa: F401
        import tritonclient.grpc.aio  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or a protobuf/grpcio mismatch
        return False
    return True


def triton_error(message: str, status, names) -> APIError:
    """A Triton error of model 'lisa' (its HTTP status) -> the OpenAI error the client gets:
    400 stays 400 (the field named when the message starts with it), not ready / unavailable 503,
    anything else 500 (the served model's message carries a request id, never a traceback)."""
    code = int(status) if str(status).isdigit() else 503
    if code == 400:
        return APIError(400, message, error_param(message, tuple(names) + ("prompt", "seed", "negative_prompt")),
                        "invalid_value")
    if code in (404, 503) or "not ready" in message or "unavailable" in message.lower():
        return APIError(503, f"model '{MODEL_NAME}' is not ready ({message}); retry later", None,
                        "service_unavailable")
    return APIError(500, message, None, "server_error")


class TritonImages:
    """Model 'lisa' on a Triton server through tritonclient.http.aio (one client per event loop).

    grpc_url: Triton's gRPC endpoint, where the decoupled model 'lisa_stream' streams progressive
    images (`stream`); None: no progressive channel (`stream` is None), and the front end cuts a
    streaming answer's partials from the finished image."""

    def __init__(self, url: str, timeout: float = 600.0, grpc_url: Optional[str] = None):
        self.url, self.timeout, self.grpc_url = url, timeout, grpc_url
        self._client = self._grpc = None
        self._names = tuple(knob_kinds())
        if grpc_url is None:
            self.stream = None  # what create_app asks (`backend.stream`) to choose the cut-from-final answer

    def _http(self):
        if self._client is None:  # created on the serving loop (aiohttp binds its session to it)
            import tritonclient.http.aio as aio

            # conn_timeout is aiohttp's total time per request: a decode waiting in Triton's queue included
            self._client = aio.InferenceServerClient(self.url, conn_limit=MAX_PENDING, conn_timeout=self.timeout)
        return self._client

    def _grpc_client(self):
        if self._grpc is None:  # on the serving loop, as _http
            import tritonclient.grpc.aio as gaio

            self._grpc = gaio.InferenceServerClient(self.grpc_url)
        return self._grpc

    async def ready(self) -> bool:
        try:
            models = (MODEL_NAME,) + ((STREAM_MODEL_NAME,) if self.grpc_url else ())
            return bool(await self._http().is_server_ready()
                        and all([await self._http().is_model_ready(m) for m in models]))
        except Exception:  # noqa: BLE001 - not reachable: not ready
            return False

    async def generate(self, call: ImagesCall) -> list:
        """-> per row (image (H, W, 3) uint8, stats); APIError with Triton's status mapped."""
        import aiohttp
        import tritonclient.http as http
        from tritonclient.utils import InferenceServerException

        from .client import make_rows_inputs, parse_rows, server_message

        inputs = make_rows_inputs(http, [call.prompt] * call.n, list(call.seeds), **call.inputs)
        try:
            res = await self._http().infer(MODEL_NAME, inputs)
        except InferenceServerException as e:
            raise triton_error(server_message(e.message() or str(e)), e.status(), self._names) from None
        except (OSError, asyncio.TimeoutError, aiohttp.ClientError) as e:
            raise APIError(503, f"the Triton server at {self.url} is not reachable ({type(e).__name__}); it is "
                                "starting or shutting down: retry later", None, "service_unavailable") from None
        rows = parse_rows(res)
        failed = [r for r in rows if isinstance(r, str)]
        if failed:  # the model fails the whole request first; this is a row it answered with an error
            raise triton_error(failed[0], "400", self._names)
        return rows

    async def stream(self, call: ImagesCall):
        """The progressive channel: one request of n rows to 'lisa_stream' over gRPC streaming ->
        ("partial", k, tokens, images (n, H, W, 3)) while Triton decodes, then ("done", rows) as
        `generate`; APIError with the model's status (an `error` event once the stream started).
        Closed (or cancelled) before its final response, e.g. because the SSE client went away, it
        cancels the gRPC stream (tritonclient's `cancel()`): Triton marks the request cancelled and
        'lisa_stream' stops its decode at the next step."""
        import grpc
        import numpy as np
        import tritonclient.grpc as tgrpc

        from .client import make_rows_inputs, server_message

        inputs = make_rows_inputs(tgrpc, [call.prompt] * call.n, list(call.seeds), **call.inputs)
        k = tgrpc.InferInput("partial_images", [call.n, 1], "INT32")
        k.set_data_from_numpy(np.full((call.n, 1), call.partial_images, np.int32))
        done = asyncio.Event()

        async def requests():  # one request; the stream stays open until its final response came
            yield {"model_name": STREAM_MODEL_NAME, "inputs": inputs + [k]}
            await done.wait()

        responses = None
        try:
            responses = self._grpc_client().stream_infer(requests(), stream_timeout=self.timeout)
            async for result, error in responses:
                if error is not None:
                    raise triton_error(server_message(error.message() or str(error)), "500", self._names)
                item = stream_item(result, self._names)
                if item[0] == "done":
                    done.set()
                yield item
                if item[0] == "done":
                    return
        except (OSError, asyncio.TimeoutError, grpc.RpcError) as e:
            raise APIError(503, f"the Triton server at {self.grpc_url} (gRPC) is not reachable "
                                f"({type(e).__name__}); it is starting or shutting down: retry later", None,
                           "service_unavailable") from None
        finally:
            if not done.is_set() and responses is not None:  # given up before the final response
                responses.cancel()
            done.set()
        raise APIError(503, f"model '{STREAM_MODEL_NAME}' closed the stream before its final response; retry later",
                       None, "service_unavailable")

    async def close(self):
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._grpc is not None:
            await self._grpc.close()
            self._grpc = None


def stream_item(res, names=()) -> tuple:
    """One response of model 'lisa_stream' (tritonclient InferResult) -> ("partial", k, tokens,
    images (n, H, W, 3) uint8) or ("done", rows as parse_rows); a final response with a failure
    (serve/model.py final_failure: its `status` 400 / 500) -> APIError as the plain path maps it."""
    from .client import parse_rows
    from .model import final_failure

    k = int(res.as_numpy("partial_index").reshape(-1)[0])
    if k >= 0:
        return "partial", k, int(res.as_numpy("tokens").reshape(-1)[0]), res.as_numpy("image")
    failure = final_failure({"status": res.as_numpy("status"), "error": res.as_numpy("error")})
    if failure is not None:
        raise triton_error(str(failure), "500" if failure.internal else "400", names)
    return "done", parse_rows(res)


def _error_response(e: APIError):
    from fastapi.responses import JSONResponse

    headers = {"Retry-After": "1"} if e.status in (429, 503) else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def _internal(request, exc: BaseException) -> APIError:
    rid = uuid.uuid4().hex[:12]
    LOG.error("internal error (request id %s) on %s %s", rid, request.method, request.url.path, exc_info=exc)
    return APIError(500, f"internal error (request id {rid}); the details are in the server log", None,
                    "server_error")


async def _read_json(request, limit: int):
    """The request's JSON body, or APIError 413 (too large) / 400 (not JSON)."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise APIError(413, f"the request body is {int(size)} bytes; the limit is {limit}", None,
                       "request_too_large")
    raw = await request.body()
    if len(raw) > limit:
        raise APIError(413, f"the request body is {len(raw)} bytes; the limit is {limit}", None,
                       "request_too_large")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON ({e})", None, "invalid_json") from None


class _Pending:
    """Requests in flight; one over `limit` is refused with 429 instead of queueing without end."""

    def __init__(self, limit: int):
        self.limit, self.now = int(limit), 0

    def __enter__(self):
        if self.now >= self.limit:
            raise APIError(429, f"{self.now} requests are in flight (the server's --openai-max-pending "
                                f"{self.limit}); retry shortly", None, "rate_limit_exceeded")
        self.now += 1

    def __exit__(self, *exc):
        self.now -= 1


def _install_error_handlers(app) -> None:
    """Every error in OpenAI's shape: ours (APIError), Starlette's 404 / 405, FastAPI's validation,
    and any other exception (500 with a request id; the traceback goes to the log)."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(APIError)
    async def _api_error(_req, e: APIError):
        return _error_response(e)

    @app.exception_handler(HTTPException)
    async def _http_error(req, e: HTTPException):
        code = {404: "unknown_url", 405: "method_not_allowed"}.get(e.status_code)
        return _error_response(APIError(e.status_code, f"Invalid URL ({req.method} {req.url.path})"
                                        if e.status_code in (404, 405) else str(e.detail), None, code))

    @app.exception_handler(RequestValidationError)
    async def _validation(_req, e: RequestValidationError):
        return _error_response(APIError(400, "; ".join(str(x.get("msg")) for x in e.errors()), None,
                                        "invalid_value"))

    @app.exception_handler(Exception)
    async def _fault(req, e: Exception):
        return _error_response(_internal(req, e))


def _closing_stream(body, release):
    """A StreamingResponse of the async generator `body` that, however the response ends, closes
    `body` and then awaits `release()` (what the stream holds: its in-flight slot, the backend's
    stream). When the client disconnects, Starlette cancels the send loop: `body` may be left
    suspended at a `yield` (closing it runs its `finally` at once) or may never have started (a
    client gone before the first chunk: closing an unstarted generator runs none of its code), so
    the release is the response's, not the body's."""
    from fastapi.responses import StreamingResponse
    from starlette.requests import ClientDisconnect

    class _Closing(StreamingResponse):
        async def __call__(self, scope, receive, send):
            try:
                await super().__call__(scope, receive, send)
            except ClientDisconnect:  # a send failed (ASGI spec 2.4): the client left, no server fault
                LOG.info("a streaming client disconnected; its stream is closed")
            finally:
                try:
                    await body.aclose()
                finally:
                    await release()

    return _Closing(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _progressive(request, backend, info: ModelInfo, call: ImagesCall, pending: _Pending):
    """A streaming answer from a backend with a progressive channel (`backend.stream(call)`: items
    ("partial", k, tokens, images) while it decodes, then ("done", rows)): each partial is sent as it
    arrives. A failure before the first item is an ordinary error response; a later one an `error`
    event (the status line is sent by then). When the client goes away the backend's stream is
    closed (`aclose`), which cancels its decode (TritonImages.stream)."""
    from starlette.concurrency import run_in_threadpool

    from .openai_images import completed_events, decoded_partial_events, error_event

    pending.__enter__()
    t0 = time.perf_counter()
    items = backend.stream(call).__aiter__()

    async def release():  # once: the response's (or the failed first fetch's) last step
        pending.__exit__()
        await items.aclose()  # a no-op once it ended; else (the client left) it cancels the decode

    try:
        first = await items.__anext__()
    except BaseException:
        await release()
        raise

    async def body():
        item = first
        try:
            while item[0] == "partial":
                _, k, tokens, images = item
                yield b"".join(await run_in_threadpool(decoded_partial_events, info, call, k, tokens, images))
                item = await items.__anext__()
            rows, secs = item[1], time.perf_counter() - t0
            yield b"".join(await run_in_threadpool(completed_events, info, call, rows, secs))
        except APIError as e:
            yield error_event(e.body())
        except Exception as e:  # noqa: BLE001 - the stream has started: the fault goes into it
            yield error_event(_internal(request, e).body())

    return _closing_stream(body(), release)


def api_key_check(api_key: Optional[str]):
    """A FastAPI dependency: with `api_key`, every /v1 request must send `Authorization: Bearer KEY`
    (else 401 in OpenAI's shape, as vLLM's --api-key); /health stays open (probes carry no key)."""
    import hmac

    from fastapi import Request

    async def check(request: Request):
        if api_key is None or not request.url.path.startswith("/v1"):
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
            raise APIError(401, "Incorrect or missing API key: send the header 'Authorization: Bearer <key>' with "
                                "the key the server was started with (--api-key)", None, "invalid_api_key")

    return check


def create_app(backend: TritonImages, info: ModelInfo, *, max_pending: int = MAX_PENDING,
               max_body_bytes: int = MAX_BODY_BYTES, api_key: Optional[str] = None):
    """The ASGI app (FastAPI) serving `info`'s model (OpenAI name `info.id`) through `backend`;
    `api_key`: the bearer token every /v1 request must carry (None: none)."""
    from contextlib import asynccontextmanager

    from fastapi import Depends, FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool

    from .openai_images import images_response, stream_events

    @asynccontextmanager
    async def lifespan(_app):
        yield
        await backend.close()

    app = FastAPI(title="lisa-trt OpenAI Images API", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None, dependencies=[Depends(api_key_check(api_key))])
    _install_error_handlers(app)
    pending, kinds = _Pending(max_pending), knob_kinds()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [info.card()]}

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str):
        if model_id != info.id:
            raise APIError(404, f"The model '{model_id}' does not exist; this server serves '{info.id}'", "model",
                           "model_not_found")
        return info.card()

    @app.get("/health")
    async def health():
        if not await backend.ready():
            raise APIError(503, f"model '{MODEL_NAME}' is not ready", None, "service_unavailable")
        return {"status": "ok"}

    @app.post("/v1/images/generations")
    async def generations(request: Request):
        call = parse_images_request(await _read_json(request, max_body_bytes), info, kinds)
        if call.stream and getattr(backend, "stream", None) is not None:
            return await _progressive(request, backend, info, call, pending)
        with pending:
            t0 = time.perf_counter()
            rows = await backend.generate(call)
            secs = time.perf_counter() - t0
        if call.stream:  # decoded: every event is ready to send (see openai_images.py)
            events = await run_in_threadpool(lambda: list(stream_events(info, call, rows, secs)))
            return StreamingResponse(iter(events), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return JSONResponse(await run_in_threadpool(images_response, info, call, rows, secs))

    return app


class FrontEnd:
    """uvicorn serving an ASGI `app` on a thread of its own (the process's signals stay its owner's)."""

    def __init__(self, app, *, host: str, port: int, drain_timeout: int = 60):
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                   access_log=False, timeout_graceful_shutdown=drain_timeout))
        self._thread = None
        self.info: Optional[ModelInfo] = None

    @classmethod
    def for_triton(cls, engine_dir, *, triton_url: str, host: str, port: int, max_batch: int,
                   max_pending: int = MAX_PENDING, drain_timeout: int = 60,
                   triton_grpc_url: Optional[str] = None, served_model_name: str = MODEL_NAME,
                   api_key: Optional[str] = None) -> "FrontEnd":
        """The OpenAI API of ENGINE_DIR's bundle, forwarding to model 'lisa' at `triton_url`
        (HTTP); with `triton_grpc_url`, streaming requests go to 'lisa_stream' there (TritonImages).

        served_model_name: the model's OpenAI name (requests' `model`, GET /v1/models), as vLLM's
        --served-model-name; api_key: the bearer token /v1 requests must carry (None: none)."""
        require_openai_deps()
        info = ModelInfo.from_dir(engine_dir, max_batch, model_id=served_model_name)
        front = cls(create_app(TritonImages(triton_url, grpc_url=triton_grpc_url), info, max_pending=max_pending,
                               api_key=api_key), host=host, port=port, drain_timeout=drain_timeout)
        front.info = info
        return front

    def start(self, timeout: float = 60.0) -> None:
        """Serve on a thread; return once the port accepts connections (LisaError when it cannot)."""
        import threading

        self._thread = threading.Thread(target=self.server.run, name="openai-front-end", daemon=True)
        self._thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if not self._thread.is_alive():
                raise LisaError("the OpenAI front end stopped while starting; its log is above")
            if time.monotonic() - t0 > timeout:
                raise LisaError(f"the OpenAI front end did not start within {timeout:g} s")
            time.sleep(0.05)

    def serve_until_signal(self, drain_timeout: float = 60.0) -> int:
        """Serve until SIGTERM / SIGINT, then finish the in-flight requests; -> 0 (1 if uvicorn died)."""
        import signal
        import threading

        stop = threading.Event()
        old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            while not stop.wait(0.5):
                if not self._thread.is_alive():
                    return 1
            return 0
        finally:
            self.stop(drain_timeout + 5)
            for s, h in old.items():
                signal.signal(s, h)

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stop taking connections, let in-flight requests finish (uvicorn's graceful shutdown)."""
        if self._thread is not None and self._thread.is_alive():
            self.server.should_exit = True
            self._thread.join(timeout)
