"""The ceiling of tree speculation on this CPU (issue 12): how fast can LISA be with NO host work?

Two measurements in ONE run, then arithmetic:

1. Engine cost per call, through the runtime's own engines (ONNX Runtime, in-place KV cache,
   1 thread, CFG batch of 2 rows, demo bundle from `lisa-trt demo` or `--engine-dir`): the
   target verifying S new tokens, c(S), for S = 1 (a vanilla step) .. 16; one drafter step with
   S nodes, d(S); the drafter's tap projection; the GASV graph over S nodes, g(S).
2. Acceptance (MAL, tokens per target forward) per tree and rule, measured with the PyTorch
   reference (acceptance does not depend on the backend), batched, same prompts and seeds for
   every point: exact, GASV at the tables' knobs, LANTERN delta 0.2, and the ORACLE drafter (the
   target's own top-k at every node: the best exact MAL any drafter can reach on that tree).

Ceilings per tree and rule, zero host time (the loop costs nothing but its engine calls):
    engine-only speed-up = MAL * c(1) / (c(S) + calls_d * d + project + [g(S) for GASV])
    perfect-drafter bound = MAL_oracle * c(1) / c(S)          (drafting free, exact rule)
and the speed-up that the issue asks for (1.3x vanilla) needs MAL >= 1.3 * (engine step) / c(1).
If the engine-only ceiling is below 1.3x, no host optimisation can reach it on this machine.

    python bench/cpu_ceiling.py --engine-dir lisa-trt-demo/engines --images 32 --json bench/cpu_ceiling.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ort_cost_curve import median_ms  # noqa: E402
from lisa_trt.speculative.methods import resolve_method


def _ms(fn, reps: int) -> float:
    return median_ms(fn, reps, warmup=3)  # bench/ort_cost_curve.py: median of reps after warm-up


def engine_costs(engine_dir: str, s_list, reps: int) -> dict:
    """c(S), d(S), project, g(S) in ms through the runtime's graph engines (CFG batch 2)."""
    from lisa_trt.engines.graph import load_engines

    eng = load_engines(engine_dir, "ort", threads=1)
    tgt, dr, gasv = eng.target, eng.drafter, eng.gasv
    B, tc = 2, tgt.config
    cache = tgt.new_cache(B, extra=max(s_list))
    cond = torch.tensor([0, tc.num_classes])  # cond row, null-class row
    tgt.prefill(cond, cache, taps=True)
    cache.lengths.fill_(tc.cls_token_num + 100)  # a mid-image state: 100 committed tokens
    out = {"verify_ms": {}, "drafter_step_ms": {}, "gasv_ms": {}}
    for S in s_list:
        tok = torch.randint(0, tc.vocab_size, (B, S))
        slots = cache.lengths[:, None] + torch.arange(S)[None]
        pos = slots - tc.cls_token_num
        anc = torch.tril(torch.ones(S, S, dtype=torch.bool))[None].expand(B, S, S)
        mask = cache.attention_mask(slots, anc)
        out["verify_ms"][S] = _ms(lambda: tgt.forward_tokens(tok, pos, slots, mask, cache, taps=True), reps)
    dc = dr.new_cache(B, tc.seq_len + max(s_list))
    dc.lengths.fill_(tc.cls_token_num + 100)
    taps = torch.randn(B, 2, dr.config.tap_dim)
    out["drafter_project_ms"] = _ms(lambda: dr.project_taps(taps), reps)
    for S in s_list:
        h = torch.randn(B, S, dr.config.hidden)
        tok = torch.randint(0, tc.vocab_size, (B, S))
        slots = dc.lengths[:, None] + torch.arange(S)[None]
        pos = (slots - tc.cls_token_num).clamp(max=tc.seq_len - 1)
        mask = dc.attention_mask(slots, torch.tril(torch.ones(S, S, dtype=torch.bool))[None].expand(B, S, S))
        out["drafter_step_ms"][S] = _ms(lambda: dr.forward(h, tok, pos, slots, mask, dc), reps)
        if gasv is not None:
            lg = torch.randn(S, tc.vocab_size) * 3
            nt = torch.randint(0, tc.vocab_size, (S,))
            par = torch.arange(S) - 1
            out["gasv_ms"][S] = _ms(lambda: gasv(lg, nt, par), reps)
    eng.close()
    return out


def acceptance(trees, methods, images: int, batch: int, seed: int, have: dict | None = None) -> dict:
    """MAL per (tree, method) with the PyTorch reference, same prompts and seeds for every point
    (points already in `have` are kept, not re-measured)."""
    from lisa_trt.artifacts import load_drafter_by_name, load_tables_by_name
    from lisa_trt.demo.registry import demo_sampling, load_demo_target
    from lisa_trt.speculative.methods import SpecConfig
    from lisa_trt.speculative.run import run_method

    target = load_demo_target()
    tables = load_tables_by_name("demo", target)
    drafter = load_drafter_by_name("demo-lisa", target)
    sampling = demo_sampling()
    res = {k: dict(v) for k, v in (have or {}).items()}
    for k, d, n in trees:
        key = f"{k},{d},{n}"
        res.setdefault(key, {})
        for label, method, over in methods:
            if label in res[key]:
                continue
            spec = SpecConfig.make(method, top_k=k, depth=d, total_tokens=n, **over)
            com, tvd, t0 = [], [], time.perf_counter()
            for i0 in range(0, images, batch):
                cond = torch.arange(i0, min(images, i0 + batch)) % target.config.num_classes
                _, st = run_method(resolve_method(method), target, drafter, tables, cond, sampling=sampling, spec=spec,
                                   seed=seed + i0)
                com += [c.float() for c in st.committed]
                tvd += [t.float() for t in st.tvd]
            c = torch.cat(com)
            res[key][label] = {"mal": float(c.mean()), "mal_stderr_steps": float(c.std() / c.numel() ** 0.5),
                               "mean_tvd": float(torch.cat(tvd).mean()) if tvd else 0.0, "images": images,
                               "cpu_s": round(time.perf_counter() - t0, 1)}
            print(key, label, res[key][label], flush=True)
    return res


