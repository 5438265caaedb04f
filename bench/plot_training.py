"""Training curves of one or more drafter runs on one figure (issue 11 item 2).

Reads RUN/metrics.jsonl of each run (`lisa-trt train --eval-every N` logs held-out "eval"
records: MAL proxy, top-1 / top-3 agreement per TTT step, real decoding MAL) and plots training
loss, held-out top-1 and top-3 agreement (step 0) and decoding MAL against the step.

    python bench/plot_training.py runs/lisa runs/eagle3 --labels LISA,EAGLE-3 --out bench/drafter_training.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_run(run: Path) -> dict:
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path} not found: is {run} a `lisa-trt train` run directory?")
    train, ev = [], []
    for ln in path.read_text().splitlines():
        if not ln.strip():
            continue
        r = json.loads(ln)
        (ev if "eval" in r else train).append(r)
    return {"train": train, "eval": ev}


def plot(runs: list, labels: list, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lisa_trt.io import atomic_write

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for data, label in zip(runs, labels):
        tr, ev = data["train"], data["eval"]
        axes[0].plot([r["step"] for r in tr], [r["loss"] for r in tr], label=label, lw=0.8)
        steps = [r["step"] for r in ev]
        axes[1].plot(steps, [r["eval"]["top1_s"][0] for r in ev], "-o", ms=3, label=f"{label} top-1")
        axes[1].plot(steps, [r["eval"]["top3_s"][0] for r in ev], "--s", ms=3, label=f"{label} top-3")
        if any("decode_mal" in r["eval"] for r in ev):
            axes[2].plot([r["step"] for r in ev if "decode_mal" in r["eval"]],
                         [r["eval"]["decode_mal"] for r in ev if "decode_mal" in r["eval"]], "-o", ms=3,
                         label=f"{label} decoding")
        axes[2].plot(steps, [r["eval"]["mal_proxy"] for r in ev], ":", label=f"{label} proxy")
    for ax, title in zip(axes, ("training loss", "held-out agreement (step 0)", "MAL (exact)")):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_write(out) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--labels", default=None, help="comma-separated, one per run (default: directory names)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    labels = a.labels.split(",") if a.labels else [Path(r).name for r in a.runs]
    if len(labels) != len(a.runs):
        raise SystemExit("--labels needs one label per run")
    plot([read_run(Path(r)) for r in a.runs], labels, Path(a.out))


if __name__ == "__main__":
    main()
