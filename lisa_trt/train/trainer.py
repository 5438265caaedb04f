"""Drafter distillation trainer: EAGLE-3 training-time test (TTT) unroll + LISA / baseline losses.

TTT unroll (docs/spec/speculative.md), with N image tokens z and target taps g (taps[:, j] belongs to
the position whose logits predict z_j):
  step 0, entry j (j = 0..N-2): hidden fc(g_j), token z_j, position C + j -> predicts z_{j+1}
  step s, entry j: hidden = the drafter's own step s-1 output at j, token z_{j+s}, position
          C + j + s -> predicts z_{j+s+1} (valid while j + s + 1 <= N - 1)
  attention at step s: causal over step-0 keys plus the same entry's keys from steps 1..s,
          as one mask over the concatenated keys of steps 0..s.
This is exactly what a depth-s tree node sees at inference (the committed prefix + its
ancestors + itself), so train and test attention patterns coincide.

Training: AdamW, linear warmup + cosine decay, fp32 or bf16 autocast, gradient clipping,
atomic checkpoints every N steps (model, optimiser, scheduler, RNG states, step, data order)
resumed exactly, JSONL metrics, final MAL-proxy eval on held-out sequences. Multi-GPU: run the
same entry point under torchrun (WORLD_SIZE set -> torch.distributed + DDP); single process
otherwise. Rank 0 writes every file.

Every model family trains through this one loop; what differs is asked of the target and of
the family's layout, never named (models/drafter.py lists the drafter protocol):
- teacher forcing: `target.forward_train(cond, tokens, taps=True)` (logits [:, j] predict
  tokens[:, j], taps aligned) and `target.start_positions(cond)`, the position of tokens[:, 0]
  (LlamaGen: cls_token_num; prompt-id families: each row's real prompt length, left padding);
- data: class ids / captions (LlamaGen) or a `request` (models.family.Request: prompts + the
  family's SequenceLayout, rolled out through the generic AR loop, train/requests.py);
- the trained vocabulary (`TrainVocab`, from the layout): where the layout restricts sampling to
  `allowed` ids (Chameleon: the image codes inside the whole-vocabulary head), the drafter head
  predicts those ids only (d2t) and the losses compare the target renormalised over them (the
  law the decode loop samples from); forced indices (Lumina's row ends) carry no loss and count
  as accepted in the MAL proxy (the decode loop commits them with probability 1);
- the LISA codebook: one row per head id, or the VQ rows of the layout's SubVocab codes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ArtifactMismatchError, CheckpointError, ConfigError
from ..io import atomic_write, write_json
from ..models.draft_vocab import build_d2t, in_vocab_mass, restrict
from ..models.drafter import Drafter, save_drafter
from .data import Batch, DataConfig, FeatureCache, OnlineFeatures, batch_indices, build_dataset, epoch_permutation
from .losses import (LossConfig, agreement_stats, combine_ttt, estimate_radius, kl_to_target, locality_score, mal_proxy,
                     step_loss)


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on (defaults: docs/spec/lisa.md paper recipe where given)."""

    steps: int = 1000
    batch_size: int = 8  # global batch (sequences), split evenly over DDP ranks
    lr: float = 3e-4
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.95)
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    grad_clip: float = 0.5
    bf16: bool = False
    ttt_steps: int = 7
    seed: int = 0
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10
    eval_depth: int = 0  # chain depth of the MAL proxy (0: ttt_steps)
    eval_every: int = 0  # > 0: held-out eval (MAL proxy, top-1/top-3, + eval_fn) every N steps -> metrics.jsonl
    drafter_hidden: Optional[int] = None  # None: the target's dim
    drafter_heads: Optional[int] = None
    drafter_ffn: Optional[int] = None
    init_head_from_target: bool = True
    draft_vocab: int = 0  # 0: full head; N: the N most frequent training codes (models/draft_vocab.py)
    target_name: str = ""
    # the EAGLE-3 loss: it ties or beats every LISA form on the demo in every regime measured
    # (docs/drafters.md "LISA in the flat regime"); LossConfig() is the paper's LISA form
    loss: LossConfig = field(default_factory=lambda: LossConfig(kind="eagle3"))
    data: DataConfig = field(default_factory=DataConfig)

    def __post_init__(self):
        object.__setattr__(self, "betas", tuple(self.betas))
        if self.steps < 1 or self.batch_size < 1 or self.ttt_steps < 1:
            raise ConfigError("steps, batch_size and ttt_steps must be >= 1")
        if self.checkpoint_every < 1 or self.log_every < 1:
            raise ConfigError("checkpoint_every and log_every must be >= 1")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        d = dict(d)
        if "loss" in d:
            d["loss"] = LossConfig(**d["loss"])
        d["data"] = DataConfig(**d.get("data", {}))
        return cls(**d)


