"""`lisa-trt serve`: one engine directory behind NVIDIA Triton Inference Server.

`serve` writes a Triton model repository for ENGINE_DIR (repo.py: Python-backend model
'lisa', dynamic batcher, `--instances` instance groups, one warm-up request; with
`--openai-port P --progressive` the engines are in the decoupled model 'lisa_stream' instead,
whose progressive images the front end streams over gRPC, and 'lisa' is its proxy through BLS:
one copy of the engines) into a temporary directory and runs the `tritonserver` binary that
PyTriton bundles on it. Triton loads the models, sends 'lisa' its warm-up request (the engine
model decodes one image in its initialize), and opens its HTTP / gRPC / metrics endpoints only
after that, so `/v2/health/ready` (and gRPC ServerReady) never answers before the models can
serve; `serve` prints the moment it first answers 200.

Every port is checked before Triton starts: a taken one is refused with a one-line message
(Triton itself would crash natively). Bad requests get HTTP 400 (gRPC INVALID_ARGUMENT) with a
one-line message, server faults HTTP 500 with a request id (traceback in the server log).

SIGTERM / SIGINT: Triton stops taking new requests, finishes the in-flight ones (up to
`--drain-timeout` seconds), stops its Python-backend stubs, and the process exits 0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..errors import InputError, LisaError
from .model import MODEL_NAME, STREAM_MODEL_NAME

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


def check_ports(host: str, ports: dict) -> None:
    """Refuse, before anything starts, a port that is out of range, repeated, or already taken.

    Args:
        ports: {option name: port}, e.g. {"--http-port": 8000, ...}.
    Raises:
        InputError naming the option and the port.
    """
    seen = {}
    for opt, port in ports.items():
        if not 1 <= int(port) <= 65535:
            raise InputError(f"{opt} {port} is not a TCP port (use 1..65535)")
        if port in seen:
            raise InputError(f"{opt} and {seen[port]} are both {port}; give each endpoint its own port")
        seen[port] = opt
    for opt, port in ports.items():
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Triton binds: TIME_WAIT is no conflict
            try:
                s.bind((host, int(port)))
            except OSError as e:
                why = "already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
                raise InputError(f"port {port} ({opt}) on {host} is {why}; stop what holds it or pass another "
                                 f"{opt}") from None


def _triton_dist() -> tuple[Path, Path]:
    """(the tritonserver directory PyTriton ships, its bundled shared libraries)."""
    require_pytriton()
    import pytriton
    from pytriton.utils.distribution import get_libs_path

    return Path(pytriton.__file__).parent / "tritonserver", Path(get_libs_path())


def backend_dir(dest: Path) -> Path:
    """A Triton backend directory with the Python backend and the stub for this interpreter."""
    dist, _ = _triton_dist()
    ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = dist / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServeUnavailableError(f"PyTriton has no Python-backend stub for Python {ver} ({stub}); "
                                    "serve from a Python version it supports (3.8 .. 3.13)")
    py = dest / "python"
    py.mkdir(parents=True, exist_ok=True)
    for f in (dist / "backends" / "python").iterdir():
        if f.is_file():
            os.symlink(f, py / f.name)
    os.symlink(stub, py / "triton_python_backend_stub")
    return dest


def triton_command(repo: Path, backends: Path, *, host: str, http_port: int, grpc_port: int, metrics_port: int,
                   drain_timeout: int, gpu_metrics: bool = False, log_verbose: int = 0) -> list[str]:
    """The tritonserver command line: load every model at start-up, strict readiness."""
    dist, _ = _triton_dist()
    return [str(dist / "bin" / "tritonserver"), f"--model-repository={repo}", f"--backend-directory={backends}",
            "--model-control-mode=none", "--strict-readiness=true", "--exit-on-error=true",
            f"--exit-timeout-secs={drain_timeout}", f"--log-verbose={log_verbose}",
            f"--http-address={host}", f"--http-port={http_port}", f"--grpc-address={host}", f"--grpc-port={grpc_port}",
            "--allow-metrics=true", f"--metrics-address={host}", f"--metrics-port={metrics_port}",
            "--allow-cpu-metrics=true", f"--allow-gpu-metrics={'true' if gpu_metrics else 'false'}",
            # a unique shared-memory prefix: several servers side by side never share a region
            f"--backend-config=python,shm-region-prefix-name=lisa{os.getpid()}_{int(time.time() * 1000) % 10**8}_"]


def lisa_trt_source() -> str:
    """The directory holding the lisa_trt package this process runs (what the model stubs import)."""
    return str(Path(__file__).resolve().parents[2])


def triton_env(environ=os.environ) -> dict:
    """tritonserver's environment: bundled libraries and this libpython first, this lisa_trt importable."""
    _, libs = _triton_dist()
    env = dict(environ)
    fix_libpython_path(env)
    env["LD_LIBRARY_PATH"] = ":".join(p for p in (env.get("LD_LIBRARY_PATH", ""), str(libs)) if p)
    env["PATH"] = f"{Path(sys.exec_prefix) / 'bin'}:{env.get('PATH', '')}"
    src = lisa_trt_source()  # also each model's `lisa_trt_src` parameter: the stubs import the lisa_trt serving them
    env["PYTHONPATH"] = ":".join([src] + [p for p in env.get("PYTHONPATH", "").split(":") if p and p != src])
    return env


