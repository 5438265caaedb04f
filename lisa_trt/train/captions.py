"""t2i drafter-training data: token sequences conditioned on T5 caption features.

A t2i `TokenDataset` keeps `cond` as a `CaptionConds`: a caption table (features (M, L, C) +
mask (M, L), valid tokens first, as `lisa-trt encode-captions` writes them) plus, per training
sequence, the caption row it was generated for and whether it is trained with the NULL caption
(the target's `uncond_embedding`, placed by `Transformer.null_cond`, like LlamaGen's caption
dropout). Sequences share caption rows, so the table is stored once.

Sources (DataConfig.source):
  self    the target samples `num_samples` sequences with CFG from captions drawn (seeded) from
          `caption_file` (a captions .txt is encoded first by the CLI);
  tokens  a token file: "tokens" (N, block) with either "caption_features" (N, L, C) +
          "caption_mask" (N, L), or "caption_index" (N,) into `caption_file`; optional "null" (N,).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import torch

from ..errors import InputError
from ..io import load_safetensors, save_safetensors, tensor_hash
from ..models.captions import caption_shape

LAZY_BYTES = 2 << 30  # caption feature files larger than this are read row by row (memory-mapped)


class LazyFeatures:
    """(M, L, C) caption features of a large safetensors file, read row by row on indexing
    (safetensors memory-maps the file), so a 100k-caption table need not fit in RAM."""

    def __init__(self, path):
        from safetensors import safe_open

        self.path = str(path)
        self._f = safe_open(self.path, framework="pt")
        self.shape = tuple(self._f.get_slice("caption_features").get_shape())

    def dim(self) -> int:
        return len(self.shape)

    def __getitem__(self, idx) -> torch.Tensor:
        rows = torch.as_tensor(idx).long().reshape(-1).tolist()
        sl = self._f.get_slice("caption_features")
        if not rows:
            return torch.zeros(0, *self.shape[1:])
        return torch.cat([sl[r: r + 1] for r in rows])


class CaptionRows:
    """The conditions of one batch: features, mask and null flags (moved together by .to)."""

    def __init__(self, feats: torch.Tensor, mask: torch.Tensor, null: torch.Tensor):
        self.feats, self.mask, self.null = feats, mask, null

    def to(self, device) -> "CaptionRows":
        return CaptionRows(self.feats.to(device), self.mask.to(device), self.null.to(device))

    def __len__(self) -> int:
        return self.feats.shape[0]


class CaptionConds:
    """Per-sequence caption conditions over a shared caption table (see module docstring)."""

    def __init__(self, feats: torch.Tensor, mask: torch.Tensor, index: torch.Tensor, null: Optional[torch.Tensor] = None):
        self.feats, self.mask = feats, mask.to(torch.bool)
        self.index = index.long().flatten()
        self.null = torch.zeros_like(self.index, dtype=torch.bool) if null is None else null.to(torch.bool).flatten()

    def __len__(self) -> int:
        return self.index.shape[0]

    def __getitem__(self, key):
        if isinstance(key, slice):
            return CaptionConds(self.feats, self.mask, self.index[key], self.null[key])
        rows = torch.as_tensor(key).long()
        i = self.index[rows]
        return CaptionRows(self.feats[i].float(), self.mask[i], self.null[rows])

    def fingerprint(self) -> str:
        M = self.feats.shape[0]
        sample = self.feats[torch.arange(0, M, max(1, M // 64))].float().flatten()  # <= ~64 caption rows
        return tensor_hash(torch.cat([self.index.double(), self.null.double(), self.mask.flatten().double(),
                                      sample.double()]))

    def tensors(self) -> dict:
        feats = self.feats if torch.is_tensor(self.feats) else self.feats[torch.arange(self.feats.shape[0])]
        return {"caption_features": feats, "caption_mask": self.mask, "caption_index": self.index, "null": self.null}


def as_target_cond(target, cond):
    """A batch condition as the target takes it: CaptionRows -> (features, mask) with the null
    rows replaced by the target's null caption; prompt rows (train/requests.PromptRows) ->
    (ids, valid); class ids pass through."""
    if hasattr(cond, "as_cond"):
        return cond.as_cond()
    if not isinstance(cond, CaptionRows):
        return cond
    feats, mask = cond.feats.to(target.output.weight.dtype), cond.mask
    if bool(cond.null.any()):
        nf, _ = target.null_cond((feats, mask))
        feats = torch.where(cond.null[:, None, None], nf.to(feats.dtype), feats)
    return feats, mask


def _check(tokens, conds: CaptionConds, tcfg, where: str):
    from .dataset import TokenDataset

    if tokens.dim() != 2 or tokens.shape[1] != tcfg.block_size:
        raise InputError(f"{where}: tokens have shape {tuple(tokens.shape)}; expected (N, {tcfg.block_size})")
    if tokens.dtype.is_floating_point:
        raise InputError(f"{where}: tokens must be integers")
    if len(conds) != tokens.shape[0]:
        raise InputError(f"{where}: {tokens.shape[0]} sequences but {len(conds)} caption conditions")
    want = caption_shape(tcfg)
    if conds.feats.dim() != 3 or tuple(conds.feats.shape[1:]) != want:
        raise InputError(f"{where}: caption features are {tuple(conds.feats.shape)}; this target needs (M, {want[0]}, "
                         f"{want[1]}) (encode with `lisa-trt encode-captions --max-length {want[0]}`)")
    M = conds.feats.shape[0]
    if len(conds) and (int(conds.index.min()) < 0 or int(conds.index.max()) >= M):
        raise InputError(f"{where}: caption_index must lie in [0, {M})")
    V = tcfg.vocab_size
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= V):
        raise InputError(f"{where}: token ids must lie in [0, {V}); got {int(tokens.min())}..{int(tokens.max())}")
    return TokenDataset(tokens.long(), conds)


def load_caption_table(path, tcfg) -> tuple[torch.Tensor, torch.Tensor]:
    from ..models.captions import load_caption_features

    if path is None:
        raise InputError("t2i training needs caption features: pass --captions FILE (captions .txt with --encoder, "
                         "or a .safetensors from `lisa-trt encode-captions`)")
    p = Path(path)
    if p.suffix.lower() == ".safetensors" and p.is_file() and p.stat().st_size > LAZY_BYTES:
        from safetensors import safe_open

        feats = LazyFeatures(p)
        with safe_open(str(p), framework="pt") as f:
            mask = f.get_tensor("caption_mask").to(torch.bool)
        want = caption_shape(tcfg)
        if feats.shape[1:] != want or tuple(mask.shape) != feats.shape[:2]:
            raise InputError(f"{p}: caption features {feats.shape} / mask {tuple(mask.shape)}; this target needs "
                             f"(M, {want[0]}, {want[1]}) / (M, {want[0]})")
        return feats, mask
    f, m, _ = load_caption_features(p, tcfg)
    return f, m


def load_caption_token_file(path, tcfg, caption_file=None):
    """Token + caption-feature dataset for a t2i target (formats in the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"token file {path} does not exist")
    if path.suffix.lower() == ".safetensors":
        d, _ = load_safetensors(path)
    elif path.suffix.lower() in (".pt", ".pth"):
        d = torch.load(path, map_location="cpu", weights_only=True)
    else:
        raise InputError(f"t2i token files must be .safetensors or .pt, got {path.name}")
    if not isinstance(d, dict) or "tokens" not in d:
        raise InputError(f"{path}: expected 'tokens' (N, block) plus caption_features/caption_mask or caption_index")
    null = d.get("null")
    if "caption_features" in d:
        if "caption_mask" not in d:
            raise InputError(f"{path}: caption_features need caption_mask (N, L)")
        feats, mask = d["caption_features"].float(), d["caption_mask"]
        index = d.get("caption_index", torch.arange(feats.shape[0]))
    elif "caption_index" in d:
        feats, mask = load_caption_table(caption_file, tcfg)
        index = d["caption_index"]
    else:
        raise InputError(f"{path}: a t2i token file needs 'caption_features' + 'caption_mask' (per sequence) or "
                         "'caption_index' into --captions FEATURES")
    return _check(d["tokens"], CaptionConds(feats, mask, index, null), tcfg, str(path))


def self_distill_caption_tokens(target, feats: torch.Tensor, mask: torch.Tensor, n: int, *, cfg_scale: float = 7.5,
                                temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, uncond_frac: float = 0.1,
                                seed: int = 0, batch_size: int = 64, progress: bool = True):
    """n CFG samples of the target, each from a caption drawn (seeded) from the table.

    The first min(n, M) sequences use a seeded permutation of the captions (every caption used
    once before any repeats); chunk c is sampled with seed * 1_000_003 + c, so the result is a
    pure function of the arguments. round(uncond_frac * n) rows are trained with the null caption.
    """
    from ..speculative.autoregressive import generate
    from .dataset import TokenDataset, _tqdm

    M = feats.shape[0]
    if M == 0:
        raise InputError("the caption table is empty")
    g = torch.Generator().manual_seed(seed)
    reps = math.ceil(n / M)
    index = torch.cat([torch.randperm(M, generator=g) for _ in range(reps)])[:n]
    null = torch.zeros(n, dtype=torch.bool)
    null[torch.randperm(n, generator=g)[: round(uncond_frac * n)]] = True
    device = target.output.weight.device
    dt = target.output.weight.dtype
    out = []
    for c in _tqdm(range(math.ceil(n / batch_size)), progress, desc="self-distillation samples", unit="batch"):
        i = index[c * batch_size: (c + 1) * batch_size]
        cond = (feats[i].to(device=device, dtype=dt), mask[i].to(device))
        out.append(generate(target, cond, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed * 1_000_003 + c).cpu())
    tokens = torch.cat(out) if out else torch.zeros(0, target.config.block_size, dtype=torch.long)
    return TokenDataset(tokens, CaptionConds(feats, mask, index, null))