# ----------------------------------------------------------------------------- TTT unroll

def unroll_mask(n: int, s: int, device=None) -> torch.Tensor:
    """(1, n, (s + 1) n) bool: causal over step-0 keys, then the same entry's key of steps 1..s."""
    blocks = [torch.ones(n, n, dtype=torch.bool, device=device).tril()]
    blocks += [torch.eye(n, dtype=torch.bool, device=device)] * s
    return torch.cat(blocks, dim=1)[None]


def ttt_unroll(drafter: Drafter, taps: torch.Tensor, tokens: torch.Tensor, n_steps: int,
               start: Optional[torch.Tensor] = None) -> list:
    """Run the EAGLE-3 training-time-test unroll.

    Args:
        drafter: the Drafter.
        taps: (B, N, 3H) target taps aligned with tokens (forward_train convention).
        tokens: (B, N) image tokens.
        n_steps: unroll steps S.
        start: (B,) position of tokens[:, 0] per row (target.start_positions); None: the
            drafter's cls_token_num (LlamaGen's fixed prefix).
    Returns:
        list over s of (logits (B, N-1, V), hidden (B, N-1, H)); entry j of step s predicts
        tokens[:, j + s + 1] and is meaningful for j < N - 1 - s.
    """
    B, N = tokens.shape
    n0 = N - 1
    C = drafter.config.cls_token_num
    j = torch.arange(n0, device=tokens.device)
    hidden = drafter.project_taps(taps[:, :n0])
    k = v = None
    outs = []
    for s in range(min(n_steps, n0)):
        idx = (j + s).clamp(max=N - 1)  # token consumed by entry j at step s
        if start is None:
            pos = (C + idx)[None].expand(B, n0)
        else:
            pos = start.to(tokens.device)[:, None] + idx[None]  # (B, n0): per-row prompt lengths
        logits, hidden, k, v = drafter.forward_kv(hidden, tokens[:, idx], pos, k, v,
                                                  unroll_mask(n0, s, tokens.device))
        outs.append((logits, hidden))
    return outs


class _Unroll(nn.Module):
    """nn.Module wrapper so that DDP sees the whole unroll as one forward."""

    def __init__(self, drafter: Drafter, n_steps: int):
        super().__init__()
        self.drafter, self.n_steps = drafter, n_steps

    def forward(self, taps, tokens, start=None):
        return ttt_unroll(self.drafter, taps, tokens, self.n_steps, start)


