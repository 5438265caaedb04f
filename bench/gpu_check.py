#!/usr/bin/env python
"""One-call GPU check (issue 7): what a session lent a GPU runs, in about 8 minutes.

    python bench/gpu_check.py bench/gpu_check_<gpu>.json            # on a CUDA machine
    python bench/gpu_check.py /tmp/smoke.json --cpu-smoke           # seconds on CPU (CI smoke)

Sections (each guarded: an error is recorded and the next section runs; the JSON is rewritten
after every section, so a run cut by a timeout keeps what it measured):
  env            torch / CUDA / GPU / triton / onnxruntime / polygraphy versions, and whether
                 `import tensorrt` works there (the import error otherwise);
  gasv_kernel    the GASV v2 Triton kernel vs the PyTorch reference `gasv_gates` at V=16384,
                 H=1280, C=256 (GPT-XL head): max |difference| of p / delta_eff / gate, and median
                 latency of both for 2 / 64 / 128 rows, dense and top-2000 support;
  verify_latency one target forward over S tree tokens (S = 1 .. 64, CFG batch 2, random tree
                 masks) on random official-shaped GPT-B / GPT-L / GPT-XL in bf16 (--dtype): the
                 cost curve that sets the tree budget; plus prefill latency and peak memory;
                 GPT-XL-T2I is the text-to-image shape of the paper's LlamaGen setting
                 (t2i_XL_stage1_256: 120 FLAN-T5 caption slots of 2048, 16x16 tokens, CFG batch
                 with the null caption);
  demo_decode    vanilla vs speculative (exact, LANTERN, GASV) decoding with the torch runner on
                 the bundled demo model (`demo` + drafter `demo-lisa` + tables `demo`), via
                 lisa_trt.harness; skipped with the reason when the demo assets are absent;
  compiled_decode the same methods through an exported demo bundle on the torch graph backend,
                 eager vs torch.compile (Inductor) vs torch.compile + CUDA graphs
                 (`Pipeline.from_dir(dir, backend="torch", compile=...)`), compile time apart;
  decoders       the training-free decoders (sjd, mcsjd, sjd-pac, gsd, zipar) and LISA's drafter
                 combined with them (coupled, sjd-gasv) next to vanilla / exact / gasv, on the same
                 demo-bundle pipelines (CUDA graphs first, the fastest plain decoding there, then
                 eager): seconds per image, MAL per target forward and TVD per decoder, and the
                 speed-up against the FASTEST vanilla seconds per image measured in this run (any
                 mode); rows compiled_decode measured are reused, not re-run. The CPU smoke runs
                 it on a tiny random model in memory (seconds);
  cuda_graph     a decode step of the demo target (a tree verification over its static cache) captured
                 as one CUDA graph (torch.cuda.graph) and replayed: logits of the replay against eager,
                 and ms per step eager vs replayed (issue 49); skipped with the reason without CUDA;
  tensorrt       when tensorrt imports: export the demo bundle fp32 and fp16, build every engine
                 of each (lisa_trt.deploy.build, --attention auto: build seconds, plan bytes and
                 the attention each engine uses, op or plain ops after a refused probe), then parity
                 against the bundle's torch graphs per graph (gasv, vq_decode, drafter_project) and
                 greedy target tokens (the cache committed in place by the runner): fp32 tokens
                 must be identical to torch (fp16: the fraction that agrees is recorded); then
                 docs/tensorrt.md's first-GPU-run checklist (`checklist`): attention fused per engine
                 (the engine inspector's layer list: no standalone Softmax layer), ms per tree step
                 against `lisa-trt plan`'s floor for this GPU, greedy tokens against ONNX Runtime's,
                 device memory after a decode against the plan's total; else the reason.
With --cpu-smoke (or without CUDA) every section runs a tiny version on CPU in a few seconds.

Time: --budget (490 s) bounds the whole run; each section also has its own share
(SECTION_BUDGET, `--section-budget NAME=SECONDS` to change one), and the loops over models,
modes and methods stop at their section's deadline, recording what they skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from lisa_trt.speculative.methods import resolve_method

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SECTIONS = ("env", "gasv_kernel", "verify_latency", "demo_decode", "compiled_decode", "decoders", "cuda_graph",
            "tensorrt")
# seconds each section may use at most (the run's --budget still bounds the total); about 8 minutes in all
SECTION_BUDGET = {"env": 10, "gasv_kernel": 30, "verify_latency": 80, "demo_decode": 40, "compiled_decode": 90,
                  "decoders": 80, "cuda_graph": 20, "tensorrt": 140}
DECODE_METHODS = ("vanilla", "exact", "lantern", "gasv")
# the decoders section: the baseline first, then the new decoders by priority, then the tree rules
DECODERS = ("vanilla", "sjd", "mcsjd", "sjd-pac", "gsd", "zipar", "sjd-gasv", "coupled", "exact", "gasv")
TREE_SIZES = (1, 2, 4, 8, 16, 32, 48, 64)
MODELS = ("GPT-B", "GPT-L", "GPT-XL", "GPT-XL-T2I")


def _latency_model(name: str):
    """(TargetConfig, CFG condition (2 rows: cond, null) builder) for a --models entry.

    "<config>-T2I" is the t2i variant (caption prefix); "tiny-t2i" its CPU-smoke size."""
    from lisa_trt.models.target_config import target_config

    if name.lower().endswith("-t2i"):
        base = name[: -len("-t2i")]
        extra = dict(cls_token_num=6, caption_dim=12) if base == "tiny" else {}
        return target_config(base, model_type="t2i", **extra)
    return target_config(name)


def _latency_cond(model, device):
    """[cond; uncond] for one prompt: class 1 / null class, or a 20-token caption / null caption."""
    import torch

    cfg = model.config
    if cfg.model_type == "c2i":
        return torch.tensor([1, cfg.num_classes], device=device)
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(1, cfg.cls_token_num, cfg.caption_dim, generator=g).to(device)
    mask = torch.zeros(1, cfg.cls_token_num, dtype=torch.bool, device=device)
    mask[:, : min(20, cfg.cls_token_num)] = True  # valid tokens first, as the T5 tokenizer returns them
    nf, nm = model.null_cond((feats, mask))
    return torch.cat([feats, nf.to(feats.dtype)]), torch.cat([mask, nm])


# ----------------------------------------------------------------------------- timing

def time_ms(fn, *, reps: int, warmup: int, cuda: bool) -> dict:
    """Median / min wall time of fn() in ms (CUDA events around each call on GPU)."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return {"median_ms": round(statistics.median(times), 4), "min_ms": round(min(times), 4), "reps": reps}