def build_caption_dataset(target, cfg, seed: int, data_dir: Path, *, is_main: bool = True,
                          barrier=lambda: None, progress: bool = True):
    """(train, held-out) for a t2i target; self-distilled tokens are stored once in
    data_dir/selfdistill.safetensors (tokens + caption_index + null) and re-read on resume."""
    from ..models.checkpoints import target_hash
    from .dataset import _matches

    tcfg = target.config
    if cfg.source == "tokens":
        ds = load_caption_token_file(cfg.token_file, tcfg, cfg.caption_file)
        if len(ds) <= cfg.eval_samples:
            raise InputError(f"token file has {len(ds)} sequences; need more than eval_samples={cfg.eval_samples}")
        return ds.split(cfg.eval_samples)
    feats, mask = load_caption_table(cfg.caption_file, tcfg)
    path = Path(data_dir) / "selfdistill.safetensors"
    n = cfg.num_samples + cfg.eval_samples
    key = {"cfg": cfg.to_dict(), "seed": seed, "n": n, "target_hash": target_hash(target),
           "captions": CaptionConds(feats, mask, torch.arange(feats.shape[0])).fingerprint()}
    if is_main and not _matches(path, key):
        ds = self_distill_caption_tokens(target, feats, mask, n, cfg_scale=cfg.cfg_scale, temperature=cfg.temperature,
                                         top_k=cfg.top_k, top_p=cfg.top_p, uncond_frac=cfg.uncond_frac, seed=seed,
                                         batch_size=cfg.gen_batch, progress=progress)
        save_safetensors({"tokens": ds.tokens, "caption_index": ds.cond.index, "null": ds.cond.null}, path,
                         metadata={"kind": "lisa-trt-tokens-t2i", "key": key})
    barrier()
    t, _ = load_safetensors(path)
    ds = _check(t["tokens"], CaptionConds(feats, mask, t["caption_index"], t["null"]), tcfg, str(path))
    return ds.split(cfg.eval_samples)


def eval_captions(target, data_cfg, n: int):
    """Held-out decoding prompts for a t2i drafter: the last n captions of the table
    (cycled when the table is smaller)."""
    tcfg = target.config
    if data_cfg.caption_file is None and data_cfg.token_file:
        c = load_caption_token_file(data_cfg.token_file, tcfg).cond
        feats, mask = c.feats, c.mask
    else:
        feats, mask = load_caption_table(data_cfg.caption_file, tcfg)
    idx = (torch.arange(n) + max(feats.shape[0] - n, 0)) % feats.shape[0]
    return feats[idx].float(), mask[idx]
