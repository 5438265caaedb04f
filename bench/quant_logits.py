"""Logit error of the quantized ORT target on REAL decoding states (teacher forcing), vs torch fp32.

The export validation uses random ids and random caches (an upper bound). Here the demo target
generates `--images` images with vanilla decoding (torch fp32); then each engine directory
(fp32 / int8 / int4 ORT) and the torch model re-read the same token sequences in one causal
forward (CFG pair: class row + unconditional row), and the logits are compared:
max |diff|, mean |diff|, top-1 agreement, and the max total-variation distance of the softmax.

    python bench/quant_logits.py --engines fp32=DIR int8=DIR int4=DIR --json bench/quant_logits.json
"""

from __future__ import annotations

import argparse
import time

import torch


def teacher_forced_logits(target, cond: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(B, N, V) logits of `target` (torch Transformer or ORT runner) reading `tokens` after `cond`."""
    B, N = tokens.shape
    cache = target.new_cache(B, extra=16)
    target.prefill(cond, cache)
    pos = cache.lengths[:, None] + torch.arange(N)[None]
    anc = torch.tril(torch.ones(N, N, dtype=torch.bool))[None].expand(B, -1, -1)
    with torch.no_grad():
        return target.forward_tokens(tokens, pos, pos, cache.attention_mask(pos, anc), cache).logits.float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", nargs="+", required=True, help="name=engine_dir ...")
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    from lisa_trt.demo.registry import demo_sampling, load_demo_target
    from lisa_trt.engines.ort import load_ort_engines
    from lisa_trt.io import write_json
    from lisa_trt.speculative.autoregressive import generate

    ref = load_demo_target()
    cfg = ref.config
    classes = torch.arange(a.images) % cfg.num_classes
    s = demo_sampling()
    toks = torch.cat([generate(ref, classes[i:i + 1], seed=i, cfg_scale=s.cfg_scale, temperature=s.temperature,
                               top_k=s.top_k, top_p=s.top_p) for i in range(a.images)])  # (n, N)
    cond = torch.cat([classes, torch.full_like(classes, cfg.num_classes)])  # class rows, then unconditional
    seq = torch.cat([toks, toks])
    want = teacher_forced_logits(ref, cond, seq)
    from pathlib import Path

    from lisa_trt.export.int8_isa import cpu_kind

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?")
    out = {"images": a.images, "tokens_per_image": toks.shape[1], "note": __doc__.split("\n\n")[0],
           "cpu": cpu, "cpu_kind": cpu_kind(), "engines": {}}
    for spec in a.engines:
        name, path = spec.split("=", 1)
        t0 = time.perf_counter()
        have = teacher_forced_logits(load_ort_engines(path, threads=1).target, cond, seq)
        d = (have - want).abs()
        tvd = 0.5 * (have.softmax(-1) - want.softmax(-1)).abs().sum(-1)
        out["engines"][name] = {"max_abs_logit_diff": d.max().item(), "mean_abs_logit_diff": d.mean().item(),
                                "top1_agreement": (have.argmax(-1) == want.argmax(-1)).float().mean().item(),
                                "max_tvd": tvd.max().item(), "mean_tvd": tvd.mean().item(),
                                "seconds": round(time.perf_counter() - t0, 2)}
        print(name, out["engines"][name], flush=True)
    write_json(a.json, out)


if __name__ == "__main__":
    main()
