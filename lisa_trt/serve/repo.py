"""`lisa-trt triton-repo ENGINE_DIR REPO_DIR`: a Triton model repository (also what `lisa-trt serve` runs).

Layout (model 'lisa', Python backend):

    REPO_DIR/lisa/config.pbtxt     inputs/outputs of serve/model.py, dynamic batcher, instance
                                   groups, one warm-up request (model_warmup)
    REPO_DIR/lisa/warmup/prompt    the warm-up request's prompt (class 0, Triton's BYTES layout)
    REPO_DIR/lisa/1/model.py       TritonPythonModel: Pipeline.from_dir(engine_dir) + ServeModel
    REPO_DIR/lisa/1/engines/       (with --copy-engines) a copy of ENGINE_DIR

With stream=True (`triton-repo --stream`, what `lisa-trt serve --openai-port P --progressive`
writes) the engines are in the decoupled model 'lisa_stream' and 'lisa' becomes its proxy:

    REPO_DIR/lisa_stream/config.pbtxt  the same inputs plus `partial_images`, the same outputs plus
                                   `partial_index`, `tokens`, `status`; decoupled; its own
                                   dynamic batcher and the instance groups; no model_warmup (its
                                   initialize decodes once)
    REPO_DIR/lisa_stream/1/model.py    Pipeline + ServeModel.stream_batch: per request its partial
                                   images (if asked), then its final response; a cancelled
                                   request (request.is_cancelled()) stops at its next decode step
    REPO_DIR/lisa_stream/1/engines/    (with --copy-engines) a copy of ENGINE_DIR
    REPO_DIR/lisa/config.pbtxt     the inputs and outputs above, dynamic batcher, KIND_CPU
                                   instances (one per engine instance), no model_warmup
    REPO_DIR/lisa/1/model.py       PROXY_MODEL_PY: no engines; each request forwarded through BLS
                                   (decoupled exec) to 'lisa_stream', its final response answered

Run it in the Triton container (with TensorRT and lisa-trt installed):
`tritonserver --model-repository REPO_DIR`. Triton loads the model, runs the warm-up request
through it and only then reports the model (and, with strict readiness, the server) ready.
Request errors: a bad request gets TritonError INVALID_ARG (HTTP 400, gRPC INVALID_ARGUMENT)
with a one-line message; a server fault gets INTERNAL (HTTP 500) with a request id, and the
traceback goes to the server log. The repository is written atomically (staged next to
REPO_DIR, then renamed); an existing REPO_DIR that is not a lisa-trt repository is refused.
"""

from __future__ import annotations

import os
import shutil
import struct
import uuid
from pathlib import Path
from typing import Optional

from ..errors import InputError
from .model import INPUTS, MODEL_NAME, OUTPUTS, REQUIRED, STREAM_INPUTS, STREAM_MODEL_NAME, STREAM_OUTPUTS

_TRITON_TYPES = {"str": "TYPE_STRING", "int64": "TYPE_INT64", "int32": "TYPE_INT32", "float32": "TYPE_FP32",
                 "uint8": "TYPE_UINT8"}


def triton_type(dtype, kind: Optional[str] = None) -> str:
    """A numpy dtype of serve/model.py's INPUTS / OUTPUTS (kind "str" or a bytes dtype: BYTES) -> Triton's."""
    import numpy as np

    return _TRITON_TYPES["str" if kind == "str" or np.dtype(dtype).kind == "S" else np.dtype(dtype).name]

_MODEL_HEAD = '''"""Triton Python-backend model written by `lisa-trt triton-repo`: lisa-trt Pipeline + ServeModel."""

import json
import logging
import os
import sys

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        logging.basicConfig(level=logging.INFO, format="lisa-trt %(levelname)s %(name)s: %(message)s")
        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        if params.get("lisa_trt_src") and params["lisa_trt_src"] not in sys.path:  # the lisa_trt that serves
            sys.path.insert(0, params["lisa_trt_src"])
        if args.get("model_instance_kind") == "GPU":  # one instance per listed GPU: pin it before CUDA starts
            os.environ["CUDA_VISIBLE_DEVICES"] = str(args["model_instance_device_id"])
        from lisa_trt.runtime.pipeline import Pipeline
        from lisa_trt.serve.model import ServeModel

        engine_dir = params["engine_dir"]
        if not os.path.isabs(engine_dir):
            engine_dir = os.path.join(args["model_repository"], args["model_version"], engine_dir)
        self.names = [i["name"] for i in cfg["input"]]
        threads = int(params.get("threads", "0")) or None
        window = int(params["sjd_window"]) if params.get("sjd_window") else None  # serve --sjd-window
        pipe = Pipeline.from_dir(engine_dir, backend=params.get("backend", "auto"), threads=threads, sjd_window=window)
        self.model = ServeModel(pipe, max_batch=int(cfg.get("max_batch_size", 16)) or 1)
        # a first decode here fails the load with its message (a failing model_warmup request would
        # take tritonserver down natively); Triton's model_warmup then runs one request end to end
        secs = self.model.warm_up()
        self.instance, self.answered = args.get("model_instance_name"), False
        logging.getLogger("lisa_trt.serve").info("instance %s loaded and warmed up (%s, %s threads; warm-up decode "
                                                 "%.1f s)", args.get("model_instance_name"), pipe.backend,
                                                 threads or "default", secs)

    def inputs(self, req):
        """{name: array} of the request's inputs (optional ones it did not send left out)."""
        data = {}
        for name in self.names:
            t = pb_utils.get_input_tensor_by_name(req, name)
            if t is not None:
                data[name] = t.as_numpy()
        return data

'''

