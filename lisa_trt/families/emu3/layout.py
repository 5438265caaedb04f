"""Emu3's image layout: the grid written in the prompt and the sequence generated after it.

The layout rule is the Emu3 model card's `prefix_allowed_tokens_fn` (read, not copied): counting
from the prompt's `<|image token|>`, every (w + 1)-th token is end-of-line, then come
end-of-frame, end-of-image and end-of-sequence, and every other position is a visual token. The
grid (h, w) is the text "h*w" between the prompt's last `<|image start|>` and its closing
`<|image token|>` (how Emu3's processor writes it).
"""

from __future__ import annotations

import re

import torch

from ...errors import InputError
from ...models.family import SequenceLayout
from ...models.prompts import Prompts
from .config import BOI, IMAGE_WRAPPER

_GRID = re.compile(r"^\s*(\d+)\s*\*\s*(\d+)\s*$")


def span_forced(cfg, h: int, w: int) -> torch.Tensor:
    """(h * (w + 1) + 3,) the id forced at each index (-1 where a visual token is sampled)."""
    eol, eof, eoi, eos = cfg.end_tokens()
    rows = torch.full((h, w + 1), -1, dtype=torch.long)
    rows[:, w] = eol
    return torch.cat([rows.flatten(), torch.tensor([eof, eoi, eos])])


def _names(target) -> dict:
    """{id: name} of the vocabulary map (cached on the target)."""
    inv = getattr(target, "_emu3_names", None)
    if inv is None:
        inv = {int(i): n for n, i in target.config.vocabulary_map.items()}
        target._emu3_names = inv
    return inv


def row_grid(target, ids: list) -> tuple:
    """(h, w) a prompt row writes: `<|image start|>h*w<|image token|>` at its end."""
    cfg = target.config
    boi, wrap = cfg.token_id(BOI), cfg.token_id(IMAGE_WRAPPER)
    if not ids or ids[-1] != wrap or boi not in ids:
        raise InputError(f"an Emu3 image prompt ends with {BOI}H*W{IMAGE_WRAPPER} (Emu3's processor with "
                         "return_for_image_generation=True writes it); this prompt does not")
    start = len(ids) - 1 - ids[::-1].index(boi)
    names = _names(target)
    text = "".join(names.get(int(t), "?") for t in ids[start + 1:-1])
    m = _GRID.match(text)
    if m is None or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise InputError(f"the prompt's image size {text!r} between {BOI} and {IMAGE_WRAPPER} is not 'H*W' "
                         "(the code grid's height and width, e.g. 90*90 for 720 px)")
    return int(m.group(1)), int(m.group(2))


def prompt_grid(target, cond) -> tuple:
    """The one (h, w) every row of the prompt batch writes (InputError when rows differ)."""
    p = Prompts.of(cond)
    grids = {row_grid(target, p.ids[b][p.valid[b]].tolist()) for b in range(p.batch)}
    if len(grids) != 1:
        raise InputError(f"the prompts ask for different image grids {sorted(grids)}; batch prompts of one size")
    return grids.pop()


def image_layout(target, family, h: int, w: int, device=None) -> SequenceLayout:
    """The generated span of an (h, w) image: visual tokens allowed, the end tokens forced."""
    forced = span_forced(target.config, h, w)
    ids = family.image_ids(target)
    if device is not None:
        forced, ids = forced.to(device), ids.to(device)
    return SequenceLayout(int(forced.numel()), ids, forced, family.sub_vocab(target))
