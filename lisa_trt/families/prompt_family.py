"""The shared `ModelFamily` of whole-vocabulary prompt-id HF families (Chameleon / Lumina-mGPT,
Emu3): HF directories claimed by their config.json `model_type`, token-id prompts (`Prompts`)
as the condition, the image codes a sub-vocabulary of the head.

A family subclasses `VocabPromptFamily` and answers `image_vocab(cfg)` ({token id: VQ code});
the condition hooks, the image-code ids and `SubVocab`, the free layout and teacher forcing come
from here.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import ConfigError, InputError
from ..models.conditioning import TextPrompts
from ..models.family import ModelFamily, SequenceLayout, SubVocab
from ..models.prompts import Prompts, with_mask


def token_code_lut(vocab: dict, vocab_size: int) -> torch.Tensor:
    """(vocab_size,) token id -> VQ code, -1 for every id that is not an image code."""
    lut = torch.full((int(vocab_size),), -1, dtype=torch.long)
    ids = torch.tensor(sorted(vocab), dtype=torch.long)
    lut[ids] = torch.tensor([vocab[int(i)] for i in ids], dtype=torch.long)
    return lut


def cached_image_ids(target, vocab) -> torch.Tensor:
    """Sorted token ids of the image codes, `vocab()` ({token id: code}) computed once per target."""
    ids = getattr(target, "_image_token_ids", None)
    if ids is None:
        ids = torch.tensor(sorted(vocab()), dtype=torch.long)
        target._image_token_ids = ids
    return ids


def sub_vocab_of(vocab: dict) -> SubVocab:
    """The K image codes (sorted ids, their VQ rows); forced tokens come from the layout."""
    ids = sorted(vocab)
    return SubVocab(torch.tensor(ids), torch.tensor([vocab[i] for i in ids]))


def read_config_json(path, what: str) -> tuple:
    """(config.json path, parsed dict) of an HF directory (or the file itself); ConfigError naming
    `what` a checkpoint of the family is when there is none or it is not JSON."""
    path = Path(path)
    cfg_path = path / "config.json" if path.is_dir() else path
    if not cfg_path.is_file():
        raise ConfigError(f"{path} has no config.json: {what}")
    try:
        return cfg_path, json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{cfg_path} is not valid JSON ({e})") from e


def config_model_type(path) -> object:
    """`model_type` of DIR/config.json (None when there is no readable one)."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return None
    try:
        return json.loads(cfg.read_text()).get("model_type")
    except (OSError, ValueError):
        return None