class Ctx:
    def __init__(self, args):
        import torch

        self.args = args
        self.cuda = torch.cuda.is_available() and not args.cpu_smoke
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.smoke = not self.cuda
        self.deadline = time.monotonic() + args.budget
        self.section_deadline = self.deadline
        self.rows = {}  # mode -> {method: row} of the demo-bundle pipelines (compiled_decode, decoders)
        self.pipes = {}  # mode -> open Pipeline (compiled_decode keeps them for the decoders section)

    def start_section(self, name: str) -> None:
        """The section's deadline: its share (SECTION_BUDGET / --section-budget), within the run's."""
        cap = self.args.section_budget.get(name, SECTION_BUDGET.get(name, self.args.budget))
        self.section_deadline = min(self.deadline, time.monotonic() + cap)

    def left(self) -> float:
        """Seconds left to the current section (its share, or the run's budget if that is sooner)."""
        return min(self.deadline, self.section_deadline) - time.monotonic()

    def close(self) -> None:
        for p in self.pipes.values():
            p.close()
        self.pipes = {}


# ----------------------------------------------------------------------------- sections

def section_env(ctx: Ctx) -> dict:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
           "torch_cuda": torch.version.cuda, "mode": "cuda" if ctx.cuda else "cpu-smoke"}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        out["capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
        out["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    for mod in ("triton", "onnx", "onnxruntime", "polygraphy", "onnx_graphsurgeon", "lisa_trt"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", "?")
        except Exception as e:
            out[mod] = f"unavailable: {type(e).__name__}: {e}"
    try:
        import onnxruntime

        out["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except Exception:
        pass
    try:
        import tensorrt

        out["tensorrt"] = {"importable": True, "version": tensorrt.__version__}
        try:
            import tensorrt.plugin  # noqa: F401

            out["tensorrt"]["plugin_module"] = True
        except Exception as e:
            out["tensorrt"]["plugin_module"] = f"{type(e).__name__}: {e}"
    except Exception as e:
        out["tensorrt"] = {"importable": False, "error": f"{type(e).__name__}: {e}"}
    return out


def _gasv_case(V, H, C, N, *, top_k, seed, device):
    """GASV v2 inputs: N tree nodes (a chain) with filtered logits, node tokens near the top."""
    import types

    import torch

    from lisa_trt.calibration.profile import lantern_neighbors
    from lisa_trt.speculative.gasv import GASVConfig

    g = torch.Generator().manual_seed(seed)
    W = torch.randn(V, H, generator=g)
    wt = W / W.std(0, correction=0)
    logits = torch.randn(N, V, generator=g) * 3.0
    if top_k:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    parents = torch.arange(N) - 1
    tokens = logits[parents.clamp(min=0)].argsort(-1, descending=True)[:, 1]
    cfg = GASVConfig(theta_geo=2.5, neighbours=16)
    nb = lantern_neighbors(torch.randn(V, 8, generator=g), 64)
    tables = types.SimpleNamespace(w_tilde=wt.to(device), w_tilde_norm2=(wt * wt).sum(1).to(device),
                                   cluster=torch.randint(0, C, (V,), generator=g, dtype=torch.int32).to(device),
                                   beta=(0.5 + 2 * torch.rand(C, generator=g)).to(device), lantern_neighbors=nb.to(device),
                                   vocab_size=V, theta_geo=2.5, config=cfg)
    return logits.to(device), tokens.to(device), parents.to(device), tables, cfg


def section_gasv_kernel(ctx: Ctx) -> dict:
    import torch

    from lisa_trt.speculative.gasv import gasv_gates

    V, H, C = (256, 32, 8) if ctx.smoke else (16384, 1280, 256)
    rows = (4,) if ctx.smoke else (2, 64, 128)
    reps, warm = (2, 1) if ctx.smoke else (20, 3)
    out = {"V": V, "H": H, "C": C, "gasv_version": 2, "cases": []}
    kernel = ctx.cuda or os.environ.get("TRITON_INTERPRET") == "1"
    gt = None
    if kernel:
        from lisa_trt.engines.plugins import gasv_triton as gt
    else:
        out["triton_kernel"] = "skipped: no CUDA (set TRITON_INTERPRET=1 to run the interpreter on CPU)"
    for N in rows:
        for top_k in (0, 2000 if not ctx.smoke else 16):
            logits, tokens, parents, tables, cfg = _gasv_case(V, H, C, N, top_k=top_k, seed=N, device=ctx.device)
            case = {"rows": N, "top_k": top_k}
            with torch.no_grad():
                ref = gasv_gates(logits, tokens, parents, tables, cfg, check_inputs=False)
                case["torch_ref"] = time_ms(lambda: gasv_gates(logits, tokens, parents, tables, cfg, check_inputs=False),
                                            reps=reps, warmup=warm, cuda=ctx.cuda)
                if gt is not None:
                    got = gt.gasv_triton(logits, tokens, parents, tables, cfg, check_inputs=False)
                    case["max_abs_diff"] = {k: float((getattr(got, k) - getattr(ref, k)).abs().max())
                                            for k in ("p", "delta_eff", "gate")}
                    case["triton"] = time_ms(lambda: gt.gasv_triton(logits, tokens, parents, tables, cfg,
                                                                    check_inputs=False),
                                             reps=reps, warmup=warm, cuda=ctx.cuda)
                    case["speedup"] = round(case["torch_ref"]["median_ms"] / max(case["triton"]["median_ms"], 1e-9), 2)
            out["cases"].append(case)
    if gt is not None:
        out["max_abs_diff"] = max(max(c["max_abs_diff"].values()) for c in out["cases"])
        out["equal_to_reference"] = out["max_abs_diff"] < 1e-4
    return out


def _tree(S: int, seed: int):
    """Random tree in topological order: ancestors (S, S) incl. self, depth (S,)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    anc = torch.zeros(S, S, dtype=torch.bool)
    depth = torch.zeros(S, dtype=torch.long)
    for i in range(S):
        anc[i, i] = True
        if i:
            p = int(torch.randint(0, i, (1,), generator=g))
            anc[i] |= anc[p]
            depth[i] = depth[p] + 1
    return anc, depth


def _tree_step(cache, S: int, vocab: int, seed: int = 0) -> tuple:
    """(tokens, positions, slots, mask) of a random S-node tree after each row's committed tokens."""
    import torch

    B, dev = cache.lengths.shape[0], cache.lengths.device
    anc, depth = _tree(S, seed=seed)
    slots = cache.lengths[:, None] + torch.arange(S, device=dev)[None]
    pos = cache.lengths[:, None] + depth.to(dev)[None]
    mask = cache.attention_mask(slots, anc.to(dev)[None].expand(B, S, S))
    tok = torch.randint(0, vocab, (B, S), generator=torch.Generator().manual_seed(seed)).to(dev)
    return tok, pos, slots, mask


def section_verify_latency(ctx: Ctx) -> dict:
    import torch

    from lisa_trt.families.llamagen.model import Transformer

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[ctx.args.dtype]
    models = ("tiny", "tiny-t2i") if ctx.smoke else tuple(ctx.args.models.split(","))
    sizes = (1, 4) if ctx.smoke else TREE_SIZES
    reps, warm = (2, 1) if ctx.smoke else (10, 3)
    B = 2  # CFG: [cond; uncond]
    out = {"dtype": str(dtype) if not ctx.smoke else "float32", "batch": B, "models": {}}
    for name in models:
        if ctx.left() < 30 and not ctx.smoke:
            out["models"][name] = {"skipped": "time budget"}
            continue
        cfg = _latency_model(name)
        with torch.device(ctx.device):
            model = Transformer(cfg)
        model = model.to(dtype if ctx.cuda else torch.float32).eval()
        model.freqs_cis = model.freqs_cis.float()  # RoPE tables stay fp32 (as in the fp16 export)
        res = {"dim": cfg.dim, "n_layer": cfg.n_layer, "vocab": cfg.vocab_size, "model_type": cfg.model_type,
               "prefix": cfg.cls_token_num, "params_m":
               round(sum(p.numel() for p in model.parameters()) / 1e6, 1), "tree": {}}
        if ctx.cuda:
            torch.cuda.reset_peak_memory_stats()
        cond = _latency_cond(model, ctx.device)
        with torch.no_grad():
            cache = model.new_cache(B, extra=max(sizes))
            res["prefill"] = time_ms(lambda: model.prefill(cond, cache), reps=reps, warmup=warm, cuda=ctx.cuda)
            g = torch.Generator().manual_seed(0)
            for S in sizes:
                anc, depth = _tree(S, seed=S)
                slots = (cache.lengths[:, None] + torch.arange(S, device=ctx.device)[None])
                pos = cache.lengths[:, None] + depth.to(ctx.device)[None]
                mask = cache.attention_mask(slots, anc.to(ctx.device)[None].expand(B, S, S))
                tok = torch.randint(0, cfg.vocab_size, (B, S), generator=g).to(ctx.device)
                res["tree"][S] = time_ms(lambda: model.forward_tokens(tok, pos, slots, mask, cache, taps=True),
                                         reps=reps, warmup=warm, cuda=ctx.cuda)
        t1 = res["tree"][sizes[0]]["median_ms"]
        res["cost_ratio_vs_S1"] = {S: round(v["median_ms"] / t1, 3) for S, v in res["tree"].items()}
        if ctx.cuda:
            res["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        out["models"][name] = res
        model = cache = None  # free before the next (larger) model
        if ctx.cuda:
            torch.cuda.empty_cache()
    return out


def section_demo_decode(ctx: Ctx) -> dict:
    import torch

    from lisa_trt.demo.registry import assets_present

    if not assets_present():
        return {"skipped": "the bundled demo assets are absent (lisa_trt/assets/demo); build them with "
                           "scripts/demo/*.py"}
    from lisa_trt.models.artifact_sets import bundled_file

    missing = [str(p) for p in (bundled_file("demo-lisa", "drafters"), bundled_file("demo", "tables")) if not p.is_file()]
    if missing:
        return {"skipped": f"missing bundled drafter/tables: {missing}"}
    if ctx.smoke and not ctx.args.demo_on_cpu:
        return {"skipped": "cpu smoke (pass --demo-on-cpu to run the demo on CPU)"}
    from lisa_trt import load_target
    from lisa_trt.artifacts import load_drafter_by_name, load_tables_by_name
    from lisa_trt.harness import run_method
    from lisa_trt.demo.registry import demo_sampling
    from lisa_trt.speculative.decode import SpecConfig

    target = load_target("demo", device=str(ctx.device)).eval()
    drafter = load_drafter_by_name("demo-lisa", target).to(ctx.device).eval()
    tables = load_tables_by_name("demo", target)
    sampling, spec = demo_sampling(), SpecConfig()
    n = 1 if ctx.smoke else ctx.args.demo_images
    classes = [i % target.config.num_classes for i in range(n)]
    out = {"device": str(ctx.device), "sampling": sampling.__dict__, "spec": spec.__dict__, "images": n}
    for method in DECODE_METHODS:  # separately: a failure of one keeps the other's numbers
        if ctx.left() < 5 and not ctx.smoke:
            out[method] = {"skipped": "section time budget"}
            continue
        try:
            cond = torch.tensor([classes[0]], device=ctx.device)
            run_method(resolve_method(method), target, drafter, tables, cond, sampling=sampling, spec=spec, seed=0)  # warm-up
            secs, mals = [], []
            for i, c in enumerate(classes):
                t0 = time.perf_counter()
                _, st = run_method(resolve_method(method), target, drafter, tables, torch.tensor([c], device=ctx.device),
                                   sampling=sampling, spec=spec, seed=i)
                if ctx.cuda:
                    torch.cuda.synchronize()
                secs.append(time.perf_counter() - t0)
                mals.append(st.mal)
            out[method] = {"seconds_per_image": round(statistics.mean(secs), 4), "mal": round(statistics.mean(mals), 3)}
        except Exception as e:
            out[method] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
    _speedups(out)
    return out


def _speedups(out: dict) -> None:
    base = out.get("vanilla", {}).get("seconds_per_image")
    for m in DECODE_METHODS[1:]:
        if base and "seconds_per_image" in out.get(m, {}):
            out[m]["speedup_vs_vanilla"] = round(base / out[m]["seconds_per_image"], 3)
    if "speedup_vs_vanilla" in out.get("gasv", {}):
        out["speedup"] = out["gasv"]["speedup_vs_vanilla"]


def _demo_bundle(ctx: Ctx, fp16: bool = False) -> Path:
    """The demo bundle (`export_bundle` of demo + demo-lisa + tables + VQ; fp16: `--fp16`), exported
    once per run and precision and shared by compiled_decode and tensorrt (an export is a large
    part of the time budget)."""
    bundles = getattr(ctx, "demo_bundles", None) or {}
    cached = bundles.get(fp16)
    if cached is not None and (cached / "manifest.json").is_file():
        return cached
    import tempfile

    from lisa_trt import load_target
    from lisa_trt.artifacts import load_drafter_by_name, load_tables_by_name
    from lisa_trt.demo.registry import load_demo_vq
    from lisa_trt.export import export_bundle

    target = load_target("demo").eval()
    d = Path(tempfile.mkdtemp(prefix="gpu_check_bundle_")) / ("eng16" if fp16 else "eng")
    export_bundle(target, load_drafter_by_name("demo-lisa", target), load_tables_by_name("demo", target),
                  load_demo_vq(), d, progress=False, lint=False, validate=False, fp16=fp16)
    ctx.demo_bundles = {**bundles, fp16: d}
    return d


def _time_method(ctx: Ctx, pipe, method: str, n: int) -> dict:
    """One warm-up image (class 0, seed 10000; compiles / captures new shapes), then n images
    (class i % 8, seed i) through Pipeline.generate: seconds per image, MAL per target forward, TVD.
    The CPU smoke skips the warm-up."""
    import torch

    t0 = time.perf_counter()
    if not ctx.smoke:  # the smoke checks the path, not the time
        pipe.generate([0], seed=10_000, verify=method, decode=False)
    warm = time.perf_counter() - t0
    secs, mals, tvds = [], [], []
    for i in range(n):
        t0 = time.perf_counter()
        res = pipe.generate([i % 8], seed=i, verify=method, decode=False)
        if ctx.cuda:
            torch.cuda.synchronize()
        secs.append(time.perf_counter() - t0)
        mals.append(res.stats[0].get("mal", 1.0))
        tvds.append(res.stats[0].get("mean_tvd", 0.0))
    return {"seconds_per_image": round(statistics.mean(secs), 4), "warmup_seconds": round(warm, 2),
            "mal": round(statistics.mean(mals), 3), "mean_tvd": round(statistics.mean(tvds), 4), "images": n}


def section_compiled_decode(ctx: Ctx) -> dict:
    """Demo bundle on the torch graph backend: eager vs Inductor vs Inductor + CUDA graphs."""
    from lisa_trt.demo.registry import assets_present

    if not assets_present():
        return {"skipped": "the bundled demo assets are absent"}
    if ctx.smoke and not ctx.args.demo_on_cpu:
        return {"skipped": "cpu smoke (pass --demo-on-cpu to run the demo on CPU)"}
    from lisa_trt.runtime.pipeline import Pipeline

    t0 = time.perf_counter()
    work = _demo_bundle(ctx).parent
    out = {"export_seconds": round(time.perf_counter() - t0, 1), "device": str(ctx.device)}
    n = 1 if ctx.smoke else ctx.args.demo_images
    modes = [("eager", None), ("inductor", "default")] + ([("cuda-graphs", "cuda-graphs")] if ctx.cuda else [])
    for name, mode in modes:
        row = out[name] = {}
        try:
            # the torch graph backend puts its runners on the bundle's device option
            pipe = ctx.pipes[name] = Pipeline.from_dir(work / "eng", backend="torch", compile=mode,
                                                       device=str(ctx.device))
            for method in DECODE_METHODS:
                if ctx.left() < 10 and not ctx.smoke:
                    row[method] = {"skipped": "section time budget"}
                    continue
                row[method] = _time_method(ctx, pipe, method, n)
            ctx.rows[name] = {m: r for m, r in row.items() if "seconds_per_image" in r}
            _speedups(row)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
            row["traceback"] = traceback.format_exc()[-2000:]
    if "inductor" in ctx.pipes and "cuda-graphs" in ctx.pipes:  # the decoders section times eager and CUDA graphs
        ctx.pipes.pop("inductor").close()
    return out


def _tiny_pipeline():
    """A tiny random LlamaGen pipeline in memory (target, drafter, tables, VQ): the CPU smoke's."""
    import torch

    from lisa_trt.calibration.profile import calibrate
    from lisa_trt.config import SamplingConfig
    from lisa_trt.models.target_config import vq_config
    from lisa_trt.models.drafter import Drafter
    from lisa_trt.families.llamagen.vq import VQModel
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.testing import make_target

    torch.manual_seed(0)
    t = make_target(std=0.3, n_layer=2)
    cfg = vq_config("VQ-16", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32, codebook_size=256)
    vq = VQModel(cfg).eval()
    s = SamplingConfig(cfg_scale=2.0, top_k=0)
    tables = calibrate(t, vq.codebook().detach(), num_rollouts=2, sampling=s, progress=False)
    gen = {"sampling": {"cfg_scale": 2.0, "top_k": 0}, "tree": {"default": {"top_k": 3, "depth": 2, "total_tokens": 8}}}
    return Pipeline.from_models(t, Drafter.from_target(t).eval(), tables, vq, generation=gen)


def section_decoders(ctx: Ctx) -> dict:
    """The training-free decoders and LISA's drafter combined with them, next to vanilla / exact /
    gasv, on the demo-bundle pipelines compiled_decode opened (CUDA graphs first, then eager; a
    bundle of its own when compiled_decode did not run), or a tiny in-memory model in the CPU smoke.

    Per mode and decoder: seconds per image, MAL per target forward, mean TVD (speed-ups against
    vanilla in the same mode and against the fastest vanilla of the run). Rows compiled_decode
    measured on the same pipeline (same images and seeds) are reused, not re-run."""
    from lisa_trt.demo.registry import assets_present
    from lisa_trt.runtime.pipeline import Pipeline

    tiny = ctx.smoke and not ctx.args.demo_on_cpu
    if tiny:
        modes = ["tiny-eager"]
        ctx.pipes.setdefault("tiny-eager", _tiny_pipeline())
    elif not assets_present():
        return {"skipped": "the bundled demo assets are absent"}
    else:
        modes = ["cuda-graphs", "eager"] if ctx.cuda else ["eager"]
        for name in modes:
            if name not in ctx.pipes:
                work = _demo_bundle(ctx).parent
                ctx.pipes[name] = Pipeline.from_dir(work / "eng", backend="torch", device=str(ctx.device),
                                                    compile="cuda-graphs" if name == "cuda-graphs" else None)
    n = 1 if ctx.smoke else ctx.args.demo_images
    out = {"device": str(ctx.device), "images": n, "modes": {}}
    if ctx.smoke:
        out["note"] = "smoke: one image, no warm-up (the first decode pays one-time costs): seconds are not comparable"
    for name in modes:
        rows = ctx.rows.setdefault(name, {})
        res = out["modes"][name] = {}
        for method in DECODERS:
            if method in rows:
                res[method] = dict(rows[method], source="compiled_decode")
                continue
            if ctx.left() < 10 and not ctx.smoke:
                res[method] = {"skipped": "section time budget"}
                continue
            try:
                rows[method] = res[method] = _time_method(ctx, ctx.pipes[name], method, n)
            except Exception as e:  # one decoder's failure keeps the others' numbers
                res[method] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
    _decoder_speedups(ctx, out)
    ctx.close()
    return out


def _decoder_speedups(ctx: Ctx, out: dict) -> None:
    """speedup_vs_vanilla (same mode) and speedup_vs_fastest_vanilla (the fastest vanilla seconds
    per image of any mode this run measured: eager, Inductor, CUDA graphs)."""
    vans = {m: r["vanilla"]["seconds_per_image"] for m, r in ctx.rows.items() if "vanilla" in r}
    if not vans:
        return
    fast_mode = min(vans, key=vans.get)
    out["fastest_vanilla"] = {"mode": fast_mode, "seconds_per_image": vans[fast_mode]}
    for mode, res in out["modes"].items():
        for r in res.values():
            if "seconds_per_image" not in r:
                continue
            if mode in vans:
                r["speedup_vs_vanilla"] = round(vans[mode] / r["seconds_per_image"], 3)
            r["speedup_vs_fastest_vanilla"] = round(vans[fast_mode] / r["seconds_per_image"], 3)


def _greedy_tokens(target, cond, steps: int):
    """Greedy tokens of a TargetEngine (prefill, then one token per forward_tokens); (B, steps), logits."""
    import torch

    B = cond.shape[0]
    cache = target.new_cache(B, extra=16)
    with torch.no_grad():
        out = target.prefill(cond, cache)
        tok = out.logits[:, -1].float().argmax(-1)
        toks, logits = [tok], [out.logits[:, -1].float().cpu()]
        anc = torch.ones(B, 1, 1, dtype=torch.bool, device=cache.lengths.device)
        for _ in range(steps - 1):
            slots = cache.lengths[:, None].clone()
            o = target.forward_tokens(tok[:, None].to(slots.device), slots.clone(), slots, cache.attention_mask(slots, anc),
                                      cache)
            cache.lengths += 1
            tok = o.logits[:, -1].float().argmax(-1)
            toks.append(tok)
            logits.append(o.logits[:, -1].float().cpu())
    return torch.stack(toks, 1).cpu(), torch.stack(logits, 1)


# ----------------------------------------------------------------------------- the first GPU run's checklist

SOFTMAX_TYPES = ("softmax",)  # inspector LayerType of a standalone softmax ("SoftMax")
FUSED_HINTS = ("myelin", "foreignnode", "mha", "flash")  # fused regions / kernels (type, tactic, region name)


def inspector_layers(info) -> list:
    """The layers of an engine inspector's report (IEngineInspector.get_engine_information(
    LayerInformationFormat.JSON): {"Layers": [...], "Bindings": [...]}), as dicts with at least "Name"
    and "LayerType" (a report made without DETAILED verbosity lists names only: LayerType "")."""
    if isinstance(info, (str, bytes)):
        info = json.loads(info)
    layers = info.get("Layers") if isinstance(info, dict) else info
    if not isinstance(layers, list):
        raise ValueError("not an engine inspector report: no \"Layers\" list")
    out = []
    for layer in layers:
        if isinstance(layer, str):
            out.append({"Name": layer, "LayerType": ""})
        elif isinstance(layer, dict):
            out.append(dict(layer, Name=str(layer.get("Name", "")), LayerType=str(layer.get("LayerType", ""))))
    return out


def attention_fusion(info, attentions: int) -> dict:
    """Whether the engine fused its attentions (docs/tensorrt.md checklist 2): each BMM1 -> Softmax ->
    BMM2 chain one layer, so no standalone Softmax layer is left. `attentions`: the Softmax nodes of
    the engine's ONNX graph. Records the standalone softmax layers and the layers that look fused
    (Myelin regions, MHA / flash kernels); verdict None when the report has no layer types (built
    without DETAILED profiling verbosity)."""
    layers = inspector_layers(info)
    typed = any(layer["LayerType"] for layer in layers)
    alone = [layer["Name"] for layer in layers if layer["LayerType"].lower() in SOFTMAX_TYPES]
    def hint(layer) -> str:  # a layer's type and tactic, and its name when it names a fused region
        name = layer["Name"] if "foreignnode" in layer["Name"].lower() else ""
        return " ".join((layer["LayerType"], str(layer.get("TacticName", "")), name)).lower()

    fused = [layer["Name"] for layer in layers if any(h in hint(layer) for h in FUSED_HINTS)]
    verdict = None if not typed else (attentions == 0 or (not alone and bool(fused)))
    return {"attentions": attentions, "layers": len(layers), "standalone_softmax": alone[:8],
            "n_standalone_softmax": len(alone), "fused_layers": fused[:8], "fused": verdict}


def floor_check(ms_per_step: float, floor_ms: dict, model: str = "target") -> dict:
    """A measured step against the plan's floor (max(bytes / bandwidth, FLOPs / peak)) of `model`:
    the ratio (>= 1; near 1: at the hardware's limit), or the reason when the plan has no floor."""
    floor = (floor_ms or {}).get(model)
    if not floor:
        return {"ms": round(ms_per_step, 4), "floor_ms": None, "ratio": None,
                "reason": "the plan has no floor for this GPU (not in deploy/gpus.GPUS)"}
    return {"ms": round(ms_per_step, 4), "floor_ms": round(floor, 4), "ratio": round(ms_per_step / floor, 3),
            "below_floor": ms_per_step < floor}  # below: the plan over-counts bytes or FLOPs


def memory_check(measured: int, plan_total: int) -> dict:
    """Device memory a run used (bytes) against the plan's run total: within means measured <= plan."""
    return {"measured_gib": round(measured / 2 ** 30, 4), "plan_gib": round(plan_total / 2 ** 30, 4),
            "ratio": round(measured / plan_total, 4) if plan_total else None, "within": measured <= plan_total}


def token_parity(got, want) -> dict:
    """Two backends' tokens: identical, and the fraction of positions that agree."""
    import torch

    got, want = torch.as_tensor(got).cpu(), torch.as_tensor(want).cpu()
    if got.shape != want.shape:
        return {"identical": False, "agreement": 0.0, "shapes": [list(got.shape), list(want.shape)]}
    return {"identical": bool(torch.equal(got, want)), "agreement": float((got == want).float().mean())}


def section_cuda_graph(ctx: Ctx) -> dict:
    """One decode step of the demo target (a tree verification of 8 nodes over its static cache)
    captured as a CUDA graph and replayed (issue 49 item 5): the replay's logits against eager, and
    the ms per step of both."""
    import torch

    if not ctx.cuda:
        return {"skipped": "no CUDA device (CUDA-graph capture needs one)"}
    from lisa_trt.demo.registry import assets_present, load_demo_target

    if not assets_present():
        return {"skipped": "the bundled demo assets are absent"}
    target = load_demo_target().to(ctx.device).eval()
    cache = target.new_cache(2, extra=16)
    S = 8
    with torch.no_grad():
        target.prefill(torch.tensor([3, 3], device=ctx.device), cache)
        tok, pos, slots, mask = _tree_step(cache, S, target.config.vocab_size)
        step = lambda: target.forward_tokens(tok, pos, slots, mask, cache).logits  # noqa: E731
        eager = step().float().clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up on a side stream, as torch.cuda.graph's docs ask
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        graph.replay()
        torch.cuda.synchronize()
        diff = float((out.float() - eager).abs().max())
        return {"nodes": S, "max_abs_logit_diff": diff, "eager": time_ms(step, reps=20, warmup=3, cuda=True),
                "replay": time_ms(graph.replay, reps=20, warmup=3, cuda=True)}


TRT_PRECISIONS = ("fp32", "fp16")  # the tensorrt section builds both exports of the demo bundle


def section_tensorrt(ctx: Ctx) -> dict:
    """Export the demo bundle fp32 and fp16, build every engine of each (`--attention auto`: a
    one-node Attention probe first, plain attention ops where TensorRT refuses it), check each
    graph and the target's greedy tokens against the bundle's torch graphs.

    Records per precision: export / build seconds, per graph build seconds, plan size and the
    attention the engine uses (with the probe results), max |TensorRT - torch|; greedy tokens of
    the target (the graphs return the new K/V rows, the runner commits them into its one cache),
    with the fraction of tokens equal to the torch backend's (fp32: must be all). The fp32 results stay at the top level (as before), the
    fp16 ones under "fp16"; a precision that fails records its error and the other still runs.
    """
    from lisa_trt.deploy.build import require_tensorrt_gpu

    try:
        trt = require_tensorrt_gpu()
    except Exception as e:
        return {"available": False, "skipped": f"{type(e).__name__}: {e}"}
    from lisa_trt.demo.registry import assets_present

    if not assets_present():
        return {"available": True, "version": trt.__version__, "skipped": "the bundled demo assets are absent"}
    out = {"available": True, "version": trt.__version__}
    for prec in TRT_PRECISIONS:
        if ctx.left() <= 0:
            res = {"skipped": "the section's time budget is spent"}
        else:
            try:
                res = _trt_precision(ctx, prec)
            except Exception as e:  # record and go on: an fp16 failure must not hide the fp32 results
                res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        if prec == "fp32":
            out.update(res)
        else:
            out[prec] = res
    return out


def _trt_precision(ctx: Ctx, prec: str) -> dict:
    """One precision of section_tensorrt: export (shared), build, parity."""
    import tempfile

    from lisa_trt.deploy.build import build_engines

    out = {}
    t0 = time.perf_counter()
    d = _demo_bundle(ctx, fp16=prec == "fp16")           # fp32: shared with compiled_decode when it ran
    work = Path(tempfile.mkdtemp(prefix=f"gpu_check_trt_{prec}_"))
    out["export_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    rec = build_engines(d, timing_cache=work / "timing.cache", progress=False, attention="auto")
    out["build_s"] = round(time.perf_counter() - t0, 2)
    out["engines"] = {k: {"build_seconds": v.get("build_seconds"), "plan_bytes": (d / v["plan"]).stat().st_size,
                          "attention": v.get("attention"), "attention_probes": v.get("attention_probes")}
                      for k, v in rec["graphs"].items()}
    out["parity"] = _trt_parity(ctx, d)
    out["checklist"] = _trt_checklist(ctx, d)
    return out


def _inspector_report(d: Path, graph: str, rec: dict) -> dict:
    """attention_fusion of one built engine of `d` (its plan deserialized, its inspector's JSON)."""
    import onnx
    import tensorrt as trt

    from lisa_trt.engines.trt_plans import load_plan
    from lisa_trt.models.io_spec import Graph

    plan, _ = load_plan(d, Graph(graph))
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(plan)
    info = engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
    softmax = sum(n.op_type == "Softmax" for n in onnx.load(str(d / rec["onnx"]), load_external_data=False).graph.node)
    return attention_fusion(info, softmax)


def _trt_checklist(ctx: Ctx, d: Path) -> dict:
    """docs/tensorrt.md's first-GPU-run checklist, items 2-5, each guarded (an error is recorded)."""
    import torch

    from lisa_trt.export.manifest import read_manifest
    from lisa_trt.runtime.autotune import gpu_plan

    out, man = {}, read_manifest(d)
    plan = gpu_plan(d, "trt", batch=1, cfg=False)  # the visible GPU's plan (None: not in the GPU table)
    checks = {
        "attention_fused": lambda: {g: _inspector_report(d, g, r) for g, r in man.engines["graphs"].items()
                                    if g.startswith(("target", "drafter"))},
        "token_parity_ort": lambda: _parity_ort(ctx, d),
        "step_vs_floor": lambda: _step_vs_floor(ctx, d, plan),
        "memory_vs_plan": lambda: _memory_vs_plan(ctx, d, plan),
    }
    for name, fn in checks.items():
        try:
            if ctx.cuda:
                torch.cuda.reset_peak_memory_stats()
            out[name] = fn()
        except Exception as e:  # noqa: BLE001 - record and go on
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _parity_ort(ctx: Ctx, d: Path) -> dict:
    """Greedy target tokens of the TensorRT engines against ONNX Runtime's on the same bundle."""
    import torch

    from lisa_trt.engines.graph import load_engines
    from lisa_trt.engines.trt import load_trt_engines

    steps = 8 if ctx.smoke else 32
    with load_engines(d, "ort", threads=1) as ort:
        want, _ = _greedy_tokens(ort.target, torch.tensor([3]), steps)
    eng = load_trt_engines(d, device=ctx.device)
    got, _ = _greedy_tokens(eng.target, torch.tensor([3], device=ctx.device), steps)
    eng.close()
    return dict(token_parity(got, want), steps=steps)


def _step_vs_floor(ctx: Ctx, d: Path, plan) -> dict:
    """ms of one tree verification at the plan's tree (the GPU budget's size) against the plan's floor."""
    import torch

    from lisa_trt.engines.trt import load_trt_engines

    eng = load_trt_engines(d, device=ctx.device)
    S = min(plan.tree if plan is not None else 16, eng.target._verify.seq_capacity)
    cache = eng.target.new_cache(1, extra=S)
    with torch.no_grad():
        eng.target.prefill(torch.tensor([3], device=ctx.device), cache)
        tok, pos, slots, mask = _tree_step(cache, S, eng.target.config.vocab_size)
        t = time_ms(lambda: eng.target.forward_tokens(tok, pos, slots, mask, cache), reps=10, warmup=3, cuda=ctx.cuda)
    eng.close()
    return dict(floor_check(t["median_ms"], plan.floor_ms if plan is not None else {}), nodes=S)


def _memory_vs_plan(ctx: Ctx, d: Path, plan) -> dict:
    """Device memory of a greedy decode on the TensorRT engines (torch's peak: caches, engine I/O, the
    shared activation buffer; plus the plan files' sizes for TensorRT's weights) against the plan."""
    import torch

    from lisa_trt.engines.trt import load_trt_engines

    if not ctx.cuda:
        return {"skipped": "no CUDA device (the device memory of a decode needs one)"}
    if plan is None:
        return {"skipped": "no plan for this GPU (not in deploy/gpus.GPUS)"}
    eng = load_trt_engines(d, device=ctx.device)
    _greedy_tokens(eng.target, torch.tensor([3], device=ctx.device), 8)
    weights = sum((d / r["plan"]).stat().st_size for r in eng.manifest.engines["graphs"].values())
    used = torch.cuda.max_memory_allocated() + weights
    eng.close()
    return memory_check(used, plan.total)


def _trt_parity(ctx: Ctx, d: Path) -> dict:
    """Greedy target tokens, GASV, VQ and drafter projection of the TensorRT engines of `d`
    against the bundle's own torch graphs (CPU)."""
    import torch

    from lisa_trt.engines.graph import load_engines
    from lisa_trt.engines.trt import load_trt_engines

    ref = load_engines(d, "torch")                       # the bundle's own torch graphs (CPU)
    cfg = ref.manifest.target_config
    steps = 8 if ctx.smoke else 32
    cond = torch.tensor([3])
    want, want_logits = _greedy_tokens(ref.target, cond, steps)
    parity = {}
    dev = ctx.device
    eng = load_trt_engines(d, device=dev)
    got, got_logits = _greedy_tokens(eng.target, cond.to(dev), steps)
    parity["target_greedy"] = {
        "tokens_identical": bool(torch.equal(got, want)), "steps": steps,
        "token_agreement": float((got == want).float().mean()),
        "max_abs_logit_diff": float((got_logits.float() - want_logits.float()).abs().max())}
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, cfg.vocab_size, generator=g) * 3
    tok, par = torch.randint(0, cfg.vocab_size, (8,), generator=g), torch.arange(8) - 1
    a, b = eng.gasv(logits.to(dev), tok.to(dev), par.to(dev)), ref.gasv(logits, tok, par)
    parity["gasv"] = {k: float((getattr(a, k).float().cpu() - getattr(b, k).float()).abs().max())
                      for k in ("p", "delta_eff", "gate")}
    toks = torch.randint(0, cfg.vocab_size, (1, cfg.grid_size ** 2), generator=g)
    parity["vq_decode"] = float((eng.vq.decode_code(toks.to(dev)).float().cpu()
                                 - ref.vq.decode_code(toks).float()).abs().max())
    taps = torch.randn(1, 4, 3 * cfg.dim, generator=g)
    if eng.drafter._project is None and eng.drafter._open_project is None:  # drafter_fused replaces it (build)
        parity["drafter_project"] = "not built: drafter_fused holds the fc (deploy/build.FUSED_REPLACES)"
    else:
        parity["drafter_project"] = float((eng.drafter.project_taps(taps.to(dev)).float().cpu()
                                           - ref.drafter.project_taps(taps).float()).abs().max())
    eng.close()
    return parity


RUNNERS = {"env": section_env, "gasv_kernel": section_gasv_kernel, "verify_latency": section_verify_latency,
           "demo_decode": section_demo_decode, "compiled_decode": section_compiled_decode,
           "decoders": section_decoders, "cuda_graph": section_cuda_graph, "tensorrt": section_tensorrt}


# ----------------------------------------------------------------------------- main

def _write(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="JSON file to write the results to")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny CPU versions of every section (seconds)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--budget", type=float, default=490.0, help="seconds after which remaining sections are skipped")
    p.add_argument("--section-budget", action="append", default=[], metavar="NAME=SECONDS",
                   help=f"one section's share (repeatable; defaults: {SECTION_BUDGET})")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--demo-images", type=int, default=4)
    p.add_argument("--demo-on-cpu", action="store_true")
    args = p.parse_args(argv)
    wanted = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown:
        p.error(f"unknown sections {unknown}; valid: {', '.join(SECTIONS)}")
    shares = {}
    for item in args.section_budget:
        name, _, secs = item.partition("=")
        try:
            shares[name] = float(secs)
        except ValueError:
            shares[name] = None
        if name not in SECTIONS or shares[name] is None or shares[name] <= 0:
            p.error(f"--section-budget {item!r}: give NAME=SECONDS with NAME in {', '.join(SECTIONS)}")
    args.section_budget = shares
    import torch

    torch.manual_seed(0)
    ctx = Ctx(args)
    if not ctx.cuda:
        torch.set_num_threads(1)  # tiny CPU work: threads only oversubscribe shared cores
    results = {"script": "bench/gpu_check.py", "argv": sys.argv[1:] if argv is None else list(argv),
               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "mode": "cuda" if ctx.cuda else "cpu-smoke",
               "sections": {}}
    for name in wanted:
        if ctx.deadline - time.monotonic() <= 0:
            results["sections"][name] = {"skipped": "time budget exhausted"}
            continue
        t0 = time.perf_counter()
        ctx.start_section(name)
        try:
            res = RUNNERS[name](ctx)
            status = "skipped" if isinstance(res, dict) and "skipped" in res else "ok"
        except Exception as e:  # record and go on: one broken section must not hide the others
            res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            status = "error"
        res = dict(res, status=status, seconds=round(time.perf_counter() - t0, 2))
        results["sections"][name] = res
        print(f"[gpu_check] {name}: {status} ({res['seconds']} s)", flush=True)
        _write(args.out, results)
    ctx.close()
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    _write(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