_MODEL_EXECUTE = '''    def execute(self, requests):
        batch = [self.inputs(req) for req in requests]
        responses = []
        for err, out in self.model.infer_each(batch):
            if err is None:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(k, v) for k, v in out.items()]))
            else:  # the client's mistake: 400; the server's own fault: 500 (traceback in the server log)
                code = pb_utils.TritonError.INTERNAL if err.internal else pb_utils.TritonError.INVALID_ARG
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(err), code)))
        if not self.answered:  # the first is Triton's model_warmup request, before the model is ready
            self.answered = True
            errs = [r.error().message() for r in responses if r.has_error()]
            logging.getLogger("lisa_trt.serve").info("instance %s answered its first request (%s)", self.instance,
                                                     f"failed: {errs[0]}" if errs else "ok")
        return responses

'''

_MODEL_TAIL = '''    def finalize(self):
        self.model = None
'''

MODEL_PY = _MODEL_HEAD + _MODEL_EXECUTE + _MODEL_TAIL
# the decoupled model 'lisa_stream', the one that holds the engines when it is written: the same
# pipeline set-up, ServeModel.stream_batch per execution (its dynamic batcher groups the requests)
STREAM_MODEL_PY = _MODEL_HEAD + '''    def execute(self, requests):
        # decoupled: each request gets its progressive images (if it asks for some), then its final
        # response (COMPLETE_FINAL); a request its client cancelled (request.is_cancelled()) stops
        # decoding at its next step
        jobs = []
        for req in requests:
            sender = req.get_response_sender()

            def send(out, final, sender=sender):
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in out.items()]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

            jobs.append((self.inputs(req), send, req.is_cancelled))
        self.model.stream_batch(jobs)
        return None

''' + _MODEL_TAIL

# model 'lisa' next to 'lisa_stream': a proxy without engines. Each request is forwarded as it is
# through BLS (the Python backend's decoupled exec) to the engine model; its final response, as
# 'lisa' has always answered (a failure as a TritonError: INVALID_ARG 400, INTERNAL 500). The
# requests of one execution are forwarded at once, each from a thread of a pool started (and its
# threads running) in initialize, so they reach the engine model within its batching window and
# its dynamic batcher groups their rows as 'lisa''s own did (docs/serving.md: measured).
PROXY_MODEL_PY = '''\"\"\"Triton Python-backend model written by `lisa-trt triton-repo --stream`: model 'lisa' as a proxy
(no engines) of the decoupled engine model, through BLS.\"\"\"

import json
import logging
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        logging.basicConfig(level=logging.INFO, format="lisa-trt %(levelname)s %(name)s: %(message)s")
        cfg = json.loads(args["model_config"])
        src = cfg["parameters"].get("lisa_trt_src", {}).get("string_value")
        if src and src not in sys.path:  # the lisa_trt that serves
            sys.path.insert(0, src)
        self.engine = cfg["parameters"]["engine_model"]["string_value"]
        self.names = [i["name"] for i in cfg["input"]]
        self.outputs = [o["name"] for o in cfg["output"]]
        from lisa_trt.serve.model import final_failure

        self.final_failure = final_failure
        # one thread per request an execution can hold (each has >= 1 row), all started now: a BLS
        # call blocks its thread until the final response, and threads started on demand reach the
        # engine model too late to be batched together
        n = max(1, int(cfg.get("max_batch_size", 1)))
        self.pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="bls")
        started = threading.Barrier(n)
        for f in [self.pool.submit(started.wait) for _ in range(n)]:
            f.result()
        logging.getLogger("lisa_trt.serve").info("instance %s: proxy of model '%s' (no engines)",
                                                 args.get("model_instance_name"), self.engine)

    def execute(self, requests):
        return [f.result() for f in [self.pool.submit(self.forward, req) for req in requests]]

    def forward(self, req):
        inputs = [t for t in (pb_utils.get_input_tensor_by_name(req, n) for n in self.names) if t is not None]
        bls = pb_utils.InferenceRequest(model_name=self.engine, inputs=inputs,
                                        requested_output_names=self.outputs + ["status"])
        final = None
        for resp in bls.exec(decoupled=True):
            if resp.has_error():  # the engine model could not take it (not ready, unloading)
                return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                    f"model '{self.engine}': {resp.error().message()}", pb_utils.TritonError.UNAVAILABLE))
            if resp.output_tensors():
                final = resp
        if final is None:
            return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                f"model '{self.engine}' ended the request without a final response", pb_utils.TritonError.INTERNAL))
        out = {t.name(): t for t in final.output_tensors()}
        failure = self.final_failure({k: out[k].as_numpy() for k in ("status", "error")})
        if failure is not None:
            code = pb_utils.TritonError.INTERNAL if failure.internal else pb_utils.TritonError.INVALID_ARG
            return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(failure), code))
        return pb_utils.InferenceResponse(output_tensors=[out[k] for k in self.outputs])

    def finalize(self):
        self.pool.shutdown(wait=False)
'''

