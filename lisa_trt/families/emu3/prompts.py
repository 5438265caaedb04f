"""Emu3's text-to-image prompts: the checkpoint's tokenizer.json and the Emu3-Gen model card's
template (read, not copied): the caption + a positive suffix; CFG's unconditional rows are the
card's negative prompt, or the request's own negative text in its place; both end with
`<|image start|>H*W<|image token|>` as Emu3's processor writes it (BOS first)."""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError, InputError
from ...models.family import Request
from ...models.prompts import Prompts, negative_texts
from .config import BOI, IMAGE_WRAPPER, read_emu3_vq_config

POSITIVE = " masterpiece, film grained, best quality."
NEGATIVE = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, "
            "worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, username, blurry.")


class Emu3Prompter:
    """`encode(captions, image_size=, cfg=) -> Request` over the checkpoint's tokenizer.json."""

    def __init__(self, target, family, source):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ConfigError("text prompts need the `tokenizers` package: pip install tokenizers") from e
        file = Path(source) / "tokenizer.json" if source is not None else None
        if file is None or not file.is_file():
            raise ConfigError(f"no tokenizer.json in {source}: Emu3 text prompts need the checkpoint's tokenizer.json "
                              "(BAAI/Emu3-Gen-hf ships one); or pass prompt ids to lisa_trt.generate")
        self.target, self.family, self.tok = target, family, Tokenizer.from_file(str(file))
        cfg = target.config
        self.bos, self.boi, self.wrap = cfg.bos_token_id, cfg.token_id(BOI), cfg.token_id(IMAGE_WRAPPER)
        self.downsample = read_emu3_vq_config(source).downsample  # pixels per code (Emu3-Gen: 8)

    def ids(self, text: str, h: int, w: int) -> list:
        enc = self.tok.encode
        return [self.bos, *enc(text, add_special_tokens=False).ids, self.boi,
                *enc(f"{h}*{w}", add_special_tokens=False).ids, self.wrap]

    def encode(self, prompts, *, image_size=None, cfg: bool = False, width=None, height=None,
               negative=None) -> Request:
        """negative: one text for every prompt or one per prompt (None: the card's negative
        prompt), CFG's unconditional rows when `cfg`."""
        from .layout import image_layout

        if not prompts:
            raise InputError("no captions: pass at least one prompt")
        size = image_size or self.family.default_image_size
        width, height = width or size, height or size
        ds = self.downsample
        if width % ds or height % ds or width <= 0 or height <= 0:
            raise InputError(f"image size {width}x{height}: this Emu3 VQ takes positive multiples of {ds} px")
        h, w = height // ds, width // ds
        dev = self.target.lm_head.weight.device if hasattr(self.target, "lm_head") else self.target.device
        cond = Prompts.from_rows([self.ids(p + POSITIVE, h, w) for p in prompts], dev)
        neg = negative_texts(negative, len(prompts)) or [None] * len(prompts)  # checked with or without CFG
        if cfg:
            cond.uncond = Prompts.from_rows([self.ids(NEGATIVE if t is None else t, h, w) for t in neg], dev)
        return Request(cond, image_layout(self.target, self.family, h, w, dev), (h, w), tuple(prompts))
