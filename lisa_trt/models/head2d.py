"""2-D heads (SSD's right-and-below heads, arXiv 2606.20543): draft laws for the neighbours of an
image token from the target's final hidden state there.

The target's hidden state h at raster index i = (r, c) (the one whose LM-head logits predict
index i + 1) feeds one head per trained OFFSET (dr, dc); head k predicts the token at
(r + dr, c + dc), i.e. raster index i + dr * L + dc with L the sequence's row length (the grid
width, plus the forced row-end token where the family's layout has one):

    head_k(h) = W_k (h + SiLU(A_k h))      W_k warm-started from the target's output layer

"right" (0, 1) is the target's own next-token law in raster order (its LM head reads the same h),
so the useful heads are "below" (1, 0) and "below-right" (1, 1): they give a row that has not
started yet a law for each of its columns once the row above has decoded that column. PJD
(speculative/pjd.py) drafts such columns from a uniform prior; speculative/ssd.py replaces that
prior with the below head (docs/ssd_head.md measures whether it pays).

Any family with a grid: the heads predict the whole head vocabulary; the decode loop's layout law
(the session's Guide) restricts them to the allowed ids and forces forced ones, and training
compares them over the allowed ids only. Saved as a `lisa-trt-head2d` safetensors artifact with
its config JSON beside it, checked against the target's hash.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import CheckpointError, ConfigError
from .checkpoints import read_heads_artifact, target_hash
from .medusa import ResBlock

SCHEMA_VERSION = 1
ARTIFACT_KIND = "lisa-trt-head2d"
DIRECTIONS = {"right": (0, 1), "below": (1, 0), "below-right": (1, 1)}


def parse_directions(text: str) -> tuple:
    """"below,below-right" -> ((1, 0), (1, 1)); ConfigError naming the valid names."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    bad = [n for n in names if n not in DIRECTIONS]
    if bad or not names:
        raise ConfigError(f"2-D head directions {bad or text!r} unknown; give one or more of "
                          f"{', '.join(DIRECTIONS)}, comma-separated (e.g. below,below-right)")
    if len(set(names)) != len(names):
        raise ConfigError(f"2-D head directions {names} repeat a direction")
    return tuple(DIRECTIONS[n] for n in names)


@dataclass(frozen=True)
class Head2DConfig:
    """Shapes of 2-D heads, the grid they index and the target they were made for."""

    dim: int
    vocab_size: int
    row_len: int  # tokens per row of the sequence (a forced row end included)
    n_tokens: int  # tokens per image
    offsets: tuple = ((1, 0), (1, 1))  # (dr, dc) per head
    target_name: str = ""
    target_hash: str = ""

    def __post_init__(self):
        object.__setattr__(self, "offsets", tuple(tuple(int(x) for x in o) for o in self.offsets))
        if self.dim < 1 or self.vocab_size < 2:
            raise ConfigError("a 2-D head needs dim >= 1 and vocab_size >= 2")
        if self.row_len < 1 or self.n_tokens < 2 * self.row_len:
            raise ConfigError(f"a 2-D head needs an image of at least two rows; got {self.n_tokens} tokens in rows "
                              f"of {self.row_len}")
        if not self.offsets or any(dr < 0 or dc < 0 or (dr, dc) == (0, 0) or dc >= self.row_len
                                   for dr, dc in self.offsets):
            raise ConfigError(f"2-D head offsets {self.offsets}: each (dr, dc) must point right of or below the "
                              f"token (dr, dc >= 0, not (0, 0), dc < the row length {self.row_len})")

    def delta(self, k: int) -> int:
        """Raster distance of head k's target: dr * row_len + dc."""
        dr, dc = self.offsets[k]
        return dr * self.row_len + dc

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["offsets"] = [list(o) for o in self.offsets]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Head2DConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        if set(d) - known:
            raise ConfigError(f"unknown Head2DConfig fields {sorted(set(d) - known)}; valid: {sorted(known)}")
        return cls(**{**d, "offsets": tuple(tuple(o) for o in d.get("offsets", ((1, 0), (1, 1))))})


class Heads2D(nn.Module):
    """One ResBlock + output layer per offset on the target's final hidden state."""

    def __init__(self, cfg: Head2DConfig):
        super().__init__()
        self.config = cfg
        self.blocks = nn.ModuleList(ResBlock(cfg.dim) for _ in cfg.offsets)
        self.heads = nn.ModuleList(nn.Linear(cfg.dim, cfg.vocab_size, bias=False) for _ in cfg.offsets)

    @classmethod
    def from_target(cls, target: nn.Module, row_len: int, n_tokens: int, offsets=((1, 0), (1, 1)),
                    target_name: str = "") -> "Heads2D":
        """Fresh heads for `target`, every output layer a copy of the target's."""
        out = target.output
        cfg = Head2DConfig(dim=out.in_features, vocab_size=out.out_features, row_len=int(row_len),
                           n_tokens=int(n_tokens), offsets=tuple(offsets), target_name=target_name,
                           target_hash=target_hash(target))
        m = cls(cfg).to(out.weight.device)
        with torch.no_grad():
            for h in m.heads:
                h.weight.copy_(out.weight)
        return m

    def index(self, offset) -> int:
        """The head of `offset` (dr, dc); ConfigError when these heads have none."""
        offset = tuple(int(x) for x in offset)
        if offset not in self.config.offsets:
            raise ConfigError(f"these 2-D heads predict offsets {list(self.config.offsets)}, not {offset}; train "
                              f"them with that direction (--ssd-directions)")
        return self.config.offsets.index(offset)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., dim) final hidden -> (..., k, V) fp32; [..., j, :] predicts the token at offsets[j]."""
        return torch.stack([head(blk(hidden)).float() for blk, head in zip(self.blocks, self.heads)], dim=-2)

    def head_logits(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """(..., dim) -> (..., V) fp32 of head k only."""
        return self.heads[k](self.blocks[k](hidden)).float()


def save_heads2d(heads: Heads2D, path) -> None:
    """Write `path` (safetensors, atomically) + `path.json` (config with the target hash)."""
    from ..io import save_safetensors, write_json

    path = Path(path)
    meta = {"kind": ARTIFACT_KIND, "schema_version": SCHEMA_VERSION, "config": heads.config.to_dict()}
    save_safetensors({k: v.detach().cpu().contiguous() for k, v in heads.state_dict().items()}, path, metadata=meta)
    write_json(path.with_suffix(".json"), meta)


def load_heads2d(path, target: nn.Module, *, check_target: bool = True) -> Heads2D:
    """Load 2-D heads made for `target` (refused for another target or another artifact kind)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no 2-D head file {path}; make one with `lisa-trt train --arch ssd`")
    cfg, tensors = read_heads_artifact(path, target, kind=ARTIFACT_KIND, schema_version=SCHEMA_VERSION,
                                       label="2-D", arch="ssd", check_target=check_target)
    cfg = Head2DConfig.from_dict(cfg)
    m = Heads2D(cfg)
    try:
        m.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path} does not match its own 2-D head config: {e}") from e
    out = getattr(target, "output", None)  # a torch target; an engine target keeps its own device
    return m.to(out.weight.device if out is not None else getattr(target, "device", "cpu")).eval()


__all__ = ["DIRECTIONS", "Head2DConfig", "Heads2D", "load_heads2d", "parse_directions", "save_heads2d"]
