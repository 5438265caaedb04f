"""Distil 2-D heads (models/head2d.py; SSD's right-and-below heads) on the target's hidden states.

Data and target features are the EAGLE trainer's (train/data.py: self-distilled or token-file
sequences; `Batch.hidden[:, j + 1]` is the final hidden state at image token j, the one whose
logits predict token j + 1). The head of offset (dr, dc) on that hidden state predicts the token
at raster index t = j + dr * L + dc (L: the sequence's row length, models/head2d.py); its teacher
is the target's teacher-forced distribution there, logits[:, t]. An entry is trained when t lies
in the image, column(j) + dc stays in the row, and the layout does not force t (Lumina's row
ends); the loss is the EAGLE-3 soft cross-entropy (train/losses.step_loss), summed over heads,
compared over the layout's allowed ids (TrainVocab).

Resumable like the EAGLE trainer: checkpoints/step_*.pt (atomic) with latest.json every
`checkpoint_every` steps; a rerun with the same OUT continues from the latest one (the data order
is a function of the step). The heads are written atomically to OUT/head2d.safetensors (+ .json).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from ..errors import ArtifactMismatchError, ConfigError, InputError
from ..io import write_json
from ..models.head2d import Heads2D, save_heads2d
from .data import OnlineFeatures, batch_indices, build_dataset
from .losses import agreement_stats, step_loss
from .trainer import TrainConfig, TrainVocab, load_latest_checkpoint, lr_factor, save_checkpoint

ARTIFACT = "head2d.safetensors"


def grid_of(target, layout) -> tuple[int, int]:
    """(row length L, tokens per image N) of the family's layout (None: its free layout); InputError
    for a family without a regular grid of rows."""
    from ..models.family import family_of
    from ..speculative.zipar import row_length

    layout = layout if layout is not None else family_of(target.config).free_layout(target)
    try:
        L = row_length(target, layout)
    except InputError as e:
        raise InputError(f"2-D heads predict the token below; this target/layout has no regular grid of rows "
                         f"({e}); train an EAGLE-3 drafter (--arch eagle3) instead") from None
    if int(layout.n_tokens) < 2 * L:
        raise InputError(f"2-D heads need an image of at least two rows; this layout has {layout.n_tokens} tokens "
                         f"in rows of {L}")
    return L, int(layout.n_tokens)


def head_targets(heads: Heads2D, n_seq: int) -> list:
    """Per head k: (src (M,), dst (M,)) long: the hidden index read (token j's: j + 1) and the token
    index predicted (j + delta_k), over the tokens j of a length-n_seq sequence whose target lies in
    the image and in the row (column(j) + dc < L)."""
    cfg, out = heads.config, []
    j = torch.arange(n_seq - 1)  # token j's hidden is hidden[:, j + 1]: j <= n_seq - 2
    for k, (dr, dc) in enumerate(cfg.offsets):
        dst = j + cfg.delta(k)
        ok = (dst < n_seq) & ((j % cfg.row_len) + dc < cfg.row_len)
        out.append((j[ok] + 1, dst[ok]))
    return out


def head_pairs(heads: Heads2D, batch, vocab: TrainVocab = TrainVocab()) -> list:
    """Per head k: (k, teacher logits (M, N_ids), student logits (M, N_ids), tokens (M,) as indices
    into the N_ids ids) over the trained entries (module docstring)."""
    pairs = []
    for k, (src, dst) in enumerate(head_targets(heads, batch.tokens.shape[1])):
        if vocab.trained is not None:
            keep = vocab.trained.to(dst.device)[dst]
            src, dst = src[keep], dst[keep]
        if not src.numel():
            continue
        dev = batch.hidden.device
        s_l = heads.head_logits(batch.hidden[:, src.to(dev)], k)
        t_l, tok = batch.logits[:, dst.to(dev)].float(), batch.tokens[:, dst.to(dev)]
        t_l, s_l = vocab.gather(t_l, s_l)
        if vocab.ids is not None:  # a token as its position among the allowed ids
            tok = torch.searchsorted(vocab.ids.to(tok.device), tok)
        pairs.append((k, t_l.reshape(-1, t_l.shape[-1]), s_l.reshape(-1, s_l.shape[-1]), tok.reshape(-1)))
    return pairs


def head2d_loss(heads: Heads2D, batch, cfg: TrainConfig, vocab: TrainVocab = TrainVocab()):
    """sum_k soft-CE_k over the trained entries of every head, plus per-head top-1 agreement."""
    losses, top1 = [], []
    for _, t_l, s_l, _ in head_pairs(heads, batch, vocab):
        loss, _ = step_loss(t_l, s_l, cfg.loss)
        losses.append(loss)
        top1.append(float(agreement_stats(t_l, s_l.detach())["top1"].mean()))
    if not losses:
        raise ConfigError("no trained entry in this batch: every token a 2-D head predicts is forced")
    return torch.stack(losses).sum(), {"loss_h": [float(x.detach()) for x in losses], "top1_h": top1}


@torch.no_grad()
def evaluate_heads2d(heads: Heads2D, features, n_rows: int, batch_size: int = 8, vocab: TrainVocab = TrainVocab(),
                     k: int = 5) -> dict:
    """Held-out per head: agreement with the target's argmax (top1, top3), the lossless acceptance
    sum_v min(p_t, p_s) of a draft drawn from the head, and how often the token the target sampled
    is the head's top-1 / in its top-k; next to the same numbers for PJD's fresh draft law (uniform
    over the allowed ids: accept = sum_v min(p_t, 1 / n_ids), token top-k = k / n_ids)."""
    was = heads.training
    heads.eval()
    acc: dict = {}
    for lo in range(0, n_rows, batch_size):
        b = features.batch(torch.arange(lo, min(lo + batch_size, n_rows)))
        for h, t_l, s_l, tok in head_pairs(heads, b, vocab):
            st = agreement_stats(t_l, s_l)
            top = s_l.topk(min(k, s_l.shape[-1]), -1).indices
            n_ids = t_l.shape[-1]
            rec = acc.setdefault(h, {n: [] for n in ("top1", "top3", "accept", "token_top1", "token_topk",
                                                     "uniform_accept")})
            for name in ("top1", "top3", "accept"):
                rec[name].append(st[name].flatten())
            rec["token_top1"].append((top[:, 0] == tok).float())
            rec["token_topk"].append((top == tok[:, None]).any(-1).float())
            rec["uniform_accept"].append(t_l.softmax(-1).clamp(max=1.0 / n_ids).sum(-1))
    heads.train(was)
    out = {"sequences": n_rows, "k": k, "heads": {}}
    for h in sorted(acc):
        name = _direction_name(heads.config.offsets[h])
        out["heads"][name] = {n: float(torch.cat(v).mean()) for n, v in acc[h].items()}
        out["heads"][name]["uniform_token_topk"] = min(k, n_ids) / n_ids
        out["heads"][name]["entries"] = int(torch.cat(acc[h]["top1"]).numel())
    return out


def _direction_name(offset) -> str:
    from ..models.head2d import DIRECTIONS

    return next((n for n, o in DIRECTIONS.items() if o == tuple(offset)), f"{offset[0]},{offset[1]}")


class _Run:
    """One training run's state: heads, optimiser, schedule, data, where it writes."""

    def __init__(self, target, cfg: TrainConfig, out_dir: Path, heads: Heads2D, train_set, vocab, show: bool):
        self.target, self.cfg, self.out_dir, self.heads, self.vocab, self.show = target, cfg, out_dir, heads, vocab, show
        self.train_set, self.features = train_set, OnlineFeatures(target, train_set)
        self.opt = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: lr_factor(s, cfg))
        self.metrics = out_dir / "metrics.jsonl"
        self.t0 = time.time()

    def step(self, step: int) -> tuple:
        rows = batch_indices(step, len(self.train_set), self.cfg.batch_size, self.cfg.seed)
        loss, stats = head2d_loss(self.heads, self.features.batch(rows), self.cfg, self.vocab)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.heads.parameters(), self.cfg.grad_clip)
        self.opt.step()
        self.sched.step()
        return loss, stats

    def log(self, done: int, loss, stats: dict) -> None:
        rec = {"step": done, "loss": float(loss.detach()), "lr": self.sched.get_last_lr()[0],
               "seconds": round(time.time() - self.t0, 3), **stats}
        with open(self.metrics, "a") as f:
            f.write(json.dumps(rec) + "\n")


