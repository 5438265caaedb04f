"""`lisa-trt serve`, `lisa-trt triton-repo` and `lisa-trt openai-api`; lisa_trt/cli/__init__.py adds them
with `register(main)`."""

from __future__ import annotations

import sys

import click

from ..clitools import handle_errors


_errors = handle_errors  # clitools.py: LisaError -> message, exit 2
# -h as on every command; declared on the commands themselves because `preflight` parses `serve`'s
# arguments without the group (click caches a command's help option from its first context)
_CONTEXT = {"help_option_names": ["-h", "--help"]}
# the Jacobi window of requests that send no `sjd_window` input (a request's own value wins); declared
# here, not with the method's knob, so that `serve`'s port check does not import torch
_SJD_WINDOW = click.option("--sjd-window", type=click.IntRange(min=1), default=None,
                           help="SJD family (sjd, mcsjd, sjd-pac, gsd, sjd-gasv): default draft tokens per Jacobi "
                                "window for requests without an sjd_window input (default 16).")
# the OpenAI front end's model name and key, spelt as vLLM / trtllm-serve spell them
_SERVED_NAME = click.option("--served-model-name", default="lisa", show_default=True,
                            help="The model's name in the OpenAI API (requests' `model`, GET /v1/models); "
                                 "Triton's model stays 'lisa'.")
_API_KEY = click.option("--api-key", default=None, envvar="LISA_TRT_API_KEY",
                        help="OpenAI API: /v1 requests without 'Authorization: Bearer KEY' get 401 (env "
                             "LISA_TRT_API_KEY; default: no key). /health stays open.")


@click.command("serve", context_settings=_CONTEXT)
@click.argument("engine_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--backend", type=click.Choice(["auto", "ort", "trt", "torch"]), default="auto", show_default=True,
              help="auto: TensorRT when engines are built and a GPU is usable, else ONNX Runtime.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address Triton binds (0.0.0.0 to accept remote clients).")
@click.option("--http-port", type=int, default=8000, show_default=True)
@click.option("--grpc-port", type=int, default=8001, show_default=True)
@click.option("--metrics-port", type=int, default=8002, show_default=True, help="Prometheus /metrics.")
@click.option("--max-batch", type=int, default=16, show_default=True,
              help="Most prompts decoded together (Triton's max_batch_size).")
@click.option("--max-queue-delay-ms", type=float, default=5.0, show_default=True,
              help="Batching window: how long Triton holds a request to batch it with later ones.")
@click.option("--threads", type=int, default=None,
              help="ONNX Runtime / torch threads in all, split evenly between the instances (default: the CPUs).")
@click.option("--instances", type=int, default=1, show_default=True,
              help="Model instances (Triton instance group); on CPU they share --threads; with --gpus, per GPU.")
@click.option("--gpus", default=None, help="Comma-separated GPU ids: --instances instance(s) on each (KIND_GPU).")
@click.option("--drain-timeout", type=int, default=60, show_default=True,
              help="Seconds SIGTERM waits for in-flight requests.")
@click.option("--start-timeout", type=float, default=600.0, show_default=True,
              help="Seconds to wait for the model to load and answer its warm-up request.")
@click.option("--openai-port", type=int, default=None,
              help="Also serve the OpenAI Images API (POST /v1/images/generations, GET /v1/models) on this port, "
                   "forwarding to the Triton model (off by default; docs/serving.md).")
@click.option("--openai-max-pending", type=click.IntRange(min=1), default=256, show_default=True,
              help="OpenAI front end: requests in flight before it answers 429.")
@click.option("--progressive", is_flag=True, default=False,
              help="With --openai-port: the engines go into the decoupled model 'lisa_stream', so `stream: true` "
                   "requests get their partial images while the image decodes (over gRPC); 'lisa' becomes its "
                   "proxy (no engines: one copy of them). Off: partials are cut from the finished image.")
