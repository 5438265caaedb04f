"""The Chameleon-family drafter: lisa-trt's generic EAGLE-3 `Drafter` (models/drafter.py) over a
ChameleonTarget, kept under its family names for the export, the engines and older callers.

Everything family-specific comes from the target's drafter protocol (`ChameleonTarget.drafter_shape`):
- RoPE is 1-D over the target's absolute positions (adjacent-pair rotation, the drafter's own
  convention), `max_positions` = the checkpoint's max_position_embeddings;
- there is no fixed condition prefix: the prompt length varies, so the decode loop marks the
  prompt slots invalid in the drafter cache at run time (`cls_token_num` is 0);
- logits are full-vocabulary wide (the decode loop's layout restricts them to the image codes); a
  drafter trained by train/trainer.py predicts the image codes only (its d2t is the layout's
  allowed ids) and maps them back to the full width.
Entries follow the LlamaGen drafter's protocol: the entry consuming token x_j sits at x_j's
target slot/position and reads project_taps(tap at x_{j-1}); its logits predict x_{j+1}.
Training: `lisa_trt.train.train_drafter` (`lisa-trt train --model DIR`, the generic entry).
"""

from __future__ import annotations

from typing import Optional

from ...models.drafter import Drafter, load_drafter, rope_1d_table, save_drafter  # noqa: F401 (rope_1d_table re-exported)


class ChameleonDrafter(Drafter):
    """The generic Drafter built for a ChameleonTarget (see module docstring)."""

    @classmethod
    def from_chameleon(cls, target, *, hidden: Optional[int] = None, n_head: Optional[int] = None,
                       ffn_hidden: Optional[int] = None, init_head_from_target: bool = True) -> "ChameleonDrafter":
        """A fresh drafter for a ChameleonTarget (embedding shared and frozen; head warm-started)."""
        return cls.from_target(target, hidden=hidden, n_head=n_head, ffn_hidden=ffn_hidden, target_name="chameleon",
                               init_head_from_target=init_head_from_target)


def save_chameleon_drafter(drafter: Drafter, path) -> None:
    """Write `path` (safetensors, embedding excluded) + `path.json`; both carry the config, the
    family and the target hash (atomic). The generic save_drafter with the family recorded."""
    drafter.family = drafter.family or "chameleon"
    save_drafter(drafter, path)


def load_chameleon_drafter(path, target) -> Drafter:
    """Load a drafter made for this ChameleonTarget; refuses other targets and families."""
    return load_drafter(path, target, family="chameleon")