WARMUP_PROMPT = "0"  # class id 0: every class-conditioned bundle has it


def warmup_bytes(text: str = WARMUP_PROMPT) -> bytes:
    """One BYTES element as Triton reads a warm-up input_data_file: uint32 length (little endian) + bytes."""
    raw = text.encode()
    return struct.pack("<I", len(raw)) + raw


def _instance_groups(instances: int, kind: str, gpus) -> str:
    if gpus:
        ids = ", ".join(str(int(g)) for g in gpus)
        return f"instance_group [ {{ count: {instances} kind: KIND_GPU gpus: [ {ids} ] }} ]\n"
    return f"instance_group [ {{ count: {instances} kind: KIND_{kind.upper()} }} ]\n"


def config_pbtxt(*, engine_dir: str, backend: str, max_batch: int, max_queue_delay_ms: float, instances: int,
                 kind: str, gpus=None, threads: int = 0, warmup: bool = True,
                 sjd_window: Optional[int] = None, stream: bool = False, proxy: bool = False,
                 source: Optional[str] = None) -> str:
    """A model's config.pbtxt (protobuf text format of Triton's ModelConfig).

    Args:
        instances: model instances (Triton instance group count; per GPU when `gpus` is given).
        kind: "cpu" or "gpu" (KIND_CPU / KIND_GPU) when `gpus` is not given.
        gpus: GPU ids: one instance group over them, `instances` instances on each.
        threads: ONNX Runtime / torch threads of each instance (0: lisa-trt's default policy).
        warmup: Triton sends one request (class 0) to every instance before reporting it ready.
        sjd_window: the Jacobi window of requests that do not send one (Pipeline.from_dir; None: 16).
        stream: the config of the decoupled model 'lisa_stream', the one that holds the engines
            (STREAM_INPUTS / STREAM_OUTPUTS added, `model_transaction_policy { decoupled: true }`,
            its own dynamic batcher, no model_warmup: its initialize decodes once).
        proxy: the config of model 'lisa' as the proxy of 'lisa_stream' (PROXY_MODEL_PY: no engines,
            one KIND_CPU instance per engine instance, no model_warmup; the engine model's name as
            its parameter `engine_model`).
        source: a directory the model imports lisa_trt from before any installed copy (parameter
            `lisa_trt_src`; `serve` passes the one it runs from), None: the stub's own sys.path.
    """
    ins = ",\n".join(
        f'  {{ name: "{n}" data_type: {triton_type(dt, k)} dims: [ 1 ]{"" if n in REQUIRED else " optional: true"} }}'
        for n, (dt, k) in {**INPUTS, **(STREAM_INPUTS if stream else {})}.items())
    outs = ",\n".join(f'  {{ name: "{n}" data_type: {triton_type(dt)} dims: [ {", ".join(map(str, dims))} ] }}'
                       for n, (dt, dims) in {**OUTPUTS, **(STREAM_OUTPUTS if stream else {})}.items())
    head = (f'name: "{STREAM_MODEL_NAME if stream else MODEL_NAME}"\nbackend: "python"\nmax_batch_size: {max_batch}\n'
            f"input [\n{ins}\n]\noutput [\n{outs}\n]\n"
            + ("model_transaction_policy { decoupled: true }\n" if stream else "")
            + f"dynamic_batching {{ max_queue_delay_microseconds: {int(round(max_queue_delay_ms * 1000))} }}\n")
    if source is not None:
        head += f'parameters {{ key: "lisa_trt_src" value: {{ string_value: "{source}" }} }}\n'
    if proxy:
        return (head + _instance_groups(instances * max(1, len(gpus or ())), "cpu", None)
                + f'parameters {{ key: "engine_model" value: {{ string_value: "{STREAM_MODEL_NAME}" }} }}\n')
    return (head + _instance_groups(instances, kind, gpus)
            + ('model_warmup [ { name: "lisa_warmup" batch_size: 1 inputs { key: "prompt" value: '
               '{ data_type: TYPE_STRING dims: [ 1 ] input_data_file: "prompt" } } } ]\n' if warmup and not stream else "")
            + f'parameters {{ key: "engine_dir" value: {{ string_value: "{engine_dir}" }} }}\n'
            f'parameters {{ key: "backend" value: {{ string_value: "{backend}" }} }}\n'
            f'parameters {{ key: "threads" value: {{ string_value: "{int(threads)}" }} }}\n'
            + (f'parameters {{ key: "sjd_window" value: {{ string_value: "{int(sjd_window)}" }} }}\n'
               if sjd_window is not None else ""))