def ceilings(costs: dict, acc: dict) -> dict:
    c1 = costs["verify_ms"][1]
    out = {}
    for key, rules in acc.items():
        k, d, n = (int(x) for x in key.split(","))
        S = n  # the verify call carries every tree node but the root is the last committed token
        S_eff = min((s for s in costs["verify_ms"] if s >= S), default=max(costs["verify_ms"]))
        cS = costs["verify_ms"][S_eff]
        # per step: one drafter commit call (accepted path, <= d + 1 tokens) and one expansion
        # call per tree level below the root's children (d - 1 ... EAGLE-2 expands d levels; the
        # root's children come from the commit call), plus the tap projection
        d_commit = costs["drafter_step_ms"][min((s for s in costs["drafter_step_ms"] if s >= d + 1),
                                                default=max(costs["drafter_step_ms"]))]
        d_expand = costs["drafter_step_ms"][min((s for s in costs["drafter_step_ms"] if s >= k),
                                                default=max(costs["drafter_step_ms"]))]
        drafting = d_commit + d * d_expand + costs["drafter_project_ms"]
        row = {"verify_tokens": S, "c1_ms": c1, "cS_ms": cS, "drafting_ms": round(drafting, 4)}
        for label, r in rules.items():
            g = costs["gasv_ms"].get(S_eff, 0.0) if label.startswith("gasv") else 0.0
            step = cS + (0.0 if label == "oracle" else drafting) + g
            row[label] = {"mal": round(r["mal"], 4), "engine_step_ms": round(step, 4),
                          "engine_only_speedup": round(r["mal"] * c1 / step, 4),
                          "mal_needed_for_1.3x": round(1.3 * step / c1, 3)}
        if "oracle" in rules:
            row["perfect_drafter_bound"] = round(rules["oracle"]["mal"] * c1 / cS, 4)
        out[key] = row
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine-dir", default="lisa-trt-demo/engines")
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trees", default="2,1,4;3,2,6;3,3,10")
    ap.add_argument("--acceptance", default=None,
                    help="JSON of the acceptance part: reused if it exists, else computed and written (lets the "
                         "timing part run alone on a quiet machine)")
    ap.add_argument("--skip-costs", action="store_true", help="only compute --acceptance")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from lisa_trt.io import write_json

    import json
    from pathlib import Path

    trees = [tuple(int(x) for x in t.split(",")) for t in a.trees.split(";")]
    methods = [("exact", "exact", {}), ("oracle", "oracle", {}),
               ("gasv[kappa=0.5,lambda=0.8]", "gasv", {"gasv_kappa": 0.5, "gasv_lambda": 0.8, "gasv_delta": 1.0}),
               ("gasv[kappa=2,lambda=0.4,delta=0.3]", "gasv",
                {"gasv_kappa": 2.0, "gasv_lambda": 0.4, "gasv_delta": 0.3}),
               ("lantern[delta=0.2]", "lantern", {"lantern_delta": 0.2})]
    have = json.loads(Path(a.acceptance).read_text())["acceptance"] if a.acceptance and Path(a.acceptance).exists() \
        else {}
    acc = acceptance(trees, methods, a.images, a.batch, a.seed, have)
    if a.acceptance and acc != have:
        write_json(a.acceptance, {"command": " ".join(["python"] + sys.argv), "acceptance": acc})
    if a.skip_costs:
        return
    if not a.json:
        raise SystemExit("--json is required unless --skip-costs")
    load0 = os.getloadavg()
    costs = engine_costs(a.engine_dir, [1, 2, 3, 4, 6, 8, 10, 12, 16], a.reps)
    print("costs", costs, flush=True)
    report = {"command": " ".join(["python"] + sys.argv),
              "machine": {"cpu": platform.processor() or platform.machine(), "logical_cpus": os.cpu_count(),
                          "threads": 1, "loadavg_start": load0, "loadavg_end": os.getloadavg(),
                          "note": "engine costs are medians of repeated calls in one process; a loaded "
                                  "machine inflates all of them alike, the ratios c(S)/c(1) are what matter"},
              "acceptance_from": a.acceptance, "engine_costs_ms": costs, "acceptance": acc, "ceilings": ceilings(costs, acc)}
    write_json(a.json, report)
    for key, row in report["ceilings"].items():
        print(key, {k: (v["engine_only_speedup"] if isinstance(v, dict) else v) for k, v in row.items()})


if __name__ == "__main__":
    main()
