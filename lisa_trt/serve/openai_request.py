"""OpenAI Images API requests (`POST /v1/images/generations`) checked against one served bundle.

`ModelInfo.from_dir` reads what a request may ask of the engine directory (its image size, class
names, family, the token grid the image is decoded from); `parse_images_request` turns the JSON
body into an `ImagesCall`: the rows and Triton inputs of model 'lisa', or an `APIError` in
OpenAI's error shape. The decoding settings are extra body fields named as the Triton inputs
(`verify`, `cfg_scale`, `temperature`, `top_k`, `top_p` and every registered method's knob);
their values are checked where every other request's are, by the served model (serve/model.py),
so they get the same messages as the CLI and Triton clients.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import LisaError
from ..runtime.seeding import image_seeds
from .model import MAX_PARTIAL_IMAGES

# accepted and ignored (OpenAI fields with no meaning for these models; docs/serving.md)
IGNORED = ("quality", "style", "user", "background", "moderation", "safety_identifier", "output_compression")
OPENAI_FIELDS = ("model", "prompt", "n", "size", "response_format", "output_format", "seed", "negative_prompt",
                 "guidance_scale", "stream", "partial_images")
MAX_PROMPT_CHARS = 32000  # OpenAI's limit for a prompt
_SEED_MAX = 2**63 - 1


class APIError(LisaError):
    """A request answered with OpenAI's error body {"error": {message, type, param, code}}."""

    TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 413: "invalid_request_error",
             429: "rate_limit_exceeded", 500: "server_error", 503: "server_error"}

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = int(status), message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


def bad(message: str, param: Optional[str] = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param, code)


@dataclass(frozen=True)
class ModelInfo:
    """What the OpenAI front end knows of the served bundle (read from its manifest)."""

    id: str
    family: str
    width: int
    height: int
    max_batch: int
    class_names: tuple = ()
    num_classes: int = 0
    prompt: str = "class"  # what `prompt` is: "class" (id or name), "text" (family prompter), "caption" (T5)
    token_rows: Optional[int] = None  # rows of the token grid the image is decoded from
    tokens_per_image: Optional[int] = None  # tokens the target generates per image
    prompt_tokens: Optional[int] = None  # condition tokens of a class-conditioned prompt
    no_negative: Optional[str] = None  # why the family takes no negative_prompt (None: it does)
    created: int = 0

    @property
    def size(self) -> str:
        return f"{self.width}x{self.height}"

    @classmethod
    def from_dir(cls, engine_dir, max_batch: int, model_id: str = "lisa") -> "ModelInfo":
        """The bundle's manifest -> ModelInfo (no engine is opened)."""
        from ..export.manifest import read_manifest
        from ..models.family import family_of
        from ..runtime.conditions import run_conditions

        m = read_manifest(Path(engine_dir))
        tc, dims = m.target_config, m.dims or {}
        fam = family_of(tc)
        h, w = int(dims["height"]), int(dims["width"])
        rows = _token_rows(dims.get("block"), h, w)
        conds = run_conditions(fam, tc)
        kind = conds.kind.kind  # "class", "caption" or "text": what the prompt field holds
        num_classes = conds.num_classes  # 0 where prompts are not classes
        cls_tokens = int(tc.cond_dims().get("prefix", 1)) if num_classes else None
        names = conds.class_names((m.generation or {}).get("class_names"))  # ImageNet's for 1000
        return cls(id=model_id, family=fam.name, width=w, height=h, max_batch=int(max_batch),
                   class_names=tuple(names or ()), num_classes=num_classes, prompt=kind,
                   token_rows=rows, tokens_per_image=int(dims["block"]) if rows else None,
                   prompt_tokens=cls_tokens, no_negative=conds.no_negative(), created=_created(m))

    def card(self) -> dict:
        """The model's entry in GET /v1/models."""
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": "lisa-trt",
                "family": self.family, "sizes": [self.size], "max_n": self.max_batch,
                "prompt": self.prompt, "classes": list(self.class_names), "negative_prompt": self.no_negative is None}


