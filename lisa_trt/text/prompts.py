"""Caption prompts for `Pipeline.generate` / `lisa-trt run`: caption strings (encoded with the
pipeline's caption encoder, its family's plug-in, cached by caption hash) or precomputed feature
files. The run's caption adapter (runtime/conditions.CaptionConditions, a floor above) calls these
with the run's family; nothing here imports the runtime."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..errors import InputError


def make_encoder(text_encoder, tcfg, family, device="cpu"):
    """None, an encoder object, or a directory -> the caption encoder of the target's `family`,
    checked against the target (nothing is loaded yet). None: the family's configured default
    directory (LlamaGen: $LISA_TRT_TEXT_ENCODER), else None (then only feature files are accepted)."""
    import os

    from ..models.captions import caption_encoder, caption_shape

    if text_encoder is None or isinstance(text_encoder, (str, os.PathLike)):  # a directory, or none given
        text_encoder = caption_encoder(family, text_encoder, required=text_encoder is not None,
                                       device=device, max_length=caption_shape(tcfg)[0])
        if text_encoder is None:
            return None
    elif not hasattr(text_encoder, "encode"):
        raise InputError(f"text_encoder must be a caption encoder's directory or an encoder object, got "
                         f"{type(text_encoder).__name__}")
    text_encoder.check_target(tcfg)
    return text_encoder


def t2i_conds(items: Sequence[tuple], tcfg, encoder, family) -> tuple[tuple, list]:
    """Caption prompts, each ("caption", text) or ("file", a caption-features file of one caption)
    (runtime/conditions.CaptionConditions.parse makes them of a run's prompts)
    -> ((features (B, L, C), mask (B, L)), per-prompt labels); `family`: the target's (its
    encoder's name in messages).

    Every prompt is checked (and a missing encoder reported) before anything is encoded.
    """
    from ..models.captions import load_caption_features

    if not items:
        raise InputError("no prompts given")
    captions = [v for k, v in items if k == "caption"]
    if captions and encoder is None:
        from ..models.captions import encoder_fix, encoder_hint

        raise InputError(f"caption prompts need a {encoder_hint(family)['name']} encoder: "
                         f"{encoder_fix(family, cli=False)}, "
                         'or give precomputed features ({"caption_features": FILE} lines from '
                         "`lisa-trt encode-captions`)")
    rows: list[Optional[tuple]] = [None] * len(items)
    for i, (k, v) in enumerate(items):
        if k == "file":
            f, m, _ = load_caption_features(v, tcfg)
            if f.shape[0] != 1:
                raise InputError(f"{v} holds {f.shape[0]} captions; a prompt line takes a file with one caption")
            rows[i] = (f[0], m[0])
    if captions:
        feats, mask = encoder.encode(captions)
        it = iter(range(len(captions)))
        for i, (k, _) in enumerate(items):
            if k == "caption":
                j = next(it)
                rows[i] = (feats[j], mask[j])
    cond = (torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]))
    labels = [{"caption": v} if k == "caption" else {"caption_features": v} for k, v in items]
    return cond, labels


def cond_rows(cond, a: int, b: int):
    """Rows a:b of a condition (class ids or (features, mask))."""
    if isinstance(cond, (tuple, list)):
        return tuple(c[a:b] for c in cond)
    return cond[a:b]


def cond_len(cond) -> int:
    return cond[0].shape[0] if isinstance(cond, (tuple, list)) else len(cond)


def with_negative_captions(cond, negative, encoder, family):
    """Caption features (features (B, L, C), mask (B, L)) and the request's negative texts (one
    text or None per row; None: no row has one) -> the condition whose CFG unconditional rows are
    each negative text encoded by the same caption encoder (models/captions.GuidedCaptions; the
    rows without one keep the learned null caption). `cond` itself when no row has a negative, so
    nothing changes without one. InputError naming the fix when there is no encoder."""
    from ..models.captions import GuidedCaptions

    idx = [] if negative is None else [i for i, t in enumerate(negative) if t is not None]
    if not idx:
        return cond
    if encoder is None:
        from ..models.captions import encoder_fix, encoder_hint

        raise InputError(f"a negative_prompt on a {encoder_hint(family)['name']}-caption bundle is encoded by its "
                         f"caption encoder, and none is loaded: {encoder_fix(family, cli=False)}, or leave "
                         "negative_prompt out")
    feats, mask = cond
    nf, nm = encoder.encode([negative[i] for i in idx])  # (k, L, C), (k, L): valid tokens first
    null_f, null_m = torch.zeros_like(feats), torch.zeros_like(mask)
    null_f[idx], null_m[idx] = nf.to(feats.dtype), nm.to(mask.dtype)
    rows = torch.zeros(feats.shape[0], dtype=torch.bool)
    rows[idx] = True
    return GuidedCaptions(feats, mask, (null_f, null_m), rows)


def caption_rows(cond, a: int, b: int):
    """Rows a:b of a caption condition (a GuidedCaptions keeps its negative rows)."""
    from ..models.captions import GuidedCaptions

    return cond.rows(a, b) if isinstance(cond, GuidedCaptions) else cond_rows(cond, a, b)
