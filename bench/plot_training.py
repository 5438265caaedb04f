"""Training curves of one or more drafter runs on one figure (issue 11 item 2).

Reads RUN/metrics.jsonl of each run (`lisa-trt train --eval-every N` logs held-out "eval"
records: MAL proxy, top-1 / top-3 agreement per TTT step, real decoding MAL) and plots training
loss, held-out top-1 and top-3 agreement (step 0) and decoding MAL against the step.

    python bench/plot_training.py runs/lisa runs/eagle3 --labels LISA,EAGLE-3 --out bench/drafter_training.png

`--mark 400` draws a dotted line at step 400 on every panel (e.g. where `lisa-trt train --extend`
continued a finished run: the learning rate restarts there).
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
    cfg_path = Path(run) / "train_config.json"
    loss = json.loads(cfg_path.read_text()).get("loss", {}) if cfg_path.is_file() else {}
    # what ce_0 measures: the LISA loss logs its nucleus-truncated CE, the others the full soft CE
    ce = "nucleus CE" if loss.get("kind") == "lisa" and loss.get("truncated_ce", True) else "soft CE"
    return {"train": train, "eval": ev, "ce_kind": ce}


def plot(runs: list, labels: list, out: Path, marks: tuple = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lisa_trt.io import atomic_write

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for i, (data, label) in enumerate(zip(runs, labels)):
        col = f"C{i}"
        tr, ev = data["train"], data["eval"]
        # step-0 cross-entropy to the target's distribution (ce_0): the full soft CE for the EAGLE-3
        # loss, the nucleus (top-p) CE for the LISA loss: a curve per run, not comparable across
        # losses (the losses themselves have different scales too)
        key = "ce_0" if tr and all("ce_0" in r for r in tr) else "loss"
        xs, ys = [r["step"] for r in tr], [r[key] for r in tr]
        axes[0].plot(xs, ys, color=col, lw=0.5, alpha=0.35)
        w = 5
        sm = [sum(ys[max(0, j - w + 1): j + 1]) / len(ys[max(0, j - w + 1): j + 1]) for j in range(len(ys))]
        what = data.get("ce_kind", "soft CE") if key == "ce_0" else "loss"
        axes[0].plot(xs, sm, color=col, lw=1.5, label=f"{label} ({what}, mean of {w} logs)")
        steps = [r["step"] for r in ev]
        axes[1].plot(steps, [r["eval"]["top1_s"][0] for r in ev], "-o", color=col, ms=3, label=f"{label} top-1")
        axes[1].plot(steps, [r["eval"]["top3_s"][0] for r in ev], "--s", color=col, ms=3, label=f"{label} top-3")
        if any("decode_mal" in r["eval"] for r in ev):
            axes[2].plot([r["step"] for r in ev if "decode_mal" in r["eval"]],
                         [r["eval"]["decode_mal"] for r in ev if "decode_mal" in r["eval"]], "-o", color=col, ms=3,
                         label=f"{label} decoding")
        axes[2].plot(steps, [r["eval"]["mal_proxy"] for r in ev], ":", color=col, label=f"{label} proxy")
    for m in marks:
        for ax in axes:
            ax.axvline(m, color="0.4", ls=":", lw=1)
        axes[0].annotate(f"--extend from {m}\n(learning rate restarts)", (m, 0.97), xycoords=("data", "axes fraction"),
                         fontsize=7, ha="left", va="top", color="0.3")
    for ax, title in zip(axes, ("training: step-0 cross-entropy (each loss's own)", "held-out agreement with the target (step 0)",
                                "held-out MAL (exact): decoding and teacher-forced proxy")):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_write(out) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--labels", default=None, help="comma-separated, one per run (default: directory names)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--mark", default="", help="comma-separated steps to mark (e.g. where --extend continued the runs)")
    a = ap.parse_args()
    labels = a.labels.split(",") if a.labels else [Path(r).name for r in a.runs]
    if len(labels) != len(a.runs):
        raise SystemExit("--labels needs one label per run")
    marks = tuple(int(m) for m in a.mark.split(",") if m.strip())
    plot([read_run(Path(r)) for r in a.runs], labels, Path(a.out), marks)


if __name__ == "__main__":
    main()
