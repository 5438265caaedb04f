"""Issue 11 item 3: the distillation ablation at matched budget, with paired error bars.

The decoding runs are `bench/gasv_frontier.py` jobs (batched, same prompts and seeds, class
accuracy +- SE), one per drafter, each merged into a copy of one base file that holds the stored
vanilla point, then joined here:

    python bench/gasv_frontier.py --drafter runs/lisa/drafter.safetensors --label-prefix lisa: \\
        --points "vanilla|exact|gasv[kappa=2,lambda=0.4,delta=0.3]" --merge --json A.json ...
    python bench/gasv_frontier.py --points "vanilla|oracle" --merge --json O.json ...
    python bench/lisa_ablation.py --combine O.json A.json B.json ... --json bench/lisa_ablation.json \\
        --plot bench/lisa_ablation.png

Labels are DRAFTER:RULE (e.g. `lisa-no-kd:exact`). For every drafter and rule this adds a summary:
MAL +- SE over images, drafter efficiency (exact MAL / the exact oracle's MAL on the same images; per-image
means when a drafter was decoded on fewer images than the oracle) with its SE (paired over images, delta
method), and the
PAIRED difference to the reference drafters (`--refs`, default eagle3 and lisa) on the images both
were decoded on (image i has the same prompt and seed in every job, so the pairing is exact): the
mean per-image MAL difference +- its SE, and whether it is beyond 2 SE. Prints the table as
Markdown.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path


def _frontier():
    spec = importlib.util.spec_from_file_location("gasv_frontier", Path(__file__).with_name("gasv_frontier.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def paired(a: list, b: list) -> dict:
    """Mean and SE of the per-image difference a - b over the images both have (the first n)."""
    n = min(len(a), len(b))
    if n < 2:
        raise SystemExit("paired comparison needs per-image MALs of >= 2 common images "
                         "(frontier files made before mal_per_image existed cannot be paired)")
    d = [x - y for x, y in zip(a[:n], b[:n])]
    m = sum(d) / n
    se = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1) / n)
    return {"diff": m, "se": se, "images": n, "beyond_2se": abs(m) > 2 * se}


def ratio_se(a: list, b: list) -> float:
    """SE of sum(a) / sum(b) over paired per-image values (delta method), on the first common images."""
    n = min(len(a), len(b))
    if n < 2:
        return float("nan")
    ma, mb = sum(a[:n]) / n, sum(b[:n]) / n
    r = ma / mb
    z = [(x - r * y) / mb for x, y in zip(a[:n], b[:n])]
    mz = sum(z) / n
    return math.sqrt(sum((v - mz) ** 2 for v in z) / (n - 1) / n)


def summarize(report: dict, refs: list) -> dict:
    res = report["results"]
    rows = {}
    for label, r in sorted(res.items()):
        if ":" not in label:
            continue
        name, rule = label.split(":", 1)
        row = {"drafter": name, "rule": rule, "images": r["images"], "mal": r["mal"], "mal_se": r.get("mal_se"),
               "class_acc": r.get("class_acc"), "class_acc_se": r.get("class_acc_se"), "mean_tvd": r.get("mean_tvd")}
        if "oracle" in res and rule == "exact":
            o = res["oracle"]
            if r["images"] == o["images"]:  # the frontier's own figure: MAL / oracle MAL
                row["drafter_efficiency"] = r["mal"] / o["mal"]
            else:  # fewer images than the oracle: compare on the images both decoded (per-image means)
                n = min(len(r["mal_per_image"]), len(o["mal_per_image"]))
                row["drafter_efficiency"] = sum(r["mal_per_image"][:n]) / sum(o["mal_per_image"][:n])
                row["efficiency_on"] = f"per-image means over the first {n} images"
            if r.get("mal_per_image") and o.get("mal_per_image"):  # paired over images (delta method)
                row["drafter_efficiency_se"] = ratio_se(r["mal_per_image"], o["mal_per_image"])
        for ref in refs:
            other = res.get(f"{ref}:{rule}")
            if other is not None and ref != name:
                row[f"vs_{ref}"] = paired(r["mal_per_image"], other["mal_per_image"])
        rows[label] = row
    return rows


def markdown(rows: dict, report: dict, refs: list) -> str:
    o = report["results"].get("oracle")
    out = []
    if o:
        out.append(f"oracle (exact): MAL {o['mal']:.3f} +- {o['mal_se']:.3f} ({o['images']} images)\n")
    head = "| drafter | rule | images | MAL +- SE | efficiency | " + " | ".join(f"d vs {r} (paired)" for r in refs)
    out += [head + " | class acc |", "|" + "---|" * (6 + len(refs))]
    for row in rows.values():
        eff = f"{row['drafter_efficiency']:.3f}" if "drafter_efficiency" in row else ""
        if eff and row.get("drafter_efficiency_se") is not None:
            eff += f" +- {row['drafter_efficiency_se']:.3f}"
        cmp_ = []
        for ref in refs:
            p = row.get(f"vs_{ref}")
            cmp_.append("" if p is None else f"{p['diff']:+.3f} +- {p['se']:.3f}{' *' if p['beyond_2se'] else ''}")
        acc = "" if row["class_acc"] is None else f"{row['class_acc']:.3f} +- {row['class_acc_se']:.3f}"
        out.append(f"| {row['drafter']} | {row['rule']} | {row['images']} | {row['mal']:.3f} +- {row['mal_se']:.3f} | "
                   f"{eff} | " + " | ".join(cmp_) + f" | {acc} |")
    out.append("\n`*`: paired difference beyond 2 standard errors.")
    return "\n".join(out)


def plot(rows: dict, report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lisa_trt.io import atomic_write

    rules = sorted({r["rule"] for r in rows.values()}, key=lambda r: (r != "exact", r))
    names = list(dict.fromkeys(r["drafter"] for r in rows.values()))
    def loss_run(n):  # "eagle3" / "lisa" / "lisa-1600" -> (loss, longer run?); ablations -> None
        base, _, rest = n.partition("-")
        return (base, bool(rest)) if base in ("eagle3", "lisa") and (not rest or rest.isdigit()) else None

    def colour(n):  # blue: EAGLE-3 loss, orange: LISA loss (pale: the 400-step run), grey: ablations
        run = loss_run(n)
        if run is None:
            return matplotlib.colors.to_rgba("C7")
        return matplotlib.colors.to_rgba("C0" if run[0] == "eagle3" else "C1", 1.0 if run[1] else 0.45)

    names.sort(key=lambda n: (loss_run(n) is None, len(n), n))  # the two losses' runs first, then the ablations
    fig, axes = plt.subplots(1, len(rules), figsize=(5 * len(rules), 3.8), squeeze=False)
    for ax, rule in zip(axes[0], rules):
        xs = [n for n in names if f"{n}:{rule}" in rows]
        ys = [rows[f"{n}:{rule}"]["mal"] for n in xs]
        es = [2 * rows[f"{n}:{rule}"]["mal_se"] for n in xs]
        ax.bar(range(len(xs)), ys, yerr=es, capsize=3, color=[colour(n) for n in xs])
        if rule == "exact" and "oracle" in report["results"]:
            o = report["results"]["oracle"]["mal"]
            ax.axhline(o, color="k", ls="--", lw=1, label="oracle drafter")
            ax.axhline(0.9 * o, color="k", ls=":", lw=1, label="0.9 of the oracle")
            ax.legend(fontsize=7, loc="lower right")
        ax.set_xticks(range(len(xs)))
        ax.set_xticklabels(xs, rotation=30, ha="right", fontsize=7)
        lo = min(ys) - 0.15
        ax.set_ylim(max(1.0, lo), None)
        ax.set_title(f"{rule}: MAL (bars: 2 SE over images, unpaired;\npaired differences: the JSON summary)", fontsize=8)
    fig.suptitle("drafter ablation at matched budget (demo model)", fontsize=9)
    fig.tight_layout()
    with atomic_write(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--combine", nargs="+", required=True, metavar="JSON",
                    help="frontier files made with gasv_frontier.py --merge from the same base file")
    ap.add_argument("--json", required=True)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--refs", default="eagle3,lisa", help="drafters every other one is paired against")
    ap.add_argument("--recipe", default=None, help="a JSON file describing the training runs, stored as settings.training")
    a = ap.parse_args(argv)
    refs = [r for r in a.refs.split(",") if r]
    _frontier()._combine(a.combine, a.json, None)
    report = json.loads(Path(a.json).read_text())
    report["summary"] = summarize(report, refs)
    if a.recipe:
        report["settings"]["training"] = json.loads(Path(a.recipe).read_text())
    from lisa_trt.io import write_json

    write_json(a.json, report)
    if a.plot:
        plot(report["summary"], report, Path(a.plot))
    print(markdown(report["summary"], report, refs))


if __name__ == "__main__":
    main()
