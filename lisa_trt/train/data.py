"""Training data for drafter distillation: token sequences + the frozen target's features.

Sequences come from
  (a) self-distillation: the target samples with the deployment CFG scale (`lisa_trt.generate`);
      a fraction `uncond_frac` (10 %) of them is trained with the NULL condition (choice: the
      tokens are still CFG samples, because at deployment the drafter's unconditional half
      reads exactly those tokens), or
  (b) a token file of (N, block) image token ids + class ids.
The target's taps / final hidden states are computed on the fly (`OnlineFeatures`) or cached
once to safetensors shards (`FeatureCache`; the size is printed before anything is written).
Logits are always recomputed from the cached final hidden (one GEMM with the target head), so
a cache stores 4H numbers per position instead of V.

Batch order is a pure function of (seed, step): epoch e uses randperm(n) seeded by seed + e,
so resuming at step k needs nothing but k.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..errors import ConfigError, InputError
from ..io import load_safetensors, save_safetensors
from ..models.conditioning import CaptionFeatures, ClassLabels, TextPrompts, for_kind
from ..models.family import family_of
from .dataset import TokenDataset, _matches, _tqdm  # noqa: F401  (re-exported: train.data.TokenDataset)

DATA_SOURCES = ("self", "tokens")
FEATURE_MODES = ("online", "cache")


@dataclass(frozen=True)
class DataConfig:
    """Where the training sequences come from and how the target features are obtained."""

    source: str = "self"  # "self" (target-generated) | "tokens" (token_file)
    token_file: Optional[str] = None
    caption_file: Optional[str] = None  # t2i: caption features .safetensors (train/captions.py)
    num_samples: int = 1024  # self-distillation: training sequences to generate
    eval_samples: int = 32  # held-out sequences (generated with other seeds / last rows of the file)
    cfg_scale: float = 4.0  # deployment CFG scale for self-distillation
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    uncond_frac: float = 0.1
    gen_batch: int = 64
    features: str = "online"  # "online" | "cache"
    cache_dir: Optional[str] = None  # default: <out_dir>/features
    cache_dtype: str = "float32"  # or "bfloat16" / "float16"
    shard_size: int = 256

    def __post_init__(self):
        if self.source not in DATA_SOURCES:
            raise ConfigError(f"unknown data source {self.source!r}; valid: {', '.join(DATA_SOURCES)}")
        if self.source == "tokens" and not self.token_file:
            raise ConfigError("data source 'tokens' needs token_file (a .pt/.npy/.npz/.safetensors of token ids)")
        if self.features not in FEATURE_MODES:
            raise ConfigError(f"unknown feature mode {self.features!r}; valid: {', '.join(FEATURE_MODES)}")
        if self.cache_dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"cache_dtype must be float32, bfloat16 or float16, got {self.cache_dtype!r}")
        if not 0.0 <= self.uncond_frac <= 1.0:
            raise ConfigError(f"uncond_frac must lie in [0, 1], got {self.uncond_frac}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Batch:
    cond: object  # (B,) class ids, or train.captions.CaptionRows
    tokens: torch.Tensor  # (B, N)
    taps: torch.Tensor  # (B, N, 3H): [:, j] from the position whose logits predict tokens[:, j]
    logits: torch.Tensor  # (B, N, V) fp32, aligned with taps
    hidden: torch.Tensor  # (B, N, H) final normed hidden, aligned with taps
    start: Optional[torch.Tensor] = None  # (B,) position of tokens[:, 0] (None: cls_token_num)


# ----------------------------------------------------------------------------- token files

def _check_tokens(tokens: torch.Tensor, cond: torch.Tensor, tcfg, where: str) -> TokenDataset:
    if tokens.dim() != 2 or tokens.shape[1] != tcfg.block_size:
        raise InputError(f"{where}: tokens have shape {tuple(tokens.shape)}; expected (N, {tcfg.block_size})")
    if tokens.dtype.is_floating_point or cond.dtype.is_floating_point:
        raise InputError(f"{where}: tokens and class ids must be integers")
    tokens, cond = tokens.long(), cond.long().flatten()
    if cond.shape[0] != tokens.shape[0]:
        raise InputError(f"{where}: {tokens.shape[0]} sequences but {cond.shape[0]} class ids")
    V = tcfg.vocab_size
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= V):
        raise InputError(f"{where}: token ids must lie in [0, {V}); got {int(tokens.min())}..{int(tokens.max())}")
    n_cls = family_of(tcfg).conditioning(tcfg).num_classes  # ClassLabels: the only kind with token files here
    if cond.numel() and (int(cond.min()) < 0 or int(cond.max()) > n_cls):
        raise InputError(f"{where}: class ids must lie in 0..{n_cls} ({n_cls} = unconditional)")
    return TokenDataset(tokens, cond)


def load_token_file(path, tcfg) -> TokenDataset:
    """Read image tokens + their conditions, in the format of the target's kind (kind_data):
    class ids here (_class_token_file), caption ids beside the tokens for caption targets
    (train/captions.py)."""
    return kind_data(tcfg).token_file(Path(path), tcfg)


def _class_token_file(path: Path, tcfg) -> TokenDataset:
    """Read image tokens + class ids.

    Formats: .safetensors / .pt / .npz with "tokens" (N, block) and "classes" (N,);
    .npy of shape (N, block + 1) whose column 0 is the class id, or (N, block) with the class
    ids in a sibling `<name>.classes.npy`.
    """
    if not path.is_file():
        raise InputError(f"token file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        d, _ = load_safetensors(path)
    elif suffix in (".pt", ".pth"):
        from ..safe_load import safe_torch_load

        d = safe_torch_load(path, "token file")
    elif suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            d = {k: torch.from_numpy(z[k]) for k in z.files}
    elif suffix == ".npy":
        arr = torch.from_numpy(np.load(path, allow_pickle=False))
        if arr.dim() == 2 and arr.shape[1] == tcfg.block_size + 1:
            d = {"tokens": arr[:, 1:], "classes": arr[:, 0]}
        else:
            side = path.with_suffix(".classes.npy")
            if not side.is_file():
                raise InputError(f"{path}: a (N, {tcfg.block_size}) .npy needs its class ids in {side} "
                                 f"(or store (N, {tcfg.block_size + 1}) with the class id in column 0)")
            d = {"tokens": arr, "classes": torch.from_numpy(np.load(side, allow_pickle=False))}
    else:
        raise InputError(f"unsupported token file {path.name}; use .safetensors, .pt, .npz or .npy")
    if not isinstance(d, dict) or "tokens" not in d or "classes" not in d:
        raise InputError(f"{path}: expected a mapping with 'tokens' (N, block) and 'classes' (N,)")
    return _check_tokens(d["tokens"], d["classes"], tcfg, str(path))


# ----------------------------------------------------------------------------- self-distillation

def self_distill_tokens(target, n: int, *, cfg_scale: float = 4.0, temperature: float = 1.0, top_k: int = 0,
                        top_p: float = 1.0, uncond_frac: float = 0.1, seed: int = 0, batch_size: int = 64,
                        progress: bool = True) -> TokenDataset:
    """Sample n sequences from the target (random classes, CFG) for self-distillation.

    Class ids and the unconditional subset come from a generator seeded with `seed`; chunk c is
    sampled with seed (seed * 1_000_003 + c), so the result is a pure function of the arguments.
    Returns the tokens and the TRAINING conditions (null class for round(uncond_frac * n) rows).
    """
    from ..speculative.autoregressive import generate

    tcfg = target.config
    fam = family_of(tcfg)
    g = torch.Generator().manual_seed(seed)
    classes = fam.conditioning(tcfg).random(n, g)  # InputError naming the conditions to pass
    uncond = torch.randperm(n, generator=g)[: round(uncond_frac * n)]
    device = target.output.weight.device
    out = []
    chunks = range(math.ceil(n / batch_size))
    it = _tqdm(chunks, progress, desc="self-distillation samples", unit="batch")
    for c in it:
        ids = classes[c * batch_size: (c + 1) * batch_size].to(device)
        out.append(generate(target, ids, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed * 1_000_003 + c).cpu())
    cond = classes.clone()
    cond[uncond] = fam.null_cond(tcfg, cond[uncond])  # the family's null class id
    return TokenDataset(torch.cat(out) if out else torch.zeros(0, tcfg.block_size, dtype=torch.long), cond)


def build_dataset(target, cfg: DataConfig, seed: int, data_dir: Path, *, is_main: bool = True,
                  barrier=lambda: None, progress: bool = True, request=None,
                  resuming: bool = False) -> tuple[TokenDataset, TokenDataset]:
    """(train, held-out) datasets. Self-distilled sequences are generated once (by the main rank)
    and stored in data_dir/selfdistill.safetensors, so a resumed run reads the same data.

    request: for prompt-id families (Chameleon, Janus), the prompts and layout to roll out
        (a models.family.Request, train/requests.py); class ids / captions otherwise.
    resuming: the run has a checkpoint (prompt rollouts must then match the stored ones)."""
    if request is not None:
        from .requests import build_prompt_dataset

        return build_prompt_dataset(target, request, cfg, seed, data_dir, is_main=is_main, barrier=barrier,
                                    progress=progress, resuming=resuming)
    return kind_data(target.config).datasets(target, cfg, seed, data_dir, is_main=is_main, barrier=barrier,
                                             progress=progress)


def _class_datasets(target, cfg: DataConfig, seed: int, data_dir: Path, *, is_main: bool, barrier,
                    progress: bool) -> tuple[TokenDataset, TokenDataset]:
    """Class-conditioned (train, held-out): a token file's rows, or self-distilled samples stored once."""
    tcfg = target.config
    if cfg.source == "tokens":
        ds = load_token_file(cfg.token_file, tcfg)
        if len(ds) <= cfg.eval_samples:
            raise InputError(f"token file has {len(ds)} sequences; need more than eval_samples={cfg.eval_samples}")
        return ds.split(cfg.eval_samples)
    path = Path(data_dir) / "selfdistill.safetensors"
    from ..models.checkpoints import target_hash

    key = {"cfg": cfg.to_dict(), "seed": seed, "n": cfg.num_samples + cfg.eval_samples,
           "target_hash": target_hash(target)}
    if is_main and not _matches(path, key):
        ds = self_distill_tokens(target, cfg.num_samples + cfg.eval_samples, cfg_scale=cfg.cfg_scale,
                                 temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                                 uncond_frac=cfg.uncond_frac, seed=seed, batch_size=cfg.gen_batch,
                                 progress=progress)
        save_safetensors({"tokens": ds.tokens, "classes": ds.cond}, path,
                         metadata={"kind": "lisa-trt-tokens", "key": key})
    barrier()
    t, _ = load_safetensors(path)
    return _check_tokens(t["tokens"], t["classes"], tcfg, str(path)).split(cfg.eval_samples)


