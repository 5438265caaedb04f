"""`lisa-trt encode-captions`: a captions file -> a family's caption features + mask (.safetensors).

Registered on the main group by one line in lisa_trt/cli/__init__.py. It runs without a target:
the family is named by --family (default: the one family with a caption encoder), resolved
through the registry when the command runs, so `lisa-trt --help` imports no family.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..clitools import handle_errors


_errors = handle_errors  # clitools.py: LisaError -> message, exit 2


def default_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@click.command("encode-captions")
@click.argument("captions", type=click.Path(dir_okay=False))
@click.option("--family", "family_name", default=None,
              help="Model family whose caption encoder to use (default: the one family with one, llamagen).")
@click.option("--encoder", "encoder_dir", default=None, type=click.Path(),
              help="Local encoder directory (LlamaGen: flan-t5-xl, transformers layout); default $LISA_TRT_TEXT_ENCODER.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="Output .safetensors.")
@click.option("--max-length", type=int, default=None,
              help="Caption slots (the target's cls_token_num; default: the encoder's, 120 for LlamaGen).")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:1 ... (auto: cuda if available).")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto", show_default=True,
              help="Encoder precision (auto: bf16 on CUDA as LlamaGen does, fp32 on CPU).")
@click.option("--save-dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--batch-size", type=int, default=16, show_default=True)
@click.option("--preprocess", type=click.Choice(["lower", "none"]), default=None,
              help="Caption text before tokenization: lower-case + strip (LlamaGen's default) or as given.")
@click.option("--cache-dir", default=None, type=click.Path(), help="Per-caption feature cache (default $LISA_TRT_CAPTION_CACHE).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out file (refused without it, before any work).")
@_errors
def encode_captions(captions, family_name, encoder_dir, out_path, max_length, device, dtype, save_dtype, batch_size,
                    preprocess, cache_dir, overwrite):
    """Encode CAPTIONS (one caption per line, no empty lines) with a family's caption encoder;
    LlamaGen's is its t2i recipe (FLAN-T5: its tokenizer, max length 120, padded to max length),
    written as caption_features (N, 120, 2048) and caption_mask (N, 120) with the valid tokens
    first (the target left-pads)."""
    from ..errors import InputError
    from ..io import refuse_existing
    from ..models.captions import caption_encoder, caption_family, read_captions, save_caption_features

    if Path(out_path).suffix != ".safetensors":
        raise InputError(f"--out must end in .safetensors, got {out_path}")
    refuse_existing(out_path, overwrite=overwrite)  # the overwrite rule (io.py), before the encoder loads
    caps = read_captions(captions)  # every check before the encoder loads
    given = dict(max_length=max_length, preprocess=preprocess)  # unset: the encoder's own defaults
    enc = caption_encoder(caption_family(family_name), encoder_dir, device=default_device(device), dtype=dtype,
                          cache_dir=cache_dir, batch_size=batch_size, **{k: v for k, v in given.items() if v is not None})
    feats, mask = enc.encode(caps, progress=True)
    save_caption_features(out_path, feats, mask, caps, dtype=save_dtype,
                          meta={"encoder": str(enc.dir), "encoder_fingerprint": enc.fingerprint,
                                "max_length": enc.max_length, "encoder_dtype": enc.dtype, "preprocess": enc.preprocess})
    n = mask.sum(1)
    click.echo(f"wrote {out_path}: {len(caps)} captions, features {tuple(feats.shape)}, "
               f"{int(n.min())}..{int(n.max())} valid tokens per caption")