@_SERVED_NAME
@_API_KEY
@_SJD_WINDOW
@_errors
def serve_cmd(engine_dir, backend, host, http_port, grpc_port, metrics_port, max_batch, max_queue_delay_ms,
              threads, instances, gpus, drain_timeout, start_timeout, openai_port, openai_max_pending, progressive,
              served_model_name, api_key, sjd_window):
    """Serve ENGINE_DIR on NVIDIA Triton Inference Server (PyTriton) with dynamic batching.

    Model 'lisa': inputs prompt (class id/name), seed, verify, cfg_scale, temperature, top_k,
    top_p and every registered method's knob (lantern_delta, gasv_kappa, sjd_window, gsd_group, zipar_window, ...);
    outputs image (H, W, 3 uint8), mal, tvd,
    seconds, batch, error. Ready (/v2/health/ready 200) once the model is loaded and has answered a
    warm-up request. With --openai-port P: the OpenAI Images API on port P in front of the same model.
    SIGTERM finishes in-flight requests and exits. See docs/serving.md."""
    from ..errors import InputError
    from .server import serve

    try:
        gpu_ids = [int(g) for g in gpus.split(",") if g.strip()] if gpus else None
    except ValueError:
        raise InputError(f"--gpus {gpus!r}: give comma-separated GPU ids, e.g. --gpus 0,1") from None
    sys.exit(serve(engine_dir, backend=backend, host=host, http_port=http_port, grpc_port=grpc_port,
                   metrics_port=metrics_port, max_batch=max_batch, max_queue_delay_ms=max_queue_delay_ms,
                   threads=threads, instances=instances, gpus=gpu_ids, drain_timeout=drain_timeout,
                   start_timeout=start_timeout, sjd_window=sjd_window, openai_port=openai_port,
                   openai_max_pending=openai_max_pending, progressive=progressive,
                   served_model_name=served_model_name, api_key=api_key, echo=click.echo))