@dataclass(frozen=True)
class TrainVocab:
    """What the family's layout says about the trained tokens (module docstring).

    ids: (K,) sorted token ids that may be generated (SequenceLayout.allowed), None: every id.
    trained: (N,) bool, False at forced token indices (no loss there), None: every index.
    """

    ids: Optional[torch.Tensor] = None
    trained: Optional[torch.Tensor] = None

    @classmethod
    def of(cls, layout) -> "TrainVocab":
        if layout is None:
            return cls()
        trained = None if layout.forced is None else (layout.forced < 0)
        return cls(layout.allowed, trained)

    def keep(self, s: int, device) -> Optional[torch.Tensor]:
        """(N - 1 - s,) bool over the entries of unroll step s (entry j predicts index j + s + 1)."""
        return None if self.trained is None else self.trained[s + 1:].to(device)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) with -inf outside the allowed ids (unchanged without a restriction)."""
        if self.ids is None:
            return logits
        keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        keep[self.ids.to(logits.device)] = True
        return logits.masked_fill(~keep, float("-inf"))

    def gather(self, *logits: torch.Tensor) -> tuple:
        """Logits (..., V) restricted to the allowed ids (unchanged without a restriction)."""
        if self.ids is None:
            return logits
        return tuple(x.index_select(-1, self.ids.to(x.device)) for x in logits)


def ttt_loss(outs: list, batch: Batch, cfg: LossConfig, *, codebook=None, radius=None, step: int = 0,
             total_steps: int = 1, d2t=None, vocab: TrainVocab = TrainVocab()) -> tuple[torch.Tensor, dict]:
    """sum_s decay^s * loss_s over the valid entries of each unroll step, plus per-step stats.

    With a reduced draft vocabulary (`d2t`) the losses run on the draft vocabulary (target
    renormalised over it, codebook rows d2t); top-1 agreement stays over the full vocabulary
    (over `vocab.ids` when the layout restricts it). Entries predicting a forced index
    (`vocab.trained` False) are dropped.
    """
    V = batch.logits.shape[-1]
    if d2t is not None:
        codebook = None if codebook is None else codebook.index_select(0, d2t.to(codebook.device))
    losses, stats = [], {"loss_s": [], "top1_s": [], "in_nbhd_s": []}
    extra = {}
    for s, (logits, hidden) in enumerate(outs):
        n = logits.shape[1] - s
        s_l, t_l, keep = logits[:, :n], batch.logits[:, s + 1:], vocab.keep(s, logits.device)
        h_s, h_t = hidden[:, :n], (batch.hidden[:, s + 1:] if cfg.kind == "eagle1" else None)
        if keep is not None:
            s_l, t_l, h_s = s_l[:, keep], t_l[:, keep], h_s[:, keep]
            h_t = None if h_t is None else h_t[:, keep]
        if s_l.shape[1] == 0:
            continue
        s_l, t_l = s_l.reshape(-1, V), t_l.reshape(-1, V)
        t_full, s_full = vocab.gather(t_l, s_l)  # agreement over what the layout lets the loop sample
        if d2t is not None:
            if s == 0:
                stats["in_vocab_mass_0"] = float(in_vocab_mass(vocab.mask(t_l), d2t).mean())
            t_l, s_l, _ = restrict(t_l, s_l, d2t)
        kw = {}
        if cfg.kind == "eagle1":
            kw = dict(pred_hidden=h_s.reshape(-1, h_s.shape[-1]), target_hidden=h_t.reshape(-1, h_t.shape[-1]))
        loss, st = step_loss(t_l, s_l, cfg, codebook=codebook, radius=radius, step=step,
                             total_steps=total_steps, **kw)
        losses.append(loss)
        stats["loss_s"].append(float(loss.detach()))
        stats["top1_s"].append(float(agreement_stats(t_full, s_full.detach())["top1"].mean()))
        if "in_nbhd" in st:
            stats["in_nbhd_s"].append(float(st["in_nbhd"]))
        elif codebook is not None and radius is not None:
            loc = locality_score(t_l.float().softmax(-1), s_l.detach(), codebook, radius, cfg.top_kc)
            stats["in_nbhd_s"].append(float(loc["in_nbhd"].mean()))
        if s == 0:
            extra = {k: float(v) for k, v in st.items() if k not in ("in_nbhd",)}
            stats["kl_0"] = float(kl_to_target(t_l, s_l.detach()).mean())  # 0 when the drafter matches
    if not losses:
        raise ConfigError("no trained position in this batch: every predicted token is forced by the layout")
    total = combine_ttt(losses, cfg.ttt_decay)
    stats.update({f"{k}_0": v for k, v in extra.items()})
    return total, stats


# ----------------------------------------------------------------------------- schedule

def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to 1 over warmup_steps, then cosine decay to min_lr_ratio at `steps`."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))


# ----------------------------------------------------------------------------- distributed

@dataclass
class _Dist:
    rank: int = 0
    world: int = 1
    enabled: bool = False
    owned: bool = False  # we initialised the process group (and destroy it at the end)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self):
        if self.enabled:
            torch.distributed.barrier()


def _init_distributed() -> _Dist:
    """torch.distributed when launched by torchrun (WORLD_SIZE set), else single process."""
    if "WORLD_SIZE" not in os.environ:
        return _Dist()
    import torch.distributed as dist

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return _Dist(dist.get_rank(), dist.get_world_size(), True, owned)


# ----------------------------------------------------------------------------- checkpoints

def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
            "python_version": random.getstate()[0],
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate((st["python_version"], tuple(st["python"]), None))
    if torch.cuda.is_available() and len(st["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(st["cuda"])


def _ckpt_dir(out_dir: Path) -> Path:
    return out_dir / "checkpoints"


def save_checkpoint(out_dir: Path, step: int, drafter, opt, sched, cfg: TrainConfig, radius, n_train: int,
                    keep: int = 2) -> Path:
    """Atomically write checkpoints/step_XXXXXXXX.pt, then point checkpoints/latest.json at it."""
    per_epoch = max(n_train // cfg.batch_size, 1)
    epoch = step // per_epoch
    state = {"step": step, "model": drafter.state_dict(), "optimizer": opt.state_dict(),
             "scheduler": sched.state_dict(), "rng": _rng_state(), "radius": radius,
             "data": {"seed": cfg.seed, "epoch": epoch, "batch_in_epoch": step % per_epoch,
                      "order": epoch_permutation(n_train, epoch, cfg.seed)},
             "train_config": json.dumps(cfg.to_dict(), sort_keys=True),
             "drafter_config": drafter.config.to_dict()}
    d = _ckpt_dir(out_dir)
    path = d / f"step_{step:08d}.pt"
    with atomic_write(path) as tmp:
        torch.save(state, tmp)
    write_json(d / "latest.json", {"step": step, "file": path.name})
    for old in sorted(d.glob("step_*.pt"))[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return path


def load_latest_checkpoint(out_dir: Path) -> Optional[dict]:
    """The latest checkpoint's state dict, or None when out_dir has none."""
    latest = _ckpt_dir(out_dir) / "latest.json"
    if not latest.is_file():
        return None
    name = json.loads(latest.read_text())["file"]
    path = _ckpt_dir(out_dir) / name
    from ..safe_load import safe_torch_load

    try:
        return safe_torch_load(path, "training checkpoint")
    except CheckpointError as e:
        raise CheckpointError(f"{e}; delete {latest} to start the run over") from None


