"""Issue 23: which int8 scheme computes the same thing on every x86 CPU, and how close it stays to fp32.

ONNX Runtime's u8 x s8 MatMulInteger saturates pair sums in int16 on CPUs without VNNI (AVX2,
AVX-512 without VNNI) and is exact on VNNI CPUs (lisa_trt/export/int8_isa.py). For each int8
scheme of the demo target (prefill + verify graphs; drafter graphs untouched), this script measures
what BOTH kinds of CPU compute: the kind this machine is runs on ONNX Runtime's real kernels, the
other kind through `int8_isa.emulate` (float64 ops reproducing that kind's integer arithmetic):

    u8s8        quantize_dynamic QInt8 per channel, full range [-127, 127]  (the shipped scheme until issue 23)
    u8s8-rr     the same with reduce_range (7-bit weights [-64, 63]: no pair sum can leave int16)
    u8u8        QUInt8 weights per channel (u8 x u8 kernels: exact everywhere)
    u8s8-rr-head  u8s8-rr with the output head kept fp32

Figures per scheme and CPU kind: the export validation's scaled error on random inputs (threshold
0.1), and on REAL decoding states (teacher forcing of `--images` torch-generated images, CFG
rows): max / mean |logit diff|, top-1 agreement, mean and max TVD of the softmax. Then the
static bound (worst pair sum) and ORT time per call of the verify graph (batch 2 = CFG, 4 tokens)
and of prefill, in interleaved rounds, on this machine.

    python bench/int8_isa.py --json bench/int8_isa.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

SCHEMES = ("u8s8", "u8s8-rr", "u8u8", "u8s8-rr-head")
GRAPHS = ("target_prefill", "target_verify")


def quantize_scheme(src: Path, dst: Path, scheme: str) -> None:
    """One graph file to `scheme` (onnxruntime.quantization.quantize_dynamic)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from lisa_trt.export.quantize import head_matmuls

    exclude = head_matmuls(onnx.load(str(src), load_external_data=False)) if scheme.endswith("-head") else []
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QUInt8 if scheme == "u8u8" else QuantType.QInt8,
                     per_channel=True, reduce_range=scheme.startswith("u8s8-rr"), op_types_to_quantize=["MatMul"],
                     nodes_to_exclude=exclude, extra_options={"MatMulConstBOnly": True})


