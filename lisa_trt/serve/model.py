"""The served model: Triton requests -> validated rows -> one speculative batch -> responses.

Framework-free (numpy in, numpy out) so that PyTriton (`lisa-trt serve`) and the Triton Python
backend (`lisa-trt triton-repo`) share it, and tests can drive it without a server.

Every request carries its rows with a leading batch dimension (usually 1 row). Inputs, all
(n, 1): `prompt` (BYTES: class id or class name; text for prompted families; a caption for
T5-caption engines when the pipeline has a text encoder), `seed` (INT64), `negative_prompt` (BYTES:
the text of CFG's unconditional rows for families whose prompter takes one, Pipeline.generate's
`negative_prompt`; empty: none) and the optional knobs
`verify` (BYTES), `cfg_scale`, `temperature`, `top_p` (FP32), `top_k` (INT32) and every
registered method's own knob by its setting name (METHOD_KNOBS: `lantern_delta`, `gasv_kappa`,
`gasv_lambda`, `gsd_group`, `sjd_pac_tree_width`, `zipar_window`, ...; FP32 / INT32 / BYTES by
the knob's type). Outputs: `image` (n, H, W, 3) UINT8, `mal`, `tvd`,
`seconds` (n, 1) FP32, `batch` (n, 1) INT32 (rows decoded together), `forwards` (n, 1) INT32
(the target forwards the decoder ran for the row: its prefill and its steps) and `error` (n, 1)
BYTES (empty on success).

Rows that share every sampling setting are decoded as ONE batch with per-row seeds
(Pipeline.generate(batch=True)), so a row's image depends only on its own prompt and seed.
A bad request gets a RequestFailure (one line naming the field and the fix; the Triton model
answers it with INVALID_ARG, HTTP 400) and its batch-mates are still served. A fault of the
server itself (an exception while decoding) is logged with its traceback under a request id;
the request gets only "internal error (request id ...)" (INTERNAL, HTTP 500).

The decoupled model 'lisa_stream' (repo.py) answers through `stream_request`: the same inputs
plus `partial_images`, its progressive images (stream_each) as responses while it decodes, then
the final answer with the failure, if any, as a `status` output. Its client can cancel: the model
asks Triton whether the request was cancelled (`request.is_cancelled()`) before every decode step
and stops the decode there (DecodeCancelled), answering status CANCELLED_STATUS.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import uuid
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

from ..errors import InputError, LisaError

LOG = logging.getLogger("lisa_trt.serve")
MODEL_NAME = "lisa"  # the served model's name (Triton repository, endpoints)

_KINDS = {float: (np.float32, "float"), int: (np.int32, "int"), str: (np.bytes_, "str")}
SAMPLING_KNOBS = ("verify", "cfg_scale", "temperature", "top_k", "top_p")
# name -> (numpy dtype, kind) of the fixed inputs; "str" inputs are BYTES
BASE_INPUTS = {"prompt": (np.bytes_, "str"), "seed": (np.int64, "int"), "negative_prompt": (np.bytes_, "str"),
               "verify": (np.bytes_, "str"),
               "cfg_scale": (np.float32, "float"), "temperature": (np.float32, "float"), "top_k": (np.int32, "int"),
               "top_p": (np.float32, "float")}
REQUIRED = ("prompt",)
# name -> (numpy dtype, per-row dims) of every output (repo.py's config.pbtxt declares these)
OUTPUTS = {"image": (np.uint8, (-1, -1, 3)), "mal": (np.float32, (1,)), "tvd": (np.float32, (1,)),
           "seconds": (np.float32, (1,)), "batch": (np.int32, (1,)), "forwards": (np.int32, (1,)),
           "error": (np.bytes_, (1,))}
# the decoupled model next to 'lisa' that streams progressive images (repo.py, stream=True):
# its extra input and outputs (ServeModel.stream_request)
STREAM_MODEL_NAME = "lisa_stream"
MAX_PARTIAL_IMAGES = 3  # OpenAI's range for partial_images: 0..3
STREAM_INPUTS = {"partial_images": (np.int32, "int")}
STREAM_OUTPUTS = {"partial_index": (np.int32, (1,)), "tokens": (np.int32, (1,)), "status": (np.int32, (1,))}
CANCELLED_STATUS = 499  # the `status` of a request whose client cancelled it (nginx's "client closed request")
_RANGES = {"lantern_delta": (0.0, 1.0), "gasv_kappa": (0.0, 1e6), "gasv_lambda": (0.0, 1e6)}  # serving's own checks


def method_knobs() -> dict:
    """name -> (numpy dtype, kind) of every registered method's knob (speculative/methods.py
    MethodOption: lantern_delta, gasv_kappa, gsd_group, zipar_window, ...): a method that declares a
    setting in its own file is servable with no edit here. (Read on use: importing the method
    registry imports torch, which `serve`'s port check must not wait for.)"""
    from ..speculative import methods  # importing the package registers every method

    return {o.name: _KINDS[o.type] for o in methods.cli_options()}


def inputs() -> dict:
    """name -> (numpy dtype, kind) of every input: BASE_INPUTS, then method_knobs()."""
    return {**BASE_INPUTS, **method_knobs()}


def __getattr__(name):  # INPUTS / KNOBS / METHOD_KNOBS, computed on first use (PEP 562)
    if name == "INPUTS":
        return inputs()
    if name == "METHOD_KNOBS":
        return method_knobs()
    if name == "KNOBS":
        return SAMPLING_KNOBS + tuple(method_knobs())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ServeRequestError(LisaError):
    """Every request of one Triton execution was invalid (each message is included)."""


class DecodeCancelled(LisaError):
    """A streamed request's client cancelled it: its decode stopped before decode step `steps + 1`."""

    def __init__(self, steps: int):
        super().__init__(f"the client cancelled the request; its decode stopped after {steps} step(s)")
        self.steps = steps


class RequestFailure(str):
    """Why one request failed: its one-line message; `internal` is True for a server fault (500),
    False for a bad request (400)."""

    internal: bool = False

    def __new__(cls, message: str, internal: bool = False):
        obj = super().__new__(cls, message)
        obj.internal = internal
        return obj


def internal_failure(context: str) -> RequestFailure:
    """Log the exception being handled with a new request id; the client sees only the id."""
    rid = uuid.uuid4().hex[:12]
    LOG.error("internal error (request id %s) %s", rid, context, exc_info=True)
    return RequestFailure(f"internal error (request id {rid}); the details are in the server log", internal=True)


@dataclass(frozen=True)
class _Row:
    req: int
    idx: int
    class_id: Optional[int]  # class-conditioned families
    seed: int
    knobs: tuple  # (verify: Method or "auto", cfg_scale, temperature, top_k, top_p, *METHOD_KNOBS values):
    #               rows with equal knobs decode together
    caption: Optional[str] = None  # prompted families (text prompts)
    negative: Optional[str] = None  # the text of CFG's unconditional rows (families whose prompter takes one)


def _range(name, v, lo, hi, lo_open=False):
    if not math.isfinite(v) or v < lo or (lo_open and v == lo) or v > hi:
        left = "(" if lo_open else "["
        raise InputError(f"{name}={v} is out of range; valid: {left}{lo}, {hi}]")
    return v


class PartialImages:
    """Pipeline.generate's on_step hook that emits `k` progressive images (ServeModel.stream_each).

    cancelled: optional `cancelled() -> bool`, asked after every decode step; True stops the decode
    there (the hook raises DecodeCancelled out of the decode loop). `steps`: the steps seen."""

    def __init__(self, k: int, emit, cancelled=None):
        self.k, self.emit, self.sent, self.cancelled, self.steps = int(k), emit, 0, cancelled, 0

    def __call__(self, step) -> None:
        self.steps += 1
        if self.cancelled is not None and self.cancelled():
            raise DecodeCancelled(self.steps)
        n = step.tokens.shape[1]
        done, images = int(step.done.min()), None
        while self.sent < self.k and done * (self.k + 1) >= (self.sent + 1) * n:
            if images is None:  # one VQ decode per step, however many partials it completes
                images = np.stack([np.asarray(im, dtype=np.uint8) for im in step.images()])
            self.emit(self.sent, done, images)
            self.sent += 1


class ServeModel:
    """Validates, groups and decodes Triton requests on one Pipeline.

    Args:
        pipeline: a runtime Pipeline (engines loaded once).
        max_batch: largest number of rows decoded together (larger groups are split).
    """

    def __init__(self, pipeline, max_batch: int = 16):
        self.pipe = pipeline
        self.max_batch = int(max_batch)
        self._lock = threading.Lock()
        gen = pipeline._e.generation
        self.defaults = pipeline.sampling()
        self.default_verify = "auto"  # the bundle's recorded never-slower choice (Pipeline.resolve_verify)
        self.vocab = pipeline.config.vocab_size
        self.tree = gen.get("tree", {})

    def warm_up(self, prompt: str = "0") -> float:
        """Decode one request (class `prompt`, seed 0) through infer_each; -> seconds.

        Raises:
            LisaError with the failure's message (the model must not be reported ready)."""
        import time

        t0 = time.perf_counter()
        (err, _), = self.infer_each([{"prompt": np.array([[prompt.encode()]], dtype=object)}])
        if err is not None:
            raise LisaError(f"warm-up request (class {prompt}) failed: {err}")
        return time.perf_counter() - t0

    # -- parsing -------------------------------------------------------------------------

    def _column(self, req: Mapping, name: str, n: int):
        """Input `name` of one request as a list of n Python values (None when absent)."""
        if name not in req:
            if name in REQUIRED:
                raise InputError(f"missing input {name!r} (BYTES, shape (n, 1): a class id or name)")
            return [None] * n
        a = np.asarray(req[name])
        dtype, kind = inputs()[name]
        if a.ndim == 0 or a.shape[0] != n or a.size != n:
            raise InputError(f"input {name!r} must have shape (n, 1) with n = {n} rows, got {a.shape}")
        vals = a.reshape(n).tolist()
        if kind == "str":
            if a.dtype.kind not in ("O", "S", "U"):
                raise InputError(f"input {name!r} must be BYTES (a string), got {a.dtype}")
            return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in vals]
        if kind == "int" and a.dtype.kind not in ("i", "u"):
            raise InputError(f"input {name!r} must be an integer ({np.dtype(dtype).name}), got {a.dtype}")
        if kind == "float" and a.dtype.kind not in ("f", "i", "u"):
            raise InputError(f"input {name!r} must be a number ({np.dtype(dtype).name}), got {a.dtype}")
        return [float(v) if kind == "float" else int(v) for v in vals]

    def _knobs(self, verify, cfg, temp, top_k, top_p, *method_values) -> tuple:
        from ..runtime.context import AUTO, resolve_spec

        verify = verify or self.default_verify
        method = self.pipe.method(verify, noun="verify rule")[0]  # "auto": what the bundle runs
        requested = None if verify == AUTO else method  # the row's knob: the Method, or auto for the plan
        if method.uses_tree and self.pipe._e.drafter is None:
            raise InputError(f"verify={verify} needs a drafter; this engine directory has none (use vanilla)")
        d = self.defaults
        cfg = _range("cfg_scale", d.cfg_scale if cfg is None else cfg, 1.0, 100.0)
        temp = _range("temperature", d.temperature if temp is None else temp, 0.0, 100.0, lo_open=True)
        # a request's top-k is checked against the vocabulary; the bundle's own default is taken as the
        # Pipeline takes it (a top-k at or above the vocabulary keeps every token: sampling.top_k_filter)
        top_k = int(d.top_k if top_k is None else _range("top_k", top_k, 0, self.vocab))
        top_p = _range("top_p", d.top_p if top_p is None else top_p, 0.0, 1.0, lo_open=True)
        mk = method_knobs()
        given = {k: v for k, v in zip(mk, method_values) if v is not None}
        for k, v in given.items():
            if k in _RANGES:
                _range(k, v, *_RANGES[k])
            elif mk[k][1] == "float" and not math.isfinite(v):
                raise InputError(f"{k}={v} is not a finite number")
        if given:  # the method's own settings check their values (speculative/methods.py SpecConfig.make)
            try:
                resolve_spec(method, knobs=given)
            except (TypeError, ValueError) as e:
                raise InputError(f"{', '.join(sorted(given))}: {e}") from e
        return (requested or AUTO, float(cfg), float(temp), top_k, float(top_p), *method_values)

    def _condition(self, value, negative=None) -> tuple:
        """A row's prompt -> (class id, None) for class-conditioned engines, else (None, its text):
        a prompted family's text prompt (its prompter) or a T5-caption engine's caption (the
        pipeline's T5 encoder, $LISA_TRT_TEXT_ENCODER where the server runs); the bundle's
        conditions adapter (resolved once, when the pipeline opened) says which. `negative`: the
        row's negative prompt, refused (naming why) where the family takes none."""
        conds = self.pipe.conditions
        conds.negatives(negative, 1)
        cid, caption = conds.served(value, self.pipe.class_names, getattr(self.pipe, "_text", None))
        if caption is not None:  # the bundle's prompt budget, per row (text prompts only have one)
            self.pipe.check_prompt(caption, negative)
        return cid, caption

    def parse(self, requests: Sequence[Mapping]) -> tuple[list, dict, list]:
        """-> (rows, {request index: error message}, rows per request)."""
        rows, errors, sizes = [], {}, []
        for r, req in enumerate(requests):
            req = getattr(req, "data", req)
            try:
                names = inputs()
                unknown = sorted(set(req) - set(names))
                if unknown:
                    raise InputError(f"unknown input(s) {', '.join(unknown)}; valid: {', '.join(names)}")
                if "prompt" not in req:
                    raise InputError("missing input 'prompt' (BYTES, shape (n, 1): a class id or name)")
                n = int(np.asarray(req["prompt"]).shape[0]) if np.asarray(req["prompt"]).ndim else 0
                sizes.append(max(n, 1))
                if n < 1:
                    raise InputError("input 'prompt' must have shape (n, 1) with n >= 1")
                if n > self.max_batch:
                    raise InputError(f"a request of {n} rows exceeds --max-batch {self.max_batch}")
                cols = {name: self._column(req, name, n) for name in names}
                mine = []
                for i in range(n):
                    neg = cols["negative_prompt"][i]
                    neg = neg.strip() if neg is not None and neg.strip() else None  # empty: none
                    cid, caption = self._condition(cols["prompt"][i], neg)
                    seed = cols["seed"][i]
                    knob_names = SAMPLING_KNOBS + tuple(k for k in names if k not in BASE_INPUTS)
                    knobs = self._knobs(*(cols[k][i] for k in knob_names))
                    mine.append(_Row(r, i, cid, 0 if seed is None else seed, knobs, caption, neg))
                rows.extend(mine)
            except LisaError as e:  # any malformed input is this request's error only
                errors[r] = RequestFailure(" ".join(str(e).split()))
            except Exception:  # noqa: BLE001 - a parsing bug is ours, not the client's
                errors[r] = internal_failure("while parsing a request")
            if len(sizes) <= r:
                sizes.append(1)
        return rows, errors, sizes

    # -- execution -----------------------------------------------------------------------

    def _decode_group(self, knobs: tuple, rows: list, on_step=None) -> list:
        """One batched decode -> per row (image uint8 (H, W, 3), stats dict)."""
        from ..runtime.prompts import Prompt

        verify, cfg, temp, top_k, top_p, *method_values = knobs
        spec = {k: v for k, v in zip(method_knobs(), method_values) if v is not None}
        # the group's one plan: its Method (auto settled by the bundle), sampling over the served defaults
        # (ranges checked by _knobs, serving's own), tree and knobs over the bundle's
        sampling = dataclasses.replace(self.defaults, cfg_scale=cfg, temperature=temp, top_k=top_k, top_p=top_p)
        plan = self.pipe.plan(verify, sampling=sampling, **spec)
        prompts = [Prompt(i, class_id=r.class_id, caption=r.caption, seed=r.seed, cfg=cfg) for i, r in enumerate(rows)]
        negative = [r.negative for r in rows] if any(r.negative is not None for r in rows) else None
        res = self.pipe.generate(prompts, plan=plan, batch=True, on_step=on_step, negative_prompt=negative)
        return [(np.asarray(img, dtype=np.uint8), st) for img, st in zip(res.images, res.stats)]

    def infer(self, requests: Sequence[Mapping]) -> list[dict]:
        """A list of requests -> one output dict per request (in-process use, e.g. PyTriton's
        `infer_func`, which can only fail a whole execution): a request that is bad as a whole gets
        its message in `error`, unless every request is bad (then this raises ServeRequestError).
        The served model (repo.py's model.py) uses infer_each, which fails requests one by one."""
        out = self.infer_each(requests)
        msgs = [err for err, _ in out]
        if out and all(m is not None for m in msgs):
            raise ServeRequestError(msgs[0] if len(msgs) == 1 else
                                    "; ".join(f"request {i}: {m}" for i, m in enumerate(msgs)))
        return [resp for _, resp in out]

    def infer_each(self, requests: Sequence[Mapping], on_step=None) -> list[tuple]:
        """-> per request (RequestFailure or None, output dict). A failure is set for a request
        that is invalid as a whole, or any of whose rows failed (the Triton Python backend answers
        it with a TritonError: INVALID_ARG, or INTERNAL when `failure.internal`); the output
        dict carries each row's message in `error`. on_step: Pipeline.generate's per-step hook
        for every decode (stream_each's progressive images)."""
        rows, errors, sizes = self.parse(requests)
        results = {}  # (req, idx) -> (image, stats) or error string
        groups: dict = {}
        for row in rows:
            groups.setdefault(row.knobs, []).append(row)
        with self._lock:
            for knobs, members in groups.items():
                for k in range(0, len(members), self.max_batch):
                    chunk = members[k:k + self.max_batch]
                    try:
                        out = self._decode_group(knobs, chunk, **({} if on_step is None else {"on_step": on_step}))
                    except DecodeCancelled:  # the whole request is given up (stream_each)
                        raise
                    except InputError as e:  # a setting the engines refuse (validated rows): the client's
                        out = [RequestFailure(" ".join(str(e).split()))] * len(chunk)
                    except Exception:  # noqa: BLE001 - one failed batch must not stop the server
                        out = [internal_failure(f"while decoding {len(chunk)} row(s) with "
                                                f"{(getattr(knobs[0], 'name', knobs[0]), *knobs[1:])}")] * len(chunk)
                    results.update({(r.req, r.idx): o for r, o in zip(chunk, out)})
        out = []
        for r in range(len(requests)):
            resp = self._response(r, sizes[r], errors.get(r), results)
            err = errors.get(r)
            if err is None:  # a row that failed in decoding fails its request (internal faults first)
                got = [results.get((r, i), "internal error: row not decoded") for i in range(sizes[r])]
                failed = [g for g in got if isinstance(g, str)]
                failed.sort(key=lambda f: not getattr(f, "internal", True))
                err = (failed[0] if isinstance(failed[0], RequestFailure) else RequestFailure(failed[0], True)) \
                    if failed else None
            out.append((err, resp))
        return out

    def stream_each(self, request: Mapping, partial_images: int, emit, cancelled=None) -> tuple:
        """One request decoded with `partial_images` progressive images -> (failure or None, output
        dict) as infer_each. While it decodes, `emit(k, tokens, images)` is called for k = 0..K-1 in
        order once every row has committed k+1 / (K+1) of its tokens: `tokens` the fewest committed
        by a row, `images` (n, H, W, 3) uint8 of every row's committed tokens (PartialDecode.images).

        cancelled: optional `cancelled() -> bool`, asked after every decode step (the Triton model
        passes `request.is_cancelled`, an in-process caller its client's disconnect): when it turns
        True the decode stops there and DecodeCancelled (its `steps`) is raised; the model is free
        for the next request at once."""
        return self.infer_each([request], on_step=PartialImages(partial_images, emit, cancelled))[0]

    def stream_request(self, request: Mapping, send, cancelled=None) -> None:
        """One request of the decoupled model 'lisa_stream' -> its responses (stream_batch of one)."""
        self.stream_batch([(request, send, cancelled)])

    def stream_batch(self, jobs: Sequence[tuple]) -> None:
        """One execution of the decoupled model 'lisa_stream', the model holding the engines, ->
        every request's responses. jobs: (request, send, cancelled) per request, `send(outputs,
        final)` its response sender.

        A request with `partial_images` K >= 1 (INT32 (n, 1), one value 0..MAX_PARTIAL_IMAGES; the
        streaming front end's) gets, per progressive image k (stream_each), `image` (n, H, W, 3) with
        `partial_index` k and `tokens` (the fewest committed by a row), each (n, 1); it decodes on
        its own, and `cancelled` (as stream_each's: Triton's `request.is_cancelled`) stops its decode
        at the next step (logged with the steps it ran; status CANCELLED_STATUS, so Triton releases
        the request). The requests without partials (K 0 or absent: what model 'lisa', the proxy,
        forwards) decode together first, their rows grouped as infer_each groups them.

        Every request ends with one final response: infer_each's output dict with `partial_index`
        -1 and `status` (n, 1): 0, or its failure as an HTTP status (400 the client's mistake, 500
        the server's; the message in `error`; `final_failure` reads it back)."""
        plain, streams = [], []
        for request, send, cancelled in jobs:
            req = dict(getattr(request, "data", request))
            try:
                k = _partials(req.pop("partial_images", None))
            except InputError as e:
                self._send_final(send, req, RequestFailure(" ".join(str(e).split())))
                continue
            (streams if k else plain).append((req, send, k, cancelled))
        if plain:
            for (req, send, _, _), (failure, out) in zip(plain, self.infer_each([j[0] for j in plain])):
                self._send_final(send, req, failure, out)
        for req, send, k, cancelled in streams:
            self._stream_one(req, send, k, cancelled)

    def _stream_one(self, req: dict, send, k: int, cancelled) -> None:
        """One request with K >= 1 progressive images (stream_batch)."""
        def emit(i, tokens, images):
            n = images.shape[0]
            send({"image": images, "partial_index": np.full((n, 1), i, np.int32),
                  "tokens": np.full((n, 1), tokens, np.int32)}, False)

        try:
            failure, out = self.stream_each(req, k, emit, cancelled)
        except DecodeCancelled as e:
            LOG.info("stream request cancelled by its client: decode stopped after %d step(s)", e.steps)
            self._send_final(send, req, RequestFailure(str(e)), status=CANCELLED_STATUS)
            return
        self._send_final(send, req, failure, out)

    def _send_final(self, send, req: Mapping, failure, out: Optional[dict] = None,
                    status: Optional[int] = None) -> None:
        """A request's final response (stream_batch): `out` (infer_each's; None: every row failed with
        `failure`), `partial_index` -1 and `status` (default: 0, or 400 / 500 from `failure`)."""
        if out is None:
            out = self._response(0, _rows(req), failure, {})
        n = out["error"].shape[0]
        if status is None:
            status = 0 if failure is None else (500 if failure.internal else 400)
        send({**out, "partial_index": np.full((n, 1), -1, np.int32), "status": np.full((n, 1), status, np.int32)},
             True)

    def _response(self, r: int, n: int, error: Optional[str], results: dict) -> dict:
        got = [error if error is not None else results.get((r, i), "internal error: row not decoded")
               for i in range(n)]
        shapes = [g[0].shape for g in got if not isinstance(g, str)]
        h, w = shapes[0][:2] if shapes else (0, 0)
        img = np.zeros((n, h, w, 3), dtype=OUTPUTS["image"][0])
        mal, tvd, sec, bat, fwd = (np.zeros((n, 1), OUTPUTS[k][0])
                                   for k in ("mal", "tvd", "seconds", "batch", "forwards"))
        err = np.array([[b""] for _ in range(n)], dtype=object)
        for i, g in enumerate(got):
            if isinstance(g, str):
                err[i, 0] = g.encode()
                continue
            img[i] = g[0]
            st = g[1]
            mal[i, 0], tvd[i, 0], sec[i, 0] = st["mal"], st["mean_tvd"], st["seconds"]
            bat[i, 0], fwd[i, 0] = st.get("batch", 1), st["forwards"]
        return {"image": img, "mal": mal, "tvd": tvd, "seconds": sec, "batch": bat, "forwards": fwd, "error": err}