# ----------------------------------------------------------------------------- eval

@torch.no_grad()
def evaluate_mal_proxy(drafter: Drafter, features, n_rows: int, depth: int, batch_size: int = 8,
                       vocab: TrainVocab = TrainVocab()) -> dict:
    """Chain acceptance proxies on held-out sequences (teacher-forced TTT unroll of `depth`).

    accept_s = sum_v min(p_t, p_s) is the lossless acceptance probability of a sampled draft at
    step s; since accepted tokens are distributed as the target (as are self-distilled data),
    mal_proxy = 1 + sum_d prod_{s<d} accept_s estimates the chain MAL under exact sampling
    (per CFG half, temperature 1). mal_top1 uses top-1 agreement instead (greedy chain).
    With a layout (`vocab`): both laws over the allowed ids; forced indices are accepted (1).
    """
    if n_rows == 0:
        return {}
    was_training = drafter.training
    drafter.eval()
    acc, top1, per_acc, per_top = [], [], [[] for _ in range(depth)], [[] for _ in range(depth)]
    per_top3 = [[] for _ in range(depth)]
    for lo in range(0, n_rows, batch_size):
        b = features.batch(torch.arange(lo, min(lo + batch_size, n_rows)))
        outs = ttt_unroll(drafter, b.taps, b.tokens, depth, b.start)
        N = b.tokens.shape[1]
        n_chain = N - 1 - len(outs) + 1  # entries whose every step is valid
        a_s, t_s = [], []
        for s, (logits, _) in enumerate(outs):
            st = agreement_stats(*vocab.gather(b.logits[:, s + 1:], logits[:, : N - 1 - s]))
            keep = vocab.keep(s, logits.device)
            if keep is not None:  # forced tokens are committed with probability 1
                st = {k: torch.where(keep, v, torch.ones_like(v)) for k, v in st.items()}
            per_acc[s].append(st["accept"].flatten())
            per_top[s].append(st["top1"].flatten())
            per_top3[s].append(st["top3"].flatten())
            a_s.append(st["accept"][:, :n_chain].flatten())
            t_s.append(st["top1"][:, :n_chain].flatten())
        acc.append(mal_proxy(torch.stack(a_s)))
        top1.append(mal_proxy(torch.stack(t_s)))
    drafter.train(was_training)
    steps = [s for s in range(depth) if per_acc[s]]
    return {"mal_proxy": float(torch.cat(acc).mean()), "mal_top1": float(torch.cat(top1).mean()),
            "accept_s": [float(torch.cat(per_acc[s]).mean()) for s in steps],
            "top1_s": [float(torch.cat(per_top[s]).mean()) for s in steps],
            "top3_s": [float(torch.cat(per_top3[s]).mean()) for s in steps],
            "depth": len(steps), "sequences": n_rows}


# ----------------------------------------------------------------------------- main entry