# ----------------------------------------------------------------------------- per conditioning kind

class _ClassData:
    """Class ids: token files with class ids, self-distillation over random classes."""

    token_file = staticmethod(_class_token_file)
    datasets = staticmethod(_class_datasets)

    @staticmethod
    def eval_conds(target, data_cfg, n: int):
        """Held-out decoding conditions: class ids 0..n-1, cycled over the classes."""
        tcfg = target.config
        return torch.arange(n) % family_of(tcfg).conditioning(tcfg).num_classes


class _CaptionData:
    """Caption features: caption ids beside the tokens, caption rollouts (train/captions.py)."""

    @staticmethod
    def token_file(path: Path, tcfg) -> TokenDataset:
        from .captions import load_caption_token_file

        return load_caption_token_file(path, tcfg)

    @staticmethod
    def datasets(target, cfg, seed, data_dir, **kw):
        from .captions import build_caption_dataset

        return build_caption_dataset(target, cfg, seed, data_dir, **kw)

    @staticmethod
    def eval_conds(target, data_cfg, n: int):
        from .captions import eval_captions

        return eval_captions(target, data_cfg, n)


class _PromptData:
    """Text prompts: a drafter trains on rollouts of the prompter's requests (`request=`), never on a
    DataConfig source."""

    @staticmethod
    def _refuse(target_or_cfg, *_, **__):
        tcfg = getattr(target_or_cfg, "config", target_or_cfg)
        raise InputError(f"{family_of(tcfg).name} targets are prompt-conditioned: train them on rollouts of prompts "
                         "(train_drafter(..., request=family.prompter(target).encode(texts, cfg=True)), or "
                         "train.requests.prompt_request(target, prompt_ids))")

    @staticmethod
    def token_file(path, tcfg):
        _PromptData._refuse(tcfg)

    datasets = eval_conds = _refuse


