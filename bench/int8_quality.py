"""Issue 23: quality of the int8 ONNX Runtime bundle at >= 256 images, against fp32, same prompts and seeds.

For each bundle (`--engines name=DIR ...`, e.g. fp32 and int8 exports of the demo with the demo-lisa
drafter and the demo tables) and each method (`--methods`, default vanilla and gasv with the
bundle's shipped settings): `--images` class-conditional images (classes cycled, image i seeded
i), decoded in batches through `Pipeline.from_dir(..., backend="ort")` with per-row seeds (so an
image does not depend on its batch neighbours). Reported per row: class accuracy +- SE and
KID-demo +- SE (lisa_trt.quality.evaluate, against the held-out real crops), MAL +- SE over images
(image tokens per target forward), and the paired difference of each bundle from the first one
(same method, same seeds: correct_b - correct_a per image, mean +- SE).

    python bench/int8_quality.py --engines fp32=DIR int8=DIR --images 256 --json bench/int8_quality.json
"""

from __future__ import annotations

import argparse
import math
import time

import torch


def mean_se(x: torch.Tensor) -> tuple[float, float]:
    x = x.double()
    return float(x.mean()), float(x.std(unbiased=True) / math.sqrt(len(x))) if len(x) > 1 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", nargs="+", required=True, help="name=engine_dir ... (the first is the baseline)")
    ap.add_argument("--methods", default="vanilla,gasv")
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    from lisa_trt.demo.registry import load_demo_scorer
    from lisa_trt.demo.scorer import extract
    from lisa_trt.export.int8_isa import cpu_kind
    from lisa_trt.io import write_json
    from lisa_trt.quality import QualityReference, evaluate
    from lisa_trt.runtime.pipeline import Pipeline

    scorer = load_demo_scorer()
    ref = QualityReference(scorer)
    out = {"note": __doc__.split("\n\n")[0], "images": a.images, "cpu_kind": cpu_kind(), "rows": {}}
    per_image = {}
    for spec in a.engines:
        name, path = spec.split("=", 1)
        pipe = Pipeline.from_dir(path, backend="ort", threads=1)
        n_cls = pipe.config.num_classes
        for method in a.methods.split(","):
            t0 = time.perf_counter()
            toks, stats = [], []
            for s in range(0, a.images, a.batch):
                ids = [i % n_cls for i in range(s, min(a.images, s + a.batch))]
                from lisa_trt.runtime.prompts import Prompt

                r = pipe.generate([Prompt(line=s + j, class_id=c, seed=s + j) for j, c in enumerate(ids)], verify=method,
                                  batch=True, decode=False)
                toks.append(r.tokens)
                stats.extend(r.stats)
                print(f"{name}/{method}: {s + len(ids)}/{a.images}", flush=True)
            tokens = torch.cat(toks)
            g = pipe.config.grid_size
            vq = pipe._e.vq
            with torch.no_grad():
                imgs = torch.cat([vq.decode_code(tokens[i:i + 64], (len(tokens[i:i + 64]), vq.config.codebook_embed_dim,
                                                                    g, g)).float() for i in range(0, len(tokens), 64)])
            labels = torch.arange(a.images) % n_cls
            q = evaluate(imgs, labels, ref)
            _, logits = extract(scorer, imgs)
            correct = (logits.argmax(-1) == labels).float()
            mal = torch.tensor([st["mal"] for st in stats], dtype=torch.float64)
            m, m_se = mean_se(mal)
            row = {**q, "mal": m, "mal_se": m_se, "seconds": round(time.perf_counter() - t0, 1)}
            if "mean_tvd" in stats[0]:
                row["mean_tvd"] = float(torch.tensor([st["mean_tvd"] for st in stats]).mean())
            base = per_image.get(method)
            if base is not None:
                dc, dc_se = mean_se(correct - base["correct"])
                dm, dm_se = mean_se(mal - base["mal"])
                row["paired_vs_" + base["name"]] = {"class_acc_diff": dc, "class_acc_diff_se": dc_se,
                                                    "mal_diff": dm, "mal_diff_se": dm_se,
                                                    "within_2se": abs(dc) <= 2 * dc_se if dc_se == dc_se else None}
            else:
                per_image[method] = {"name": name, "correct": correct, "mal": mal}
            out["rows"][f"{name}/{method}"] = row
            print(name, method, {k: row[k] for k in ("class_acc", "class_acc_se", "mal", "mal_se")}, flush=True)
        pipe.close()
    write_json(a.json, out)


if __name__ == "__main__":
    main()