def _after_step(step: int) -> None:
    """Hook called after each completed optimiser step (tests use it to simulate a kill)."""


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines logged after the checkpoint we resume from."""
    if not path.is_file():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= step]
    with atomic_write(path) as tmp:
        tmp.write_text("".join(ln + "\n" for ln in keep))


def _d2t_within(tokens: torch.Tensor, ids: torch.Tensor, n: int) -> torch.Tensor:
    """The n most frequent of `ids` in `tokens` (ties: lower id first), ascending."""
    if not 1 <= n <= ids.numel():
        raise ConfigError(f"--draft-vocab must lie in 1..{ids.numel()} (the ids this layout may generate), got {n}")
    ids = ids.cpu()
    counts = torch.bincount(tokens.reshape(-1).cpu(), minlength=int(ids.max()) + 1)[ids].double()
    score = counts - torch.arange(ids.numel(), dtype=torch.double) / (2.0 * ids.numel())
    return ids[score.topk(n).indices].sort().values


def _make_drafter(target, cfg: TrainConfig, train_tokens: Optional[torch.Tensor] = None,
                  vocab: TrainVocab = TrainVocab()) -> Drafter:
    d2t = None
    if vocab.ids is not None:  # the head predicts what the layout lets the loop draft
        d2t = vocab.ids.cpu()
        if cfg.draft_vocab:
            toks = train_tokens if vocab.trained is None else train_tokens[:, vocab.trained.cpu()]
            d2t = _d2t_within(toks, d2t, cfg.draft_vocab)
    elif cfg.draft_vocab:
        if train_tokens is None:
            raise ConfigError("a reduced draft vocabulary is counted on the training tokens; none were given")
        d2t = build_d2t(train_tokens, target.output.out_features, cfg.draft_vocab)
    return Drafter.from_target(target, hidden=cfg.drafter_hidden, n_head=cfg.drafter_heads,
                               ffn_hidden=cfg.drafter_ffn, target_name=cfg.target_name,
                               init_head_from_target=cfg.init_head_from_target, d2t=d2t)


def estimate_vocab_radius(features, n: int, cfg: TrainConfig, codebook, vocab: TrainVocab = TrainVocab(),
                     d2t=None) -> float:
    """Radius for median |N| = nbhd_size on the first (unshuffled) training sequences (over the
    layout's trained indices and the drafter's vocabulary when the layout restricts it)."""
    probs = []
    for lo in range(0, min(n, 32), cfg.batch_size):
        b = features.batch(torch.arange(lo, min(lo + cfg.batch_size, n, 32)))
        lg, keep = b.logits[:, 1:], vocab.keep(0, b.logits.device)
        if keep is not None:
            lg = lg[:, keep]
        if vocab.ids is not None and d2t is not None:
            lg = lg.index_select(-1, d2t.to(lg.device))
        probs.append(lg.reshape(-1, lg.shape[-1]).softmax(-1))
    if vocab.ids is not None and d2t is not None:
        codebook = codebook.index_select(0, d2t.to(codebook.device))
    return estimate_radius(torch.cat(probs), codebook, cfg.loss.top_kc, cfg.loss.nbhd_size)


def vocab_codebook(codebook: torch.Tensor, head_size: int, layout) -> torch.Tensor:
    """One L2-normalised row per head id: the codebook as given (head_size rows), or the VQ rows
    of a layout's SubVocab codes scattered to their token ids (zero rows elsewhere; the losses
    only read the drafter's vocabulary, which lies inside the codes)."""
    codebook = F.normalize(codebook.detach().float(), dim=-1)
    if codebook.shape[0] == head_size:
        return codebook
    sv = getattr(layout, "sub_vocab", None)
    if sv is not None and codebook.shape[0] > int(sv.codes.max()):
        full = codebook.new_zeros(head_size, codebook.shape[1])
        full[sv.code_ids.to(codebook.device)] = codebook[sv.codes.to(codebook.device)]
        return full
    raise ConfigError(f"codebook has {codebook.shape[0]} rows; the target head has {head_size} ids"
                      + ("" if sv is None else f" and the layout's sub-vocabulary {sv.K} codes"))


# settings that change what is logged and saved, not what is learnt: an extension may change them
_BOOKKEEPING = ("eval_every", "checkpoint_every", "log_every", "keep_checkpoints")


def _check_resume(saved: dict, cfg: TrainConfig, at_step: int, out_dir: Path, extend: bool) -> Optional[str]:
    """Refuse to resume a run under different settings; with `extend`, a larger `steps` is allowed
    (and other logging / checkpoint cadences).

    Returns a note for the log when the run is extended (the cosine schedule is stretched to the new
    total: the learning rate rises back to its value at that point of the longer schedule)."""
    now = json.loads(json.dumps(cfg.to_dict(), sort_keys=True))
    if saved == now:
        return None
    differ = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
    if "steps" in differ and set(differ) <= {"steps", *_BOOKKEEPING}:
        if extend and cfg.steps > at_step:
            lr0, lr1 = cfg.lr * lr_factor(at_step, TrainConfig.from_dict(saved)), cfg.lr * lr_factor(at_step, cfg)
            return (f"extending {out_dir} from {saved['steps']} to {cfg.steps} steps at its step-{at_step} checkpoint: "
                    f"the cosine schedule now ends at step {cfg.steps} (learning rate {lr0:.2e} -> {lr1:.2e}, "
                    "a warm restart)")
        if extend:
            raise ConfigError(f"--extend needs more steps than the checkpoint's {at_step} in {out_dir} "
                              f"(got --steps {cfg.steps})")
        raise ConfigError(f"{out_dir} holds a run of {saved['steps']} steps (checkpoint at step {at_step}); "
                          f"--steps {cfg.steps} differs: pass --extend to continue it to {cfg.steps} steps, "
                          "or use a new out_dir")
    raise ConfigError(f"{out_dir} holds a run with a different TrainConfig ({', '.join(differ)} differ); use a new "
                      "out_dir or the same settings to resume")


