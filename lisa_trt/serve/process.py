"""`lisa-trt serve` as a child process (tests, bench/serve_load.py): free 127.0.0.1 ports,
bounded start, SIGTERM stop that kills whatever is left, and a /proc process-tree helper."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from ..errors import LisaError


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def descendants(pid: int) -> list[int]:
    """pids of every live process below `pid` (read from /proc)."""
    kids: dict = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _answers(url: str) -> bool:
    """GET url answers 200."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


class ServerProcess:
    """Start `lisa-trt serve ENGINE_DIR` on free 127.0.0.1 ports and wait until it is ready.

    Use as a context manager (or call stop()): SIGTERM, wait `stop_timeout`, then SIGKILL the
    server and any process it left behind. openai=True also serves the OpenAI Images API
    (`--openai-port`, `self.openai_url`: http://127.0.0.1:PORT/v1) and waits for it too;
    progressive=True adds `--progressive` (model 'lisa_stream').
    """

    def __init__(self, engine_dir, log_path, *, backend: str = "ort", threads: int = 1, window_ms: float = 20.0,
                 max_batch: int = 16, instances: int = 1, start_timeout: float = 180.0, stop_timeout: float = 120.0,
                 ports: Optional[tuple] = None, wait: bool = True, openai: bool = False,
                 openai_max_pending: Optional[int] = None, progressive: bool = False):
        self.http, self.grpc, self.metrics, *rest = ports or free_ports(4 if openai else 3)
        self.openai = (rest[0] if rest else free_ports(1)[0]) if openai else None
        self.url = f"127.0.0.1:{self.http}"
        self.openai_url = f"http://127.0.0.1:{self.openai}/v1" if openai else None
        self.log_path, self.stop_timeout = Path(log_path), stop_timeout
        cmd = [sys.executable, "-m", "lisa_trt", "serve", str(engine_dir), "--backend", backend,
               "--threads", str(threads), "--instances", str(instances), "--http-port", str(self.http),
               "--grpc-port", str(self.grpc), "--metrics-port", str(self.metrics), "--max-batch", str(max_batch),
               "--max-queue-delay-ms", str(window_ms)]
        if openai:
            cmd += ["--openai-port", str(self.openai)]
        if openai_max_pending is not None:
            cmd += ["--openai-max-pending", str(openai_max_pending)]
        if progressive:
            cmd += ["--progressive"]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        if not wait:
            return
        try:
            self._wait_ready(start_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        from .client import LisaClient

        t0 = time.monotonic()
        c = LisaClient(self.url, timeout=10)
        try:
            while time.monotonic() - t0 < timeout:
                if self.proc.poll() is not None:
                    raise LisaError(f"server exited ({self.proc.returncode}):\n{self.text()[-3000:]}")
                if c.ready() and (self.openai is None or _answers(f"{self.openai_url}/models")):
                    return
                time.sleep(0.5)
        finally:
            c.close()
        raise LisaError(f"server not ready after {timeout} s:\n{self.text()[-3000:]}")

    def text(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def stop(self) -> list[int]:
        """SIGTERM and wait; then kill leftovers. Returns the pids that were below the server."""
        kids = descendants(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                pass
        for pid in kids + [self.proc.pid]:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self.proc.wait(30)
        self._log.close()
        return kids

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
