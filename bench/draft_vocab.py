"""Reduced draft vocabulary (issue 11 item 5): drafter step cost and acceptance vs N.

1. Cost: an EAGLE-3 drafter for a random GPT-B-shaped target with 16,384 codes (dim 768); one
   tree-expansion call over K nodes attending to a full-sequence cache, for N = 16384 / 8192 /
   4096 draft codes. Median wall time (torch, CPU, threads pinned) and the FLOP model of
   models/draft_vocab.py (what runtime/autotune.draft_cost_for_head uses).
2. Acceptance: the demo (1,024 codes) with N scaled in proportion (1024 / 512 / 256). The
   bundled demo-lisa drafter's head is PRUNED to the N most frequent codes of sequences the
   demo target samples (no retraining: a lower bound on `lisa-trt train --draft-vocab N`),
   exact MAL on held-out seeds.

    OMP_NUM_THREADS=1 python bench/draft_vocab.py --json bench/draft_vocab.json
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
from lisa_trt.speculative.methods import get_method


def step_cost(n_codes: int, k: int, reps: int) -> dict:
    from lisa_trt.models.target_config import target_config
    from lisa_trt.models.draft_vocab import config_step_flops
    from lisa_trt.models.drafter import Drafter, DrafterConfig

    tcfg = target_config("GPT-B", vocab_size=16384)
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(tcfg.vocab_size, tcfg.dim, generator=g) * 0.02
    full = n_codes == tcfg.vocab_size
    cfg = DrafterConfig.for_target(tcfg, draft_vocab=0 if full else n_codes)
    d2t = None if full else torch.randperm(tcfg.vocab_size, generator=g)[:n_codes].sort().values
    torch.manual_seed(0)
    drafter = Drafter(cfg, emb, d2t=d2t).eval()
    cache = drafter.new_cache(2, tcfg.seq_len + 64)  # CFG batch of one prompt
    L = tcfg.seq_len - 8
    cache.lengths.fill_(L)
    B = 2
    hidden = torch.randn(B, k, cfg.hidden, generator=g)
    tokens = torch.randint(0, tcfg.vocab_size, (B, k), generator=g)
    slots = L + torch.arange(k)[None].expand(B, k)
    pos = torch.full((B, k), L, dtype=torch.long)
    mask = cache.attention_mask(slots, torch.eye(k, dtype=torch.bool)[None].expand(B, k, k))
    ts = []
    with torch.no_grad():
        for i in range(reps + 1):
            t0 = time.perf_counter()
            drafter(hidden, tokens, pos, slots, mask, cache)
            if i:
                ts.append(time.perf_counter() - t0)
    return {"draft_vocab": n_codes, "median_s": sorted(ts)[len(ts) // 2], "min_s": min(ts),
            "gflops_model": config_step_flops(cfg, B * k, L) / 1e9,
            "head_params": cfg.hidden * cfg.head_size}


def demo_acceptance(fracs, n_count: int, n_eval: int) -> list:
    from lisa_trt.artifacts import load_drafter_by_name
    from lisa_trt.demo.registry import demo_sampling, load_demo_target
    from lisa_trt.models.draft_vocab import build_d2t, coverage, prune_head
    from lisa_trt.speculative.autoregressive import generate
    from lisa_trt.speculative.decode import SpecConfig, SpeculativeDecoder

    target = load_demo_target()
    drafter = load_drafter_by_name("demo-lisa", target)
    s = demo_sampling()
    V = target.config.vocab_size
    ncls = target.config.num_classes
    count_cond = torch.arange(n_count) % ncls
    counted = generate(target, count_cond, seed=12345, cfg_scale=s.cfg_scale, temperature=s.temperature,
                       top_k=s.top_k, top_p=s.top_p)
    spec = SpecConfig.make("exact", top_k=3, depth=3, total_tokens=10)
    rows = []
    for f in fracs:
        n = int(V * f)
        d = drafter if n == V else prune_head(drafter, build_d2t(counted, V, n)).eval()
        mals, outs = [], []
        for i in range(n_eval):
            toks, st = SpeculativeDecoder(target, d).generate(torch.tensor([i % ncls]), sampling=s, method=get_method(spec.method), spec=spec,
                                                              seed=777 + i)
            mals.append(st.mal)
            outs.append(toks)
        d2t = build_d2t(counted, V, n)
        rows.append({"draft_vocab": n, "exact_mal": sum(mals) / len(mals),
                     "heldout_token_coverage": coverage(torch.cat(outs), d2t)})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--nodes", type=int, default=10, help="nodes per expansion call (tree top_k)")
    ap.add_argument("--count-images", type=int, default=16)
    ap.add_argument("--eval-images", type=int, default=8)
    ap.add_argument("--cost-only", action="store_true",
                    help="re-measure the step cost only; keep the acceptance rows of an existing --json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    from lisa_trt.io import write_json

    cost = [step_cost(n, a.nodes, a.reps) for n in (16384, 8192, 4096)]
    base = cost[0]["median_s"]
    for r in cost:
        r["relative_to_full"] = r["median_s"] / base
    if a.cost_only:
        import json
        from pathlib import Path

        old = json.loads(Path(a.json).read_text()) if Path(a.json).is_file() else {}
        acc = old.get("demo_acceptance_pruned_head", [])
        a.count_images = old.get("settings", {}).get("count_images", a.count_images)
        a.eval_images = old.get("settings", {}).get("eval_images", a.eval_images)
    else:
        acc = demo_acceptance((1.0, 0.5, 0.25), a.count_images, a.eval_images)
    rec = {"cost_gpt_b_16384": cost, "demo_acceptance_pruned_head": acc,
           "settings": {"nodes_per_call": a.nodes, "cfg_batch": 2, "reps": a.reps, "threads": 1,
                        "count_images": a.count_images, "eval_images": a.eval_images,
                        "tree": {"top_k": 3, "depth": 3, "total_tokens": 10}, "verification": "exact",
                        "machine": platform.processor() or platform.machine(), "torch": torch.__version__}}
    write_json(a.json, rec)
    for r in cost:
        print(f"N={r['draft_vocab']:5d}  drafter call {1e3 * r['median_s']:.2f} ms ({r['relative_to_full']:.2f}x)  "
              f"model {r['gflops_model']:.3f} GFLOP")
    for r in acc:
        print(f"demo N={r['draft_vocab']:4d}  exact MAL {r['exact_mal']:.3f}  coverage {r['heldout_token_coverage']:.3f}")


if __name__ == "__main__":
    main()