def train_drafter(target, codebook: Optional[torch.Tensor], train_cfg: TrainConfig, out_dir,
                  progress: bool = True, eval_fn=None, extend: bool = False, request=None) -> dict:
    """Distil an EAGLE-3 drafter from `target` (resumes from out_dir/checkpoints if present).

    Args:
        target: a target of any family (LlamaGen Transformer, ChameleonTarget, JanusTarget; frozen;
            under DDP place it on cuda:LOCAL_RANK first).
        codebook: VQ codebook (L2-normalised here): (V, d) one row per head id, or, for a layout
            with a sub-vocabulary (Chameleon), the VQ's own (n_codes, d) rows; required by the
            LISA selection, optional otherwise (then no in-neighbourhood metric).
        request: prompt-id families: the prompts and layout to self-distil from (a
            models.family.Request: the family prompter's `encode(texts, cfg=True)`, or
            train.requests.prompt_request(target, ids)); None for class ids / captions (cfg.data).
        eval_fn: optional (drafter, step) -> dict, called with train_cfg.eval_every (e.g. real
            decoding MAL on held-out prompts); its result is logged with the held-out proxies.
        extend: resume a run whose checkpoint was made with fewer `steps` (everything else equal);
            the cosine schedule is stretched to the new total (a warm restart).
        train_cfg: TrainConfig.
        out_dir: run directory: drafter.safetensors (+ .json), metrics.jsonl, eval.json,
            train_config.json, checkpoints/, data/, features/.
    Returns:
        {"drafter": path, "eval": dict, "radius": float | None, "steps": int, "metrics": path}.
    """
    cfg, out_dir = train_cfg, Path(out_dir)
    dist = _init_distributed()
    _check_inputs(cfg, dist, codebook)
    target.eval()
    layout = None if request is None else request.layout
    vocab = TrainVocab.of(layout)
    if codebook is not None:
        codebook = vocab_codebook(codebook.to(target.output.weight.device), target.output.out_features, layout)
    state, note = _saved_run(out_dir, cfg, extend)  # checked before any data is generated
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    run = _build_run(target, codebook, vocab, cfg, out_dir, dist, progress and dist.main, request,
                     resuming=state is not None)
    start = _resume(run, state, note) if state is not None else _fresh_start(run)
    _open_run_dir(run, start)
    steps = _step_bar(run, start)
    run.t0 = time.time()
    for step in steps:
        update = _train_step(run, step)
        _after_update(run, steps, step + 1, update, eval_fn)
    result = _finish(run, trained=start < cfg.steps)
    dist.barrier()
    if dist.owned:
        torch.distributed.destroy_process_group()
    return result


def _check_inputs(cfg: TrainConfig, dist: _Dist, codebook) -> None:
    if cfg.batch_size % dist.world:
        raise ConfigError(f"batch_size {cfg.batch_size} is not divisible by the {dist.world} DDP ranks")
    if cfg.loss.needs_codebook and codebook is None:
        raise ConfigError("the LISA loss needs the VQ codebook (pass the VQ model's codebook); or use "
                          "loss kind 'eagle3'")


def _saved_run(out_dir: Path, cfg: TrainConfig, extend: bool) -> tuple[Optional[dict], Optional[str]]:
    """The latest checkpoint's state (None: a new run) and _check_resume's note, settings checked."""
    state = load_latest_checkpoint(out_dir)
    if state is not None:
        return state, _check_resume(json.loads(state["train_config"]), cfg, state["step"], out_dir, extend)
    if extend:
        raise ConfigError(f"--extend: {out_dir} holds no checkpoint to continue; check the path, or drop "
                          "--extend to start a new run")
    return None, None


