"""One caption through a real `lisa-trt serve ENGINE_DIR` (Triton on 127.0.0.1, bounded waits, the
server always stopped), for the prompted families' bundle tests; skips without the serve extra."""

import numpy as np
import pytest


def serve_one_caption(engine_dir, log_path, caption: str, seed: int):
    """(image, stats) the server returns for `caption`, and the Pipeline's image for the same
    prompt and seed (uint8 arrays). The served stats are checked here to be that decode's own: the
    same target forwards and MAL as the Pipeline's."""
    try:
        import pytriton.triton  # noqa: F401
        import tritonclient.http  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError, or pytriton broken by the numpy in this env
        pytest.skip(f"serving needs the serve extra (nvidia-pytriton, tritonclient): {e}")
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.runtime.prompts import Prompt
    from lisa_trt.serve.client import LisaClient
    from lisa_trt.serve.process import ServerProcess

    with ServerProcess(engine_dir, log_path, backend="ort", threads=1, max_batch=2, stop_timeout=60) as server:
        client = LisaClient(server.url, timeout=300)
        try:
            img, st = client.generate(caption, seed=seed)
        finally:
            client.close()
    with Pipeline.from_dir(engine_dir, backend="ort", threads=1) as pipe:
        ref = pipe.generate([Prompt(0, caption=caption, seed=seed)], verify="auto", batch=True)
    want = ref.stats[0]
    assert st["forwards"] == want["forwards"] and st["mal"] == pytest.approx(want["mal"], rel=1e-6), (st, want)
    return img, st, np.asarray(ref.images[0])


# ----------------------------------------------------------------------------- requests the server has read

def post_raw(port: int, path: str, body: bytes, content_type: str = "application/json"):
    """A complete HTTP/1.1 POST of `body` to 127.0.0.1:port on a socket of its own (Connection:
    close), every byte handed to the kernel before this returns -> the socket (read_response)."""
    import socket

    s = socket.create_connection(("127.0.0.1", port), timeout=600)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\nConnection: close\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return s


def _tcp_queues() -> dict:
    """{(local port, remote port): (tx_queue, rx_queue)} of the loopback TCP sockets (Linux /proc/net/tcp)."""
    out = {}
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        lp, rp = int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16)
        tx, rx = (int(x, 16) for x in f[4].split(":"))
        out[(lp, rp)] = (tx, rx)
    return out


def wait_read_by_server(port: int, socks, timeout: float = 300.0) -> None:
    """Wait until the server on `port` has read every byte sent on `socks` (the kernel's own counts:
    each client socket has nothing unacknowledged, the server's end of it nothing unread), so every
    request is inside the server; fails after `timeout` seconds. Linux only (skips elsewhere)."""
    import os
    import time

    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("needs Linux's /proc/net/tcp to see what the server has read")
    mine = [s.getsockname()[1] for s in socks]
    t0 = time.monotonic()
    while True:
        q = _tcp_queues()
        pending = [p for p in mine if q.get((p, port), (1, 0))[0] or q.get((port, p), (0, 1))[1]]
        if not pending:
            return
        assert time.monotonic() - t0 < timeout, f"the server on port {port} did not read requests from {pending}"
        time.sleep(0.05)


def read_response(sock) -> tuple:
    """(status, body bytes) of the HTTP/1.1 response on `sock` (read to its close)."""
    chunks = []
    while True:
        b = sock.recv(1 << 16)
        if not b:
            break
        chunks.append(b)
    sock.close()
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    if b"transfer-encoding: chunked" in head.lower():
        out, rest = b"", body
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size.split(b";")[0], 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return status, body