def _token_rows(block, h: int, w: int) -> Optional[int]:
    """Rows of a (rows, cols) token grid with the image's aspect whose cells tile it, else None
    (a sequence that is not a plain grid: Chameleon's row ends, prompts)."""
    if not block:
        return None
    rows = math.isqrt(int(block) * h // w)
    if rows < 1 or int(block) % rows or h % rows or w % (int(block) // rows):
        return None
    return rows


def _created(manifest) -> int:
    from datetime import datetime

    try:
        return int(datetime.fromisoformat(str(manifest.created)).timestamp())
    except (TypeError, ValueError):
        return 0


@dataclass(frozen=True)
class ImagesCall:
    """One validated request: n rows of `prompt` with seeds seed, seed + 1, ... and the knobs."""

    prompt: str
    seeds: tuple
    knobs: dict  # Triton input name -> value (one value for every row)
    negative_prompt: Optional[str] = None  # CFG's unconditional text (families whose prompter takes one)
    stream: bool = False
    partial_images: int = 0
    quality: str = "auto"
    background: str = "auto"

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def inputs(self) -> dict:
        """Triton input name -> value of every row besides prompt and seed: the knobs, and the
        negative prompt when one is set."""
        neg = {} if self.negative_prompt is None else {"negative_prompt": self.negative_prompt}
        return {**neg, **self.knobs}


def _typed(name: str, v, kind: str):
    """A body field's value checked against its kind ("str", "int", "float", "bool")."""
    ok = {"str": isinstance(v, str), "bool": isinstance(v, bool),
          "int": isinstance(v, int) and not isinstance(v, bool),
          "float": isinstance(v, (int, float)) and not isinstance(v, bool)}[kind]
    if not ok:
        word = {"str": "a string", "bool": "true or false", "int": "an integer", "float": "a number"}[kind]
        raise bad(f"'{name}' must be {word}, got {v!r}", name, "invalid_type")
    return float(v) if kind == "float" else v


def _prompt(body: dict, info: ModelInfo) -> str:
    if "prompt" not in body or body["prompt"] is None:
        what = (f"a class id (0..{info.num_classes - 1}) or a class name" if info.num_classes
                else {"caption": "a caption"}.get(info.prompt, "text"))  # the card's own word for its prompts
        raise bad(f"missing required parameter 'prompt' ({what})", "prompt", "missing_required_parameter")
    prompt = body["prompt"]
    if isinstance(prompt, int) and not isinstance(prompt, bool) and info.num_classes:
        prompt = str(prompt)  # a class id sent as a JSON number
    prompt = _typed("prompt", prompt, "str").strip()
    if not prompt:
        raise bad("'prompt' is empty", "prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise bad(f"'prompt' is {len(prompt)} characters; the maximum is {MAX_PROMPT_CHARS}", "prompt",
                  "string_above_max_length")
    return prompt


def _check_model(body: dict, info: ModelInfo) -> None:
    model = body.get("model")
    if model is not None and model != info.id:
        raise APIError(404, f"The model '{model}' does not exist; this server serves '{info.id}' "
                            "(GET /v1/models)", "model", "model_not_found")


def _check_output(body: dict, info: ModelInfo) -> None:
    size = body.get("size")
    if size not in (None, "auto", info.size):
        raise bad(f"size {size!r} is not available for this model; valid: '{info.size}' or 'auto' (the bundle "
                  "decodes one image size; export another bundle for another size)", "size")
    fmt = body.get("response_format")
    if fmt == "url":
        raise bad("response_format 'url' needs a place to store images, which this deployment does not "
                  "configure; use response_format 'b64_json'", "response_format", "unsupported_value")
    if fmt not in (None, "b64_json"):
        raise bad(f"response_format {fmt!r} is not supported; use 'b64_json'", "response_format")
    if body.get("output_format") not in (None, "png"):
        raise bad(f"output_format {body['output_format']!r} is not supported; use 'png'", "output_format")


def _negative(body: dict, info: ModelInfo) -> Optional[str]:
    """The request's negative prompt (None: none, or empty), refused where the family takes none."""
    neg = body.get("negative_prompt")
    if neg is None:
        return None
    neg = _typed("negative_prompt", neg, "str").strip()
    if not neg:
        return None
    if info.no_negative is not None:
        raise bad(info.no_negative, "negative_prompt", "unsupported_parameter")
    if len(neg) > MAX_PROMPT_CHARS:
        raise bad(f"'negative_prompt' is {len(neg)} characters; the maximum is {MAX_PROMPT_CHARS}",
                  "negative_prompt", "string_above_max_length")
    return neg


def _count(body: dict, info: ModelInfo) -> int:
    n = body.get("n")
    n = 1 if n is None else _typed("n", n, "int")
    if not 1 <= n <= info.max_batch:
        raise bad(f"n={n} is out of range; valid: 1..{info.max_batch} (the server's --max-batch)", "n")
    return n


def _seeds(body: dict, n: int) -> tuple:
    seed = body.get("seed")
    seed = secrets.randbelow(2**31) if seed is None else _typed("seed", seed, "int")
    if not 0 <= seed <= _SEED_MAX - n:
        raise bad(f"seed={seed} is out of range; valid: 0..{_SEED_MAX - n}", "seed")
    return image_seeds(seed, n)  # the rule of every image (runtime/seeding.py)


def _knobs(body: dict, knob_kinds: dict) -> dict:
    knobs = {k: _typed(k, body[k], kind) for k, kind in knob_kinds.items() if body.get(k) is not None}
    g = body.get("guidance_scale")
    if g is not None:
        g = _typed("guidance_scale", g, "float")
        if "cfg_scale" in knobs and knobs["cfg_scale"] != g:
            raise bad(f"guidance_scale={g} and cfg_scale={knobs['cfg_scale']} disagree; send one of them",
                      "guidance_scale")
        knobs["cfg_scale"] = g
    return knobs


def _streaming(body: dict) -> tuple[bool, int]:
    stream = bool(_typed("stream", body["stream"], "bool")) if body.get("stream") is not None else False
    k = body.get("partial_images")
    k = 0 if k is None else _typed("partial_images", k, "int")
    if not 0 <= k <= MAX_PARTIAL_IMAGES:
        raise bad(f"partial_images={k} is out of range; valid: 0..{MAX_PARTIAL_IMAGES}", "partial_images")
    if k and not stream:
        raise bad("partial_images needs stream: true", "partial_images")
    return stream, k


def parse_images_request(body, info: ModelInfo, knob_kinds: dict) -> ImagesCall:
    """A decoded JSON body -> ImagesCall, or APIError (400 / 404) naming the field and the fix.

    Args:
        knob_kinds: decoding-setting name -> "str" | "int" | "float" (the Triton model's optional
            inputs other than seed: `knob_kinds()`).
    """
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_json")
    known = set(OPENAI_FIELDS) | set(IGNORED) | set(knob_kinds)
    unknown = sorted(set(body) - known)
    if unknown:
        raise bad(f"Unknown parameter: '{unknown[0]}'. Valid: {', '.join(sorted(known))}", unknown[0],
                  "unknown_parameter")
    _check_model(body, info)
    prompt = _prompt(body, info)
    _check_output(body, info)
    negative = _negative(body, info)
    n = _count(body, info)
    stream, k = _streaming(body)
    quality, background = body.get("quality"), body.get("background")
    return ImagesCall(prompt=prompt, seeds=_seeds(body, n), knobs=_knobs(body, knob_kinds), negative_prompt=negative,
                      stream=stream,
                      partial_images=k, quality=quality if isinstance(quality, str) else "auto",
                      background=background if isinstance(background, str) else "auto")


def knob_kinds() -> dict:
    """The served model's decoding settings: Triton input name -> kind (serve/model.py INPUTS)."""
    from .model import inputs

    return {k: kind for k, (_, kind) in inputs().items() if k not in ("prompt", "seed", "negative_prompt")}


def error_param(message: str, names) -> Optional[str]:
    """The request field a served-model message is about: the name it starts with, else the first
    name its first clause mentions ("unknown verify rule ..."), "prompt" for a class, prompt or caption."""
    import re

    head = message.split(" ", 1)[0].split("=", 1)[0].strip("'\",:")
    if head in names:
        return head
    clause = re.split(r"[;(]", message, maxsplit=1)[0]
    words = set(re.findall(r"[A-Za-z_]+", clause))
    hit = [n for n in names if n in words]
    if hit:
        return hit[0]
    return "prompt" if words & {"class", "prompt", "caption"} else None
