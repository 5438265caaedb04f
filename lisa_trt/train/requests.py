"""Drafter-training data of the prompt-id families (Chameleon / Lumina-mGPT, Janus-Pro).

What self-distillation rolls out is a `models.family.Request`: M prompts in the target's own
condition form (`models.prompts.Prompts` with its CFG rows, `(ids, valid)` or bare ids) and the
family's `SequenceLayout` of one request (how many tokens, which ids may be sampled, which are
forced), as the family's prompter encodes them:

    family_of(target.config).prompter(target).encode(captions, image_size=512, cfg=True)
    prompt_request(target, prompt_ids)          # ids already tokenised: the family's free layout

`self_distill_prompt_tokens` samples n sequences through the generic AR loop
(`speculative.autoregressive.generate`, the family's layout, CFG at the deployment scale), each
from a prompt drawn (seeded) from the request; a fraction `uncond_frac` is TRAINED with the
prompt's unconditional rows (`target.null_cond`: Lumina's span prefix alone, Janus' padded
prompt), as LlamaGen trains with the null class. The training conditions are `PromptConds`:
left-padded ids + valid masks, one row per sequence. `build_prompt_dataset` stores the tokens
(and which prompt / null row each used) once under the run's data/ directory, keyed by the
settings, the target hash and the request's fingerprint, so a resumed run reads the same data.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from ..errors import ConfigError, InputError
from ..io import load_safetensors, save_safetensors, tensor_hash
from ..models.family import Request, SequenceLayout, family_of
from ..models.prompts import Prompts
from .dataset import TokenDataset, _matches, _tqdm


def take_rows(cond, idx: torch.Tensor):
    """Rows `idx` of a condition in any of the prompt forms (Prompts with its uncond rows, a tuple
    of per-row tensors, or one tensor)."""
    if isinstance(cond, Prompts):
        idx = idx.to(cond.ids.device)
        unc = None if cond.uncond is None else take_rows(cond.uncond, idx)
        return Prompts(cond.ids[idx], cond.valid[idx], unc)
    if isinstance(cond, (tuple, list)):
        return tuple(c[idx.to(c.device)] for c in cond)
    return cond[idx.to(cond.device)]


def _pad_to(ids: torch.Tensor, valid: torch.Tensor, T: int):
    n = T - ids.shape[1]
    return F.pad(ids, (n, 0)), F.pad(valid, (n, 0))


def prompt_request(target, cond, layout: Optional[SequenceLayout] = None) -> Request:
    """A Request over prompt ids already in the target's condition form (ids (M, T), (ids,
    valid) or Prompts); layout default: the family's free layout (the whole image)."""
    M = target.check_cond(cond)
    layout = layout if layout is not None else family_of(target.config).free_layout(target)
    return Request(cond, layout, (), tuple(range(M)))


def request_rows(request: Request) -> int:
    """Prompts in a request (rows of its condition)."""
    return Prompts.of(request.cond).batch


def _null_prompts(target, request: Request) -> Optional[Prompts]:
    """The unconditional rows the target builds for CFG (same row order as the prompts), or None
    when the request carries none (a Lumina request encoded without cfg)."""
    try:
        return Prompts.of(target.null_cond(request.cond))
    except InputError:
        return None


def request_fingerprint(target, request: Request) -> str:
    """Hash of the prompts, their null rows and the layout (the stored data's key)."""
    p, u, lay = Prompts.of(request.cond), _null_prompts(target, request), request.layout
    parts = [p.ids.flatten(), p.valid.flatten().long(), torch.tensor([lay.n_tokens])]
    if u is not None:
        parts += [u.ids.flatten(), u.valid.flatten().long()]
    for t in (lay.allowed, lay.forced):
        parts.append(torch.tensor([-2]) if t is None else t.flatten().long())
    return tensor_hash(torch.cat([x.cpu().long() for x in parts]).double())


class PromptRows:
    """The training conditions of one batch (left-padded ids, valid), moved together by .to."""

    def __init__(self, ids: torch.Tensor, valid: torch.Tensor):
        self.ids, self.valid = ids, valid

    def to(self, device) -> "PromptRows":
        return PromptRows(self.ids.to(device), self.valid.to(device))

    def __len__(self) -> int:
        return self.ids.shape[0]

    def as_cond(self):
        """(ids, valid) without the columns that are padding in every row (positions unchanged)."""
        lead = int((~self.valid).all(0).long().cumprod(0).sum())
        return self.ids[:, lead:], self.valid[:, lead:]


