"""Stage 3a: pick the demo target size. For candidate LlamaGen configs measure
(1) verification latency vs number of new tokens S with a KV cache (batch 2 = CFG pair, 128
committed tokens), and (2) one training step (forward_train + backward + AdamW).

    python scripts/demo/bench_sizes.py --out bench/demo_sizes.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import common  # noqa: F401
from common import setup_torch

from lisa_trt.models.target_config import TargetConfig
from lisa_trt.io import write_json
from lisa_trt.families.llamagen.model import Transformer

CANDIDATES = {
    "d192-L8": dict(dim=192, n_layer=8, n_head=6),
    "d256-L8": dict(dim=256, n_layer=8, n_head=8),
    "d320-L10": dict(dim=320, n_layer=10, n_head=8),
    "d384-L12": dict(dim=384, n_layer=12, n_head=6),
}
BASE = dict(vocab_size=1024, block_size=256, num_classes=8, cls_token_num=1, model_type="c2i")


def _time(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


@torch.no_grad()
def verify_latency(model: Transformer, s_list, batch: int = 2, committed: int = 128, reps: int = 5) -> dict:
    cond = torch.arange(batch) % model.config.num_classes
    cache = model.new_cache(batch, extra=64)
    model.prefill(cond, cache)
    T = model.config.cls_token_num
    # fill `committed` tokens
    toks = torch.randint(0, model.config.vocab_size, (batch, committed))
    pos = (T + torch.arange(committed))[None].expand(batch, -1)
    anc = torch.tril(torch.ones(committed, committed, dtype=torch.bool))[None].expand(batch, -1, -1)
    model.forward_tokens(toks, pos, pos, cache.attention_mask(pos, anc), cache)
    cache.lengths += committed
    out = {}
    for S in s_list:
        toks = torch.randint(0, model.config.vocab_size, (batch, S))
        pos = cache.lengths[:, None] + torch.arange(S)[None]
        anc = torch.tril(torch.ones(S, S, dtype=torch.bool))[None].expand(batch, -1, -1)
        mask = cache.attention_mask(pos, anc)
        out[S] = round(1000 * _time(lambda: model.forward_tokens(toks, pos, pos, mask, cache), reps), 2)
    return out


def train_step_time(model: Transformer, batch: int, reps: int = 2) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    cond = torch.randint(0, model.config.num_classes, (batch,))
    toks = torch.randint(0, model.config.vocab_size, (batch, model.config.block_size))

    def step():
        logits = model.forward_train(cond, toks).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), toks.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    model.train()
    t = _time(step, reps)
    model.eval()
    return round(t, 3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench/demo_sizes.json"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--no-train", action="store_true", help="latency only (skip the training-step timing)")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    setup_torch(a.threads, 0)
    res = {}
    for name, kw in CANDIDATES.items():
        if a.only and name not in a.only:
            continue
        cfg = TargetConfig(**BASE, **kw)
        model = Transformer(cfg).eval()
        params = sum(p.numel() for p in model.parameters())
        lat = verify_latency(model, [1, 2, 4, 8, 16, 32], reps=a.reps)
        st = None if a.no_train else train_step_time(model, a.batch)
        res[name] = dict(config=cfg.to_dict(), params_m=round(params / 1e6, 2), verify_ms_batch2=lat,
                         train_step_s=st, train_batch=a.batch)
        print(name, res[name]["params_m"], "M", lat, "train step", st, "s", flush=True)
    write_json(a.out, dict(threads=a.threads, note="2-core CPU, shared with other jobs while measured",
                           results=res))


if __name__ == "__main__":
    main()