@dataclass
class _Run:
    """What the steps of one training run share (train_drafter builds it once)."""

    cfg: TrainConfig
    out_dir: Path
    dist: _Dist
    show: bool  # progress bars (rank 0 only)
    target: nn.Module
    codebook: Optional[torch.Tensor]
    vocab: TrainVocab
    train_set: object
    eval_set: object
    features: object  # FeatureCache or OnlineFeatures over train_set
    drafter: Drafter
    model: nn.Module  # the unroll (DDP-wrapped under torchrun)
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    radius: Optional[float] = None
    t0: float = 0.0

    @property
    def device(self) -> torch.device:
        return self.target.output.weight.device

    @property
    def per_rank(self) -> int:
        return self.cfg.batch_size // self.dist.world

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / "metrics.jsonl"


def _build_run(target, codebook, vocab: TrainVocab, cfg: TrainConfig, out_dir: Path, dist: _Dist, show: bool,
               request, resuming: bool) -> _Run:
    """Data, features, drafter, unroll and optimiser of a run (before any checkpoint is loaded)."""
    train_set, eval_set = build_dataset(target, cfg.data, cfg.seed, out_dir / "data", is_main=dist.main,
                                        barrier=dist.barrier, progress=show, request=request, resuming=resuming)
    features = _train_features(target, train_set, cfg, out_dir, dist, show)
    drafter = _make_drafter(target, cfg, train_set.tokens, vocab).train()
    width = target.output.in_features  # the final hidden the target's head reads (Batch.hidden)
    if cfg.loss.kind == "eagle1" and drafter.config.hidden != width:
        raise ConfigError("the eagle1 loss regresses the target's hidden state: drafter_hidden must equal "
                          f"its width {width}")
    model = _unroll_model(drafter, cfg, dist, target.output.weight.device)
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    # A plain function: LambdaLR stores nothing for it (the schedule is a function of cfg).
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(k, cfg))
    return _Run(cfg, out_dir, dist, show, target, codebook, vocab, train_set, eval_set, features, drafter,
                model, opt, sched, radius=cfg.loss.radius)


def _train_features(target, train_set, cfg: TrainConfig, out_dir: Path, dist: _Dist, show: bool):
    """The teacher features of train_set: cached on disk (rank 0 builds them) or computed per batch."""
    if cfg.data.features != "cache":
        return OnlineFeatures(target, train_set)
    root = Path(cfg.data.cache_dir) if cfg.data.cache_dir else out_dir / "features"
    features = FeatureCache(target, train_set, root, shard_size=cfg.data.shard_size, dtype=cfg.data.cache_dtype)
    if dist.main and not features.complete():
        features.build(batch_size=cfg.batch_size, progress=show)
    dist.barrier()
    return features


def _unroll_model(drafter: Drafter, cfg: TrainConfig, dist: _Dist, device: torch.device) -> nn.Module:
    model = _Unroll(drafter, cfg.ttt_steps)
    if not dist.enabled:
        return model
    ids = None
    if device.type == "cuda":
        ids = [device.index if device.index is not None else torch.cuda.current_device()]
    return nn.parallel.DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)


def _resume(run: _Run, state: dict, note: Optional[str]) -> int:
    """Load the checkpoint's weights, optimiser, schedule, radius and RNG states; returns its step."""
    drafter, out_dir = run.drafter, run.out_dir
    if state["drafter_config"] != drafter.config.to_dict():
        raise ArtifactMismatchError(
            f"{out_dir} holds a run for target hash {state['drafter_config'].get('target_hash')}, not for this "
            f"target ({drafter.config.target_hash}); use a new out_dir")
    drafter.load_state_dict(state["model"])
    run.opt.load_state_dict(state["optimizer"])
    run.sched.load_state_dict(state["scheduler"])
    run.radius = state["radius"]
    _set_rng_state(state["rng"])
    if run.dist.main:
        print(note or f"resuming {out_dir} from step {state['step']} of {run.cfg.steps} (its latest checkpoint)",
              file=sys.stderr)
    return state["step"]


def _fresh_start(run: _Run) -> int:
    """Step 0 of a new run: the LISA radius estimated on the training data unless configured."""
    if run.radius is None and run.codebook is not None:
        run.radius = estimate_vocab_radius(run.features, len(run.train_set), run.cfg, run.codebook, run.vocab,
                                           run.drafter.d2t)
    return 0


def _open_run_dir(run: _Run, start: int) -> None:
    """Rank 0: train_config.json written, metrics after the resumed step dropped."""
    if run.dist.main:
        run.out_dir.mkdir(parents=True, exist_ok=True)
        write_json(run.out_dir / "train_config.json", run.cfg.to_dict())
        _truncate_metrics(run.metrics_path, start)