class PromptConds:
    """Per-sequence prompt conditions: ids / valid (N, T), left-padded to one width."""

    def __init__(self, ids: torch.Tensor, valid: torch.Tensor):
        self.ids, self.valid = ids.long(), valid.to(torch.bool)

    @classmethod
    def build(cls, prompts: Prompts, null: Optional[Prompts], index: torch.Tensor,
              is_null: torch.Tensor) -> "PromptConds":
        """Row i: prompt index[i], or its null rows where is_null[i]."""
        if null is None:
            if bool(is_null.any()):
                raise InputError("uncond_frac > 0 trains some sequences with the unconditional prompt, which this "
                                 "request does not carry: encode it with cfg=True, or set uncond_frac 0")
            null = prompts
        T = max(prompts.ids.shape[1], null.ids.shape[1])
        (a, av), (b, bv) = _pad_to(prompts.ids, prompts.valid, T), _pad_to(null.ids, null.valid, T)
        index, m = index.long().cpu(), is_null.to(torch.bool).cpu()[:, None]
        ids = torch.where(m, b.cpu()[index], a.cpu()[index])
        return cls(ids, torch.where(m, bv.cpu()[index], av.cpu()[index]))

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, key):
        if isinstance(key, slice):
            return PromptConds(self.ids[key], self.valid[key])
        rows = torch.as_tensor(key).long()
        return PromptRows(self.ids[rows], self.valid[rows])

    def fingerprint(self) -> str:
        return tensor_hash(torch.cat([self.ids.flatten(), self.valid.flatten().long()]).double())

    def tensors(self) -> dict:
        return {"prompt_ids": self.ids, "prompt_valid": self.valid}


def self_distill_prompt_tokens(target, request: Request, n: int, *, cfg_scale: float = 3.0,
                               temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                               uncond_frac: float = 0.1, seed: int = 0, batch_size: int = 64,
                               progress: bool = True) -> tuple[TokenDataset, torch.Tensor, torch.Tensor]:
    """n CFG samples of the target through the generic AR loop, each from a prompt of `request`.

    The first min(n, M) sequences use a seeded permutation of the prompts (every prompt once
    before any repeats); chunk c is sampled with seed * 1_000_003 + c, so the result is a pure
    function of the arguments. round(uncond_frac * n) rows are trained with the null rows.
    Returns (TokenDataset with PromptConds, index (n,), null (n,) bool).
    """
    from ..speculative.autoregressive import generate

    M = request_rows(request)
    if M == 0:
        raise InputError("no prompts to roll out")
    g = torch.Generator().manual_seed(seed)
    index = torch.cat([torch.randperm(M, generator=g) for _ in range(math.ceil(n / M))])[:n]
    null = torch.zeros(n, dtype=torch.bool)
    null[torch.randperm(n, generator=g)[: round(uncond_frac * n)]] = True
    out = []
    for c in _tqdm(range(math.ceil(n / batch_size)), progress, desc="self-distillation samples", unit="batch"):
        cond = take_rows(request.cond, index[c * batch_size: (c + 1) * batch_size])
        out.append(generate(target, cond, layout=request.layout, cfg_scale=cfg_scale, temperature=temperature,
                            top_k=top_k, top_p=top_p, seed=seed * 1_000_003 + c).cpu())
    tokens = torch.cat(out) if out else torch.zeros(0, request.layout.n_tokens, dtype=torch.long)
    conds = PromptConds.build(Prompts.of(request.cond), _null_prompts(target, request), index, null)
    return TokenDataset(tokens, conds), index, null


def build_prompt_dataset(target, request: Request, cfg, seed: int, data_dir: Path, *, is_main: bool = True,
                         barrier=lambda: None, progress: bool = True,
                         resuming: bool = False) -> tuple[TokenDataset, TokenDataset]:
    """(train, held-out) for a prompt-id target; self-distilled tokens are stored once in
    data_dir/selfdistill.safetensors (tokens + prompt index + null) and re-read on resume.

    resuming: the run has a checkpoint, so its stored data must match (other prompts, settings or
        another target are refused instead of silently re-sampled)."""
    from ..models.checkpoints import target_hash

    if cfg.source != "self":
        raise ConfigError(f"prompt-conditioned families train on self-distillation rollouts (data source 'self'), "
                          f"not {cfg.source!r}")
    path = Path(data_dir) / "selfdistill.safetensors"
    n = cfg.num_samples + cfg.eval_samples
    key = {"cfg": cfg.to_dict(), "seed": seed, "n": n, "target_hash": target_hash(target),
           "request": request_fingerprint(target, request)}
    if is_main and not _matches(path, key):
        if resuming and path.is_file():
            raise ConfigError(f"{path.parent.parent} holds a run whose rollouts were made from other prompts, "
                              "settings or another target; use a new out_dir or the run's own prompts")
        ds, index, null = self_distill_prompt_tokens(
            target, request, n, cfg_scale=cfg.cfg_scale, temperature=cfg.temperature, top_k=cfg.top_k,
            top_p=cfg.top_p, uncond_frac=cfg.uncond_frac, seed=seed, batch_size=cfg.gen_batch, progress=progress)
        save_safetensors({"tokens": ds.tokens, "prompt_index": index, "null": null}, path,
                         metadata={"kind": "lisa-trt-tokens-prompts", "key": key})
    barrier()
    t, _ = load_safetensors(path)
    conds = PromptConds.build(Prompts.of(request.cond), _null_prompts(target, request), t["prompt_index"], t["null"])
    ds = TokenDataset(t["tokens"].long(), conds)
    if len(ds) <= cfg.eval_samples:
        raise InputError(f"{len(ds)} sequences; need more than eval_samples={cfg.eval_samples}")
    return ds.split(cfg.eval_samples)


__all__ = ["PromptConds", "PromptRows", "build_prompt_dataset", "prompt_request", "request_fingerprint",
           "request_rows", "self_distill_prompt_tokens", "take_rows"]
