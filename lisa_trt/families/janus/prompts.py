"""Janus-Pro text prompts for image generation, from the checkpoint directory's tokenizer.

Facts (transformers' JanusProcessor and DeepSeek's Janus-Pro recipe; read, not copied): the user
turn is rendered with the checkpoint's chat template (`chat_template` in tokenizer_config.json or
chat_template.jinja, jinja2) when it has one, else Janus-Pro's conversation format
"<|User|>: {prompt}\\n\\n<|Assistant|>:"; image generation appends the image-start token
(`<begin_of_image>`, id `boi_token_id`) and the tokenizer adds BOS. The unconditional CFG rows
are the target's (`null_cond`: every token but BOS / BOI replaced by PAD, as transformers does),
or, for a prompt given a negative text, that text in the same template (`ids(negative)`), carried
by the condition (Prompts.uncond) and left-padded to the batch's shared width by `cfg_rows`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch

from ...errors import ConfigError, InputError
from ...models.family import Request, SequenceLayout
from ...models.prompts import Prompts, negative_texts
from . import cond as C

SFT_FORMAT = "<|User|>: {prompt}\n\n<|Assistant|>:"
BOI = "<begin_of_image>"


class JanusPrompter:
    """`encode(prompts, cfg=...) -> Request` for a JanusTarget (models/family.py protocol)."""

    def __init__(self, target, source):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ConfigError("text prompts need the `tokenizers` package (pip install tokenizers)") from e
        if source is None:
            raise InputError("text prompts need the checkpoint directory (its tokenizer.json): pass it as source")
        folder = Path(source)
        file = folder / "tokenizer.json"
        if not file.is_file():
            raise ConfigError(f"no tokenizer.json in {folder}: save the processor / tokenizer of the checkpoint "
                              "into the model directory (processor.save_pretrained(DIR))")
        self.target, self.tok = target, Tokenizer.from_file(str(file))
        self.template = _chat_template(folder)
        cfg = target.config
        boi = self.tok.token_to_id(BOI)
        self.boi = cfg.boi_token_id if cfg.boi_token_id is not None else boi
        if self.boi is None:
            raise ConfigError(f"the tokenizer has no {BOI} and the config no boi_token_id: is this a Janus checkpoint?")
        self.boi_text = self.tok.id_to_token(int(self.boi))

    def text(self, prompt: str) -> str:
        if self.template is not None:
            return self.template.render(messages=[{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        bos_token="", eos_token="") + self.boi_text
        return SFT_FORMAT.format(prompt=prompt) + self.boi_text

    def ids(self, prompt: str) -> list:
        ids = self.tok.encode(self.text(prompt), add_special_tokens=True).ids
        bos = self.target.config.bos_token_id
        if bos is not None and (not ids or ids[0] != bos):
            ids = [int(bos)] + ids
        return ids

    def encode(self, prompts: Sequence[str], *, image_size=None, cfg: bool = False, negative=None) -> Request:
        """Request of `prompts`: cond (ids, valid) left-padded; with `negative` (one text for every
        prompt or one per prompt, None / blank: none) and `cfg`, a Prompts whose `uncond` rows are
        each negative text in the prompt template (transformers' padded row where a prompt has none)."""
        prompts = list(prompts)
        if not prompts:
            raise InputError("no prompts: pass at least one")
        cfg_ = self.target.config
        if image_size not in (None, cfg_.image_size):
            raise InputError(f"this Janus checkpoint generates {cfg_.image_size} x {cfg_.image_size} images only, "
                             f"not {image_size}")
        dev = getattr(self.target, "device", None)  # graph engines: theirs; the torch target: its head's
        if not isinstance(dev, (str, torch.device)):
            dev = self.target.output.weight.device
        rows = [self.ids(t) for t in prompts]
        p = Prompts.from_rows(rows, dev)
        neg = negative_texts(negative, len(prompts))  # checked with or without CFG
        cond = (p.ids, p.valid)
        if cfg and neg is not None:
            null = [self.ids(t) if t is not None else C.null_ids(cfg_, torch.tensor([r]))[0].tolist()
                    for r, t in zip(rows, neg)]
            cond = Prompts(p.ids, p.valid, uncond=Prompts.from_rows(null, dev))
        g = cfg_.grid_hw
        return Request(cond, SequenceLayout(cfg_.block_size), tuple(g), tuple(prompts))


def _chat_template(folder: Path):
    text = None
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        text = jinja.read_text()
    else:
        tc = folder / "tokenizer_config.json"
        if tc.is_file():
            try:
                text = json.loads(tc.read_text()).get("chat_template")
            except (OSError, ValueError):
                text = None
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        import jinja2
    except ImportError:
        return None  # the documented conversation format instead
    return jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(text)


__all__ = ["JanusPrompter", "SFT_FORMAT"]