def swap_graphs(engine_dir: Path, files: dict) -> None:
    """Replace graph files of an engine directory and re-record their hashes (bench-only helper)."""
    import json

    import onnx

    from lisa_trt.export import manifest as M

    mj = json.loads((engine_dir / "manifest.json").read_text())
    for name, model in files.items():
        onnx.save(model, str(engine_dir / f"{name}.onnx"))
        mj["graphs"][name]["sha256"] = M.file_sha256(engine_dir / f"{name}.onnx")
        mj["graphs"][name]["external_data"] = None
    (engine_dir / "manifest.json").write_text(json.dumps(mj, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", required=True)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    import onnx

    from lisa_trt.demo.registry import demo_sampling, load_demo_target, load_demo_vq
    from lisa_trt.engines.ort import load_ort_engines
    from lisa_trt.export.int8_isa import cpu_kind, emulate, run_emulated, saturation_bound
    from lisa_trt.models.io_spec import Graph, export_dims, graph_spec
    from lisa_trt.export import export_bundle
    from lisa_trt.export.validate import output_error, reference_outputs, run_onnx, sample_inputs
    from lisa_trt.io import write_json
    from lisa_trt.speculative.autoregressive import generate
    from quant_logits import teacher_forced_logits

    here = cpu_kind()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="int8-isa-"))
    ref = load_demo_target()
    vq = load_demo_vq()
    refs = dict(target=ref, drafter=None, tables=None, vq=vq)
    base = work / "fp32"
    if not (base / "manifest.json").exists():
        export_bundle(ref, None, None, vq, base, lint=False, validate=False, progress=False)
    import json

    max_cache = json.loads((base / "manifest.json").read_text())["max_cache_len"]
    dims = export_dims(ref.config, max_cache_len=max_cache, vq_cfg=vq.config)

    cfg = ref.config
    classes = torch.arange(a.images) % cfg.num_classes
    s = demo_sampling()
    toks = torch.cat([generate(ref, classes[i:i + 1], seed=i, cfg_scale=s.cfg_scale, temperature=s.temperature,
                               top_k=s.top_k, top_p=s.top_p) for i in range(a.images)])
    cond = torch.cat([classes, torch.full_like(classes, cfg.num_classes)])
    seq = torch.cat([toks, toks])
    want = teacher_forced_logits(ref, cond, seq)

    def real_state_errors(engine_dir: Path) -> dict:
        have = teacher_forced_logits(load_ort_engines(engine_dir, threads=1).target, cond, seq)
        d = (have - want).abs()
        tvd = 0.5 * (have.softmax(-1) - want.softmax(-1)).abs().sum(-1)
        return {"max_abs_logit_diff": d.max().item(), "mean_abs_logit_diff": d.mean().item(),
                "top1_agreement": (have.argmax(-1) == want.argmax(-1)).float().mean().item(),
                "mean_tvd": tvd.mean().item(), "max_tvd": tvd.max().item()}

    out = {"note": __doc__.split("\n\n")[0], "machine_cpu_kind": here,
           "cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                        if ln.startswith("model name")), "?"),
           "images": a.images, "tokens_per_image": toks.shape[1], "schemes": {}}
    timing_dirs = {"fp32": base}
    for scheme in SCHEMES:
        print("scheme", scheme, flush=True)
        sdir = work / scheme
        if sdir.exists():
            shutil.rmtree(sdir)
        shutil.copytree(base, sdir)
        models = {}
        for g in GRAPHS:
            quantize_scheme(base / f"{g}.onnx", sdir / f"{g}.onnx.q", scheme)
            models[g] = onnx.load(str(sdir / f"{g}.onnx.q"))
            os.unlink(sdir / f"{g}.onnx.q")
        swap_graphs(sdir, models)
        timing_dirs[scheme] = sdir
        row = {"bound": {g: saturation_bound(models[g]) for g in GRAPHS}, "kinds": {}}
        for kind in ("vnni", "avx2"):
            emu = "exact" if kind == "vnni" else "avx2"
            k = {"computed_by": "onnxruntime (this CPU)" if kind == here else f"int8_isa.emulate({emu!r})"}
            # the export's validation inputs (random ids / caches)
            val = {}
            for g in GRAPHS:
                graph = Graph(g)
                spec = graph_spec(graph, n_layer=cfg.n_layer, model_type=cfg.model_type)
                inputs = sample_inputs(graph, spec, dims, refs, seed=123, batch=3, seq=5, nodes=4)
                path = sdir / f"{g}.onnx"
                have = run_onnx(path, inputs) if kind == here else run_emulated(path, inputs, emu)
                wants = reference_outputs(graph, refs, inputs)
                val[g] = max(output_error(have[n], wants[n]) for n in spec.output_names)
            k["validation_max_scaled_error"] = val
            if kind == here:
                k["real_states"] = real_state_errors(sdir)
            else:
                edir = work / f"{scheme}-{kind}"
                if edir.exists():
                    shutil.rmtree(edir)
                shutil.copytree(sdir, edir)
                swap_graphs(edir, {g: emulate(models[g], emu) for g in GRAPHS})
                k["real_states"] = real_state_errors(edir)
            row["kinds"][kind] = k
            print(" ", kind, k, flush=True)
        out["schemes"][scheme] = row

    # time per call on this machine (interleaved rounds)
    times = {n: {"verify_ms": [], "prefill_ms": []} for n in timing_dirs}
    engines = {n: load_ort_engines(d, threads=1).target for n, d in timing_dirs.items()}
    c2 = torch.tensor([1, cfg.num_classes])
    for _ in range(a.rounds):
        for n, tgt in engines.items():
            cache = tgt.new_cache(2, extra=64)
            t0 = time.perf_counter()
            for _ in range(5):
                cache.lengths.zero_()
                tgt.prefill(c2, cache)
            times[n]["prefill_ms"].append((time.perf_counter() - t0) / 5 * 1e3)
            L = int(cache.lengths[0])
            tk = torch.randint(0, 100, (2, 4))
            pos = L + torch.arange(4)[None].expand(2, -1)
            anc = torch.tril(torch.ones(4, 4, dtype=torch.bool))[None].expand(2, -1, -1)
            mask = cache.attention_mask(pos, anc)
            t0 = time.perf_counter()
            for _ in range(20):
                tgt.forward_tokens(tk, pos, pos, mask, cache)
            times[n]["verify_ms"].append((time.perf_counter() - t0) / 20 * 1e3)
    out["timing"] = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()}
    out["timing_note"] = (f"ONNX Runtime, 1 thread, this machine ({here}); medians of {a.rounds} interleaved rounds. "
                          "The machine was shared with other jobs during this run: ratios inside the run only.")
    write_json(a.json, out)
    print(json.dumps(out["timing"], indent=1))


if __name__ == "__main__":
    main()