_KIND_DATA = {ClassLabels: _ClassData, CaptionFeatures: _CaptionData, TextPrompts: _PromptData}


def kind_data(tcfg):
    """What `tcfg`'s targets train on, per its family's conditioning kind (models/conditioning.py):
    an object with `token_file(path, tcfg)`, `datasets(target, cfg, seed, data_dir, is_main=,
    barrier=, progress=)` and `eval_conds(target, data_cfg, n)`."""
    return for_kind(family_of(tcfg).conditioning(tcfg), _KIND_DATA, "drafter training data")


# ----------------------------------------------------------------------------- batch order

def epoch_permutation(n: int, epoch: int, seed: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + epoch))


def batch_indices(step: int, n: int, global_batch: int, seed: int, rank: int = 0, world: int = 1) -> torch.Tensor:
    """Dataset rows of optimiser step `step` for `rank` (drop_last epochs of n // global_batch)."""
    per_epoch = n // global_batch
    if per_epoch == 0:
        raise InputError(f"{n} training sequences are fewer than one global batch ({global_batch})")
    epoch, b = divmod(step, per_epoch)
    rows = epoch_permutation(n, epoch, seed)[b * global_batch: (b + 1) * global_batch]
    return rows[rank::world]


# ----------------------------------------------------------------------------- features

