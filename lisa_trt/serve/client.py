"""A small tritonclient helper for model 'lisa' (used by the tests, bench/serve_load.py, docs).

    from lisa_trt.serve.client import LisaClient
    c = LisaClient("127.0.0.1:8000")
    image, stats = c.generate("coffee", seed=3, verify="gasv", cfg_scale=4.0)

`generate` raises ServeError with the server's message for a rejected request (Triton error or
a non-empty `error` output).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import LisaError
from .model import INPUTS

MODEL = "lisa"
_TYPES = {"str": "BYTES", np.int64: "INT64", np.int32: "INT32", np.float32: "FP32"}


class ServeError(LisaError):
    """The server rejected a request (bad input: `status` 400) or failed it (500)."""

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        self.status = status


def make_inputs(module, prompt, seed: Optional[int] = None, **knobs) -> list:
    """tritonclient InferInput list (module: tritonclient.http or tritonclient.grpc), one row."""
    return make_rows_inputs(module, [prompt], None if seed is None else [seed], **knobs)


def make_rows_inputs(module, prompts: list, seeds: Optional[list] = None, **knobs) -> list:
    """tritonclient InferInput list for one request of len(prompts) rows: row i has prompts[i],
    seeds[i] and every knob (one value for all rows); None values are left out."""
    n = len(prompts)
    vals = {"prompt": list(prompts), "seed": seeds, **{k: None if v is None else [v] * n for k, v in knobs.items()}}
    out = []
    for name, col in vals.items():
        if col is None:
            continue
        if name not in INPUTS:
            raise ServeError(f"unknown input {name!r}; valid: {', '.join(INPUTS)}")
        dt, kind = INPUTS[name]
        arr = (np.array([[str(v).encode()] for v in col], dtype=object) if kind == "str"
               else np.array([[v] for v in col], dtype=dt))
        inp = module.InferInput(name, list(arr.shape), _TYPES["str" if kind == "str" else dt])
        inp.set_data_from_numpy(arr)
        out.append(inp)
    return out


def server_message(text: str) -> str:
    """The server's one-line message inside a Triton error (without Triton's request-id prefix)."""
    import re

    return re.sub(r"^\[request id: [^\]]*\] ", "", text.strip())


def parse_rows(res) -> list:
    """tritonclient InferResult -> per row (image (H, W, 3) uint8, stats) or the row's error message."""
    errs = res.as_numpy("error").reshape(-1)
    cols = {k: res.as_numpy(k).reshape(-1) for k in ("mal", "tvd", "seconds", "batch", "forwards")}
    images = res.as_numpy("image")
    out = []
    for i, err in enumerate(errs):
        err = err.decode() if isinstance(err, bytes) else str(err)
        out.append(err if err else (images[i], {k: v[i].item() for k, v in cols.items()}))
    return out


def parse_result(res) -> tuple[np.ndarray, dict]:
    """tritonclient InferResult (one row) -> (image (H, W, 3) uint8, stats) or ServeError."""
    row = parse_rows(res)[0]
    if isinstance(row, str):
        raise ServeError(row)
    return row


class LisaClient:
    """HTTP client for one server (thread-safe for one request at a time per instance)."""

    def __init__(self, url: str = "127.0.0.1:8000", timeout: float = 600.0):
        import tritonclient.http as http

        self._http = http
        self.client = http.InferenceServerClient(url, connection_timeout=timeout, network_timeout=timeout)

    def ready(self) -> bool:
        try:
            return bool(self.client.is_server_ready() and self.client.is_model_ready(MODEL))
        except Exception:  # noqa: BLE001 - not up yet
            return False

    def generate(self, prompt, seed: Optional[int] = None, **knobs) -> tuple[np.ndarray, dict]:
        from tritonclient.utils import InferenceServerException

        try:
            res = self.client.infer(MODEL, make_inputs(self._http, prompt, seed, **knobs))
        except InferenceServerException as e:
            status = e.status() if callable(getattr(e, "status", None)) else None
            raise ServeError(server_message(e.message() if callable(getattr(e, "message", None)) else str(e)),
                             int(status) if status and str(status).isdigit() else None) from e
        return parse_result(res)

    def close(self):
        self.client.close()
