"""The LlamaGen family (models/family.py seam): c2i class conditions and t2i T5 captions."""

from __future__ import annotations

import torch

from ...errors import InputError, SpecError
from ...models.conditioning import CaptionFeatures, ClassLabels
from ...models.family import ModelFamily, register_family
from . import config as _config  # noqa: F401  (registers GPT-*, tiny, VQ-*; publishes TargetConfig / VQConfig)


class LlamaGenFamily(ModelFamily):
    """LlamaGen: c2i (one class token, id num_classes = unconditional) and t2i (T5 captions)."""

    name = "llamagen"
    model_types = ("c2i", "t2i")

    def check_cond(self, cfg, cond) -> int:
        if cfg.model_type == "c2i":
            if not torch.is_tensor(cond) or cond.dim() != 1 or cond.dtype not in (torch.long, torch.int32, torch.int64):
                raise InputError("c2i condition must be a 1-D LongTensor of class ids (B,)")
            bad = cond[(cond < 0) | (cond > cfg.num_classes)]
            if bad.numel():
                raise InputError(f"unknown class id {int(bad[0])}: valid ids are 0..{cfg.num_classes - 1} "
                                 f"(and {cfg.num_classes} = unconditional)")
            return cond.shape[0]
        if not (isinstance(cond, (tuple, list)) and len(cond) == 2):
            raise InputError("t2i condition must be a tuple (caption_features (B, 120, C), caption_mask (B, 120))")
        feats, mask = cond
        want = (cfg.cls_token_num, cfg.caption_dim)
        if feats.dim() != 3 or tuple(feats.shape[1:]) != want:
            raise InputError(f"caption features have shape {tuple(feats.shape)}; expected (B, {want[0]}, {want[1]}) "
                             "as the T5 encoder returns them")
        if tuple(mask.shape) != tuple(feats.shape[:2]):
            raise InputError(f"caption mask shape {tuple(mask.shape)} does not match features {tuple(feats.shape[:2])}")
        if not torch.isfinite(feats).all():
            raise InputError("caption features contain NaN or Inf")
        return feats.shape[0]

    def null_cond(self, cfg, cond, uncond_embedding=None):
        if cfg.model_type == "c2i":
            return torch.full_like(cond, cfg.num_classes)
        # LlamaGen feeds uncond_embedding unrotated in all 120 slots, with the cond's mask.
        # `_left_pad` rotates features by n_valid, so pre-rotate the other way: after padding,
        # slot j holds uncond_embedding[j] exactly as in the official loop.
        feats, mask = cond
        T = feats.shape[1]
        n_valid = mask.to(torch.bool).sum(1)
        src = (torch.arange(T, device=feats.device)[None, :] - n_valid[:, None]) % T
        null = uncond_embedding.to(feats.dtype)[src]
        given = getattr(cond, "negative", None)  # models/captions.GuidedCaptions: negative captions' rows
        if given is None or not bool(given.any()):
            return null, mask
        # a row with a negative caption: its T5 features and mask, placed as any caption's (_left_pad)
        rows = given.to(feats.device)
        nf, nm = cond.null
        return (torch.where(rows[:, None, None], nf.to(device=feats.device, dtype=feats.dtype), null),
                torch.where(rows[:, None], nm.to(device=mask.device, dtype=mask.dtype), mask))

    def conditioning(self, cfg_or_type):
        if getattr(cfg_or_type, "model_type", cfg_or_type) == "c2i":
            return ClassLabels(getattr(cfg_or_type, "num_classes", None))
        return CaptionFeatures(getattr(cfg_or_type, "cls_token_num", None), getattr(cfg_or_type, "caption_dim", None))

    def condition_tensors(self, target) -> dict:
        u = getattr(target.cls_embedding, "uncond_embedding", None)  # t2i: the null caption
        return {} if u is None else {"uncond_embedding": u.detach().float()}

    def cond_specs(self, cfg_or_type) -> tuple:
        model_type = getattr(cfg_or_type, "model_type", cfg_or_type)
        if model_type == "c2i":
            return (("class_ids", "int64", ("batch",), "class id per row (num_classes = unconditional)"),)
        if model_type == "t2i":
            return (("caption_features", "act", ("batch", "prefix", "caption_dim"), "T5 features, valid tokens first"),
                    ("caption_mask", "bool", ("batch", "prefix"), "True for valid caption tokens (a prefix of each row)"))
        raise SpecError(f"model_type must be 'c2i' or 't2i', got {model_type!r}")

    def cond_inputs(self, cfg, cond, device, act_dtype) -> dict:
        if cfg.model_type == "c2i":
            return dict(class_ids=cond.to(device=device, dtype=torch.int64).contiguous())
        return dict(caption_features=cond[0].to(device=device, dtype=act_dtype).contiguous(),
                    caption_mask=cond[1].to(device=device, dtype=torch.bool).contiguous())

    def cond_from_inputs(self, cfg, inputs: dict):
        return inputs["class_ids"] if cfg.model_type == "c2i" else (inputs["caption_features"], inputs["caption_mask"])

    def example_cond(self, cfg, batch: int, generator=None):
        if cfg.model_type == "c2i":
            return torch.randint(0, cfg.num_classes + 1, (batch,), generator=generator)
        feats = torch.randn(batch, cfg.cls_token_num, cfg.caption_dim, generator=generator)
        n = torch.randint(1, cfg.cls_token_num + 1, (batch,), generator=generator)
        return feats, torch.arange(cfg.cls_token_num)[None, :] < n[:, None]

    def random_cond(self, cfg, batch: int, generator=None):
        """Real class ids (c2i), or caption features with a different valid length per row (t2i)."""
        if cfg.model_type == "c2i":
            return torch.randint(0, cfg.num_classes, (batch,), generator=generator)
        feats = torch.randn(batch, cfg.cls_token_num, cfg.caption_dim, generator=generator)
        mask = torch.zeros(batch, cfg.cls_token_num)
        for b in range(batch):
            mask[b, : min(2 + b, cfg.cls_token_num)] = 1  # valid tokens first
        return feats, mask

    def init_target(self, config):
        from .model import Transformer

        return Transformer(config)

    def init_decoder(self, config):
        from .vq import VQModel

        return VQModel(config)

    def target_from_state(self, config, state_dict: dict):
        from ...models.checkpoints import model_with_state
        from .model import Transformer

        return model_with_state(Transformer(config), state_dict, "target")

    def decoder_from_state(self, config, state_dict: dict):
        from ...models.checkpoints import model_with_state
        from .vq import VQModel

        return model_with_state(VQModel(config), state_dict, "VQ")

    def random_target(self, model_type: str = "c2i", seed: int = 0, std: float = 0.1, **overrides):
        """The "tiny" config (t2i: 6 caption slots of width 12), every weight N(0, std) (norm
        gammas 1 + N(0, std)), the null caption seeded too."""
        from .config import tiny_config
        from .model import Transformer

        g = torch.Generator().manual_seed(seed)
        kw = dict(model_type=model_type)
        if model_type == "t2i":
            kw.update(cls_token_num=6, caption_dim=12)
        kw.update(overrides)
        m = Transformer(tiny_config(**kw))
        with torch.no_grad():
            for name, p in m.named_parameters():
                noise = torch.randn(p.shape, generator=g) * std
                p.copy_(1.0 + noise if name.endswith("norm.weight") else noise)
            if model_type == "t2i":  # the null caption is a buffer: seed it too (not the global RNG)
                u = m.cls_embedding.uncond_embedding
                u.copy_(torch.randn(u.shape, generator=g) / u.shape[1] ** 0.5)
        return m.eval()

    def describe_checkpoint(self) -> str:
        return "an official .pt or a lisa-trt .safetensors file (" + " / ".join(CHECKPOINT_SUFFIXES) + ")"

    def claims(self, path) -> bool:
        """A single weights file (.pt / .pth / .bin / .safetensors; a missing one fails in
        read_state_dict, naming it); never a directory."""
        from pathlib import Path

        p = Path(path)
        return p.suffix.lower() in CHECKPOINT_SUFFIXES and not p.is_dir()

    def load_target(self, path, config=None, device="cpu"):
        from .checkpoint import load_llamagen_target

        return load_llamagen_target(path, config, device)

    def load_decoder(self, path, config=None, device="cpu"):
        from .checkpoint import load_llamagen_vq

        return load_llamagen_vq(path, config, device)


CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")  # the files read_state_dict reads

register_family(LlamaGenFamily())

__all__ = ["LlamaGenFamily"]
