"""Response bodies of the OpenAI Images API: PNGs, the usage block, the streaming events.

Partial images come one of two ways (docs/serving.md, Streaming). From a backend with a
progressive channel (`stream`: Triton's decoupled model 'lisa_stream' over gRPC, or in-process):
decoded while the image decodes, from the tokens committed so far (ServeModel.stream_each), RGB,
sent as they arrive (`decoded_partial_events`). From a backend without one (model 'lisa' over
HTTP only: one response, the finished image): cut from the final image once it is decoded
(`stream_events`): partial k of K shows the first round(k * R / (K + 1)) of the R token
rows (their pixel bands exactly as in the final image, opaque) and the rows below transparent
(RGBA, alpha 0).
"""

from __future__ import annotations

import base64
import io
import json
import time
from typing import Optional

import numpy as np

from .openai_request import ImagesCall, ModelInfo


def png_b64(image: np.ndarray) -> str:
    """(H, W, 3|4) uint8 -> base64 of its PNG (lossless: the pixels decode back unchanged)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def prefix_rows(token_rows: Optional[int], height: int, k: int, total: int) -> tuple[int, int]:
    """(token rows shown, pixel rows shown) by partial image k (1-based) of `total`; an image with no
    plain token grid is cut in `total + 1` equal pixel bands."""
    rows = token_rows or (total + 1)
    shown = max(1, min(rows - 1, round(k * rows / (total + 1)))) if rows > 1 else 0
    return shown, shown * height // rows


def partial_image(image: np.ndarray, pixel_rows: int) -> np.ndarray:
    """The final image's first `pixel_rows` rows, opaque; the rest transparent -> (H, W, 4) uint8."""
    h, w, _ = image.shape
    out = np.zeros((h, w, 4), dtype=np.uint8)
    out[:pixel_rows, :, :3] = image[:pixel_rows]
    out[:pixel_rows, :, 3] = 255
    return out


def usage(info: ModelInfo, stats: list, seconds: float) -> dict:
    """The usage block of `len(stats)` images: OpenAI's token counts, plus the target forwards the
    decoder ran for them (per image its prefill and its steps, counted by the decode loop: the
    served model's `forwards` output), MAL (mean accepted tokens per forward), wall seconds and
    Triton's batch size."""
    n, per = len(stats), info.tokens_per_image
    out_tokens = per * n if per else None
    in_tokens = info.prompt_tokens * n if info.prompt_tokens is not None else None
    forwards = sum(int(s["forwards"]) for s in stats)
    total = (in_tokens or 0) + (out_tokens or 0) if out_tokens is not None else None
    return {"input_tokens": in_tokens, "input_tokens_details": {"text_tokens": 0, "image_tokens": 0},
            "output_tokens": out_tokens, "output_tokens_details": {"image_tokens": out_tokens, "text_tokens": 0},
            "total_tokens": total, "forwards": forwards,
            "mal": round(sum(float(s["mal"]) for s in stats) / max(n, 1), 4),
            "seconds": round(seconds, 4), "decode_seconds": round(max(float(s["seconds"]) for s in stats), 4),
            "batch": max(int(s["batch"]) for s in stats)}


def images_response(info: ModelInfo, call: ImagesCall, rows: list, seconds: float) -> dict:
    """The JSON body of a non-streaming answer: created, data[i] (b64_json PNG, seed), usage."""
    data = [{"b64_json": png_b64(img), "revised_prompt": None, "seed": seed}
            for (img, _), seed in zip(rows, call.seeds)]
    return {"created": int(time.time()), "data": data, "size": info.size, "output_format": "png",
            "usage": usage(info, [st for _, st in rows], seconds)}


def _event(kind: str, body: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


def _common(info: ModelInfo, call: ImagesCall) -> dict:
    return {"size": info.size, "quality": call.quality, "background": call.background, "output_format": "png"}


def shown_rows(info: ModelInfo, tokens: int) -> Optional[int]:
    """Token rows fully committed when `tokens` of an image's tokens are (None: no plain grid)."""
    if not info.token_rows or not info.tokens_per_image:
        return None
    return tokens * info.token_rows // info.tokens_per_image


def decoded_partial_events(info: ModelInfo, call: ImagesCall, k: int, tokens: int, images) -> list:
    """image_generation.partial_image events (one per image) of progressive image k: the decoder's
    images of the tokens committed so far (ServeModel.stream_each), while the image decodes."""
    return [_event("image_generation.partial_image", {
        "type": "image_generation.partial_image", "b64_json": png_b64(img), "created_at": int(time.time()),
        "partial_image_index": k, **_common(info, call), "image_index": i, "rows": shown_rows(info, tokens),
        "tokens": int(tokens), "token_rows": info.token_rows, "progressive": True}) for i, img in enumerate(images)]


def completed_events(info: ModelInfo, call: ImagesCall, rows: list, seconds: float) -> list:
    """image_generation.completed per image: its PNG, seed and usage."""
    return [_event("image_generation.completed", {
        "type": "image_generation.completed", "b64_json": png_b64(img), "created_at": int(time.time()),
        **_common(info, call), "image_index": i, "seed": seed, "usage": usage(info, [st], seconds)})
        for i, ((img, st), seed) in enumerate(zip(rows, call.seeds))]


def error_event(body: dict) -> bytes:
    """An `error` event: a failure after the stream started (OpenAI's error body)."""
    return _event("error", {"type": "error", **body})


def stream_events(info: ModelInfo, call: ImagesCall, rows: list, seconds: float):
    """Server-Sent Events of a streaming answer cut from finished images, per image:
    `call.partial_images` image_generation.partial_image events (row prefixes), then
    image_generation.completed (a backend with no progressive channel, TritonImages)."""
    done = completed_events(info, call, rows, seconds)
    for i, (img, _st) in enumerate(rows):
        for k in range(1, call.partial_images + 1):
            shown, px = prefix_rows(info.token_rows, info.height, k, call.partial_images)
            yield _event("image_generation.partial_image", {
                "type": "image_generation.partial_image", "b64_json": png_b64(partial_image(img, px)),
                "created_at": int(time.time()), "partial_image_index": k - 1, **_common(info, call),
                "image_index": i, "rows": shown, "pixel_rows": px, "token_rows": info.token_rows,
                # cut from the finished image, all sent after the decode (serve without --progressive)
                "progressive": False})
        yield done[i]
