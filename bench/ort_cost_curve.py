"""Verification cost curve on this CPU: latency vs number of new tokens, ONNX Runtime vs torch eager.

For each model: export target + drafter (fp32, validated) into --workdir (default /tmp), fill a
CFG batch of 2 rows with `--committed` tokens, then time one tree-verification call with S new
tokens (S = 1..64, a chain mask) through ORT (IO binding, in-place cache) and torch eager, and
one drafter step with S nodes. Median of `--reps` timed runs after a warm-up. Also records:
- commit check: the verify graph returns only the step's new K/V rows and the runner commits them
  into the one cache: cache bytes vs bytes a step writes, the cache kept in place, the commit's time
  (`inplace` in results recorded before the new-rows graphs measured the old whole-cache copy);
- alternating sessions (drafter step, then verify) with ORT thread spinning on vs off;
- a thread probe: each backend runs at its best of {1, physical cores} threads (on a busy 2-core
  machine torch's 2-thread MKL/OpenMP GEMMs can be 100x slower than 1 thread).

Models: `demo` (the bundled demo model when lisa_trt/assets/demo has it, else a random model of
the demo's size), and random official-shaped GPT-B / GPT-L (block 256, c2i).

    python bench/ort_cost_curve.py                      # all three, writes bench/ort_cost_curve.{json,png}
    python bench/ort_cost_curve.py --models demo --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

S_LIST = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64]
DRAFT_S = [1, 2, 4, 8, 16, 32, 64]
DEMO_SIZE = dict(dim=256, n_layer=8, n_head=8, vocab_size=1024, block_size=256, num_classes=8)


LAST_MIN: list = []  # min of the last median_ms call (contention-robust companion of the median)


def median_ms(fn, reps: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    LAST_MIN[:] = [round(1000 * min(ts), 3)]
    return round(1000 * statistics.median(ts), 3)


def build_target(name: str):
    """(target, description) for 'demo', 'GPT-B', 'GPT-L'."""
    from lisa_trt.models.target_config import TargetConfig, target_config
    from lisa_trt.families.llamagen.model import Transformer

    torch.manual_seed(0)
    if name == "demo":
        from lisa_trt.demo import registry

        if registry.assets_present():
            from lisa_trt import load_target

            return load_target("demo"), "bundled demo model (lisa_trt/assets/demo)"
        cfg = TargetConfig(**DEMO_SIZE)
        return Transformer(cfg).eval(), f"random demo-sized model {DEMO_SIZE} (demo assets absent)"
    return Transformer(target_config(name, image_size=256)).eval(), f"random official-shaped {name} (block 256, c2i)"


def fill(engine, cond, committed: int, max_tree: int):
    """Prefill + `committed` causal tokens; returns the cache."""
    cfg = engine.config
    B = cond.shape[0]
    cache = engine.new_cache(B, extra=max_tree)
    engine.prefill(cond, cache)
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, cfg.vocab_size, (B, committed), generator=g)
    pos = cache.lengths[:, None] + torch.arange(committed)[None]
    anc = torch.tril(torch.ones(committed, committed, dtype=torch.bool))[None].expand(B, -1, -1)
    engine.forward_tokens(toks, pos, pos, cache.attention_mask(pos, anc), cache)
    cache.lengths += committed
    return cache


def step_args(cache, S: int, vocab: int):
    B = cache.batch
    toks = torch.randint(0, vocab, (B, S))
    pos = cache.lengths[:, None] + torch.arange(S)[None]
    anc = torch.tril(torch.ones(S, S, dtype=torch.bool))[None].expand(B, -1, -1)
    return toks, pos, pos, cache.attention_mask(pos, anc)


@torch.no_grad()
def verify_curve(engine, cond, committed, max_tree, reps, s_list) -> dict:
    cache = fill(engine, cond, committed, max_tree)
    out, best = {}, {}
    for S in s_list:
        args = step_args(cache, S, engine.config.vocab_size)
        out[str(S)] = median_ms(lambda: engine.forward_tokens(*args, cache, taps=True), reps)
        best[str(S)] = LAST_MIN[0]
    return dict(median=out, min=best)


@torch.no_grad()
def drafter_curve(drafter, cond_len, batch, max_len, reps, s_list) -> dict:
    cfg = drafter.config
    cache = drafter.new_cache(batch, max_len)
    cache.lengths.fill_(cond_len)
    out, best = {}, {}
    for S in s_list:
        args = step_args(cache, S, cfg.vocab_size)
        h = torch.randn(batch, S, cfg.hidden)
        out[str(S)] = median_ms(lambda: drafter.forward(h, *args, cache), reps)
        best[str(S)] = LAST_MIN[0]
    taps = torch.randn(batch, 1, cfg.tap_dim)
    return dict(median=out, min=best, project_taps_S1=median_ms(lambda: drafter.project_taps(taps), reps))


@torch.no_grad()
def commit_check(engines, cond, committed, max_tree, reps) -> dict:
    """The cache update of a verify call (S = 1): the graph returns only the new K/V rows and the
    runner commits them (engines/graph._run_kv -> models/layers.commit_rows). Records the cache's
    bytes against the rows a step writes, that the cache stays at its addresses and is written in
    place, and the commit's share of the call's time."""
    from lisa_trt.models.layers import commit_rows

    tgt = engines.target
    cache = fill(tgt, cond, committed, max_tree)
    toks, pos, slots, mask = step_args(cache, 1, tgt.config.vocab_size)
    ptrs = [t.data_ptr() for t in cache.k + cache.v]
    before = cache.k[0].clone()
    tgt.forward_tokens(toks, pos, slots, mask, cache)
    B, H, _, D = cache.k[0].shape
    rows = torch.randn(B, H, 1, D, dtype=cache.k[0].dtype)
    res = dict(cache_bytes=sum(b.numel() * b.element_size() for b in cache.k + cache.v),
               rows_bytes_per_step=2 * len(cache.k) * rows.numel() * rows.element_size(),
               cache_pointers_unchanged=ptrs == [t.data_ptr() for t in cache.k + cache.v],
               cache_written_in_place=not torch.equal(before, cache.k[0]))
    res["verify_S1_ms"] = median_ms(lambda: tgt.forward_tokens(toks, pos, slots, mask, cache), reps)

    def commit():
        for buf in cache.k + cache.v:
            commit_rows(buf, rows, slots)

    res["commit_S1_ms"] = median_ms(commit, reps)
    return res


@torch.no_grad()
def wrapper_overhead(engines, cond, committed, max_tree, reps) -> dict:
    """GraphTarget.forward_tokens (ORT) (checks, tensor prep, binding, run) vs the bare ORT run (S = 1).

    Measured twice in alternation (full, bare, full, bare), best median of each kept.
    """
    tgt = engines.target
    cache = fill(tgt, cond, committed, max_tree)
    toks, pos, slots, mask = step_args(cache, 1, tgt.config.vocab_size)
    ins = dict(input_ids=toks, position_ids=pos, cache_slots=slots, attention_mask=mask)
    outs = tgt._verify.allocate(ins, ["logits", "taps", "hidden"])  # alive while bound
    io, sess = tgt._verify._io, tgt._verify.session
    full, bare = [], []
    for _ in range(2):
        full.append(median_ms(lambda: tgt.forward_tokens(toks, pos, slots, mask, cache), 10 * reps, warmup=5))
        tgt._run_kv(tgt._verify, cache, tgt.config.n_layer, dict(ins), dict(outs))  # rebind to live buffers
        bare.append(median_ms(lambda: sess.run_with_iobinding(io), 10 * reps, warmup=5))
    f, b = min(full), min(bare)
    return dict(forward_tokens_ms=f, bare_run_ms=b, wrapper_ms=round(f - b, 3), wrapper_fraction=round((f - b) / f, 3))


@torch.no_grad()
def alternating(engine_dir, cond, committed, max_tree, reps, threads) -> dict:
    """Drafter step (S=8) then verify (S=16), alternating sessions, ORT spinning on vs off."""
    from lisa_trt.engines.ort import load_ort_engines

    res = {}
    for spin in (False, True):
        eng = load_ort_engines(engine_dir, threads=threads, spin=spin)
        cache = fill(eng.target, cond, committed, max_tree)
        dcache = eng.drafter.new_cache(cache.batch, cache.max_len)
        dcache.lengths.copy_(cache.lengths)
        vargs = step_args(cache, 16, eng.target.config.vocab_size)
        dargs = step_args(dcache, 8, eng.drafter.config.vocab_size)
        h = torch.randn(cache.batch, 8, eng.drafter.config.hidden)

        def pair():
            eng.drafter.forward(h, *dargs, dcache)
            eng.target.forward_tokens(*vargs, cache, taps=True)

        res[f"spin_{'on' if spin else 'off'}_ms"] = median_ms(pair, reps)
    return res


@torch.no_grad()
def probe_threads(make, cond, committed, max_tree, counts, reps=3) -> tuple:
    """Time S = 1 and S = 16 at each thread count; (best count, {count: {S: ms}})."""
    res = {}
    for n in counts:
        engine = make(n)
        cache = fill(engine, cond, committed, max_tree)
        res[n] = {}
        for S in (1, 16):
            a = step_args(cache, S, engine.config.vocab_size)
            res[n][str(S)] = median_ms(lambda: engine.forward_tokens(*a, cache, taps=True), reps)
    best = min(res, key=lambda n: sum(res[n].values()))
    return best, {str(n): v for n, v in res.items()}


def bench_model(name: str, args) -> dict:
    from lisa_trt.engines.ort import load_ort_engines
    from lisa_trt.export import export_bundle
    from lisa_trt.models.drafter import Drafter

    target, desc = build_target(name)
    torch.manual_seed(1)
    drafter = Drafter.from_target(target).eval()
    cfg = target.config
    print(f"[{name}] {desc}: dim {cfg.dim}, {cfg.n_layer} layers, vocab {cfg.vocab_size}", flush=True)
    out_dir = Path(args.workdir) / name
    t0 = time.perf_counter()
    man = export_bundle(target, drafter, None, None, out_dir, max_tree=args.max_tree, lint=False,
                        progress=False, validate=True)
    export_s = round(time.perf_counter() - t0, 1)
    onnx_bytes = sum(p.stat().st_size for p in out_dir.iterdir())
    print(f"[{name}] exported in {export_s} s ({onnx_bytes / 2**20:.0f} MiB)", flush=True)
    cond = torch.tensor([1, cfg.num_classes])  # CFG pair: [cond; uncond]
    reps = args.reps if cfg.dim < 700 else max(2, args.reps - 2)
    counts = sorted({1, args.threads})
    ort_threads, ort_probe = probe_threads(lambda n: load_ort_engines(out_dir, threads=n).target, cond,
                                           args.committed, args.max_tree, counts)

    def torch_at(n):
        torch.set_num_threads(n)
        return target

    torch_threads, torch_probe = (probe_threads(torch_at, cond, args.committed, args.max_tree, counts)
                                  if name in args.torch_models else (None, None))
    print(f"[{name}] thread probe: ort {ort_probe} -> {ort_threads}; torch {torch_probe} -> {torch_threads}", flush=True)
    eng = load_ort_engines(out_dir, threads=ort_threads)
    res = dict(description=desc, config=cfg.to_dict(), export_seconds=export_s, onnx_mib=round(onnx_bytes / 2**20, 1),
               max_cache_len=man.max_cache_len, committed=args.committed, batch=2, reps=reps,
               validation={k: g.validation["max_error"] for k, g in man.graphs.items()},
               threads={"ort": ort_threads, "torch": torch_threads, "probe_ms": {"ort": ort_probe, "torch": torch_probe}},
               measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"), load_average_before=[round(x, 2) for x in os.getloadavg()])
    res["verify_ms"] = {"ort": verify_curve(eng.target, cond, args.committed, args.max_tree, reps, S_LIST)}
    print(f"[{name}] ort verify {res['verify_ms']['ort']}", flush=True)
    if name in args.torch_models:
        torch.set_num_threads(torch_threads)
        res["verify_ms"]["torch"] = verify_curve(target, cond, args.committed, args.max_tree, reps, S_LIST)
        print(f"[{name}] torch verify {res['verify_ms']['torch']}", flush=True)
    max_len = man.max_cache_len
    res["drafter_ms"] = {"ort": drafter_curve(eng.drafter, cfg.cls_token_num + args.committed, 2, max_len, reps, DRAFT_S)}
    if name in args.torch_models:
        res["drafter_ms"]["torch"] = drafter_curve(drafter, cfg.cls_token_num + args.committed, 2, max_len, reps,
                                                   DRAFT_S)
    print(f"[{name}] drafter {res['drafter_ms']}", flush=True)
    res["commit"] = commit_check(eng, cond, args.committed, args.max_tree, max(reps, 7))
    print(f"[{name}] commit {res['commit']}", flush=True)
    if name == "demo":
        res["alternating_sessions"] = alternating(out_dir, cond, args.committed, args.max_tree, reps, ort_threads)
        print(f"[{name}] alternating {res['alternating_sessions']}", flush=True)
        res["wrapper_overhead"] = wrapper_overhead(eng, cond, args.committed, args.max_tree, reps)
        print(f"[{name}] wrapper overhead {res['wrapper_overhead']}", flush=True)
    res["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    del eng
    if not args.keep:
        shutil.rmtree(out_dir, ignore_errors=True)
    return res


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["models"])
    fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        r = results["models"][name]
        for backend, style in (("ort", "-o"), ("torch", "--s")):
            if backend in r["verify_ms"]:
                c = sorted((int(s), v) for s, v in r["verify_ms"][backend]["median"].items())
                ax.plot(*zip(*c), style, label=f"target verify ({backend})", ms=3)
            if backend in r["drafter_ms"]:
                c = sorted((int(s), v) for s, v in r["drafter_ms"][backend]["median"].items())
                ax.plot(*zip(*c), style, label=f"drafter step ({backend})", ms=3, alpha=0.6)
        ax.set_title(f"{name}: dim {r['config']['dim']}, {r['config']['n_layer']} layers")
        ax.set_xlabel("new tokens S (batch 2 = CFG)")
        ax.set_ylabel("latency (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Verification cost on {results['machine']['cpu']} ({results['machine']['logical_cpus']} cpus; "
                 "each backend at its best thread count)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def machine_info(threads: int) -> dict:
    import onnxruntime

    cpu = platform.processor() or "cpu"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return dict(cpu=cpu, logical_cpus=os.cpu_count(), load_average_at_start=[round(x, 2) for x in os.getloadavg()],
                torch=torch.__version__, onnxruntime=onnxruntime.__version__, threads=threads)


def main(argv=None) -> None:
    from lisa_trt.engines.ort import physical_cores

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="demo,GPT-B,GPT-L")
    p.add_argument("--torch-models", default="demo,GPT-B,GPT-L", help="models also timed with torch eager")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--committed", type=int, default=128, help="tokens already in the cache")
    p.add_argument("--max-tree", type=int, default=64)
    p.add_argument("--threads", type=int, default=0,
                   help="most threads to probe for ORT and torch (0: physical cores); each backend is timed at "
                        "its best of {1, threads} (torch's MKL/OpenMP threads collapse on a busy 2-core box)")
    p.add_argument("--workdir", default="/tmp/lisa_ort_bench")
    p.add_argument("--keep", action="store_true", help="keep the exported ONNX in --workdir")
    p.add_argument("--out", default=str(REPO / "bench" / "ort_cost_curve.json"))
    p.add_argument("--merge", action="store_true", help="keep the other models already in --out (re-run some)")
    p.add_argument("--plot-only", action="store_true", help="redraw the PNG from --out")
    args = p.parse_args(argv)
    if args.plot_only:
        plot(json.loads(Path(args.out).read_text()), Path(args.out).with_suffix(".png"))
        return
    args.threads = args.threads or physical_cores()
    args.torch_models = set(args.torch_models.split(","))
    torch.set_num_threads(args.threads)
    results = dict(machine=machine_info(args.threads),
                   settings=dict(threads=args.threads, reps=args.reps, committed=args.committed, batch=2,
                                 max_tree=args.max_tree, s_list=S_LIST, drafter_s_list=DRAFT_S, precision="fp32",
                                 statistic="median (and min) of reps timed runs after 1 warm-up"),
                   models={})
    out = Path(args.out)
    if args.merge and out.is_file():
        old = json.loads(out.read_text())
        results["models"] = old.get("models", {})
        results["machine"]["earlier_runs"] = old["machine"].get("earlier_runs", []) + [
            {k: v for k, v in old["machine"].items() if k != "earlier_runs"}]
    for name in args.models.split(","):
        results["models"][name] = bench_model(name, args)
        results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        from lisa_trt.io import write_json

        write_json(out, results)  # partial results survive a later failure
    plot(results, out.with_suffix(".png"))
    for n, r in results["models"].items():
        for b, c in r["verify_ms"].items():
            pts = sorted((int(s), v) for s, v in c["median"].items())
            print(f"{n:6s} verify {b:5s} median ms:", " ".join(f"{s}:{v}" for s, v in pts))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
