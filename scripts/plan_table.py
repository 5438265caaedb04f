"""The memory-plan table of docs/deployment.md, made by `lisa_trt.deploy.memory_plan` (issue 26).

    python scripts/plan_table.py                           # print the table (markdown)
    python scripts/plan_table.py --write docs/deployment.md  # replace it between the markers
    python scripts/plan_table.py --check docs/deployment.md  # exit 1 when the docs are stale

Rows: LlamaGen GPT-B ... GPT-3B (384 px), Lumina-mGPT-7B (512 / 768 / 1024 px), Janus-Pro-7B
(384 px) at fp16 / int8 / int4; settings: batch 1 with CFG (2 rows), a 64-node tree, the default
prompt; columns: the plan's parts, totals, and per GPU whether it fits and the largest batch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BEGIN, END = "<!-- plan-table:begin -->", "<!-- plan-table:end -->"
MODELS = [(n, 384) for n in ("GPT-B", "GPT-L", "GPT-XL", "GPT-XXL", "GPT-3B")] + \
    [("Lumina-mGPT-7B", s) for s in (512, 768, 1024)] + [("Janus-Pro-7B", 384)]
PRECISIONS = ("fp16", "int8", "int4")
GPUS = ("rtx4090", "l4", "orin-64")
TREE, BATCH = 64, 1


def table() -> str:
    from lisa_trt.deploy.memory_plan import GIB, GPUS as DEVICES, make_plan

    g = lambda b: f"{b / GIB:.2f}"  # noqa: E731
    head = ["model", "px", "precision", "target weights", "KV cache", "drafter", "tables + VQ", "activations + io + loop",
            "run total", "build peak"] + [f"{DEVICES[d].label} ({g(DEVICES[d].usable)} usable)" for d in GPUS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, size in MODELS:
        for prec in PRECISIONS:
            cells = []
            for gpu in GPUS:
                p = make_plan(name, gpu=gpu, precision=prec, batch=BATCH, tree=TREE, image_size=size)
                cells.append(f"{'yes' if p.fits else 'no'} (batch <= {p.max_batch})" if p.fits else "no")
            e = p.engines
            act = sum(v.get("activations", 0) + v.get("io", 0) for v in e.values()) + p.temporaries
            small = e["gasv"]["weights"] + e["vq_decode"]["weights"]
            dr = e["drafter"]["weights"] + e["drafter"]["kv_cache"]
            lines.append("| " + " | ".join([name, str(size), prec, g(e["target"]["weights"]), g(e["target"]["kv_cache"]),
                                            g(dr), g(small), g(act), g(p.total), g(p.build_peak), *cells]) + " |")
    return "\n".join(lines)


def splice(doc: str, body: str) -> str:
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"the document has no {BEGIN} ... {END} markers")
    pre, rest = doc.split(BEGIN, 1)
    _, post = rest.split(END, 1)
    return f"{pre}{BEGIN}\n{body}\n{END}{post}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", type=Path, help="replace the table between the markers of this file")
    ap.add_argument("--check", type=Path, help="exit 1 when this file's table differs from a fresh one")
    a = ap.parse_args(argv)
    body = table()
    if a.check:
        doc = a.check.read_text()
        if splice(doc, body) != doc:
            print(f"{a.check}: the plan table is stale; run python scripts/plan_table.py --write {a.check}")
            return 1
        return 0
    if a.write:
        from lisa_trt.io import atomic_write

        new = splice(a.write.read_text(), body)
        with atomic_write(a.write) as tmp:
            tmp.write_text(new)
        print(f"wrote the plan table into {a.write}")
        return 0
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
