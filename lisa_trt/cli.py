"""`lisa-trt` command line. Thin: each command builds one config and makes one library call."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from .errors import LisaError


def _handle_errors(fn):
    """Print LisaError as a one-paragraph message (no traceback) and exit 2."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except LisaError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lisa-trt")
def main():
    """lisa-trt: LISA speculative decoding for autoregressive image generators.

    Pipeline: train (drafter) -> calibrate (GASV tables) -> export (ONNX) -> build (TensorRT)
    -> run. `lisa-trt demo` runs all of it on the bundled CPU model.
    """


# ----------------------------------------------------------------------------- shared options

def model_options(fn):
    fn = click.option("--model", "model", required=True,
                      help="Target checkpoint (.pt official / .safetensors) or 'demo'.")(fn)
    fn = click.option("--config", "config", default=None,
                      help="Target config name (GPT-B ... GPT-7B); default: the file's metadata.")(fn)
    fn = click.option("--image-size", type=int, default=256, show_default=True,
                      help="Image size for official configs (256/384/512).")(fn)
    fn = click.option("--model-type", type=click.Choice(["c2i", "t2i"]), default=None,
                      help="c2i or t2i for official configs (default c2i).")(fn)
    return fn


def sampling_options(fn):
    from .config import SamplingConfig

    d = SamplingConfig()
    fn = click.option("--cfg-scale", type=float, default=None, help=f"CFG scale (default {d.cfg_scale}; demo: its own).")(fn)
    fn = click.option("--temperature", type=float, default=None, help=f"Temperature (default {d.temperature}).")(fn)
    fn = click.option("--top-k", type=int, default=None, help=f"Top-k, 0 = off (default {d.top_k}).")(fn)
    fn = click.option("--top-p", type=float, default=None, help=f"Top-p (default {d.top_p}).")(fn)
    fn = click.option("--cfg-interval", type=int, default=None, help="Guidance off after this step (-1 = always on).")(fn)
    fn = click.option("--greedy", is_flag=True, help="Argmax of the guided logits.")(fn)
    fn = click.option("--seed", type=int, default=0, show_default=True)(fn)
    return fn


def resolve_target(model, config, image_size, model_type):
    from .config import target_config
    from .models.checkpoints import load_target

    cfg = None
    if config is not None:
        cfg = target_config(config, image_size=image_size, model_type=model_type)
    return load_target(model, cfg)


def resolve_sampling(model, **given):
    """SamplingConfig from CLI values; unset values come from the bundle defaults (demo) or
    the dataclass defaults."""
    import dataclasses

    from .config import SamplingConfig

    base = SamplingConfig()
    if model == "demo":
        from .demo import registry

        base = getattr(registry, "demo_sampling", SamplingConfig)()
    return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None and v is not False})


def parse_classes(text: str, num_classes: int, names=None) -> list[int]:
    """'1,2,golden_retriever' -> ids; unknown ids/names are errors listing what is allowed."""
    from .errors import InputError

    ids = []
    for tok in [t.strip() for t in text.split(",") if t.strip()]:
        if tok.lstrip("-").isdigit():
            i = int(tok)
        elif names and tok in names:
            i = names.index(tok)
        else:
            allowed = f"0..{num_classes - 1}" + (f" or one of {', '.join(names)}" if names else "")
            raise InputError(f"unknown class {tok!r}; use ids {allowed}")
        if not 0 <= i < num_classes:
            raise InputError(f"unknown class id {i}; valid ids are 0..{num_classes - 1}")
        ids.append(i)
    if not ids:
        raise InputError("no classes given; pass e.g. --classes 0,1,2")
    return ids


def load_caption_file(path, caption_dim: int):
    """A .safetensors/.npy file of T5 features (+ mask) -> (features, mask) tensors."""
    import numpy as np
    import torch

    from .errors import InputError
    from .io import load_safetensors

    p = Path(path)
    if p.suffix == ".safetensors":
        t, _ = load_safetensors(p)
        if "caption_features" not in t:
            raise InputError(f"{p} must hold 'caption_features' (B, 120, {caption_dim}) and 'caption_mask' (B, 120)")
        feats = t["caption_features"].float()
        mask = t.get("caption_mask", torch.ones(feats.shape[:2]))
    elif p.suffix == ".npy":
        feats = torch.from_numpy(np.load(p)).float()
        mask_path = p.with_name(p.stem + "_mask.npy")
        mask = torch.from_numpy(np.load(mask_path)) if mask_path.exists() else torch.ones(feats.shape[:2])
    else:
        raise InputError(f"caption features must be .safetensors or .npy, got {p.name}")
    if feats.dim() == 2:
        feats, mask = feats[None], mask.reshape(1, -1)
    return feats, mask


# ----------------------------------------------------------------------------- commands

@main.command()
@click.argument("src")
@click.argument("dst")
@click.option("--config", "config", required=True, help="Target config name (GPT-B ...) or VQ-16/VQ-8.")
@click.option("--image-size", type=int, default=256, show_default=True)
@click.option("--model-type", type=click.Choice(["c2i", "t2i"]), default=None)
@_handle_errors
def convert(src, dst, config, image_size, model_type):
    """Convert an official LlamaGen .pt (target or VQ) to safetensors + config JSON."""
    from .config import target_config, vq_config
    from .models.checkpoints import load_target, load_vq, save_model

    if config.startswith("VQ"):
        cfg = vq_config(config)
        model = load_vq(src, cfg)
    else:
        cfg = target_config(config, image_size=image_size, model_type=model_type)
        model = load_target(src, cfg)
    save_model(model, cfg, dst)
    click.echo(f"wrote {dst} (+ {Path(dst).with_suffix('.json').name})")


@main.command("random-checkpoint")
@click.argument("out")
@click.option("--config", "config", required=True, help="GPT-B ... GPT-7B, tiny, or VQ-16/VQ-8.")
@click.option("--image-size", type=int, default=256, show_default=True)
@click.option("--model-type", type=click.Choice(["c2i", "t2i"]), default=None)
@click.option("--seed", type=int, default=0, show_default=True)
@_handle_errors
def random_checkpoint(out, config, image_size, model_type, seed):
    """Write a randomly initialised checkpoint in the official layout ({"model": state_dict})."""
    import torch

    from .config import target_config, vq_config
    from .io import atomic_write
    from .models.llamagen import Transformer
    from .models.vq import VQModel

    torch.manual_seed(seed)
    if config.startswith("VQ"):
        model = VQModel(vq_config(config))
    else:
        model = Transformer(target_config(config, image_size=image_size, model_type=model_type))
    with atomic_write(out) as tmp:
        torch.save({"model": model.state_dict()}, tmp)
    click.echo(f"wrote {out}")


@main.command()
@model_options
@click.option("--vq", "vq", default=None, help="VQ checkpoint (or 'demo'); without it only tokens are written.")
@click.option("--vq-config", default="VQ-16", show_default=True)
@click.option("--classes", default=None, help="c2i: comma-separated class ids (or names for the demo).")
@click.option("--captions", default=None, type=click.Path(exists=True),
              help="t2i: .safetensors (caption_features, caption_mask) or .npy of T5 features.")
@sampling_options
@click.option("--out", "out_dir", default="outputs", show_default=True, type=click.Path())
@_handle_errors
def generate(model, config, image_size, model_type, vq, vq_config, classes, captions, cfg_scale,
             temperature, top_k, top_p, cfg_interval, greedy, seed, out_dir):
    """Generate images with the reference AR loop; writes PNGs and tokens.npy."""
    import dataclasses

    import numpy as np
    import torch

    from . import generate as ar_generate
    from .errors import InputError

    target = resolve_target(model, config, image_size, model_type)
    tc = target.config
    s = resolve_sampling(model, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k,
                         top_p=top_p, cfg_interval=cfg_interval, greedy=greedy)
    if tc.model_type == "c2i":
        if classes is None:
            raise InputError("c2i models need --classes (e.g. --classes 0,1,2)")
        names = _class_names(model)
        cond = torch.tensor(parse_classes(classes, tc.num_classes, names))
    else:
        if captions is None:
            raise InputError("t2i models need --captions FILE (T5 features + mask)")
        cond = load_caption_file(captions, tc.caption_dim)
    tokens = ar_generate(target, cond, seed=seed, **dataclasses.asdict(s))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from .io import atomic_write

    with atomic_write(out / "tokens.npy") as tmp:
        with open(tmp, "wb") as f:
            np.save(f, tokens.cpu().numpy())
    if vq is None and model == "demo":
        vq = "demo"
    if vq is not None:
        paths = decode_and_save(tokens, vq, vq_config, tc, out)
        click.echo(f"wrote {len(paths)} images and tokens.npy to {out}")
    else:
        click.echo(f"wrote tokens.npy to {out} (pass --vq to decode images)")


def _class_names(model):
    if model == "demo":
        from .demo.registry import class_names

        return list(class_names())
    return None


def decode_and_save(tokens, vq, vq_config_name, tc, out):
    import torch

    from .imaging import save_images, to_uint8
    from .models.checkpoints import load_vq

    vqm = load_vq(vq, None if vq == "demo" or str(vq).endswith(".safetensors") else vq_config_name)
    g = tc.grid_size
    with torch.no_grad():
        imgs = vqm.decode_code(tokens, (tokens.shape[0], vqm.config.codebook_embed_dim, g, g))
    return save_images(to_uint8(imgs), out)


if __name__ == "__main__":  # pragma: no cover
    main()