class VocabPromptFamily(ModelFamily):
    """Token-id prompts over a whole-vocabulary head; subclasses answer `image_vocab(cfg)`."""

    vq_beside_checkpoint = True  # the decoder in the checkpoint directory (Chameleon: DIR/vqgan/)
    train_data = ("self",)  # self-distillation from the prompter's requests (rollouts of the target)
    checkpoint_model_types: tuple = ()  # config.json model_type values claimed (default: model_types)
    # self-distillation / calibration captions when none are given (generic, varied scenes)
    default_captions = (
        "a red fox in the snow", "a bowl of ramen on a wooden table", "a lighthouse at sunset",
        "a portrait of an old man with a beard", "a city street at night in the rain", "a cat sleeping on a sofa",
        "a mountain lake with pine trees", "a bouquet of sunflowers in a vase", "an astronaut riding a horse",
        "a watercolor painting of a harbor", "a close-up of a hummingbird", "a cozy library with tall shelves",
    )

    def conditioning(self, cfg_or_type):
        # text prompts through the family's prompter (--prompt / captions files); a negative text
        # replaces the prompter's unconditional rows, as negative_prompt_ids replace them in generate
        return TextPrompts(negative=True)

    def image_vocab(self, cfg) -> dict:
        """{token id: VQ code} of every image-code token of `cfg`'s vocabulary."""
        raise NotImplementedError

    def claims(self, path) -> bool:
        return config_model_type(path) in (self.checkpoint_model_types or self.model_types)

    # -- conditions: token-id prompts (models/prompts.Prompts) ------------------------------

    def check_cond(self, cfg, cond) -> int:
        p = Prompts.of(cond)
        if p.ids.numel() and (int(p.ids.min()) < 0 or int(p.ids.max()) >= cfg.vocab_size):
            raise InputError(f"token ids must be in 0..{cfg.vocab_size - 1}")
        return p.batch

    def null_cond(self, cfg, cond, uncond_embedding=None):
        """The unconditional rows the prompt carries (its protocol's, or negative_prompt_ids)."""
        p = Prompts.of(cond)
        if p.uncond is None:
            raise InputError("classifier-free guidance needs the unconditional rows: build the prompt with the "
                             "family's prompter (encode(..., cfg=True)), pass negative_prompt_ids, or use cfg_scale 1")
        return p.uncond

    def cond_specs(self, cfg_or_type) -> tuple:
        return (("input_ids", "int64", ("batch", "prompt"), "prompt token ids, left-padded"),
                ("valid", "bool", ("batch", "prompt"), "False on left padding"))

    def cond_inputs(self, cfg, cond, device, act_dtype) -> dict:
        p = Prompts.of(cond)
        return dict(input_ids=p.ids.to(device).contiguous(), valid=p.valid.to(device).contiguous())

    def cond_from_inputs(self, cfg, inputs: dict):
        return Prompts(inputs["input_ids"], inputs["valid"])

    def example_cond(self, cfg, batch: int, generator=None):
        return Prompts.of(torch.randint(0, cfg.vocab_size, (batch, 8), generator=generator))

    # -- the image codes inside the vocabulary ----------------------------------------------

    def image_ids(self, target) -> torch.Tensor:
        """Sorted token ids of the image codes (cached on the target)."""
        return cached_image_ids(target, lambda: self.image_vocab(target.config))

    def sub_vocab(self, target) -> SubVocab:
        return sub_vocab_of(self.image_vocab(target.config))

    def token_codes(self, cfg) -> torch.Tensor:
        """(vocab_size,) token id -> VQ code (-1 elsewhere)."""
        return token_code_lut(self.image_vocab(cfg), cfg.vocab_size)

    def free_layout(self, target, n_tokens=None, image_tokens_only: bool = False) -> SequenceLayout:
        """`n_tokens` free tokens over the raw head (optionally image codes only)."""
        if n_tokens is None:
            raise InputError(f"{self.name} targets need max_new_tokens=N here (the raw head has no image length)")
        return SequenceLayout(int(n_tokens), self.image_ids(target) if image_tokens_only else None)

    def generation_inputs(self, target, cond, attention_mask=None, negative=None, negative_mask=None):
        """The prompt as Prompts (attention_mask folded in), its CFG rows `negative` when given."""
        p = Prompts.of(with_mask(cond, attention_mask))
        if negative is not None:
            neg = Prompts.of(negative if negative_mask is None else (negative, negative_mask))
            if neg.batch != p.batch:
                raise InputError(f"negative_prompt_ids has {neg.batch} rows for {p.batch} prompts; pass one per prompt")
            p = Prompts(p.ids, p.valid, uncond=neg)
        return p, None, None

    def teacher_forced_logits(self, target, cond, tokens=None) -> torch.Tensor:
        """Raw head logits (B, N, V): [:, j] predicts tokens[:, j] from row b's prompt and tokens[:, :j].

        One cache-free forward per row over its real prompt tokens (left padding stripped; the
        CFG rows are their own prompts, from position 0), so a row's logits never depend on the
        other rows of the batch. tokens None: (B, T, V) of the ids `cond` itself (unpadded), as
        transformers' model(input_ids).logits."""
        p = Prompts.of(cond)
        if tokens is None:
            if not bool(p.valid.all()):
                raise InputError("teacher_forced_logits(target, input_ids) takes unpadded ids; for a left-padded "
                                 "batch pass (prompt, tokens) or one row at a time")
            return target.teacher_forced_logits(p.ids)
        N = tokens.shape[1]
        rows = []
        for b in range(p.batch):
            ids = torch.cat([p.ids[b][p.valid[b]], tokens[b, :-1].to(p.ids.device)])
            rows.append(target.forward_full(ids[None]).logits[0, -N:])
        return torch.stack(rows)
