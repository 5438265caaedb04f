"""`lisa-trt serve` and `lisa-trt triton-repo`; lisa_trt/cli.py adds them with `register(main)`."""

from __future__ import annotations

import sys

import click

from ..clitools import handle_errors


_errors = handle_errors  # clitools.py: LisaError -> message, exit 2


@click.command("serve")
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
@click.option("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: cores).")
@click.option("--drain-timeout", type=int, default=60, show_default=True,
              help="Seconds SIGTERM waits for in-flight requests.")
@_errors
def serve_cmd(engine_dir, backend, host, http_port, grpc_port, metrics_port, max_batch, max_queue_delay_ms,
              threads, drain_timeout):
    """Serve ENGINE_DIR on NVIDIA Triton Inference Server (PyTriton) with dynamic batching.

    Model 'lisa': inputs prompt (class id/name), seed, verify, cfg_scale, temperature, top_k,
    top_p, lantern_delta, gasv_kappa, gasv_lambda; outputs image (H, W, 3 uint8), mal, tvd,
    seconds, batch, error. SIGTERM finishes in-flight requests and exits. See docs/serving.md."""
    from .server import serve

    sys.exit(serve(engine_dir, backend=backend, host=host, http_port=http_port, grpc_port=grpc_port,
                   metrics_port=metrics_port, max_batch=max_batch, max_queue_delay_ms=max_queue_delay_ms,
                   threads=threads, drain_timeout=drain_timeout, echo=click.echo))


@click.command("triton-repo")
@click.argument("engine_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("repo_dir", type=click.Path(file_okay=False))
@click.option("--backend", type=click.Choice(["auto", "ort", "trt", "torch"]), default="trt", show_default=True,
              help="Backend the Python-backend model opens the engines with.")
@click.option("--max-batch", type=int, default=16, show_default=True)
@click.option("--max-queue-delay-ms", type=float, default=5.0, show_default=True)
@click.option("--instances", type=int, default=1, show_default=True, help="Model instances (per GPU: KIND_GPU).")
@click.option("--kind", type=click.Choice(["gpu", "cpu"]), default="gpu", show_default=True)
@click.option("--copy-engines", is_flag=True, help="Copy ENGINE_DIR into the repository (self-contained).")
@_errors
def triton_repo_cmd(engine_dir, repo_dir, backend, max_batch, max_queue_delay_ms, instances, kind, copy_engines):
    """Write a Triton model repository (config.pbtxt + Python-backend model.py) for ENGINE_DIR.

    For GPU servers running the Triton container with TensorRT:
    tritonserver --model-repository REPO_DIR (lisa-trt must be importable there)."""
    from .repo import write_triton_repo

    out = write_triton_repo(engine_dir, repo_dir, backend=backend, max_batch=max_batch,
                            max_queue_delay_ms=max_queue_delay_ms, instances=instances, kind=kind,
                            copy_engines=copy_engines)
    click.echo(f"wrote Triton model repository {out} (model 'lisa'): tritonserver --model-repository {repo_dir}")


def register(group: click.Group) -> click.Group:
    """Add `serve` and `triton-repo` to the `lisa-trt` group."""
    group.add_command(serve_cmd)
    group.add_command(triton_repo_cmd)
    return group