def _step_bar(run: _Run, start: int):
    """The steps still to run, as a tqdm bar over the whole run when progress is shown."""
    from ..progress import iterate

    return iterate(range(start, run.cfg.steps), run.show, initial=start, total=run.cfg.steps, desc="train drafter",
                   unit="step")


def _train_step(run: _Run, step: int) -> tuple:
    """One optimiser step on this rank's rows of `step`; returns (loss, stats, grad norm)."""
    cfg = run.cfg
    rows = batch_indices(step, len(run.train_set), cfg.batch_size, cfg.seed, run.dist.rank, run.dist.world)
    with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
        batch = run.features.batch(rows)
        outs = run.model(batch.taps, batch.tokens, batch.start)
        loss, stats = ttt_loss(outs, batch, cfg.loss, codebook=run.codebook, radius=run.radius, step=step,
                               total_steps=cfg.steps, d2t=run.drafter.d2t, vocab=run.vocab)
    run.opt.zero_grad(set_to_none=True)
    loss.backward()
    clip = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    gnorm = torch.nn.utils.clip_grad_norm_(run.drafter.parameters(), clip)
    run.opt.step()
    run.sched.step()
    return loss, stats, gnorm


def _after_update(run: _Run, bar, done: int, update: tuple, eval_fn) -> None:
    """Rank 0 logs, checkpoints and evaluates at their cadences (and at the last step); all ranks meet."""
    cfg = run.cfg

    def due(every: int) -> bool:
        return run.dist.main and (done % every == 0 or done == cfg.steps)

    if due(cfg.log_every):
        _log_step(run, bar, done, *update)
    if due(cfg.checkpoint_every):
        save_checkpoint(run.out_dir, done, run.drafter, run.opt, run.sched, cfg, run.radius, len(run.train_set),
                        cfg.keep_checkpoints)
    if cfg.eval_every and due(cfg.eval_every):
        _periodic_eval(run, done, eval_fn)
    run.dist.barrier()
    _after_step(done)


def _log_step(run: _Run, bar, done: int, loss: torch.Tensor, stats: dict, gnorm: torch.Tensor) -> None:
    """One training record in metrics.jsonl (and the loss / top-1 on the bar)."""
    rec = {"step": done, "loss": float(loss.detach()), "lr": run.sched.get_last_lr()[0],
           "grad_norm": float(gnorm), "seconds": round(time.time() - run.t0, 3), "rows": run.per_rank, **stats}
    with open(run.metrics_path, "a") as f:
        f.write(json.dumps(rec) + "\n")
    if run.show:
        bar.set_postfix(loss=f"{rec['loss']:.4f}", top1=f"{stats['top1_s'][0]:.3f}")


def _held_out(run: _Run) -> dict:
    """evaluate_mal_proxy of the drafter on the held-out sequences (features computed online)."""
    cfg = run.cfg
    return evaluate_mal_proxy(run.drafter, OnlineFeatures(run.target, run.eval_set), len(run.eval_set),
                              cfg.eval_depth or cfg.ttt_steps, batch_size=run.per_rank, vocab=run.vocab)


def _periodic_eval(run: _Run, step: int, eval_fn=None) -> None:
    """One "eval" record in metrics.jsonl: held-out MAL proxy, top-1/top-3 per step, eval_fn's."""
    ev = _held_out(run)
    if eval_fn is not None:
        was = run.drafter.training
        ev.update(eval_fn(run.drafter.eval(), step))
        run.drafter.train(was)
    with open(run.metrics_path, "a") as f:
        f.write(json.dumps({"step": step, "eval": ev}) + "\n")


def _finish(run: _Run, trained: bool = True) -> dict:
    """train_drafter's result; rank 0 writes eval.json and drafter.safetensors. A run that was
    already finished (`trained` False: no step ran) keeps its recorded eval.json and drafter."""
    out_dir = run.out_dir
    result = {"radius": run.radius, "steps": run.cfg.steps, "metrics": str(run.metrics_path),
              "drafter": str(out_dir / "drafter.safetensors")}
    recorded = out_dir / "eval.json"
    if not trained and recorded.is_file() and (out_dir / "drafter.safetensors").is_file():
        result["eval"] = json.loads(recorded.read_text())
        if run.dist.main:
            print(f"{out_dir} is finished ({run.cfg.steps} steps): its recorded evaluation (eval.json) is not "
                  "repeated (--extend with more --steps trains further)", file=sys.stderr)
        return result
    if run.dist.main:
        result["eval"] = _held_out(run)
        write_json(out_dir / "eval.json", result["eval"])
        save_drafter(run.drafter, out_dir / "drafter.safetensors")
    return result
