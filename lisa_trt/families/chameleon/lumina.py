"""Lumina-mGPT's text-to-image protocol on a Chameleon-architecture target (the family's prompt
encoding and sequence layout; the decode loops are the generic ones).

Facts (Lumina-mGPT's FlexARItemProcessor / inference solver; read, not copied):
- Prompt: `<bos>` + "Generate an image of {W}x{H} according to the following prompt:\\n{caption}"
  + the turn separator `<reserved08706>`; the tokenizer is the checkpoint's tokenizer.json.
- Image span: `<racm3:break>` (image start), two size tokens `<reserved{8800 + n:05d}>` for the
  height then width in 32-pixel grids, then per latent row (2 rows per grid, 16 px per VQ code)
  w_lat image-code tokens and the row-end token `<reserved08799>`, then `<eoss>` (image end).
- Row-end and end tokens are FORCED at their positions (never sampled or drafted); every other
  span position samples among the image-code tokens only, after CFG and top-k.
- CFG: the unconditional sequence is the image span alone, starting at position 0
  (`[<racm3:break>, h, w, ...]`), guided = uncond + scale * (cond - uncond). A negative text
  (lisa-trt's, not Lumina's) is written as a prompt of its own before that span. Lumina's defaults:
  cfg 3.0 (4.0 in its demos), image top-k 2000, temperature 1.0.
Here start and size tokens are forced from the requested size (Lumina lets the model emit them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ...errors import ConfigError, InputError
from .model import Prompts
from ...models.family import SequenceLayout

PATCH = 32  # pixels per size-token grid
LATENT_PER_GRID = 2  # VQ codes per grid side (16-pixel codes)
TEMPLATE = "Generate an image of {w}x{h} according to the following prompt:\n{caption}"
START, END, NEWLINE, SEP = "<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>"


def size_token(n_grids: int) -> str:
    return f"<reserved{8800 + n_grids:05d}>"


class LuminaTokenizer:
    """The checkpoint's tokenizer.json (HF `tokenizers`) plus the protocol's special ids."""

    def __init__(self, path):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ConfigError("text prompts need the `tokenizers` package: pip install 'lisa-trt[chameleon]'") from e
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ConfigError(f"no tokenizer.json in {path}: copy the checkpoint's tokenizer.json (and "
                              "tokenizer_config.json) into the model directory (see docs/chameleon.md)")
        self.tok = Tokenizer.from_file(str(file))
        self.bos = self.id(self._bos_name(file.parent))
        self.start, self.end, self.newline, self.sep = (self.id(n) for n in (START, END, NEWLINE, SEP))

    @staticmethod
    def _bos_name(folder: Path) -> str:
        import json

        cfg = folder / "tokenizer_config.json"
        if cfg.is_file():
            bos = json.loads(cfg.read_text()).get("bos_token")
            bos = bos.get("content") if isinstance(bos, dict) else bos
            if bos:
                return bos
        return "<s>"

    def id(self, name: str) -> int:
        i = self.tok.token_to_id(name)
        if i is None:
            raise ConfigError(f"the tokenizer has no token {name!r}: is this a Lumina-mGPT / Chameleon tokenizer?")
        return int(i)

    def prompt_ids(self, caption: str, width: int, height: int) -> list[int]:
        # Lumina-mGPT tokenizes the whole turn, separator included (it is an added token)
        text = TEMPLATE.format(w=width, h=height, caption=caption) + SEP
        return [self.bos] + self.tok.encode(text, add_special_tokens=False).ids

    def span_prefix(self, width: int, height: int) -> list[int]:
        hg, wg = grids(width, height)
        return [self.start, self.id(size_token(hg)), self.id(size_token(wg))]


def grids(width: int, height: int) -> tuple[int, int]:
    if width % PATCH or height % PATCH or width <= 0 or height <= 0:
        raise InputError(f"image size {width}x{height}: width and height must be positive multiples of {PATCH}")
    return height // PATCH, width // PATCH


def row_end_mask(h_lat: int, w_lat: int) -> torch.Tensor:
    """(h_lat * (w_lat + 1),) bool: True at span positions that hold the forced row-end token.
    Samplers and tree drafters must skip these positions."""
    m = torch.zeros(h_lat, w_lat + 1, dtype=torch.bool)
    m[:, -1] = True
    return m.flatten()


@dataclass
class LuminaImages:
    tokens: torch.Tensor  # (B, L) the span after the size tokens: codes and row ends (token ids)
    codes: torch.Tensor  # (B, h_lat, w_lat) VQ code indices


def tokens_to_codes(target, span: torch.Tensor, h_lat: int, w_lat: int) -> torch.Tensor:
    """Span tokens (B, h_lat * (w_lat + 1)) -> VQ codes (B, h_lat, w_lat) (row ends dropped)."""
    from .vocab import code_lut

    lut = code_lut(target.config)
    grid = span.view(span.shape[0], h_lat, w_lat + 1)[:, :, :w_lat].cpu()
    codes = lut[grid]
    if (codes < 0).any():
        raise InputError("the image span holds non-image tokens where codes belong")
    return codes


def span_request(target, tokenizer: LuminaTokenizer, captions: Sequence[str], width: int, height: int,
                 cfg: bool, device=None, negative=None) -> tuple[Prompts, SequenceLayout, tuple[int, int]]:
    """The condition and layout of one image span per caption.

    negative: one text for every caption or one per caption (None: none), the CFG rows' prompt.
    Returns (Prompts: prompt + span prefix per caption, with the CFG rows when `cfg` (the span
    prefix alone, from position 0; a row with a negative text: that text's prompt + the span
    prefix); SequenceLayout: the span, image codes allowed, row ends forced; (h_lat, w_lat))."""
    from ...models.prompts import negative_texts
    from .vocab import image_ids, sub_vocab

    hg, wg = grids(width, height)
    h_lat, w_lat = hg * LATENT_PER_GRID, wg * LATENT_PER_GRID
    if not captions:
        raise InputError("no captions: pass at least one prompt")
    dev = device if device is not None else device_of(target)
    prefix = tokenizer.span_prefix(width, height)
    prompts = Prompts.from_rows([tokenizer.prompt_ids(c, width, height) + prefix for c in captions], dev)
    neg = negative_texts(negative, len(captions)) or [None] * len(captions)  # checked with or without CFG
    if cfg:
        prompts.uncond = Prompts.from_rows([prefix if t is None else tokenizer.prompt_ids(t, width, height) + prefix
                                            for t in neg], dev)
    ends = row_end_mask(h_lat, w_lat)
    forced = torch.where(ends, torch.tensor(tokenizer.newline), torch.tensor(-1))
    layout = SequenceLayout(int(ends.numel()), image_ids(target).to(dev), forced, sub_vocab(target))
    return prompts, layout, (h_lat, w_lat)


def device_of(target) -> torch.device:
    """Device of a torch target (its head) or of an exported-graph runner (`.device`)."""
    dev = getattr(target, "device", None)
    return dev if isinstance(dev, torch.device) else target.lm_head.weight.device