def write_triton_repo(engine_dir, repo_dir, *, backend: str = "trt", max_batch: int = 16,
                      max_queue_delay_ms: float = 5.0, instances: int = 1, kind: str = "gpu",
                      copy_engines: bool = False, gpus=None, threads: int = 0, warmup: bool = True,
                      sjd_window: Optional[int] = None, stream: bool = False, source: Optional[str] = None) -> Path:
    """Write the repository (see module docstring and config_pbtxt); returns REPO_DIR.

    stream: the engines in the decoupled model 'lisa_stream' (progressive images over gRPC
    streaming, and every request of 'lisa', which becomes its proxy): one copy of the engines.
    source: the directory the models import lisa_trt from first (config_pbtxt)."""
    from ..export.manifest import read_manifest
    from ..runtime.context import resolve_spec

    if sjd_window is not None:
        resolve_spec(None, knobs={"sjd_window": sjd_window})  # the setting's own check, before anything is written

    engine_dir, repo_dir = Path(engine_dir).resolve(), Path(repo_dir)
    read_manifest(engine_dir)  # refuse anything that is not an engine directory
    if max_batch < 1 or instances < 1 or max_queue_delay_ms < 0 or threads < 0:
        raise InputError(f"need --max-batch >= 1, --instances >= 1, --max-queue-delay-ms >= 0, --threads >= 1 "
                         f"(got {max_batch}, {instances}, {max_queue_delay_ms}, {threads})")
    if repo_dir.exists() and any(repo_dir.iterdir()) and not (repo_dir / MODEL_NAME / "config.pbtxt").is_file():
        raise InputError(f"{repo_dir} exists and is not a lisa-trt Triton repository; choose another directory")
    stage = repo_dir.parent / f".{repo_dir.name}.staging-{uuid.uuid4().hex[:8]}"
    common = dict(backend=backend, max_batch=max_batch, max_queue_delay_ms=max_queue_delay_ms, instances=instances,
                  kind=kind, gpus=gpus, threads=threads, sjd_window=sjd_window, source=source)
    try:
        engines = STREAM_MODEL_NAME if stream else MODEL_NAME  # the model that holds the engines
        ver = stage / engines / "1"
        ver.mkdir(parents=True)
        where = str(engine_dir)
        if copy_engines:
            shutil.copytree(engine_dir, ver / "engines")
            where = "engines"
        (ver / "model.py").write_text(STREAM_MODEL_PY if stream else MODEL_PY)
        (stage / engines / "config.pbtxt").write_text(config_pbtxt(engine_dir=where, warmup=warmup, stream=stream,
                                                                   **common))
        if stream:  # 'lisa': the proxy (no engines, no warm-up: see docs/serving.md)
            (stage / MODEL_NAME / "1").mkdir(parents=True)
            (stage / MODEL_NAME / "1" / "model.py").write_text(PROXY_MODEL_PY)
            (stage / MODEL_NAME / "config.pbtxt").write_text(config_pbtxt(engine_dir="", proxy=True, **common))
        elif warmup:
            (stage / MODEL_NAME / "warmup").mkdir()
            (stage / MODEL_NAME / "warmup" / "prompt").write_bytes(warmup_bytes())
        _replace(stage, repo_dir)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
    return repo_dir


def _replace(stage: Path, repo_dir: Path) -> None:
    """Move the staged repository to REPO_DIR, replacing an existing one atomically."""
    old = None
    if repo_dir.exists():
        old = repo_dir.parent / f".{repo_dir.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(repo_dir, old)
    os.replace(stage, repo_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
