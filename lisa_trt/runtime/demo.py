"""`lisa-trt demo`: the main job on the bundled CPU model.

1. export the demo target + LISA drafter + GASV tables + VQ decoder to ONNX (cached: reused when
   the bundle's manifest matches the shipped artifacts' hashes);
2. generate the same prompts with the same seeds twice through the chosen backend (ONNX Runtime
   by default): vanilla AR decoding and LISA (tree speculation + GASV);
3. print what ran and why the speed-up is what it is, MAL, and quality (class accuracy with a
   95 % interval, FD-demo with a bootstrap error, "indicative" below 64 images); write a labelled
   grid (rows = method, columns = class) and summary.json (runtime/demo_report.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..errors import LisaError


def _bundle_is_current(engine_dir: Path, target, drafter, tables, generation: dict) -> bool:
    """The cached export was made from these exact artifacts and settings."""
    from ..export.manifest import drafter_hash, read_manifest, tables_hash
    from ..models.checkpoints import target_hash

    try:
        man = read_manifest(engine_dir, target_hash=target_hash(target), drafter_hash=drafter_hash(drafter),
                            tables_hash=tables_hash(tables))
    except LisaError:
        return False
    return man.generation == generation


def ensure_demo_bundle(engine_dir: Path, echo: Callable = print) -> Path:
    """Export the bundled demo model into `engine_dir` unless an up-to-date export is there."""
    from ..artifacts import load_drafter_by_name, load_tables_by_name
    from ..demo.registry import class_names, demo_sampling, load_demo_target, load_demo_vq
    from .autotune import default_tree_budgets, record_choices
    from ..export import export_bundle
    from ..export.manifest import drafter_hash

    target = load_demo_target()
    drafter = load_drafter_by_name("demo-lisa", target)
    tables = load_tables_by_name("demo", target)
    import dataclasses
    import json

    gen = {"sampling": dataclasses.asdict(demo_sampling()), "class_names": list(class_names()),
           "tree": default_tree_budgets(target.config, _measured_budgets())}
    gen = record_choices(gen, _measured_choices(),  # never slower: what each precision runs (bench/speed.py)
                         {"drafter": drafter_hash(drafter)})  # timed with this drafter
    gen = json.loads(json.dumps(gen))  # as the manifest stores it (lists, not tuples)
    if _bundle_is_current(engine_dir, target, drafter, tables, gen):
        echo(f"using cached export {engine_dir}")
        return engine_dir
    echo(f"exporting the demo model to {engine_dir} (once; validated against PyTorch) ...")
    t0 = time.perf_counter()
    export_bundle(target, drafter, tables, load_demo_vq(), engine_dir, generation=gen, progress=True)
    echo(f"exported in {time.perf_counter() - t0:.1f} s")
    return engine_dir


def _measured_choices() -> list:
    """Never-slower choices per precision measured by bench/speed.py (assets/demo/decode_choice.json)."""
    from ..demo.registry import DEMO_DIR as ASSETS
    from .autotune import DecodeChoice

    p = ASSETS / "decode_choice.json"
    if not p.is_file():
        return []
    import json

    return [DecodeChoice.from_dict(d) for d in json.loads(p.read_text()).get("choices", [])]


def _measured_budgets() -> dict:
    """Tree budgets chosen from the measured cost curve by bench/tune_tree.py, if shipped."""
    from ..demo.registry import DEMO_DIR as ASSETS

    p = ASSETS / "tree_budgets.json"
    if p.is_file():
        import json

        return json.loads(p.read_text())
    return {}


def run_demo(out_dir: Path, *, num_images: int = 8, backend: str = "ort", verify: str = "gasv", seed: int = 0,
             echo: Callable = print) -> dict:
    """Export (cached), then vanilla vs LISA on the same prompts; a labelled grid and summary.json.

    Prints what ran, the speed-up decomposed into accepted tokens per step and the cost of a step,
    and quality with a 95 % interval / bootstrap error (marked "indicative" below 64 images).
    """
    from ..demo.registry import class_names, load_demo_scorer
    from ..imaging import save_png
    from ..io import write_json
    from ..threads import ort_threads
    from ..validation import check_positive, probe_writable_dir
    from .demo_report import format_quality, labelled_grid, quality_with_error, speed_explanation
    from .pipeline import Pipeline

    check_positive(num_images, "--num-images")
    probe_writable_dir(out_dir, "--out directory")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    engines = ensure_demo_bundle(out_dir / "engines", echo)
    pipe = Pipeline.from_dir(engines, backend=backend)
    names = list(class_names())
    prompts = [i % len(names) for i in range(num_images)]
    plans = {m: pipe.plan(m, seed=seed) for m in ("vanilla", verify)}  # each method's plan, made once
    for plan in plans.values():
        pipe.generate(prompts[:1], plan=plan)  # warm-up (sessions, allocations)
    results, images = {}, {}
    scorer = load_demo_scorer()
    for method in ("vanilla", verify):
        echo(f"generating {num_images} images with {method} ({pipe.backend}) ...")
        t0 = time.perf_counter()
        res = pipe.generate(prompts, plan=plans[method], progress=True)
        secs = (time.perf_counter() - t0) / num_images
        imgs = torch.from_numpy(np.stack([np.asarray(im) for im in res.images])).permute(0, 3, 1, 2)
        q = quality_with_error(imgs.float() / 127.5 - 1.0, torch.tensor(prompts), scorer, seed=seed)
        results[method] = {**speed_row(res, secs), "class_acc": q["class_acc"], "class_acc_ci95": q["class_acc_ci95"],
                           "fd_demo": q["fd_demo"], "fd_demo_se": q["fd_demo_se"], "quality": format_quality(q),
                           "indicative": q["indicative"]}
        images[method] = [np.asarray(im) for im in res.images]
    base = results["vanilla"]["seconds_per_image"]
    for r in results.values():
        r["speedup"] = base / r["seconds_per_image"]
    # rows = method, columns = class (the first image of each class)
    cols = sorted(set(prompts), key=prompts.index)
    rows = {"vanilla": [images["vanilla"][prompts.index(c)] for c in cols],
            f"LISA ({verify})": [images[verify][prompts.index(c)] for c in cols]}
    grid_path = out_dir / "vanilla_vs_lisa.png"
    save_png(labelled_grid(rows, [names[c] for c in cols]), grid_path)
    spec = plans[verify].spec
    tree = {"top_k": spec.tree.top_k, "depth": spec.tree.depth, "total_tokens": spec.tree.total_tokens}
    speed = speed_explanation(results["vanilla"], results[verify], verify=verify, backend=pipe.backend,
                              threads=ort_threads(), tree=tree, tokens_per_image=pipe.config.block_size)
    summary = {"backend": pipe.backend, "verify": verify, "num_images": num_images, "seed": seed,
               "threads": ort_threads(), "tree": tree, "classes": [names[p] for p in prompts],
               "results": results, "speed": speed, "grid": str(grid_path),
               "note": "quality from a few images is indicative only; bench/demo_quality.json scores 256 images",
               "deploy": deploy_line(pipe, engines, verify)}
    v, l = results["vanilla"], results[verify]
    echo(f"vanilla:      {v['seconds_per_image']:.2f} s/image, MAL 1.00, {v['quality']}")
    echo(f"LISA ({verify}): {l['seconds_per_image']:.2f} s/image, MAL {l['mal']:.2f}, mean TVD {l['mean_tvd']:.3f}, "
         f"{l['quality']}")
    for line in speed:
        echo(line)
    echo(f"grid (rows: method, columns: class): {grid_path}")
    write_json(out_dir / "summary.json", _json_safe(summary))
    echo(summary["deploy"])
    return summary


def speed_row(res, seconds_per_image: float) -> dict:
    """summary.json's speed entries of one method from its GenerationResult: MAL, mean TVD and the
    target forwards per image (the stats' `forwards`: the decoder's own count, prefill included)."""
    st = res.stats
    return {"seconds_per_image": seconds_per_image, "mal": float(np.mean([s["mal"] for s in st])),
            "mean_tvd": float(np.mean([s.get("mean_tvd", 0.0) for s in st])),
            "target_forwards": float(np.mean([s["forwards"] for s in st]))}


def deploy_line(pipe, engines: Path, compared: str) -> str:
    """The demo's last word: the command to deploy, and what its `--verify auto` runs and why
    (the same resolution `lisa-trt run` makes, Pipeline.resolve_verify), set apart from what the
    demo compared."""
    method, _, why = pipe.resolve_verify("auto")
    same = "the method compared above" if method == compared else f"not {compared}, the method compared above"
    return (f"to deploy: lisa-trt run {engines} PROMPTS.txt --out DIR   (--verify auto runs {method} "
            f"there, {same}: {why}; --verify {compared} runs what was compared)")


def _json_safe(obj):
    """NaN (e.g. FD from one image) -> None, so summary.json stays strict JSON."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj
