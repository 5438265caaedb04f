"""`lisa-trt convert` and `random-checkpoint`: official-config checkpoints, target or VQ."""

from __future__ import annotations

from pathlib import Path


def _official(model_cfg):
    """--config / --image-size / --model-type -> (is a VQ config, its config)."""
    from ...models.target_config import target_config, vq_config

    name = model_cfg["config"]
    if name.startswith("VQ"):
        return True, vq_config(name)
    return False, target_config(name, image_size=model_cfg["image_size"], model_type=model_cfg["model_type"])


def convert(src, dst, model_cfg, *, echo) -> None:
    """An official LlamaGen .pt (target or VQ) -> safetensors + config JSON at `dst`."""
    from ...models.checkpoints import load_target, load_vq, save_model

    is_vq, cfg = _official(model_cfg)
    model = load_vq(src, cfg) if is_vq else load_target(src, cfg)
    save_model(model, cfg, dst)
    echo(f"wrote {dst} (+ {Path(dst).with_suffix('.json').name})")


def random_checkpoint(out, model_cfg, seed: int, *, echo) -> None:
    """A randomly initialised target or VQ of the family's own init, in the official layout
    ({"model": state_dict}) at `out`."""
    import torch

    from ...models.target_config import TargetConfig
    from ...io import atomic_write
    from ...models.family import family_of

    torch.manual_seed(seed)
    is_vq, cfg = _official(model_cfg)
    fam = family_of((model_cfg["model_type"] or TargetConfig.model_type) if is_vq else cfg)
    model = fam.init_decoder(cfg) if is_vq else fam.init_target(cfg)
    with atomic_write(out) as tmp:
        torch.save({"model": model.state_dict()}, tmp)
    echo(f"wrote {out}")
