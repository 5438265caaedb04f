"""LlamaGen's caption encoder (its `captions` plug-in): captions -> FLAN-T5 features, the t2i recipe
(spec/llamagen.md, "t2i").

LlamaGen encodes a caption with the flan-t5-xl ENCODER through transformers: the caption is
lower-cased and stripped (`preprocess="lower"`, LlamaGen's T5Embedder without its web-caption
cleaning; see PREPROCESS), then its tokenizer
with `max_length=120, padding="max_length", truncation=True, add_special_tokens=True`, then
`last_hidden_state` (B, 120, 2048) and the tokenizer's attention mask. Those arrays have the
valid tokens FIRST (right padding); the target moves them to the end itself (left padding,
padded slots zeroed, padded columns masked; see `Transformer._left_pad`). This module returns
exactly that pair, with the padded rows zeroed: `(features (B, L, C) float32, mask (B, L) bool)`.

Features are cached by caption hash (sha256 of the encoder fingerprint + max length + caption
text): in memory for the life of a `CaptionEncoder`, and on disk under `cache_dir` (one small
safetensors per caption holding only its valid rows), so a caption is encoded once.

Every check (encoder directory, transformers importable, feature width) runs before any model
is loaded, so a bad input fails in milliseconds with the fix in the message. The generic caption
plumbing (caption and feature files, the target's caption shape) is models/captions.py, which
reaches this module by name through `caption_encoder(encoder_dir, required=, **options)`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional, Sequence

import torch

from ...errors import InputError
from ...io import load_safetensors, save_safetensors
from ...models.captions import caption_shape

MAX_LENGTH = 120  # LlamaGen t2i: cls_token_num = 120 caption slots
# Caption text before tokenization. "lower": text.lower().strip(), LlamaGen's T5Embedder with
# use_text_preprocessing=False; its default additionally runs a web-caption cleaner (URLs, HTML,
# CJK, punctuation runs; PixArt's clean_caption, needs ftfy + bs4) that is not reproduced here:
# for plain captions it reduces to lower-casing, whitespace and punctuation spacing. "none": as given.
PREPROCESS = ("lower", "none")
_ENCODER_ENV = "LISA_TRT_TEXT_ENCODER"
# how a user gives this family's caption encoder (models/captions.encoder_hint: the generic messages)
ENCODER_HINT = {"name": "T5", "dir": "a local flan-t5-xl directory", "env": _ENCODER_ENV}
_CACHE_ENV = "LISA_TRT_CAPTION_CACHE"


# ----------------------------------------------------------------------------- encoder

def resolve_encoder_dir(encoder_dir=None) -> Optional[Path]:
    """The given directory, else $LISA_TRT_TEXT_ENCODER, else None."""
    d = encoder_dir or os.environ.get(_ENCODER_ENV)
    return Path(d) if d else None


def check_encoder_dir(encoder_dir) -> dict:
    """Check a local T5 directory (config.json + tokenizer + weights) and that transformers
    imports; returns its config.json. Raises InputError saying how to fix each problem."""
    if encoder_dir is None:
        raise InputError("captions need a T5 encoder: pass --encoder DIR (a local flan-t5-xl directory, e.g. "
                         f"`hf download google/flan-t5-xl --local-dir DIR`) or set ${_ENCODER_ENV}; "
                         "or pass precomputed features (.safetensors from `lisa-trt encode-captions`)")
    d = Path(encoder_dir)
    if not d.is_dir():
        raise InputError(f"T5 encoder directory not found: {d} (download google/flan-t5-xl there first)")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise InputError(f"{d} has no config.json; it must be a transformers T5 directory (save_pretrained layout)")
    if not any((d / n).is_file() for n in ("tokenizer.json", "spiece.model", "tokenizer_config.json")):
        raise InputError(f"{d} has no tokenizer (tokenizer.json or spiece.model); download the full flan-t5-xl folder")
    if not any(d.glob("*.safetensors")) and not any(d.glob("*.bin")):
        raise InputError(f"{d} has no weights (*.safetensors / *.bin)")
    cfg = json.loads(cfg_path.read_text())
    if "d_model" not in cfg:
        raise InputError(f"{cfg_path} is not a T5 config (no d_model)")
    _import_transformers()
    return cfg


def _import_transformers():
    try:
        import transformers
    except ImportError as e:
        raise InputError("encoding captions needs transformers: `pip install 'lisa-trt[text]'` "
                         f"(or `pip install transformers tokenizers sentencepiece`) ({e})") from None
    return transformers


def encoder_fingerprint(encoder_dir) -> str:
    """sha256 over the directory's config, tokenizer files and weight file names + sizes."""
    d = Path(encoder_dir)
    h = hashlib.sha256()
    for f in sorted(d.iterdir()):
        if not f.is_file():
            continue
        h.update(f.name.encode())
        if f.suffix in (".json", ".model", ".txt"):
            h.update(f.read_bytes())
        else:
            h.update(str(f.stat().st_size).encode())
    return h.hexdigest()[:16]


