"""EAGLE-3 drafter for Chameleon-architecture targets, and a teacher-forced training step.

The drafter is lisa-trt's EAGLE-3 `Drafter` (models/drafter.py: fc on the target's three tap
layers, one decoder layer over concat(E[x], hidden), own head) with two family differences:
- RoPE is 1-D over the target's absolute positions (rotation of adjacent pairs, the drafter's
  own convention), not LlamaGen's 2-D grid table;
- there is no fixed condition prefix: the prompt length varies, so the decode loop marks the
  prompt slots invalid in the drafter cache at run time (`cls_token_num` is 0).
Entries follow the LlamaGen drafter's protocol: the entry consuming token x_j sits at x_j's
target slot/position and reads project_taps(tap at x_{j-1}); its logits predict x_{j+1}.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ...checkpoints import target_hash
from ...drafter import Drafter, DrafterConfig


def rope_1d_table(n_pos: int, head_dim: int, base: float) -> torch.Tensor:
    """(n_pos, head_dim // 2, 2) cos/sin for adjacent-pair RoPE over 1-D positions, fp32."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    ang = torch.outer(torch.arange(n_pos, dtype=torch.float), inv)
    return torch.stack([ang.cos(), ang.sin()], dim=-1)


class ChameleonDrafter(Drafter):
    """Drafter over a ChameleonTarget's taps (see module docstring)."""

    def __init__(self, cfg: DrafterConfig, embedding, max_positions: int):
        super().__init__(cfg, embedding)
        self.max_positions = int(max_positions)
        self.freqs_cis = rope_1d_table(self.max_positions, cfg.head_dim, cfg.rope_base).to(self.fc.weight.device)

    @classmethod
    def from_chameleon(cls, target, *, hidden: Optional[int] = None, n_head: Optional[int] = None,
                       ffn_hidden: Optional[int] = None, init_head_from_target: bool = True) -> "ChameleonDrafter":
        """A fresh drafter for a ChameleonTarget (embedding shared and frozen; head warm-started)."""
        tc = target.config
        hidden = hidden or tc.dim
        n_head = n_head or (tc.n_head if hidden == tc.dim else max(1, hidden // tc.head_dim))
        ffn = ffn_hidden or (tc.intermediate_size if hidden == tc.dim else 4 * hidden)
        cfg = DrafterConfig(target_dim=tc.dim, hidden=hidden, n_head=n_head, ffn_hidden=ffn,
                            vocab_size=tc.vocab_size, tap_dim=3 * tc.dim, block_size=1, cls_token_num=0,
                            rope_base=tc.rope_theta, norm_eps=tc.rms_norm_eps, target_name="chameleon",
                            target_hash=target_hash(target))
        d = cls(cfg, target.model.embed_tokens, tc.max_position_embeddings).to(target.lm_head.weight.device)
        if init_head_from_target and hidden == tc.dim:
            with torch.no_grad():
                d.lm_head.weight.copy_(target.lm_head.weight)
                d.norm.weight.copy_(target.model.norm.weight)
        return d


def drafter_loss(drafter: ChameleonDrafter, target, input_ids: torch.Tensor, start: int = 1) -> torch.Tensor:
    """Teacher-forced EAGLE step-0 loss: KL(target || drafter) of the next-token distributions.

    Entry j (j >= start) consumes (project_taps(tap at j - 1), x_j) at position j and is trained
    to predict what the target predicts at j (the distribution of x_{j+1}).

    Args:
        input_ids: (B, T) sequences (prompt + image span) to learn from.
        start: first entry (the drafter never sees the first prompt tokens' successors if > 1).
    """
    with torch.no_grad():
        out = target.forward_full(input_ids, taps=True)
    B, T = input_ids.shape
    pos = torch.arange(start, T, device=input_ids.device)[None].expand(B, -1)
    S = T - start
    mask = torch.tril(torch.ones(S, S, dtype=torch.bool, device=input_ids.device))[None]
    hidden = drafter.project_taps(out.taps[:, start - 1: T - 1])
    logits, _, _, _ = drafter.forward_kv(hidden, input_ids[:, start:], pos, None, None, mask)
    p = torch.softmax(out.logits[:, start:], -1)
    return -(p * torch.log_softmax(logits, -1)).sum(-1).mean() + (p * torch.log(p.clamp_min(1e-30))).sum(-1).mean()


def train_drafter(drafter: ChameleonDrafter, target, sequences: torch.Tensor, *, steps: int = 10, lr: float = 1e-3,
                  batch_size: int = 4, seed: int = 0, start: int = 1, checkpoint=None,
                  save_every: int = 50) -> list[float]:
    """AdamW steps of `drafter_loss` over random rows of `sequences` (N, T); returns the losses.

    checkpoint: optional path of a resumable training state (drafter, optimizer, step, sampler
        RNG), written atomically every `save_every` steps and at the end; when it exists, training
        resumes from it, so an interrupted run continues exactly where it stopped.
    """
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    step = 0
    if checkpoint is not None and Path(checkpoint).is_file():
        state = torch.load(str(checkpoint), map_location="cpu", weights_only=True)
        drafter.load_state_dict(state["drafter"])
        opt.load_state_dict(state["optimizer"])
        g.set_state(state["rng"])
        step = int(state["step"])
    losses = []
    drafter.train()
    while step < steps:
        idx = torch.randint(0, sequences.shape[0], (min(batch_size, sequences.shape[0]),), generator=g)
        loss = drafter_loss(drafter, target, sequences[idx].to(target.lm_head.weight.device), start)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        step += 1
        if checkpoint is not None and (step % save_every == 0 or step == steps):
            _save_state(checkpoint, drafter, opt, g, step)
    drafter.eval()
    return losses


def _save_state(path, drafter, opt, g, step: int) -> None:
    from ....io import atomic_write

    with atomic_write(path) as tmp:
        torch.save({"drafter": drafter.state_dict(), "optimizer": opt.state_dict(), "rng": g.get_state(),
                    "step": step}, str(tmp))


def save_chameleon_drafter(drafter: ChameleonDrafter, path) -> None:
    """Write `path` (safetensors, embedding excluded) + `path.json`; both carry the config,
    the family and the target hash (atomic)."""
    from ....io import save_safetensors, write_json
    from ...drafter import ARTIFACT_KIND, SCHEMA_VERSION

    path = Path(path)
    meta = {"kind": ARTIFACT_KIND, "schema_version": SCHEMA_VERSION, "family": "chameleon",
            "max_positions": drafter.max_positions, "config": drafter.config.to_dict()}
    save_safetensors(dict(drafter.state_dict()), path, metadata=meta)
    write_json(path.with_suffix(".json"), meta)


def load_chameleon_drafter(path, target) -> ChameleonDrafter:
    """Load a drafter made for this ChameleonTarget; refuses other targets and families."""
    from ....errors import ArtifactMismatchError, CheckpointError
    from ....io import load_safetensors
    from ...drafter import ARTIFACT_KIND, SCHEMA_VERSION

    path = Path(path)
    tensors, meta = load_safetensors(path)
    if meta.get("kind") != ARTIFACT_KIND or meta.get("family") != "chameleon":
        raise CheckpointError(f"{path} is not a Chameleon-family lisa-trt drafter "
                              "(make one with lisa_trt.models.chameleon_drafter.train_drafter)")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise ArtifactMismatchError(f"{path} has drafter schema version {meta.get('schema_version')}; "
                                    f"this lisa-trt reads version {SCHEMA_VERSION}")
    cfg = DrafterConfig.from_dict(meta["config"])
    if cfg.target_hash != target_hash(target):
        raise ArtifactMismatchError(f"drafter {path} was trained for target hash {cfg.target_hash}, but the "
                                    f"loaded target has hash {target_hash(target)}: train one for this target")
    d = ChameleonDrafter(cfg, target.model.embed_tokens, meta["max_positions"])
    try:
        d.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path} does not match its own drafter config: {e}") from e
    return d.to(target.lm_head.weight.device).eval()