def _resume(run: _Run) -> int:
    """The latest checkpoint's step (0: none), its heads / optimiser / schedule / RNG loaded;
    another target, other heads or another recipe are refused."""
    state = load_latest_checkpoint(run.out_dir)
    if state is None:
        return 0
    if state["drafter_config"] != run.heads.config.to_dict():
        raise ArtifactMismatchError(f"{run.out_dir} holds a run of other heads or for another target "
                                    f"({state['drafter_config']}); use a new --out")
    saved, now = json.loads(state["train_config"]), run.cfg.to_dict()
    cadence = ("steps", "checkpoint_every", "log_every", "keep_checkpoints", "eval_every")
    diff = sorted(k for k in now if k not in cadence and saved.get(k) != now[k])
    if diff:
        raise ConfigError(f"{run.out_dir} holds a run with other settings ({', '.join(diff)}); resume it with the "
                          "same options or use a new --out")
    run.heads.load_state_dict(state["model"])
    run.opt.load_state_dict(state["optimizer"])
    run.sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["torch"])
    print(f"resuming {run.out_dir} from step {state['step']} of {run.cfg.steps} (its latest checkpoint)",
          file=sys.stderr)
    return int(state["step"])


def _keep_metrics_until(path: Path, step: int) -> None:
    """metrics.jsonl without the records past `step` (a resumed run rewrites them)."""
    if not path.is_file():
        path.write_text("")
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= step]
    path.write_text("".join(ln + "\n" for ln in keep))


def _check(cfg: TrainConfig) -> None:
    if cfg.loss.kind != "eagle3":
        raise ConfigError(f"2-D heads train with the plain soft cross-entropy (--loss eagle3), not {cfg.loss.kind!r}")
    if cfg.draft_vocab:
        raise ConfigError("--draft-vocab applies to the EAGLE-3 drafter; 2-D heads predict the ids the layout allows")


def train_heads2d(target, cfg: TrainConfig, out_dir, *, offsets=((1, 0), (1, 1)), progress: bool = True,
                  request=None) -> dict:
    """Train 2-D heads for `target`; writes OUT/head2d.safetensors (+ .json), metrics.jsonl, eval.json.

    Args:
        target: a target of any family with a grid of rows (frozen).
        cfg: TrainConfig (steps, batch_size, lr, warmup, data, seed, checkpoint cadence are used; the
            loss must be eagle3).
        offsets: the (dr, dc) each head predicts (models/head2d.DIRECTIONS).
        request: prompt-id families: the prompts and layout to self-distil from; None otherwise.
    Returns:
        {"drafter": path, "eval": dict, "steps": int, "metrics": path}.
    """
    from ..progress import iterate

    _check(cfg)
    layout = None if request is None else request.layout
    L, N = grid_of(target, layout)  # before any data work
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target.eval()
    vocab = TrainVocab.of(layout)
    heads = Heads2D.from_target(target, L, N, offsets, target_name=cfg.target_name).train()
    torch.manual_seed(cfg.seed)
    resuming = (out_dir / "checkpoints" / "latest.json").is_file()
    train_set, eval_set = build_dataset(target, cfg.data, cfg.seed, out_dir / "data", progress=progress,
                                        request=request, resuming=resuming)
    run = _Run(target, cfg, out_dir, heads, train_set, vocab, progress)
    start = _resume(run)
    _keep_metrics_until(run.metrics, start)
    write_json(out_dir / "train_config.json", {**cfg.to_dict(), "arch": "ssd", "offsets": heads.config.to_dict()["offsets"]})
    bar = iterate(range(start, cfg.steps), progress, initial=start, total=cfg.steps, desc="train 2-D heads", unit="step")
    for step in bar:
        loss, stats = run.step(step)
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            run.log(done, loss, stats)
            bar.set_postfix(loss=f"{float(loss.detach()):.4f}")
        if done % cfg.checkpoint_every == 0 or done == cfg.steps:
            save_checkpoint(out_dir, done, heads, run.opt, run.sched, cfg, None, len(train_set), cfg.keep_checkpoints)
    ev = evaluate_heads2d(heads, OnlineFeatures(target, eval_set), len(eval_set), cfg.batch_size, vocab)
    write_json(out_dir / "eval.json", ev)
    path = out_dir / ARTIFACT
    save_heads2d(heads.eval(), path)
    return {"drafter": str(path), "eval": ev, "steps": cfg.steps, "metrics": str(run.metrics)}


__all__ = ["evaluate_heads2d", "grid_of", "head2d_loss", "head_pairs", "head_targets", "train_heads2d"]