class CaptionEncoder:
    """FLAN-T5 encoder + tokenizer from a local directory; captions -> (features, mask).

    Args:
        encoder_dir: transformers directory (config.json, tokenizer, weights); default
            $LISA_TRT_TEXT_ENCODER.
        device: where the encoder runs ("cpu", "cuda").
        dtype: "float32", "bfloat16" (LlamaGen's choice on GPU) or "float16"; "auto" = bf16 on
            CUDA, fp32 on CPU.
        max_length: caption slots (the target's cls_token_num; 120 for LlamaGen).
        cache_dir: on-disk feature cache (default $LISA_TRT_CAPTION_CACHE, else none).
        batch_size: captions per encoder forward.
        preprocess: caption text before tokenization, "lower" (LlamaGen) or "none" (PREPROCESS).
    """

    def __init__(self, encoder_dir=None, *, device="cpu", dtype: str = "auto", max_length: int = MAX_LENGTH,
                 cache_dir=None, batch_size: int = 16, preprocess: str = "lower"):
        self.dir = resolve_encoder_dir(encoder_dir)
        self._cfg = check_encoder_dir(self.dir)
        self.device = torch.device(device)
        if dtype == "auto":
            dtype = "bfloat16" if self.device.type == "cuda" else "float32"
        if dtype not in ("float32", "bfloat16", "float16"):
            raise InputError(f"encoder dtype must be float32, bfloat16, float16 or auto, got {dtype!r}")
        if max_length < 1:
            raise InputError(f"max_length must be >= 1, got {max_length}")
        if preprocess not in PREPROCESS:
            raise InputError(f"preprocess must be one of {', '.join(PREPROCESS)}, got {preprocess!r}")
        self.preprocess = preprocess
        self.dtype, self.max_length, self.batch_size = dtype, int(max_length), int(batch_size)
        self.fingerprint = encoder_fingerprint(self.dir)
        cache_dir = cache_dir or os.environ.get(_CACHE_ENV)
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self._memo: dict[str, torch.Tensor] = {}
        self._model = self._tok = None

    @property
    def dim(self) -> int:
        """Feature width (d_model; 2048 for flan-t5-xl)."""
        return int(self._cfg["d_model"])

    def check_target(self, tcfg) -> None:
        """Raise unless this encoder's features fit the target's caption slots."""
        slots, width = caption_shape(tcfg)
        if self.dim != width:
            raise InputError(f"the T5 encoder at {self.dir} gives {self.dim}-wide features but the target expects "
                             f"{width} (flan-t5-xl gives d_model 2048)")
        if self.max_length != slots:
            raise InputError(f"encoder max_length {self.max_length} != the target's {slots} caption slots")

    def caption_key(self, caption: str) -> str:
        return hashlib.sha256(f"{self.fingerprint}|{self.max_length}|{self.preprocess}|{caption}".encode()).hexdigest()

    def prepare(self, caption: str) -> str:
        """The text the tokenizer sees."""
        return caption.lower().strip() if self.preprocess == "lower" else caption

    def _load(self):
        if self._model is None:
            tf = _import_transformers()
            self._tok = tf.AutoTokenizer.from_pretrained(str(self.dir))
            dt = getattr(torch, self.dtype)
            major = int(tf.__version__.split(".")[0])
            kw = {"dtype": dt} if major >= 5 else {"torch_dtype": dt}  # renamed in transformers 5
            self._model = tf.T5EncoderModel.from_pretrained(str(self.dir), **kw)
            self._model.to(self.device).eval()
        return self._tok, self._model

    def _disk_path(self, key: str) -> Optional[Path]:
        return None if self.cache_dir is None else self.cache_dir / key[:2] / f"{key}.safetensors"

    def _lookup(self, key: str) -> Optional[torch.Tensor]:
        if key in self._memo:
            return self._memo[key]
        p = self._disk_path(key)
        if p is not None and p.is_file():
            try:
                t, meta = load_safetensors(p)
            except Exception:
                return None  # unreadable entry: re-encode and overwrite
            if meta.get("encoder") == self.fingerprint:
                self._memo[key] = t["valid"].float()
                return self._memo[key]
        return None

    @torch.no_grad()
    def _encode_batch(self, captions: list[str]) -> list[torch.Tensor]:
        tok, model = self._load()
        b = tok([self.prepare(c) for c in captions], max_length=self.max_length, padding="max_length", truncation=True,
                return_attention_mask=True, add_special_tokens=True, return_tensors="pt")
        ids, att = b["input_ids"].to(self.device), b["attention_mask"].to(self.device)
        h = model(input_ids=ids, attention_mask=att).last_hidden_state.float().cpu()
        n = att.sum(1).cpu()
        return [h[i, : int(n[i])].clone() for i in range(len(captions))]

    def encode(self, captions: Sequence[str], progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Captions -> (features (B, L, C) float32, mask (B, L) bool), valid tokens first,
        padded rows zero. Cached captions are not re-encoded."""
        if isinstance(captions, str):
            captions = [captions]
        bad = [i for i, c in enumerate(captions) if not isinstance(c, str) or not c.strip()]
        if bad:
            raise InputError(f"caption {bad[0]} is empty or not a string; every prompt needs text")
        keys = [self.caption_key(c) for c in captions]
        valid: dict[str, torch.Tensor] = {}
        todo, queued = [], set()
        for c, k in zip(captions, keys):
            if k in valid or k in queued:
                continue
            v = self._lookup(k)
            if v is None:
                todo.append((c, k))
                queued.add(k)
            else:
                valid[k] = v
        chunks = range(0, len(todo), self.batch_size)
        if progress and todo:
            from tqdm.auto import tqdm

            chunks = tqdm(chunks, desc="encode captions", unit="batch")
        for a in chunks:
            part = todo[a: a + self.batch_size]
            for (c, k), v in zip(part, self._encode_batch([c for c, _ in part])):
                valid[k] = self._memo[k] = v
                p = self._disk_path(k)
                if p is not None:
                    p.parent.mkdir(parents=True, exist_ok=True)
                    save_safetensors({"valid": v}, p, metadata={"encoder": self.fingerprint, "caption": c})
        L, C = self.max_length, self.dim
        feats = torch.zeros(len(captions), L, C)
        mask = torch.zeros(len(captions), L, dtype=torch.bool)
        for i, k in enumerate(keys):
            v = valid[k]
            feats[i, : v.shape[0]] = v
            mask[i, : v.shape[0]] = True
        return feats, mask


def caption_encoder(encoder_dir=None, *, required: bool = True, **options) -> Optional[CaptionEncoder]:
    """The plug-in's entry (models/captions.caption_encoder): a CaptionEncoder for `encoder_dir`
    (default $LISA_TRT_TEXT_ENCODER) with CaptionEncoder's keyword options. required=False: None
    when neither names a directory."""
    if not required and resolve_encoder_dir(encoder_dir) is None:
        return None
    return CaptionEncoder(encoder_dir, **options)
