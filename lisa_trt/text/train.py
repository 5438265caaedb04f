"""CLI glue: caption inputs of `train`, `calibrate`, `bench` and `generate` for caption targets
(their family's caption encoder, models/captions.caption_encoder)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ..errors import InputError
from ..models.captions import (caption_conds, caption_encoder, caption_shape, cycle_conds, encoder_fix, is_feature_file,
                               load_caption_features, read_captions, save_caption_features)


def training_caption_file(tcfg, captions, encoder_dir, out_dir, source: str) -> Optional[str]:
    """The caption-feature file a t2i training run reads: a feature file as given, or a
    captions .txt encoded once into OUT/data/caption_features.safetensors (reused on resume
    when the captions and encoder are unchanged; the encoder's per-caption cache makes a
    re-encode cheap)."""
    from ..models.family import family_of

    if source == "images":
        raise InputError("--data images is for c2i targets (one folder per class); for t2i use --data self "
                         "with --captions, or --data tokens with a token + caption-feature file")
    if captions is None:
        if source == "tokens":
            return None  # the token file carries caption_features (or fails with the fix)
        raise InputError(f"t2i drafter training needs captions: pass --captions CAPTIONS.txt with the caption encoder "
                         f"({encoder_fix(family_of(tcfg))}; self-distillation prompts, the paper uses 100k "
                         "LAION-COCO captions) or --captions FEATURES.safetensors from `lisa-trt encode-captions`")
    if is_feature_file(captions):
        load_caption_features(captions, tcfg)  # shape check before any work
        return str(captions)
    caps = read_captions(captions)
    enc = caption_encoder(family_of(tcfg), encoder_dir, device=_device(), max_length=caption_shape(tcfg)[0],
                          cache_dir=Path(out_dir) / "data" / "caption_cache")
    enc.check_target(tcfg)
    feats, mask = enc.encode(caps, progress=int(os.environ.get("RANK", "0")) == 0)
    path = Path(out_dir) / "data" / "caption_features.safetensors"
    save_caption_features(path, feats, mask, caps, meta={"encoder": str(enc.dir), "encoder_fingerprint": enc.fingerprint})
    return str(path)


def _device() -> str:
    import torch

    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return "cpu"


def prompt_conds(tcfg, captions, encoder_dir, n: Optional[int] = None, what: str = "this command"):
    """(features, mask) for calibrate / bench / generate from --captions (a .txt with
    --encoder, or a feature file), cycled to n rows when n is given; + the caption texts."""
    if captions is None:
        from ..models.family import family_of

        raise InputError(f"t2i targets need --captions for {what}: a captions .txt (one per line) with its caption "
                         f"encoder ({encoder_fix(family_of(tcfg))}), or a .safetensors from `lisa-trt encode-captions`")
    feats, mask, texts = caption_conds(captions, tcfg, encoder_dir=encoder_dir, device=_device())
    if n is not None:
        feats, mask = cycle_conds((feats, mask), n)
        texts = [texts[i % len(texts)] for i in range(n)] if texts else []
    return (feats, mask), texts


def precheck_captions(family, captions, encoder_dir) -> None:
    """Cheap checks of --captions / --encoder before any model is loaded: a captions text file
    must have no empty line and needs a usable encoder of `family` (its directory, or the family's
    default such as $LISA_TRT_TEXT_ENCODER); nothing is loaded."""
    if captions is None or is_feature_file(captions):
        return
    read_captions(captions)
    caption_encoder(family, encoder_dir)
