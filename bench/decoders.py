"""Issue 27's decoder frontier on the demo model: every decoder on the same classes and seeds,
MAL per target forward +- SE, mean per-token TVD, class accuracy +- SE and KID-demo +- SE.

    OMP_NUM_THREADS=1 nohup python bench/decoders.py --images 256 > runs/decoders.log 2>&1 &
    python bench/decoders.py --images 256 --methods 'gsd[group=6]'      # one more point, merged
    python bench/decoders.py --timing --images 16                        # quiet machine only
    python bench/decoders.py --choose bench/decoders_timing.json         # never-slower choices from both

Points are labels `method[knob=value,...]` (knobs are the method's flat settings without the
`<method>_` prefix: `gsd[group=14]` -> gsd_group=14); `lisa-exact` / `lisa-gasv` are the tree
methods `exact` / `gasv` with the demo's trained drafter (`--drafter`) and tables, `oracle` the
target's own top-k in the same tree (the drafter ceiling). Image i has class i % classes; batch j
(images j*batch .. (j+1)*batch - 1) is decoded as one batch with seed `seed + j`, so every point
sees the same classes and seeds whatever run produced it.

ROUNDS: each round brings every requested point to the next multiple of `--per-round` images
(at most `--images`); after every round the JSON is rewritten atomically (lisa_trt.io.write_json)
with the tokens in a side file (`--state`, default beside the JSON: bench/decoders.tokens.pt is
committed), so a stopped run resumes where it was, even in a fresh clone, and every point
keeps the same number of images. Points already in the JSON and not requested are kept (merge);
settings that change the images (seed, batch, sampling, window, tree, drafter) must match.
`--merge OTHER.json` takes the points of a run made in parallel into another --out (same settings,
tokens beside it: OTHER.tokens.pt) into this JSON and its token file where they hold more images;
without --methods it decodes nothing (the merged points keep their image counts).

Rows are BATCHED (batch > 1): this measures acceptance and quality, not speed (`loaded: true`).
MAL = committed tokens per target forward (prefill excluded, docs/spec/speculative.md), pooled
over images; `mal_se` is the standard error of the per-image MAL; the MC-SJD / SJD ratio is the
ratio of mean per-image MALs with a paired delta-method SE. Quality uses lisa_trt.quality (KID vs
real held-out crops; >= 256 images per point for claims). `--timing` is a separate small mode:
seconds per image at batch 1 on the demo bundle's torch and ONNX Runtime engines.

CHOOSE (`--choose TIMING[,TIMING]`): the never-slower choice per backend and precision re-made from
timing files and this frontier (runtime/autotune.choose_decoding): the fastest timed decoder that
beats vanilla by MIN_GAIN and is lossless (frontier TVD 0) or quality-neutral at the frontier (class
accuracy and KID-demo within 2 SE of vanilla at >= 256 images; a relaxed tree rule only when the
timed tree is the frontier's), else vanilla; written to lisa_trt/assets/demo/decode_choice.json, which
the demo bundle records (`--verify auto` of run / Pipeline / serve). Precisions no timing file
covers keep their earlier choices.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_POINTS = ("vanilla", "sjd", "mcsjd", "sjd-pac", "gsd[group=14]", "zipar[window=4]", "lisa-exact",
                  "lisa-gasv", "gsd[group=25]", "zipar[window=8]", "oracle")
ALIASES = {"lisa-exact": "exact", "lisa-gasv": "gasv", "lisa-lantern": "lantern", "lisa-coupled": "coupled"}  # drafter-tree methods
GASV_KNOBS = {"kappa": "gasv_kappa", "lambda": "gasv_lambda", "delta": "gasv_delta", "scope": "gasv_scope"}
GASV_METHODS = ("gasv", "sjd-gasv", "gasv-2d", "pjd-gasv-2d")  # methods whose kappa / lambda / delta are gasv's
SAME = ("model", "seed", "batch", "window", "tree", "drafter", "sampling")  # settings that change the images


def parse_point(label: str) -> tuple[str, dict]:
    """'gsd[group=14]' -> ('gsd', {'gsd_group': 14}); 'lisa-gasv[kappa=1]' -> ('gasv', {'gasv_kappa': 1})."""
    base, _, rest = label.partition("[")
    method = ALIASES.get(base, base)
    over = {}
    for kv in filter(None, rest.rstrip("]").split(",")):
        k, v = kv.split("=")
        name = GASV_KNOBS.get(k) if method in GASV_METHODS else None
        name = name or f"{method.replace('-', '_')}_{k}"
        try:
            over[name] = int(v)
        except ValueError:
            try:
                over[name] = float(v)
            except ValueError:
                over[name] = v
    return method, over


def split_points(text: str) -> list:
    """'vanilla,gsd[group=14,prob_gap=0.1];sjd' -> ['vanilla', 'gsd[group=14,prob_gap=0.1]', 'sjd']."""
    out, cur, depth = [], "", 0
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch in ",;" and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return [x for x in out if x]


def row_stats(st, B: int, kind: str, n_commit: int):
    """Per row of one batch -> (committed tokens, forwards, mean TVD over its steps).

    Tree decoders record the row of every step (DecodeStats.rows). The Jacobi loops record the
    live rows only, in row order, without their indices; a row is live until it has committed
    `n_commit` tokens, so the rows are reconstructed exactly from the running totals."""
    tok, fwd = [0.0] * B, [0] * B
    tvd_sum = [0.0] * B
    if kind == "ar":
        return [float(n_commit)] * B, [n_commit] * B, [0.0] * B
    tvds = st.tvd if len(st.tvd) == len(st.committed) else [None] * len(st.committed)
    for i, (c, t) in enumerate(zip(st.committed, tvds)):
        c = c.float().cpu()
        t = t.float().cpu() if t is not None else torch.zeros_like(c)
        if st.rows and len(st.rows) == len(st.committed):
            rows = st.rows[i].cpu().tolist()
        else:
            rows = [b for b in range(B) if tok[b] < n_commit]
            if len(rows) != c.numel():
                raise RuntimeError(f"step {i}: {c.numel()} committed entries for {len(rows)} live rows")
        for j, b in enumerate(rows):
            tok[b] += float(c[j])
            fwd[b] += 1
            tvd_sum[b] += float(t[j])
    if any(abs(x - n_commit) > 1e-6 for x in tok):
        raise RuntimeError(f"rows committed {tok}, expected {n_commit} each")
    return tok, fwd, [s / max(f, 1) for s, f in zip(tvd_sum, fwd)]


def mean_se(xs):
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan")
    m = sum(xs) / n
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n) if n > 1 else float("nan"))


def ratio_se(a, b):
    """Ratio of the means of paired samples a, b (same images) and its delta-method SE. With a, b
    the target forwards per image of two points (every image commits the same tokens), it is the
    inverse ratio of their pooled MALs: ratio_se(fwd_sjd, fwd_x) = MAL_x / MAL_sjd."""
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    ma, mb = sum(a) / n, sum(b) / n
    if n < 2:
        return ma / mb, float("nan")
    va = sum((x - ma) ** 2 for x in a) / (n - 1)
    vb = sum((y - mb) ** 2 for y in b) / (n - 1)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (n - 1)
    r = ma / mb
    var = (va - 2 * r * cov + r * r * vb) / (mb * mb) / n
    return r, math.sqrt(max(var, 0.0))


class Frontier:
    """The generation side: demo target, drafter, tables, and one batch of any point."""

    def __init__(self, a):
        from lisa_trt.demo.registry import demo_sampling, load_demo_target

        self.a = a
        self.target = load_demo_target()
        self.sampling = demo_sampling()
        self.ncls = self.target.config.num_classes
        self.n_tokens = math.prod(self.target.config.grid_hw)
        self._drafter = self._tables = None
        k, d, n = (int(x) for x in a.tree.split(","))
        self.tree = {"top_k": k, "depth": d, "total_tokens": n}

    def artifacts(self):
        from lisa_trt.artifacts import load_drafter_by_name, load_tables_by_name

        if self._drafter is None:
            self._drafter = load_drafter_by_name(self.a.drafter, self.target)
            self._tables = load_tables_by_name("demo", self.target)
        return self._drafter, self._tables

    def batch(self, label: str, j: int) -> dict:
        """Batch j of point `label` -> {tokens (B, N) int16, tok, fwd, tvd per row, seconds}."""
        from lisa_trt.speculative.methods import SpecConfig, get_method
        from lisa_trt.speculative.run import run_method

        method, over = parse_point(label)
        m = get_method(method)
        i0 = j * self.a.batch
        cond = torch.arange(i0, i0 + self.a.batch) % self.ncls
        spec = SpecConfig.make(method=method, **self.tree).replace(**over)
        drafter = tables = None
        if m.kind == "tree" or m.needs_tables or m.needs_drafter:  # tree rules, gasv-2d / exact-2d
            drafter, tables = self.artifacts()
        t0 = time.perf_counter()
        with torch.no_grad():
            toks, st = run_method(m, self.target, drafter, tables, cond, sampling=self.sampling, spec=spec,
                                  seed=self.a.seed + j, sjd_window=self.a.window)
        sec = time.perf_counter() - t0
        tok, fwd, tvd = row_stats(st, len(cond), m.kind, toks.shape[1] - 1)
        return {"tokens": toks.to(torch.int16).cpu(), "tok": tok, "fwd": fwd, "tvd": tvd, "seconds": sec}


def summarize(label: str, acc: dict, quality: dict) -> dict:
    method, over = parse_point(label)
    n = len(acc["tok"])
    img_mal = [t / f for t, f in zip(acc["tok"], acc["fwd"])]
    m, se = mean_se(img_mal)
    f, f_se = mean_se([float(x) for x in acc["fwd"]])
    t = sum(acc["tok"]) / n  # the same for every image (all tokens but the prefill's)
    tvd, tvd_se = mean_se(acc["tvd"])
    res = {"method": method, "knobs": over, "images": n,
           "mal": t / f,  # pooled: committed tokens per target forward over all images
           "mal_se": t * f_se / f ** 2 if n > 1 else float("nan"),  # delta method on forwards per image
           "mal_mean_per_image": m, "mal_mean_per_image_se": se, "mean_tvd": tvd, "mean_tvd_se": tvd_se,
           "target_forwards_per_image": f + 1,
           "cpu_seconds_per_image_batched_loaded": acc["seconds"] / n,
           "raw": {k: [round(x, 5) for x in acc[k]] for k in ("tok", "fwd", "tvd")}}
    if method in ("exact", "gasv", "lantern"):
        res["drafter"] = "settings.drafter"
    res.update(quality)
    return res


def load_state(a, out=None, state=None):
    """(report, accumulators) from an earlier run of the same settings (--out / --state, or another
    run's `out` and `state`), or empty ones."""
    import json

    out, state = out or a.out, state or a.state
    if not Path(out).is_file():
        return None, {}
    rep = json.loads(Path(out).read_text())
    toks = torch.load(state) if Path(state).is_file() else {}
    accs = {}
    for label, r in rep.get("results", {}).items():
        if "raw" in r and label in toks and toks[label].shape[0] == r["images"]:
            accs[label] = {"tok": list(r["raw"]["tok"]), "fwd": list(r["raw"]["fwd"]), "tvd": list(r["raw"]["tvd"]),
                           "seconds": r["cpu_seconds_per_image_batched_loaded"] * r["images"],
                           "tokens": toks[label]}
    return rep, accs


def _merge_runs(a, settings, accs, results) -> list:
    """--merge: take the points of other runs (their JSON and token side file, same settings) into
    this one where they hold more images (runs of different points in parallel, then one frontier).
    Updates accs / results in place; returns the merged labels."""
    labels = []
    for path in filter(None, (a.merge or "").split(",")):
        other, acc2 = load_state(a, path, str(Path(path).with_name(Path(path).stem + ".tokens.pt")))
        if other is None:
            raise SystemExit(f"--merge {path}: no such frontier JSON")
        check_settings(other["settings"], settings, path)
        for lab, acc in acc2.items():
            if len(acc["tok"]) > len(accs.get(lab, {}).get("tok", [])):
                accs[lab], results[lab] = acc, other["results"][lab]
                labels.append(lab)
    return labels


def check_settings(old: dict, new: dict, path) -> None:
    diff = [k for k in SAME if old.get(k) != new.get(k)]
    if diff:
        raise SystemExit(f"{path}: settings {diff} differ from this run ({[old.get(k) for k in diff]} vs "
                         f"{[new.get(k) for k in diff]}); use the same ones or another --out")


def derived(results: dict) -> dict:
    """Every point's pooled MAL over SJD's (paired over the common images, delta-method SE:
    MAL_x / MAL_sjd = mean forwards of SJD / mean forwards of x), the MC-SJD / SJD verdict."""
    out = {}
    if "sjd" in results:
        sj = results["sjd"]
        for label, r in results.items():
            r["mal_vs_sjd"], r["mal_vs_sjd_se"] = ratio_se(sj["raw"]["fwd"], r["raw"]["fwd"])
        if "mcsjd" in results:
            r = results["mcsjd"]
            out["mcsjd_over_sjd"] = {"ratio": r["mal_vs_sjd"], "se": r["mal_vs_sjd_se"],
                                     "images": min(r["images"], sj["images"]), "target": 1.3,
                                     "above_1.3_by_2se": r["mal_vs_sjd"] - 2 * r["mal_vs_sjd_se"] >= 1.3,
                                     "below_1.3_by_2se": r["mal_vs_sjd"] + 2 * r["mal_vs_sjd_se"] < 1.3}
    if "oracle" in results:
        for r in results.values():
            if r["method"] in ("exact", "gasv", "lantern"):
                r["drafter_efficiency"] = r["mal"] / results["oracle"]["mal"]
    return out


def plot(report: dict, path) -> None:
    """Target forwards per image (log scale; +- 1 SE) against class accuracy, KID-demo (+- 1 SE) and
    FD-demo: the frontier of issue 54 (fewer forwards at vanilla's quality is better)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lisa_trt.io import atomic_write

    res = report["results"]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.5))
    colors = plt.cm.tab20.colors  # more points than tab10 has colours
    for ax, q, yl in ((axes[0], "class_acc", "class accuracy (higher is better)"),
                      (axes[1], "kid_real", "KID-demo vs real crops (lower is better)"),
                      (axes[2], "fd_demo", "FD-demo (lower is better; no SE)")):
        for i, (label, r) in enumerate(sorted(res.items())):
            if q not in r:
                continue
            f_se = mean_se([float(x) for x in r["raw"]["fwd"]])[1] if "raw" in r else None
            lossless = r["mean_tvd"] < 1e-6
            ax.errorbar(r["target_forwards_per_image"], r[q], xerr=f_se, yerr=r.get(q + "_se"),
                        fmt="o" if lossless else "s", capsize=3, label=label, color=colors[i % len(colors)])
            ax.annotate(label, (r["target_forwards_per_image"], r[q]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        if "vanilla" in res and q in res["vanilla"] and q + "_se" in res["vanilla"]:
            v, s = res["vanilla"][q], res["vanilla"][q + "_se"]
            ax.axhspan(v - 2 * s, v + 2 * s, color="grey", alpha=0.15, label="vanilla +- 2 SE")
        ax.set_xscale("log")
        ax.set_xticks([40, 50, 60, 80, 100, 150, 200, 256], labels=["40", "50", "60", "80", "100", "150", "200", "256"])
        ax.minorticks_off()
        ax.set_xlabel("target forwards per image (prefill included; fewer is faster)")
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:  # below the panels, where it hides no point
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 8), fontsize=7)
    n = sorted({r["images"] for r in res.values()})
    fig.suptitle(f"demo decoders, {'/'.join(map(str, n))} images per point (circles: lossless, squares: relaxed "
                 "or approximate)")
    fig.tight_layout(rect=(0, 0.1 if handles else 0, 1, 1))
    with atomic_write(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def run_frontier(a, echo=print) -> dict:
    torch.set_num_threads(1)
    fr = Frontier(a)
    if a.images % a.batch or a.per_round % a.batch:
        raise SystemExit("--images and --per-round must be multiples of --batch")
    settings = {"model": "demo", "seed": a.seed, "batch": a.batch, "window": a.window, "tree": fr.tree,
                "drafter": a.drafter, "sampling": dataclasses.asdict(fr.sampling), "classes": "image i: i % "
                f"{fr.ncls}", "seeds": "batch j: seed + j", "torch_threads": torch.get_num_threads(),
                "loaded": True, "note": "rows batched, machine shared: acceptance and quality only, no speed claims",
                "tables_gasv": fr.artifacts()[1].config.to_dict()}  # lisa-gasv without knobs: these defaults
    old, accs = load_state(a)
    if old is not None:
        check_settings(old["settings"], settings, a.out)
    results = dict((old or {}).get("results", {}))
    merged = _merge_runs(a, settings, accs, results)
    labels = split_points(a.methods) if a.methods else (merged or list(DEFAULT_POINTS))
    kept = {k: v for k, v in results.items() if k not in labels and k not in accs}
    for lab in labels:
        accs.setdefault(lab, {"tok": [], "fwd": [], "tvd": [], "seconds": 0.0, "tokens": None})
    quality = {lab: {k: v for k, v in results.get(lab, {}).items()
                     if k.startswith(("class_acc", "kid", "fd_", "n", "underpowered"))} for lab in accs}
    ref = None
    t_start, ran = time.time(), False
    while True:
        counts = {lab: len(accs[lab]["tok"]) for lab in labels}
        goal = min(a.images, (min(counts.values()) // a.per_round + 1) * a.per_round)
        todo = [lab for lab in labels if counts[lab] < goal and not (merged and not a.methods)]
        if not todo:
            break
        for lab in todo:
            s = accs[lab]
            for j in range(counts[lab] // a.batch, goal // a.batch):
                b = fr.batch(lab, j)
                s["tok"] += b["tok"]
                s["fwd"] += b["fwd"]
                s["tvd"] += b["tvd"]
                s["seconds"] += b["seconds"]
                s["tokens"] = b["tokens"] if s["tokens"] is None else torch.cat([s["tokens"], b["tokens"]])
            if not a.no_quality and len(s["tok"]) >= 32:  # lisa_trt.quality refuses fewer
                ref = ref or _reference()
                quality[lab] = _quality(fr, s["tokens"], ref)
            echo(f"  {lab:24s} {len(s['tok'])} images  {time.time() - t_start:.0f} s", flush=True)
        ran = True
        write_report(a, settings, kept, accs, quality, t_start)
        echo(f"round to {goal} images: wrote {a.out}  ({time.time() - t_start:.0f} s)", flush=True)
    if not ran and old is not None:  # only re-summarised: keep the run's own time and command
        settings.update({k: old["settings"][k] for k in ("elapsed_s", "command") if k in old["settings"]})
    return write_report(a, settings, kept, accs, quality, t_start, tokens=bool(merged), keep_run=not ran)


def write_report(a, settings, kept, accs, quality, t_start, tokens=True, keep_run=False) -> dict:
    """The JSON (atomically), the token side file and the plot from the accumulators."""
    from lisa_trt.io import write_json

    results = dict(kept)
    for lab in accs:
        if accs[lab]["tok"]:
            results[lab] = summarize(lab, accs[lab], quality.get(lab, {}))
    if "vanilla" in results and "class_acc" in results["vanilla"]:
        from lisa_trt.quality import quality_neutral

        for r in results.values():
            if "class_acc" in r and not r.get("underpowered", True):
                r["quality_neutral"] = quality_neutral(r, results["vanilla"])
    run = {} if keep_run and "elapsed_s" in settings else {"elapsed_s": round(time.time() - t_start, 1),
                                                          "command": " ".join(["python"] + sys.argv)}
    report = {"settings": dict(settings, **run),
              "summary": derived(results), "results": results}
    if tokens:
        _save_tokens(a.state, {lab: s["tokens"] for lab, s in accs.items() if s["tokens"] is not None})
    write_json(a.out, report)
    if a.plot:
        plot(report, a.plot)
    return report


def _save_tokens(path, toks: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(toks, tmp)
    os.replace(tmp, path)


def _reference():
    from lisa_trt.demo.registry import load_demo_scorer
    from lisa_trt.quality import QualityReference

    return QualityReference(load_demo_scorer())  # KID vs the real held-out crops (deterministic)


def _quality(fr, tokens, ref) -> dict:
    from lisa_trt.demo.registry import load_demo_vq
    from lisa_trt.quality import evaluate

    vq = load_demo_vq()
    h, w = fr.target.config.grid_hw
    imgs = []
    with torch.no_grad():
        for i in range(0, tokens.shape[0], 64):
            t = tokens[i: i + 64].long()
            imgs.append(vq.decode_code(t, (t.shape[0], vq.config.codebook_embed_dim, h, w)).clamp(-1, 1))
    labels = torch.arange(tokens.shape[0]) % fr.ncls
    return evaluate(torch.cat(imgs), labels, ref)


def run_timing(a) -> dict:
    """Seconds per image at batch 1 on the demo bundle's torch and ORT engines (quiet machine)."""
    from lisa_trt.io import write_json
    from lisa_trt.runtime.demo import ensure_demo_bundle
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.speculative.methods import get_method

    bundle = Path(a.engine_dir) if a.engine_dir else ensure_demo_bundle(Path(a.workdir) / "demo", echo=print)
    labels = [x for x in (a.methods or "vanilla,sjd,mcsjd,sjd-pac,gsd,zipar,exact,gasv,pjd,pjd-gasv-2d").split(",") if x]
    load0 = os.getloadavg()
    rows, precision = {}, None
    for backend in ("torch", "ort"):
        try:
            pipe = Pipeline.from_dir(bundle, backend=backend, threads=1)
            precision = precision or pipe.precision
        except Exception as e:  # noqa: BLE001 - a backend that is not installed is reported, not fatal
            rows[backend] = {"error": f"{type(e).__name__}: {e}"}
            continue
        prompts = [i % pipe.config.num_classes for i in range(a.images)]
        for lab in labels:
            method, over = parse_point(lab)
            try:
                pipe.generate(prompts[:1], seed=10_000, verify=method, decode=False, **over)  # warm-up
                t0 = time.perf_counter()
                res = pipe.generate(prompts, seed=a.seed, verify=method, decode=False, **over)
                sec = (time.perf_counter() - t0) / a.images
                row = {"tokens_seconds_per_image": sec, "mal": sum(s["mal"] for s in res.stats) / len(res.stats)}
                if get_method(method).kind == "tree":  # the bundle's tree for this backend
                    t = pipe.spec(method, **over).tree
                    row["tree"] = {"top_k": t.top_k, "depth": t.depth, "total_tokens": t.total_tokens}
                rows.setdefault(backend, {})[lab] = row
                print(f"{backend:5s} {lab:20s} {sec:.3f} s/image", flush=True)
            except Exception as e:  # noqa: BLE001
                rows.setdefault(backend, {})[lab] = {"error": f"{type(e).__name__}: {e}"}
                print(f"{backend:5s} {lab:20s} {type(e).__name__}: {e}", flush=True)
    load1 = os.getloadavg()
    rep = {"images": a.images, "batch": 1, "threads": 1, "seed": a.seed, "bundle": str(bundle), "precision": precision,
           "load_average_before_after": [list(load0), list(load1)],
           "quiet": max(load0[0], load1[0]) < 1.2, "results": rows}
    write_json(a.timing_out, rep)
    print(f"wrote {a.timing_out}")
    return rep


def timed_decoders(rows: dict, frontier: dict) -> list:
    """One backend's timing rows -> choose_decoding's `decoders` (speed-up over vanilla in the same
    run; lossless / quality-neutral from the frontier point with the same method and knobs)."""
    from lisa_trt.speculative.methods import get_method

    res, ftree = frontier.get("results", {}), frontier.get("settings", {}).get("tree")
    points = {}
    for lab, r in res.items():
        m, kn = parse_point(lab)
        points[(m, tuple(sorted(kn.items())))] = r
    van = rows["vanilla"]["tokens_seconds_per_image"]
    out = []
    for lab, row in rows.items():
        if lab == "vanilla" or "error" in row:
            continue
        method, knobs = parse_point(lab)
        fr = points.get((method, tuple(sorted(knobs.items()))))
        same_tree = get_method(method).kind != "tree" or row.get("tree") == ftree
        out.append({"label": lab, "method": method, "knobs": knobs or None, "speedup": van / row["tokens_seconds_per_image"],
                    "lossless": fr is not None and fr["mean_tvd"] < 1e-9,
                    "quality_neutral": fr.get("quality_neutral") if fr is not None and same_tree else None})
    return out


def _rel(path) -> str:
    p = Path(path).resolve()
    return p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else str(path)


def run_choose(a) -> dict:
    """Never-slower choices from timing files + this frontier -> --choice-out (module docstring)."""
    import json

    from lisa_trt.io import write_json
    from lisa_trt.runtime.autotune import DecodeChoice, choose_decoding

    frontier = json.loads(Path(a.out).read_text())
    if any(r.get("images", 0) < 256 for r in frontier["results"].values()):
        print(f"note: {a.out} has points below 256 images; their quality verdicts are underpowered (absent)")
    old = json.loads(Path(a.choice_out).read_text()) if Path(a.choice_out).is_file() else {"choices": []}
    choices = {(c["backend"], c["precision"]): c for c in old.get("choices", [])}
    timed = []
    for path in a.choose.split(","):
        rep = json.loads(Path(path).read_text())
        if not rep.get("quiet", False):
            raise SystemExit(f"{path} was not timed on a quiet machine (load {rep.get('load_average_before_after')}); "
                             "re-time it before choosing from it")
        for backend, rows in rep["results"].items():
            if "error" in rows or "vanilla" not in rows:
                continue
            c = choose_decoding(backend=backend, precision=rep.get("precision") or "fp32",
                                decoders=timed_decoders(rows, frontier))
            choices[(c.backend, c.precision)] = c.to_dict()
            print(c.reason)
        timed.append(_rel(path))
    out = {"source": {"timing": timed, "frontier": _rel(a.out), "earlier": old.get("source")},
           "choices": [DecodeChoice.from_dict(c).to_dict() for c in choices.values()]}
    write_json(a.choice_out, out)
    print(f"wrote {a.choice_out}")
    return out


def markdown_table(report: dict) -> str:
    """The frontier as a Markdown table (docs/spec/decoders.md, README)."""
    res = report["results"]
    lines = ["| point | images | MAL per target forward +- SE | MAL / SJD +- SE | mean TVD | class acc +- SE "
             "| KID-demo vs real +- SE |", "|---|---|---|---|---|---|---|"]
    fmt = lambda r, k, d=3: (f"{r[k]:.{d}f} +- {r[k + '_se']:.{d}f}" if k in r else "-")  # noqa: E731
    for label, r in sorted(res.items(), key=lambda kv: kv[1]["mal"]):
        lines.append(f"| {label} | {r['images']} | {fmt(r, 'mal', 2)} | "
                     f"{fmt(r, 'mal_vs_sjd', 2) if 'mal_vs_sjd' in r else '-'} | {r['mean_tvd']:.3f} | "
                     f"{fmt(r, 'class_acc')} | {fmt(r, 'kid_real')} |")
    return "\n".join(lines)


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=256, help="images per point (the run stops there)")
    ap.add_argument("--per-round", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", type=int, default=16, help="Jacobi window of every SJD-family decoder")
    ap.add_argument("--tree", default="3,3,10", help="top_k,depth,total_tokens of the drafter tree")
    ap.add_argument("--drafter", default="demo-lisa")
    ap.add_argument("--methods", default=None,
                    help="points, comma-separated (commas inside [...] belong to the point); default: "
                         + ",".join(DEFAULT_POINTS) + ". Points already in --out are kept.")
    ap.add_argument("--no-quality", action="store_true", help="skip class accuracy / KID (tests)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "decoders.json"))
    ap.add_argument("--plot", default=str(ROOT / "bench" / "decoders.png"))
    ap.add_argument("--state", default=None, help="token side file (default: beside --out, <out name>.tokens.pt; "
                                                  "bench/decoders.tokens.pt is committed, ~2 MB, so a clone resumes)")
    ap.add_argument("--timing", action="store_true", help="the small seconds-per-image mode (quiet machine)")
    ap.add_argument("--timing-out", default=str(ROOT / "bench" / "decoders_timing.json"))
    ap.add_argument("--workdir", default="/tmp/lisa-decoders", help="--timing: where the demo bundle is exported")
    ap.add_argument("--engine-dir", default=None, help="--timing: an existing demo bundle (no export)")
    ap.add_argument("--merge", default=None, help="frontier JSON(s) of other runs with the same settings, "
                                                  "comma-separated (tokens beside each): their points join --out")
    ap.add_argument("--table", action="store_true", help="print --out as a Markdown table and stop")
    ap.add_argument("--choose", default=None, help="timing JSON(s), comma-separated: re-make the never-slower "
                                                   "choices from them and --out (module docstring)")
    ap.add_argument("--choice-out", default=str(ROOT / "lisa_trt" / "assets" / "demo" / "decode_choice.json"))
    return ap


def main(argv=None):
    a = build_parser().parse_args(argv)
    if a.state is None:
        a.state = str(Path(a.out).with_name(Path(a.out).stem + ".tokens.pt"))
    if a.table:
        import json

        print(markdown_table(json.loads(Path(a.out).read_text())))
        return None
    if a.choose:
        return run_choose(a)
    if a.timing:
        if a.images > 64:
            a.images = 16
        return run_timing(a)
    return run_frontier(a)


if __name__ == "__main__":
    main()
