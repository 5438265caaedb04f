"""`lisa-trt serve`: one engine directory behind NVIDIA Triton Inference Server (via PyTriton).

PyTriton starts the `tritonserver` binary it bundles; Triton's dynamic batcher groups requests
that arrive within `--max-queue-delay-ms` (up to `--max-batch` rows) and hands them to
ServeModel.infer, which decodes rows with equal settings as one speculative batch.

Endpoints (Triton's own): HTTP/REST (KServe v2) on --http-port, gRPC on --grpc-port, Prometheus
metrics on --metrics-port (`/metrics`), health at `/v2/health/live` and `/v2/health/ready`.

SIGTERM / SIGINT: Triton stops taking new requests, finishes the in-flight ones (up to
`--drain-timeout` seconds), stops its Python-backend stubs, and the process exits 0.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from ..errors import LisaError

MODEL_NAME = "lisa"
LOG = logging.getLogger("lisa_trt.serve")


class ServeUnavailableError(LisaError):
    """PyTriton (the `serve` extra) is not installed, or Triton could not start."""


def require_pytriton():
    """Import pytriton or say how to install it."""
    try:
        import pytriton  # noqa: F401
        from pytriton.triton import Triton  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError, or a numpy/ABI problem inside pytriton
        raise ServeUnavailableError(
            f"serving needs NVIDIA PyTriton ({type(e).__name__}: {e}); install the extra: "
            "pip install 'lisa-trt[serve]' (nvidia-pytriton pins numpy<2: use a dedicated venv)") from e


def libpython_dir() -> Optional[str]:
    """Directory holding the running interpreter's libpython shared library (None if static)."""
    libdir = sysconfig.get_config_var("LIBDIR")
    for name in (sysconfig.get_config_var("LDLIBRARY"), sysconfig.get_config_var("INSTSONAME")):
        if libdir and name and ".so" in name and Path(libdir, name).exists():
            return str(libdir)
    return None


def fix_libpython_path(environ=os.environ) -> Optional[str]:
    """Put this interpreter's libpython first on LD_LIBRARY_PATH for the processes Triton spawns.

    Triton's Python-backend stub links `libpython3.X.so`; the dynamic loader would otherwise
    pick the system's copy, whose ABI differs from this interpreter's build, and model loading
    fails (`'_thread.RLock' object has no attribute '_recursion_count'`). Only child processes
    (tritonserver and its stubs, which inherit os.environ) load it, so no re-exec is needed.
    """
    d = libpython_dir()
    if d is None:
        return None
    parts = [p for p in environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    if not parts or parts[0] != d:
        environ["LD_LIBRARY_PATH"] = ":".join([d] + [p for p in parts if p != d])
    return d


def model_tensors():
    """PyTriton input / output Tensor specs (every input (n, 1); image (n, H, W, 3))."""
    import numpy as np
    from pytriton.model_config import Tensor

    from .model import INPUTS, REQUIRED

    ins = [Tensor(name=n, dtype=bytes if k == "str" else dt, shape=(1,), optional=n not in REQUIRED)
           for n, (dt, k) in INPUTS.items()]
    outs = [Tensor(name="image", dtype=np.uint8, shape=(-1, -1, 3))]
    outs += [Tensor(name=n, dtype=dt, shape=(1,)) for n, dt in (("mal", np.float32), ("tvd", np.float32),
                                                                ("seconds", np.float32), ("batch", np.int32))]
    outs.append(Tensor(name="error", dtype=bytes, shape=(1,)))
    return ins, outs


def start_triton(serve_model, *, host: str = "127.0.0.1", http_port: int = 8000, grpc_port: int = 8001,
                 metrics_port: int = 8002, max_batch: int = 16, max_queue_delay_ms: float = 5.0,
                 drain_timeout: int = 60, log_verbose: int = 0):
    """Start Triton with `serve_model` bound as model 'lisa'; returns the running Triton."""
    require_pytriton()
    fix_libpython_path()
    from pytriton.model_config import DynamicBatcher, ModelConfig
    from pytriton.triton import Triton, TritonConfig

    cfg = TritonConfig(http_address=host, http_port=http_port, grpc_address=host, grpc_port=grpc_port,
                       metrics_address=host, metrics_port=metrics_port, allow_metrics=True, allow_cpu_metrics=True,
                       allow_gpu_metrics=False, exit_timeout_secs=drain_timeout, log_verbose=log_verbose,
                       strict_readiness=True)
    triton = Triton(config=cfg)
    ins, outs = model_tensors()
    batcher = DynamicBatcher(max_queue_delay_microseconds=int(round(max_queue_delay_ms * 1000)))
    try:
        triton.bind(model_name=MODEL_NAME, infer_func=serve_model.infer, inputs=ins, outputs=outs,
                    config=ModelConfig(batching=True, max_batch_size=max_batch, batcher=batcher))
        triton.run()
    except Exception as e:
        triton.stop()
        raise ServeUnavailableError(f"Triton did not start ({type(e).__name__}: {e}); check that ports "
                                    f"{http_port}/{grpc_port}/{metrics_port} on {host} are free") from e
    return triton


def serve(engine_dir, *, backend: str = "auto", host: str = "127.0.0.1", http_port: int = 8000,
          grpc_port: int = 8001, metrics_port: int = 8002, max_batch: int = 16, max_queue_delay_ms: float = 5.0,
          threads: Optional[int] = None, drain_timeout: int = 60, echo: Callable = print) -> int:
    """Load the engines, serve until SIGTERM/SIGINT, drain in-flight requests, return 0."""
    require_pytriton()
    from ..runtime.pipeline import Pipeline
    from .model import ServeModel

    if max_batch < 1:
        raise ServeUnavailableError(f"--max-batch must be >= 1, got {max_batch}")
    if max_queue_delay_ms < 0:
        raise ServeUnavailableError(f"--max-queue-delay-ms must be >= 0, got {max_queue_delay_ms}")
    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        t0 = time.perf_counter()
        pipe = Pipeline.from_dir(engine_dir, backend=backend, threads=threads)
        model = ServeModel(pipe, max_batch=max_batch)
        triton = start_triton(model, host=host, http_port=http_port, grpc_port=grpc_port,
                              metrics_port=metrics_port, max_batch=max_batch,
                              max_queue_delay_ms=max_queue_delay_ms, drain_timeout=drain_timeout)
        echo(f"serving {engine_dir} ({pipe.backend}) as model '{MODEL_NAME}' in {time.perf_counter() - t0:.1f} s: "
             f"http://{host}:{http_port}/v2/models/{MODEL_NAME} grpc {host}:{grpc_port} "
             f"metrics http://{host}:{metrics_port}/metrics (batch <= {max_batch}, window {max_queue_delay_ms} ms)")
        sys.stdout.flush()
        try:
            while not stop.wait(0.5):
                if not triton.is_alive():
                    print("Triton exited unexpectedly; see its log above", file=sys.stderr)
                    return 1
            echo("signal received: finishing in-flight requests, then exiting")
            sys.stdout.flush()
        finally:
            triton.stop()
        echo("stopped")
        return 0
    finally:
        for s, h in old.items():
            signal.signal(s, h)