class OnlineFeatures:
    """Target taps / logits / hidden computed on the fly for each batch."""

    def __init__(self, target, dataset: TokenDataset):
        self.target, self.dataset = target, dataset

    @torch.no_grad()
    def batch(self, rows: torch.Tensor) -> Batch:
        from .captions import as_target_cond

        device = self.target.output.weight.device
        cond, tokens = self.dataset.cond[rows].to(device), self.dataset.tokens[rows].to(device)
        tc = as_target_cond(self.target, cond)
        out = self.target.forward_train(tc, tokens, taps=True)
        return Batch(cond, tokens, out.taps, out.logits.float(), out.hidden, self.target.start_positions(tc))


def estimate_cache_bytes(n: int, tcfg, dtype: str = "float32", n_tokens: Optional[int] = None,
                         hidden: Optional[int] = None) -> int:
    """Bytes of a feature cache: n x tokens x (3H taps + H' hidden) x element size.

    n_tokens: tokens per sequence (default tcfg.block_size); hidden: width H' of the final hidden
    the head reads (default tcfg.dim)."""
    size = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    n_tokens = tcfg.block_size if n_tokens is None else n_tokens
    return n * n_tokens * (3 * tcfg.dim + (tcfg.dim if hidden is None else hidden)) * size


class FeatureCache:
    """Target features cached to safetensors shards under `root` (written once, read by slices)."""

    def __init__(self, target, dataset: TokenDataset, root, *, shard_size: int = 256, dtype: str = "float32"):
        from ..models.checkpoints import target_hash

        self.target, self.dataset, self.root = target, dataset, Path(root)
        self.shard_size, self.dtype = shard_size, dtype
        self.key = {"target_hash": target_hash(target), "data": dataset.fingerprint(), "n": len(dataset),
                    "shard_size": shard_size, "dtype": dtype}
        self._handles: dict = {}

    def _shard(self, i: int) -> Path:
        return self.root / f"shard_{i:05d}.safetensors"

    @property
    def n_shards(self) -> int:
        return math.ceil(len(self.dataset) / self.shard_size)

    def complete(self) -> bool:
        return all(_matches(self._shard(i), self.key) for i in range(self.n_shards))

    @torch.no_grad()
    def build(self, batch_size: int = 16, progress: bool = True) -> None:
        """Compute and write missing shards (prints the size estimate first)."""
        tcfg = self.target.config
        N, H = self.dataset.tokens.shape[1], self.target.output.in_features
        est = estimate_cache_bytes(len(self.dataset), tcfg, self.dtype, N, H)
        print(f"feature cache: {len(self.dataset)} sequences x {N} positions x {3 * tcfg.dim + H} "
              f"{self.dtype} = {_human(est)} in {self.n_shards} shards at {self.root}", flush=True)
        online = OnlineFeatures(self.target, self.dataset)
        dt = getattr(torch, self.dtype)
        for i in _tqdm(range(self.n_shards), progress, desc="caching target features", unit="shard"):
            if _matches(self._shard(i), self.key):
                continue
            lo, hi = i * self.shard_size, min((i + 1) * self.shard_size, len(self.dataset))
            taps, hidden = [], []
            for s in range(lo, hi, batch_size):
                b = online.batch(torch.arange(s, min(s + batch_size, hi)))
                taps.append(b.taps.to(dt).cpu())
                hidden.append(b.hidden.to(dt).cpu())
            save_safetensors({"taps": torch.cat(taps), "hidden": torch.cat(hidden)}, self._shard(i),
                             metadata={"key": self.key, "rows": [lo, hi]})

    def _handle(self, i: int):
        from safetensors import safe_open

        if i not in self._handles:
            self._handles[i] = safe_open(str(self._shard(i)), framework="pt")
        return self._handles[i]

    @torch.no_grad()
    def batch(self, rows: torch.Tensor) -> Batch:
        device = self.target.output.weight.device
        taps, hidden = [], []
        for r in rows.tolist():
            h = self._handle(r // self.shard_size)
            o = r % self.shard_size
            taps.append(h.get_slice("taps")[o:o + 1])
            hidden.append(h.get_slice("hidden")[o:o + 1])
        from .captions import as_target_cond

        wdt = self.target.output.weight.dtype
        hid = torch.cat(hidden).to(device=device, dtype=wdt)
        logits = self.target.output(hid).float()
        cond = self.dataset.cond[rows].to(device)
        return Batch(cond, self.dataset.tokens[rows].to(device), torch.cat(taps).to(device=device, dtype=wdt),
                     logits, hid, self.target.start_positions(as_target_cond(self.target, cond)))


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n:.1f} TiB"


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


