"""Issue 49 item 6: do GASV and LANTERN keep their acceptance law across the decode-loop reshaping?

The same demo images (bench/decoders.py's classes, seeds, tree, drafter, tables and sampling:
image i has class i % classes, batch j is decoded with seed `seed + j`) are decoded with
`lisa-gasv` and `lisa-lantern` on two source trees in one run: `--before` (default 66d69a4, the
main commit the decode session, the batched verification rules and the one KV storage were built
on) and `--after` (default HEAD). `git archive REF lisa_trt` of each is unpacked to a temporary
directory and each tree decodes in a child process of this script (bench/_refs.py, as
bench/step_budget.py --compare does), one thread each, the two trees side by side.

Per method and tree: MAL (committed tokens per target forward, pooled) +- SE, mean per-token TVD
+- SE, target forwards per image, and per image the SHA-1 of its tokens; per method: the fraction
of images whose tokens are identical between the trees, and whether the MAL and TVD differences
are within 2 SE (SE of the difference: sqrt(SE_before^2 + SE_after^2); the paired SE over the
same images is recorded beside it). `vs_recorded`: the after tree against bench/decoders.json's
record of the same label (same settings, an older tree: lisa-gasv at 2789c37, before issue 49)
over the same first images, with the same verdicts.

ROUNDS: every round brings both trees to the next multiple of `--per-round` images; the JSON is
rewritten atomically after each one and holds every image's raw numbers and token hash, so a
stopped run resumes from it (the settings must match).

    OMP_NUM_THREADS=1 nice -n 5 python bench/same_law.py > /tmp/same_law.log 2>&1 &
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))  # bench/decoders.py and bench/_refs.py, imported, not copied

import decoders  # noqa: E402

TREES = ("before", "after")
SAME = ("before", "after", "before_commit", "after_commit", "methods", "seed", "batch", "window", "tree", "drafter")


def _defaults():
    return decoders.build_parser().parse_args([])


def build_parser():
    d = _defaults()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="66d69a4", help="git ref of the tree before the reshaping")
    ap.add_argument("--after", default="HEAD", help="git ref of the tree after it")
    ap.add_argument("--methods", default="lisa-gasv,lisa-lantern", help="bench/decoders.py point labels")
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--per-round", type=int, default=32)
    for k in ("batch", "seed", "window"):
        ap.add_argument(f"--{k}", type=int, default=getattr(d, k), help=f"as bench/decoders.py (default {getattr(d, k)})")
    ap.add_argument("--tree", default=d.tree, help=f"top_k,depth,total_tokens as bench/decoders.py ({d.tree})")
    ap.add_argument("--drafter", default=d.drafter)
    ap.add_argument("--out", default=str(HERE / "same_law.json"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batches", default="", help=argparse.SUPPRESS)
    return ap


# ----------------------------------------------------------------------------- worker (one tree)

def work(a) -> dict:
    """Decode batches `a.batches` of every method with the lisa_trt on the path (the child's tree)."""
    import lisa_trt
    import torch

    torch.set_num_threads(1)
    fr = decoders.Frontier(a)
    out = {"lisa_trt": str(Path(lisa_trt.__file__).parent), "results": {}}
    for label in decoders.split_points(a.methods):
        rows = []
        for j in (int(x) for x in a.batches.split(",") if x):
            b = fr.batch(label, j)
            rows.append({"batch": j, "tok": b["tok"], "fwd": b["fwd"], "tvd": b["tvd"], "seconds": b["seconds"],
                         "sha1": [hashlib.sha1(r.numpy().tobytes()).hexdigest() for r in b["tokens"]]})
        out["results"][label] = rows
    return out


# ----------------------------------------------------------------------------- driver

def _settings(a, commits) -> dict:
    return {"before": a.before, "after": a.after, "before_commit": commits["before"], "after_commit": commits["after"],
            "methods": a.methods, "seed": a.seed, "batch": a.batch, "window": a.window, "tree": a.tree,
            "drafter": a.drafter, "model": "demo", "sampling": "lisa_trt.demo.registry.demo_sampling()",
            "classes": "image i: i % classes", "seeds": "batch j: seed + j", "threads": 1}


def _load(a, settings) -> dict:
    """Per tree and label the accumulated per-image lists from an earlier run of the same settings."""
    empty = {t: {lab: {"tok": [], "fwd": [], "tvd": [], "sha1": [], "seconds": 0.0}
                 for lab in decoders.split_points(a.methods)} for t in TREES}
    p = Path(a.out)
    if not p.is_file():
        return empty
    old = json.loads(p.read_text())
    diff = [k for k in SAME if old["settings"].get(k) != settings.get(k)]
    if diff:
        raise SystemExit(f"{p}: settings {diff} differ from this run ({[old['settings'].get(k) for k in diff]} vs "
                         f"{[settings.get(k) for k in diff]}); use the same ones or another --out")
    for t in TREES:
        for lab, acc in old["raw"][t].items():
            empty[t][lab] = acc
    return empty


def _child(src: Path, a, batches: list) -> dict:
    from _refs import run_worker

    return run_worker(__file__, src, ["--methods", a.methods, "--batches", ",".join(map(str, batches)),
                                      "--batch", a.batch, "--seed", a.seed, "--window", a.window, "--tree", a.tree,
                                      "--drafter", a.drafter])


def _both(srcs: dict, a, batches: dict) -> dict:
    """Both trees' children at once (one thread each); a failure in either is raised."""
    out, errs = {}, []

    def go(t):
        try:
            out[t] = _child(srcs[t], a, batches[t]) if batches[t] else {"results": {}}
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errs.append(e)

    th = [threading.Thread(target=go, args=(t,)) for t in TREES]
    for x in th:
        x.start()
    for x in th:
        x.join()
    if errs:
        raise errs[0]
    return out


def _delta(b: dict, n: dict, key: str, se_key: str, paired: list) -> dict:
    d = n[key] - b[key]
    se = math.sqrt(b[se_key] ** 2 + n[se_key] ** 2)
    return {"before": b[key], "after": n[key], "delta": d, "se": se, "paired_se": decoders.mean_se(paired)[1],
            "within_2se": abs(d) <= 2 * se}


def compare(accs: dict) -> dict:
    """Per label: each tree's summary (bench/decoders.summarize) and the before / after verdicts."""
    out = {}
    for lab in accs["before"]:
        b_acc, n_acc = accs["before"][lab], accs["after"][lab]
        n = min(len(b_acc["tok"]), len(n_acc["tok"]))
        if n < 2:
            continue
        cut = {t: {k: (v[:n] if isinstance(v, list) else v) for k, v in accs[t][lab].items()} for t in TREES}
        s = {t: decoders.summarize(lab, cut[t], {}) for t in TREES}
        for t in TREES:
            s[t].pop("raw")
            s[t].pop("cpu_seconds_per_image_batched_loaded")
            s[t]["cpu_seconds_per_image"] = cut[t]["seconds"] / len(accs[t][lab]["tok"])
        tok = sum(cut["after"]["tok"]) / n
        f_b, f_n = cut["before"]["fwd"], cut["after"]["fwd"]
        mb, mn = sum(f_b) / n, sum(f_n) / n
        # pooled MAL = tok / mean forwards: paired per-image forward differences, delta method
        mal_paired = [-tok * (y - x) / (mb * mn) for x, y in zip(f_b, f_n)]
        tvd_paired = [y - x for x, y in zip(cut["before"]["tvd"], cut["after"]["tvd"])]
        same = sum(x == y for x, y in zip(cut["before"]["sha1"], cut["after"]["sha1"]))
        out[lab] = {"images": n, "before": s["before"], "after": s["after"],
                    "mal": _delta(s["before"], s["after"], "mal", "mal_se", mal_paired),
                    "mean_tvd": _delta(s["before"], s["after"], "mean_tvd", "mean_tvd_se", tvd_paired),
                    "forwards_per_image": {"before": s["before"]["target_forwards_per_image"],
                                           "after": s["after"]["target_forwards_per_image"]},
                    "identical_tokens_fraction": same / n}
        out[lab]["same_law"] = out[lab]["mal"]["within_2se"] and out[lab]["mean_tvd"]["within_2se"]
    return out


def recorded(accs: dict, settings: dict, path: Path, tokens_path: Path) -> dict:
    """The after tree against bench/decoders.json's record of the same label, made on an older
    tree with the same settings (lisa-gasv: 2789c37, before issue 49), over the same first n
    images: compare()'s verdicts and identical-token fraction, with the record as "before"."""
    import torch

    if not (path.is_file() and tokens_path.is_file()):
        return {}
    rec, toks, out = json.loads(path.read_text()), torch.load(tokens_path), {}
    k, d, t = (int(x) for x in settings["tree"].split(","))
    mine = {"seed": settings["seed"], "batch": settings["batch"], "window": settings["window"],
            "drafter": settings["drafter"], "tree": {"top_k": k, "depth": d, "total_tokens": t}}
    if any(rec["settings"].get(key) != v for key, v in mine.items()):
        return {}
    for lab, acc in accs["after"].items():
        r, n = rec["results"].get(lab), len(acc["tok"])
        if r is None or lab not in toks or n < 2 or r["images"] < n:
            continue
        old = {"tok": r["raw"]["tok"][:n], "fwd": r["raw"]["fwd"][:n], "tvd": r["raw"]["tvd"][:n], "seconds": 0.0,
               "sha1": [hashlib.sha1(x.numpy().tobytes()).hexdigest() for x in toks[lab][:n]]}
        out[lab] = compare({"before": {lab: old}, "after": {lab: acc}})[lab]
        out[lab]["record"] = {"file": f"bench/{path.name}", "images": r["images"], "mal": r["mal"],
                              "mal_se": r["mal_se"], "mean_tvd": r["mean_tvd"], "mean_tvd_se": r["mean_tvd_se"]}
    return out


def _write(a, settings, accs, t0, echo) -> dict:
    sys.path.insert(0, str(ROOT))
    from lisa_trt.io import write_json

    res = compare(accs)
    report = {"settings": dict(settings, elapsed_s=round(time.time() - t0, 1), command=" ".join(["python"] + sys.argv)),
              "criterion": "|after - before| <= 2 * sqrt(SE_before^2 + SE_after^2) for MAL and mean TVD",
              "results": res,
              "vs_recorded": recorded(accs, settings, HERE / "decoders.json", HERE / "decoders.tokens.pt"),
              "raw": accs}
    write_json(a.out, report)
    for lab, r in res.items():
        echo(f"  {lab}: {r['images']} images  MAL {r['mal']['before']:.3f} -> {r['mal']['after']:.3f} "
             f"(delta {r['mal']['delta']:+.3f}, SE {r['mal']['se']:.3f})  TVD {r['mean_tvd']['before']:.4f} -> "
             f"{r['mean_tvd']['after']:.4f} (SE {r['mean_tvd']['se']:.4f})  identical "
             f"{r['identical_tokens_fraction']:.3f}  same law {r['same_law']}", flush=True)
    for lab, r in report["vs_recorded"].items():
        echo(f"  {lab} vs bench/decoders.json: MAL {r['mal']['before']:.3f} -> {r['mal']['after']:.3f} (SE "
             f"{r['mal']['se']:.3f})  TVD {r['mean_tvd']['before']:.4f} -> {r['mean_tvd']['after']:.4f}  identical "
             f"{r['identical_tokens_fraction']:.3f}  same law {r['same_law']}", flush=True)
    return report


def run(a, echo=print) -> dict:
    from _refs import export_ref

    if a.images % a.batch or a.per_round % a.batch:
        raise SystemExit("--images and --per-round must be multiples of --batch")
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        srcs, commits = {}, {}
        for t in TREES:
            srcs[t] = Path(tmp) / t
            srcs[t].mkdir()
            commits[t] = export_ref(getattr(a, t), srcs[t])
        settings = _settings(a, commits)
        accs = _load(a, settings)
        report = None
        while True:
            have = min(len(acc["tok"]) for t in TREES for acc in accs[t].values())
            if have >= a.images:
                break
            goal = min(a.images, (have // a.per_round + 1) * a.per_round)
            # a tree's batches: those its least-advanced label lacks (every label decodes them)
            batches = {t: list(range(min(len(acc["tok"]) for acc in accs[t].values()) // a.batch, goal // a.batch))
                       for t in TREES}
            got = _both(srcs, a, batches)
            for t in TREES:
                for lab, rows in got[t]["results"].items():
                    acc = accs[t][lab]
                    for r in rows:
                        if len(acc["tok"]) != r["batch"] * a.batch:
                            continue  # this label already had the batch
                        for k in ("tok", "fwd", "tvd", "sha1"):
                            acc[k] += r[k]
                        acc["seconds"] += r["seconds"]
                if got[t].get("lisa_trt") and not got[t]["lisa_trt"].startswith(str(srcs[t])):
                    raise SystemExit(f"the {t} child imported lisa_trt from {got[t]['lisa_trt']}, not {srcs[t]}")
            echo(f"round to {goal} images ({time.time() - t0:.0f} s)", flush=True)
            report = _write(a, settings, accs, t0, echo)
    return report or _write(a, settings, accs, t0, echo)


def main(argv=None):
    a = build_parser().parse_args(argv)
    if a.worker:
        print(json.dumps(work(a)))
        return
    run(a)


if __name__ == "__main__":
    main()