@click.command("triton-repo", context_settings=_CONTEXT)
@click.argument("engine_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("repo_dir", type=click.Path(file_okay=False))
@click.option("--backend", type=click.Choice(["auto", "ort", "trt", "torch"]), default="trt", show_default=True,
              help="Backend the Python-backend model opens the engines with.")
@click.option("--max-batch", type=int, default=16, show_default=True)
@click.option("--max-queue-delay-ms", type=float, default=5.0, show_default=True)
@click.option("--instances", type=int, default=1, show_default=True, help="Model instances (per GPU: KIND_GPU).")
@click.option("--kind", type=click.Choice(["gpu", "cpu"]), default="gpu", show_default=True)
@click.option("--gpus", default=None, help="Comma-separated GPU ids (instances on each; default: every GPU).")
@click.option("--threads", type=int, default=0, show_default=True, help="CPU threads per instance (0: default).")
@click.option("--copy-engines", is_flag=True, help="Copy ENGINE_DIR into the repository (self-contained).")
@click.option("--stream", is_flag=True,
              help="The engines in the decoupled model 'lisa_stream' (progressive images over gRPC streaming, for "
                   "`openai-api --triton-grpc-url`) and 'lisa' its proxy through BLS (one copy of the engines).")
@_SJD_WINDOW
@click.option("--overwrite", is_flag=True, help="Replace an existing repository in REPO_DIR (refused without it).")
@_errors
def triton_repo_cmd(engine_dir, repo_dir, backend, max_batch, max_queue_delay_ms, instances, kind, gpus, threads,
                    copy_engines, stream, sjd_window, overwrite):
    """Write a Triton model repository (config.pbtxt + Python-backend model.py) for ENGINE_DIR.

    For GPU servers running the Triton container with TensorRT:
    tritonserver --model-repository REPO_DIR (lisa-trt must be importable there)."""
    from ..errors import InputError
    from ..io import refuse_existing
    from .repo import write_triton_repo

    refuse_existing(repo_dir, overwrite=overwrite, option="REPO_DIR")  # the overwrite rule (io.py)
    try:
        gpu_ids = [int(g) for g in gpus.split(",") if g.strip()] if gpus else None
    except ValueError:
        raise InputError(f"--gpus {gpus!r}: give comma-separated GPU ids, e.g. --gpus 0,1") from None
    out = write_triton_repo(engine_dir, repo_dir, backend=backend, max_batch=max_batch,
                            max_queue_delay_ms=max_queue_delay_ms, instances=instances, kind=kind,
                            copy_engines=copy_engines, gpus=gpu_ids, threads=threads, sjd_window=sjd_window,
                            stream=stream)
    models = "models 'lisa', 'lisa_stream'" if stream else "model 'lisa'"
    click.echo(f"wrote Triton model repository {out} ({models}): tritonserver --model-repository {repo_dir}")


@click.command("openai-api", context_settings=_CONTEXT)
@click.argument("engine_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--triton-url", default="127.0.0.1:8000", show_default=True,
              help="HTTP endpoint (host:port) of the Triton server that serves ENGINE_DIR as model 'lisa'.")
@click.option("--triton-grpc-url", default=None,
              help="gRPC endpoint (host:port) of that Triton, whose model 'lisa_stream' (`triton-repo --stream`) "
                   "streams progressive images; default: none (streaming answers cut their partials from the "
                   "finished image).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the API binds (0.0.0.0: remote).")
@click.option("--port", type=int, default=8080, show_default=True)
@click.option("--max-batch", type=int, default=16, show_default=True,
              help="Most images per request (n): the Triton model's max_batch_size.")
@click.option("--max-pending", type=click.IntRange(min=1), default=256, show_default=True,
              help="Requests in flight before the API answers 429.")
@click.option("--drain-timeout", type=int, default=60, show_default=True,
              help="Seconds SIGTERM waits for in-flight requests.")
@_SERVED_NAME
@_API_KEY
@_errors
def openai_api_cmd(engine_dir, triton_url, triton_grpc_url, host, port, max_batch, max_pending, drain_timeout,
                   served_model_name, api_key):
    """The OpenAI Images API for ENGINE_DIR in front of a Triton server that already serves it
    (`lisa-trt triton-repo` in the Triton container; a sidecar next to it). `lisa-trt serve
    --openai-port` starts the same front end with its own Triton. See docs/serving.md."""
    from .openai_api import FrontEnd
    from .server import check_openai_identity, check_ports

    check_openai_identity(served_model_name, api_key)
    check_ports(host, {"--port": port})
    front = FrontEnd.for_triton(engine_dir, triton_url=triton_url, host=host, port=port, max_batch=max_batch,
                                max_pending=max_pending, drain_timeout=drain_timeout,
                                triton_grpc_url=triton_grpc_url, served_model_name=served_model_name,
                                api_key=api_key)
    click.echo(f"OpenAI Images API: http://{host}:{port}/v1/images/generations (model '{front.info.id}', "
               f"{front.info.size}, n <= {max_batch}) -> Triton {triton_url}")
    sys.exit(front.serve_until_signal(drain_timeout))  # SIGTERM: in-flight requests finish, exit 0


def preflight(args) -> None:
    """`serve`'s port check from its raw arguments, before the full CLI (and torch) is imported.

    Exits 2 with the one-line message when a port is taken; anything it cannot parse is left
    for the real command to report."""
    from ..errors import LisaError
    from .server import check_ports, serve_ports

    try:
        ctx = serve_cmd.make_context("serve", list(args), resilient_parsing=True)
        p = ctx.params
        ports = serve_ports(p["http_port"], p["grpc_port"], p["metrics_port"], p["openai_port"])
        host = p["host"]
    except (click.exceptions.ClickException, click.exceptions.Exit, KeyError, TypeError):
        return
    try:
        check_ports(host, ports)
    except LisaError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


def register(group: click.Group) -> click.Group:
    """Add `serve`, `triton-repo` and `openai-api` to the `lisa-trt` group."""
    group.add_command(serve_cmd)
    group.add_command(triton_repo_cmd)
    group.add_command(openai_api_cmd)
    return group