def encode_image_folder(vq, folder, out_path, *, grid, batch: int = 32, progress: bool = True) -> Path:
    """Encode a folder of images with the VQ into a token file for `--data tokens`.

    Layout: one sub-folder per class, named by its class id ("0", "1", ...) or, when the names
    are not all integers, numbered in sorted order. `grid`: the target's token grid, (h, w) (its
    config's `grid_hw`) or one side of a square. Images are centre-cropped to the grid's aspect
    ratio and resized to (h, w) * downsample pixels. Writes a .safetensors with "tokens" (N, h * w)
    and "classes" (N,) atomically, and returns its path.
    """
    from PIL import Image

    from ..io import save_safetensors
    from ..progress import iterate

    folder = Path(folder)
    subdirs = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    if not subdirs:
        raise InputError(f"{folder} must contain one sub-folder of images per class (e.g. {folder}/0/*.png)")
    numeric = all(p.name.isdigit() for p in subdirs)
    gh, gw = (grid, grid) if isinstance(grid, int) else (int(grid[0]), int(grid[1]))
    H, W = gh * vq.config.downsample, gw * vq.config.downsample
    items = []
    for i, d in enumerate(subdirs):
        cid = int(d.name) if numeric else i
        items += [(f, cid) for f in sorted(d.iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES]
    if not items:
        raise InputError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under {folder}/*/")

    def load(path):
        im = Image.open(path).convert("RGB")
        w, h = im.size
        scale = min(w / W, h / H)  # the largest centred box of the grid's aspect ratio
        cw, ch = round(W * scale), round(H * scale)
        box = ((w - cw) // 2, (h - ch) // 2, (w - cw) // 2 + cw, (h - ch) // 2 + ch)
        im = im.crop(box).resize((W, H), Image.BICUBIC)
        return torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float() / 127.5 - 1.0

    tokens = []
    with torch.no_grad():
        for a in iterate(range(0, len(items), batch), progress, desc="encode images"):
            x = torch.stack([load(f) for f, _ in items[a: a + batch]])
            tokens.append(vq.encode(x.to(vq.codebook().device)).cpu())
    out_path = Path(out_path)
    save_safetensors({"tokens": torch.cat(tokens).long(), "classes": torch.tensor([c for _, c in items])},
                     out_path, metadata={"kind": "lisa-trt/tokens", "source": str(folder), "image_size": H if H == W else [H, W]})
    return out_path