def _rows(req: Mapping) -> int:
    """The rows of a request (its `prompt`'s leading dimension; at least 1)."""
    p = np.asarray(req.get("prompt", np.zeros((1, 1), object)))
    return max(1, p.shape[0] if p.ndim else 1)


def _partials(value) -> int:
    """The `partial_images` input of one request (absent: 0) -> K, or InputError naming the range."""
    if value is None:
        return 0
    a = np.asarray(value)
    if a.size < 1 or a.dtype.kind not in ("i", "u"):
        raise InputError(f"input 'partial_images' must be INT32 of shape (n, 1), got {a.dtype} {a.shape}")
    ks = sorted({int(v) for v in a.reshape(-1)})
    if len(ks) > 1:
        raise InputError(f"input 'partial_images' must be one value for every row of a request, got {ks}")
    k = ks[0]
    if not 0 <= k <= MAX_PARTIAL_IMAGES:
        raise InputError(f"partial_images={k} is out of range; valid: 0..{MAX_PARTIAL_IMAGES}")
    return k


def final_failure(outputs: Mapping) -> Optional[RequestFailure]:
    """The failure a final response of 'lisa_stream' (stream_batch) carries, or None: its `status`
    (n, 1) and the rows' `error` messages -> RequestFailure (internal for status 500, or when a row's
    message is an internal error; that message first), as infer_each fails the request. Read by the
    proxy model 'lisa' (repo.py) and the OpenAI front end (openai_api.stream_item)."""
    status = int(np.asarray(outputs["status"]).reshape(-1)[0])
    msgs = [m.decode("utf-8", "replace") if isinstance(m, bytes) else str(m)
            for m in np.asarray(outputs["error"]).reshape(-1)]
    failed = [m for m in msgs if m]
    if not status and not failed:
        return None
    internal = [m for m in failed if m.startswith("internal error")]
    message = (internal or failed or [f"internal error: status {status} without a message"])[0]
    return RequestFailure(message, internal=bool(internal) or status == 500)
