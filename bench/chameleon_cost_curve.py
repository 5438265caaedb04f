#!/usr/bin/env python
"""Cost curve of a random Lumina-mGPT-7B-shaped Chameleon target (for a lent GPU).

    python bench/chameleon_cost_curve.py bench/chameleon_cost_curve_<gpu>.json   # CUDA, bf16
    python bench/chameleon_cost_curve.py /tmp/smoke.json --preset tiny            # CPU, seconds

Measures, with random weights of the real shapes (Chameleon-7B layout: 32 layers, hidden 4096,
32 heads, vocabulary 65,536), CFG batch 2 ([cond; uncond]):
- prefill latency of a text prompt (64 tokens by default);
- one tree-verification forward over S nodes (S = 1 .. 64, random tree masks) with the KV cache
  filled to the middle of a 768 x 768 image span (48 rows of 48 codes + row ends): the cost curve
  that sets the tree budget; plus peak GPU memory.
A 7B target is ~13.5 GiB in bf16 and ~27 GiB in fp32: it does not fit a 24 GiB CPU machine in
fp32, so the full preset is GPU-only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu_check import time_ms  # noqa: E402

PRESETS = {
    "lumina-7b": dict(vocab_size=65536, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=10240),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096),
}
TREE_SIZES = (1, 2, 4, 8, 16, 32, 48, 64)


def random_target(preset: str, device, dtype):
    """A ChameleonTarget with random weights, built on `device` without a CPU copy."""
    import torch

    from lisa_trt.families.chameleon.model import ChameleonConfig, ChameleonTarget

    with torch.device("meta"):
        t = ChameleonTarget(ChameleonConfig(**PRESETS[preset]))
    t = t.to_empty(device=device).to(dtype)
    t.reset_buffers()
    with torch.no_grad():
        for name, p in t.named_parameters():
            if "norm" in name:
                p.fill_(1.0) if name.endswith("weight") else p.zero_()
            else:
                p.normal_(0.0, 0.02)
    return t.eval()


def cost_curve(target, *, prompt_len: int = 64, context: int = 1200, sizes=TREE_SIZES, reps: int = 10,
               warmup: int = 3) -> dict:
    import torch

    dev = target.lm_head.weight.device
    cuda = dev.type == "cuda"
    B, V = 2, target.config.vocab_size
    ids = torch.randint(0, V, (B, prompt_len), device=dev)
    cache = target.new_cache(B, prompt_len + context + max(sizes))
    out = {"prefill": time_ms(lambda: target.prefill(ids, cache), reps=reps, warmup=warmup, cuda=cuda)}
    cache.lengths.fill_(prompt_len + context)  # as if `context` span tokens were committed
    g = torch.Generator(device="cpu").manual_seed(0)
    curve = {}
    for S in sizes:
        parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, S)])
        anc = torch.eye(S, dtype=torch.bool)
        for i in range(1, S):
            anc[i] |= anc[parents[i]]
        depth = anc.sum(1) - 1
        slots = cache.lengths[:, None] + torch.arange(S, device=dev)[None]
        pos = cache.positions(cache.lengths[:, None]) + depth.to(dev)[None]
        mask = cache.attention_mask(slots, anc.to(dev)[None].expand(B, S, S))
        tok = torch.randint(0, V, (B, S), device=dev)
        curve[S] = time_ms(lambda: target.forward_tokens(tok, pos, slots, mask, cache), reps=reps,
                           warmup=warmup, cuda=cuda)
    out["verify"] = curve
    if cuda:
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
    return out


def main(argv=None) -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="lumina-7b")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    ap.add_argument("--context", type=int, default=1200)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if args.preset != "tiny" and not cuda:
        raise SystemExit("the lumina-7b preset needs a CUDA GPU (it does not fit 24 GiB of CPU memory in fp32); "
                         "use --preset tiny for a CPU smoke run")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if not cuda:
        dtype = torch.float32
    with torch.no_grad():
        target = random_target(args.preset, "cuda" if cuda else "cpu", dtype)
        small = args.preset == "tiny"
        res = cost_curve(target, context=min(args.context, 200) if small else args.context,
                         sizes=(1, 4, 16) if small else TREE_SIZES, reps=2 if small else 10, warmup=1 if small else 3)
    res.update(preset=args.preset, dtype=str(dtype), device=torch.cuda.get_device_name() if cuda else "cpu",
               torch=torch.__version__)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res["verify"], indent=1))


if __name__ == "__main__":
    main()