def _die_with_parent():
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: tritonserver never outlives `lisa-trt serve`


def local_address(host: str) -> str:
    """The address this machine reaches a server bound to `host` at (wildcards: loopback), in URL form."""
    h = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    return f"[{h}]" if ":" in h else h


def ready_status(host: str, port: int, timeout: float = 2.0) -> Optional[int]:
    """HTTP status of GET /v2/health/ready (None while nothing answers)."""
    h = local_address(host)
    try:
        with urllib.request.urlopen(f"http://{h}:{port}/v2/health/ready", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def split_threads(threads: Optional[int], instances: int) -> int:
    """ORT/torch threads of each instance: --threads (default: the CPUs this process may use) split evenly."""
    total = threads or len(os.sched_getaffinity(0))
    return max(1, total // instances)


def serve(engine_dir, *, backend: str = "auto", host: str = "127.0.0.1", http_port: int = 8000,
          grpc_port: int = 8001, metrics_port: int = 8002, max_batch: int = 16, max_queue_delay_ms: float = 5.0,
          threads: Optional[int] = None, instances: int = 1, gpus: Optional[Sequence[int]] = None,
          drain_timeout: int = 60, start_timeout: float = 600.0, sjd_window: Optional[int] = None,
          openai_port: Optional[int] = None, openai_max_pending: int = 256, progressive: bool = False,
          served_model_name: str = MODEL_NAME, api_key: Optional[str] = None, echo: Callable = print) -> int:
    """Check the ports, start Triton on a repository for ENGINE_DIR, report readiness, serve until
    SIGTERM/SIGINT, drain in-flight requests; returns 0 (1 when Triton failed).

    sjd_window: the Jacobi window of requests that send no `sjd_window` input (None: 16).
    openai_port: also serve the OpenAI Images API there (openai_api.py), once Triton is ready;
    openai_max_pending: its requests in flight before it answers 429.
    served_model_name / api_key: the front end's OpenAI model name and the bearer token its /v1
    requests must carry (vLLM's --served-model-name / --api-key; openai_api.py).
    progressive: the engines in the decoupled model 'lisa_stream', whose partial images the front end
    streams while the image decodes, and model 'lisa' its proxy (no engines: one copy of the engines);
    needs openai_port and tritonclient[grpc]."""
    from .repo import write_triton_repo

    check_openai_identity(served_model_name, api_key, "--openai-port" if openai_port is None else None)
    _check_serve(engine_dir, host=host, ports=serve_ports(http_port, grpc_port, metrics_port, openai_port),
                 max_batch=max_batch, max_queue_delay_ms=max_queue_delay_ms, instances=instances, threads=threads,
                 openai_port=openai_port, openai_max_pending=openai_max_pending, progressive=progressive)
    t0 = time.perf_counter()
    stop = threading.Event()
    old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    work = Path(tempfile.mkdtemp(prefix="lisa-serve-"))
    proc = front = None
    stream = progressive
    try:
        per = split_threads(threads, instances)
        repo = write_triton_repo(engine_dir, work / "repo", backend=backend, max_batch=max_batch,
                                 max_queue_delay_ms=max_queue_delay_ms, instances=instances,
                                 kind="gpu" if gpus else "cpu", gpus=list(gpus) if gpus else None, threads=per,
                                 sjd_window=sjd_window, stream=stream, source=lisa_trt_source())
        cmd = triton_command(repo, backend_dir(work / "backends"), host=host, http_port=http_port,
                             grpc_port=grpc_port, metrics_port=metrics_port, drain_timeout=drain_timeout,
                             gpu_metrics=bool(gpus))
        where = f"{len(gpus)} GPU(s) x {instances}" if gpus else f"{instances} x {per} CPU thread(s)"
        echo(f"starting Triton for {engine_dir} (model '{MODEL_NAME}', {where}, batch <= {max_batch}, "
             f"window {max_queue_delay_ms} ms" + (f"; the engines in model '{STREAM_MODEL_NAME}' (progressive "
                                                  f"images), '{MODEL_NAME}' its proxy" if stream else "") + ") ...")
        sys.stdout.flush()
        proc = subprocess.Popen(cmd, env=triton_env(), preexec_fn=_die_with_parent, start_new_session=True)
        if not _wait_ready(proc, host, http_port, stop, t0 + start_timeout, start_timeout):
            echo("signal received before the model was ready: stopping")
            return 0
        warmed = f"model '{STREAM_MODEL_NAME}' loaded and warmed up, '{MODEL_NAME}' its proxy" if stream else \
            f"model '{MODEL_NAME}' loaded and warmed up"
        echo(f"ready after {time.perf_counter() - t0:.1f} s ({warmed}): "
             f"http://{host}:{http_port}/v2/models/{MODEL_NAME} grpc {host}:{grpc_port} "
             f"metrics http://{host}:{metrics_port}/metrics")
        if openai_port is not None:
            front = _front_end(engine_dir, host=host, http_port=http_port, port=openai_port, max_batch=max_batch,
                               max_pending=openai_max_pending, drain_timeout=drain_timeout, echo=echo,
                               grpc_port=grpc_port if stream else None, served_model_name=served_model_name,
                               api_key=api_key)
        sys.stdout.flush()
        while not stop.wait(0.5):
            if proc.poll() is not None:
                print(f"Triton exited unexpectedly ({proc.returncode}); see its log above", file=sys.stderr)
                return 1
        echo("signal received: finishing in-flight requests, then exiting")
        sys.stdout.flush()
        return 0
    finally:
        if front is not None:  # its in-flight requests finish on the still running Triton
            front.stop(drain_timeout + 5)
        if proc is not None:
            _stop(proc, drain_timeout)
        shutil.rmtree(work, ignore_errors=True)
        for s, h in old.items():
            signal.signal(s, h)


def _check_serve(engine_dir, *, host: str, ports: dict, max_batch: int, max_queue_delay_ms: float, instances: int,
                 threads: Optional[int], openai_port: Optional[int], openai_max_pending: int, progressive: bool) -> None:
    """`serve`'s checks before Triton starts: option ranges, free ports, an engine directory, PyTriton,
    and what the OpenAI front end and progressive images need."""
    from ..export.manifest import read_manifest

    if max_batch < 1:
        raise InputError(f"--max-batch must be >= 1, got {max_batch}")
    if max_queue_delay_ms < 0:
        raise InputError(f"--max-queue-delay-ms must be >= 0, got {max_queue_delay_ms}")
    if instances < 1 or (threads is not None and threads < 1):
        raise InputError(f"--instances and --threads must be >= 1, got {instances} and {threads}")
    if progressive and openai_port is None:
        raise InputError("--progressive streams partial images through the OpenAI front end: give --openai-port "
                         "too (or leave --progressive out)")
    check_ports(host, ports)
    read_manifest(Path(engine_dir))  # refuse anything that is not an engine directory, before Triton
    require_pytriton()
    if openai_port is not None:
        _check_front_end(openai_max_pending)
    if progressive:
        _require_streaming()


def check_openai_identity(served_model_name: str, api_key: Optional[str], missing: Optional[str] = None) -> None:
    """--served-model-name / --api-key: a name without spaces, a non-empty key; `missing`: the option
    without which they mean nothing (serve's --openai-port), named when either was changed."""
    if missing is not None and (served_model_name != MODEL_NAME or api_key is not None):
        raise InputError(f"--served-model-name and --api-key belong to the OpenAI front end: give {missing} too")
    if not served_model_name or any(c.isspace() for c in served_model_name):
        raise InputError(f"--served-model-name must be a name without spaces, got {served_model_name!r}")
    if api_key is not None and not api_key.strip():
        raise InputError("--api-key is empty: give the key clients send as 'Authorization: Bearer KEY'")


def _wait_ready(proc, host: str, http_port: int, stop, deadline: float, start_timeout: float) -> bool:
    """Wait until model 'lisa' answers ready: True; False when a signal came first.
    ServeUnavailableError when Triton exits or `deadline` (perf_counter) passes."""
    while ready_status(host, http_port) != 200:
        if proc.poll() is not None:
            raise ServeUnavailableError(f"Triton exited ({proc.returncode}) before model '{MODEL_NAME}' was "
                                        "ready; its log is above")
        if stop.is_set():
            return False
        if time.perf_counter() > deadline:
            raise ServeUnavailableError(f"model '{MODEL_NAME}' not ready after {start_timeout:g} s; "
                                        "its log is above")
        time.sleep(0.1)
    return True


def serve_ports(http_port: int, grpc_port: int, metrics_port: int, openai_port: Optional[int] = None) -> dict:
    """{option: port} of every endpoint `serve` opens (for check_ports)."""
    ports = {"--http-port": http_port, "--grpc-port": grpc_port, "--metrics-port": metrics_port}
    if openai_port is not None:
        ports["--openai-port"] = openai_port
    return ports


def _check_front_end(max_pending: int) -> None:
    """The OpenAI front end's setting and packages, checked before Triton starts."""
    from .openai_api import require_openai_deps

    if max_pending < 1:
        raise InputError(f"--openai-max-pending must be >= 1, got {max_pending}")
    require_openai_deps()


def _require_streaming() -> None:
    """--progressive needs tritonclient's gRPC client (the front end reads 'lisa_stream' over gRPC)."""
    from .openai_api import grpc_streaming_available

    if not grpc_streaming_available():
        raise InputError("--progressive reads model 'lisa_stream' over gRPC, and tritonclient[grpc] is not "
                         "importable: pip install 'tritonclient[grpc]', or leave --progressive out (partials "
                         "are then cut from the finished image)")


def _front_end(engine_dir, *, host: str, http_port: int, port: int, max_batch: int, max_pending: int,
               drain_timeout: int, echo: Callable, grpc_port: Optional[int] = None,
               served_model_name: str = MODEL_NAME, api_key: Optional[str] = None):
    """Start the OpenAI front end on `port`, forwarding to Triton's HTTP endpoint (and, with
    `grpc_port`, streaming requests to model 'lisa_stream' on its gRPC endpoint); -> its FrontEnd."""
    from .openai_api import FrontEnd

    front = FrontEnd.for_triton(engine_dir, triton_url=f"{local_address(host)}:{http_port}", host=host, port=port,
                                max_batch=max_batch, max_pending=max_pending, drain_timeout=drain_timeout,
                                triton_grpc_url=None if grpc_port is None else f"{local_address(host)}:{grpc_port}",
                                served_model_name=served_model_name, api_key=api_key)
    front.start()
    shown = f"[{host}]" if ":" in host else host
    echo(f"OpenAI Images API: http://{shown}:{port}/v1/images/generations (model '{front.info.id}', "
         f"{front.info.size}, n <= {max_batch})")
    return front


def _stop(proc: subprocess.Popen, drain_timeout: int) -> None:
    """SIGTERM Triton (it drains, up to --exit-timeout-secs); SIGKILL its group if it hangs beyond."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(drain_timeout + 30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    print("stopped", flush=True)
