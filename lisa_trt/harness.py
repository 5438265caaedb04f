"""`lisa-trt bench`: every method on the same prompts and seeds, in one process.

Speed-up = vanilla seconds per image / method seconds per image, measured in the same run
(docs/spec/speculative.md metric conventions: batch 1, same batched CFG, VQ decode excluded).
Quality comes from the demo scorer when the model has one: with a `QualityReference`
(lisa_trt.quality) class accuracy +- SE, KID-demo vs real crops and vs vanilla samples +- SE,
FD-demo; with fewer than 32 images, the scorer's (class accuracy, FD-demo) pair alone.

`--sweep` grids (`parse_sweep`): "gasv:kappa=0.5,1,2;lambda=0.6,0.3" runs gasv at every
combination, each a labelled point (`gasv[kappa=0.5,lambda=0.6]`); the Pareto plot draws MAL
against KID-demo with error bars, one curve per rule.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
import time
from typing import Optional

import torch
from .progress import iterate

from .config import SamplingConfig
from .errors import InputError
from .io import write_json
from .speculative.methods import (FLAT_FIELDS, METHODS, Method, SpecConfig, baseline_method, method_names,
                                  resolve_method)
from .runtime.context import RunContext
from .runtime.runner import Engines, decode


def parse_methods(text: str) -> list[Method]:
    """"vanilla,gasv" -> [the vanilla Method, the gasv Method] (speculative/methods.py): the bench's one
    look-up by name (`--methods` here, a `--sweep` rule through `parse_sweep`); every point then
    carries its Method (run_bench takes Methods only)."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise InputError(f"unknown bench method(s) {bad}; valid: {', '.join(method_names())}")
    return [resolve_method(m) for m in names]


# --sweep knob names -> SpecConfig fields (per rule where the name is shared)
_KNOBS = {"kappa": "gasv_kappa", "lambda": "gasv_lambda", "lam": "gasv_lambda", "neighbours": "gasv_neighbours",
          "scope": "gasv_scope", "gamma": "lantern_gamma", "lantern_gamma": "lantern_gamma",
          "lantern_delta": "lantern_delta", "gasv_delta": "gasv_delta"}


def _knob_field(method: Method, name: str) -> str:
    if name == "delta":
        return {"gasv": "gasv_delta", "lantern": "lantern_delta"}.get(method.name, "")
    own = f"{method.name.replace('-', '_')}_{name}"  # a knob registered with the method's own settings
    field = own if method.settings is not None and own in FLAT_FIELDS else _KNOBS.get(name, name)
    if field not in FLAT_FIELDS:
        raise InputError(f"unknown sweep knob {name!r} for {method.name}; use kappa, lambda, delta, neighbours, "
                         "scope, gamma (LANTERN) or a SpecConfig field")
    return field


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_sweep(text: str) -> list[tuple[str, Method, dict]]:
    """"rule:knob=a,b;knob2=c" -> [(label, the rule's Method, {SpecConfig field: value})], the full grid.

    Example: "gasv:kappa=0.5,1;delta=0.2" -> gasv[kappa=0.5,delta=0.2], gasv[kappa=1,delta=0.2].
    A rule with knobs: one that reads the draft tree's rule parameters, or has settings of its own.
    """
    name, _, grid = text.partition(":")
    name = name.strip()
    method = parse_methods(name)[0] if name in METHODS else None
    if method is None or not method.uses_tree and method.settings is None and grid:
        raise InputError(f"bad sweep {text!r}: 'RULE:knob=v1,v2;knob=v' with RULE in exact, lantern, gasv "
                         "or a method with settings (gsd)")
    axes = []
    for part in filter(None, (p.strip() for p in grid.split(";"))):
        name, eq, vals = part.partition("=")
        if not eq or not vals.strip():
            raise InputError(f"bad sweep axis {part!r} in {text!r}: expected knob=v1,v2")
        field = _knob_field(method, name.strip())
        if not field:
            raise InputError(f"knob {name!r} does not apply to {method.name}")
        axes.append([(name.strip(), field, _value(v.strip())) for v in vals.split(",") if v.strip()])
    runs = []
    for combo in itertools.product(*axes):
        label = method.name + ("[" + ",".join(f"{n}={v}" for n, _, v in combo) + "]" if combo else "")
        runs.append((label, method, {f: v for _, f, v in combo}))
    return runs


def run_bench(target, drafter, tables, methods, classes, *, sampling: SamplingConfig,
              spec: SpecConfig, seed: int = 0, scorer_fn=None, decode_fn=None, sjd_window: Optional[int] = None,
              progress: bool = True, settings_extra: Optional[dict] = None, gasv=None,
              runs: Optional[list] = None, quality=None, requests: Optional[list] = None) -> dict:
    """Run every method / sweep point on one image per entry of `classes` (batch 1, seed + i).

    Args:
        methods: the Methods to compare (each run with `spec`; names resolve once, at the bench's entry:
            `parse_methods`); the baseline (`baseline_method`, vanilla) runs first unless listed.
        runs: extra labelled points [(label, Method, {SpecConfig field: value})] (`parse_sweep`).
        sjd_window: the Jacobi window of every point (over `spec`'s).
        scorer_fn: optional (images, labels) -> (class_acc, fd_demo): the artifact set's scorer alone,
            for benches too small for a quality reference (fewer than 32 images).
        decode_fn: optional tokens -> images for the scorer / quality harness.
        quality: optional lisa_trt.quality.QualityReference (needs decode_fn): the full harness.
        requests: a prompted family's Requests, one per image (models/family.py; `classes` unused):
            each image decodes its request's condition with its layout.
    Returns:
        {"settings": {...}, "results": {label: {method, knobs, mal, seconds_per_image, speedup,
        mean_tvd, drafter_efficiency (with "oracle" among the points), [quality keys], ...}}}
    """
    from .text.prompts import cond_len

    baseline, todo = _bench_points(methods, runs)
    t2i = isinstance(classes, tuple) or requests is not None  # no class labels to score
    cls = classes if t2i else torch.as_tensor(classes).long()
    n_images = len(requests) if requests is not None else cond_len(cls)
    if sjd_window is not None:
        spec = spec.replace(sjd_window=sjd_window)  # the setting's own check (>= 1)
    runner = _Runner(Engines(target, drafter, tables, gasv), cls, requests)
    # every point's plan, checked before any run
    plans = {label: RunContext(source=None, family=None, method=m, sampling=sampling, spec=spec.replace(**over),
                               seed=seed) for label, m, over in todo}
    for m in {m.name: m for _, m, _ in todo}.values():  # warm-up (allocations, thread pools), not timed
        runner(RunContext(source=None, family=None, method=m, sampling=sampling, spec=spec, seed=seed), 0)
    results, tokens = {}, {}
    for label, m, over in todo:
        results[label], tokens[label] = _measure(runner, label, over, plans[label], n_images, progress)
    _add_speedups(results, baseline.name)
    if not t2i:
        _add_quality(results, tokens, baseline.name, cls, decode_fn=decode_fn, scorer_fn=scorer_fn, quality=quality)
    from .speculative.oracle import drafter_efficiency

    for m, e in drafter_efficiency(results).items():
        results[m]["drafter_efficiency"] = e  # MAL / oracle MAL (same tree budget and seeds)
    settings = {"num_images": n_images, "seed": seed, **({} if t2i else {"classes": cls.tolist()}),
                "sampling": dataclasses.asdict(sampling), "spec": dataclasses.asdict(spec),
                "knobs": spec.flat(),  # every method's knob in effect (zipar_window, sjd_window, ...)
                "sjd_window": spec.settings("sjd").window,
                "torch_threads": torch.get_num_threads(),
                **(settings_extra or {})}
    return {"settings": settings, "results": results}


def _bench_points(methods, runs) -> tuple:
    """(the baseline, [(label, Method, SpecConfig overrides)]): the baseline first unless listed.
    Every point carries its resolved Method; a name here is a caller's bug (TypeError)."""
    runs = list(runs or [])
    bad = [m for m in [*methods, *(m for _, m, _ in runs)] if not isinstance(m, Method)]
    if bad:
        raise TypeError(f"run_bench takes resolved Methods (harness.parse_methods(names)), got {bad!r}")
    baseline = baseline_method()
    todo = [(m.name, m, {}) for m in methods] + [(label, m, dict(over)) for label, m, over in runs]
    if baseline not in [m for _, m, _ in todo]:
        todo = [(baseline.name, baseline, {})] + todo
    labels = [t[0] for t in todo]
    if len(set(labels)) != len(labels):
        raise InputError(f"duplicate bench points: {labels}")
    return baseline, todo


@dataclasses.dataclass(frozen=True)
class _Runner:
    """One image of the bench under a point's plan (runtime/runner.decode): what every point shares."""

    engines: Engines
    cls: object  # class ids or a caption condition; unused with requests
    requests: Optional[list]

    def image(self, i: int):
        """(condition, layout) of image i."""
        if self.requests is not None:
            return self.requests[i].cond, self.requests[i].layout
        from .text.prompts import cond_rows

        return cond_rows(self.cls, i, i + 1), None

    def __call__(self, plan: RunContext, i: int):
        """Image i under `plan` (seed: the plan's + i)."""
        cond, layout = self.image(i)
        return decode(plan, self.engines, cond, seed=plan.seed + i, layout=layout)


def _measure(runner: _Runner, label: str, over: dict, plan: RunContext, n_images: int,
             progress: bool) -> tuple[dict, torch.Tensor]:
    """A point's plan on every image (seed + i), each timed -> (its result row, its tokens)."""
    m = plan.method
    secs, stats_all, toks = [], [], []
    for i in iterate(range(n_images), progress, desc=f"bench {label}"):
        t0 = time.perf_counter()  # the condition's slicing is timed too
        tk, st = runner(plan, i)
        secs.append(time.perf_counter() - t0)
        stats_all.append(st)
        toks.append(tk)
    committed = torch.cat([c.float().cpu() for s in stats_all for c in s.committed])
    tvds = [t.float().cpu() for s in stats_all for t in s.tvd]
    times = {}
    for s in stats_all:
        for k, v in s.times.items():
            times[k] = times.get(k, 0.0) + v / len(stats_all)
    row = {
        "method": m.name, "knobs": over,
        "mal": float(committed.mean()) if not m.baseline else 1.0,
        "uses_tree": m.uses_tree,  # the point decoded with the run's draft tree (autotune.bench_choice records it)
        "seconds_per_image": sum(secs) / len(secs),
        "mean_tvd": float(torch.cat(tvds).mean()) if tvds else 0.0,
        "target_forwards_per_image": sum(s.target_forwards for s in stats_all) / len(stats_all),
        "time_split": times,
    }
    return row, torch.cat([t.cpu() for t in toks])


def _add_speedups(results: dict, baseline: str) -> None:
    base = results[baseline]["seconds_per_image"]
    for r in results.values():
        r["speedup"] = base / r["seconds_per_image"]


def _add_quality(results: dict, tokens: dict, baseline: str, cls, *, decode_fn, scorer_fn, quality) -> None:
    """Scores of each point's decoded images against their class labels: the quality harness when
    given (with "quality_neutral" against the baseline), else the scorer alone; nothing without decode_fn."""
    if decode_fn is None:
        return
    from .quality import evaluate, quality_neutral

    for label, r in results.items():
        if quality is not None:
            r.update(evaluate(decode_fn(tokens[label]), cls, quality))
        elif scorer_fn is not None:
            acc, fd = scorer_fn(decode_fn(tokens[label]), cls)
            r["class_acc"], r["fd_demo"] = float(acc), float(fd)
    if quality is not None:
        v = results[baseline]
        for r in results.values():
            r["quality_neutral"] = None if r["underpowered"] else quality_neutral(r, v)


def save_bench(report: dict, json_path, plot_path=None) -> None:
    write_json(json_path, report)
    if plot_path:
        if all("kid_real" in r for r in report["results"].values()):
            plot_pareto(report, plot_path)
        else:
            plot_speed_quality(report, plot_path)


def plot_pareto(report: dict, path) -> None:
    """MAL against quality (+- 1 SE) per point, one curve per rule (sorted by MAL); panels: class
    accuracy, KID vs the cached vanilla samples (when measured), KID vs real held-out crops."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .io import atomic_write

    res = report["results"]
    keys = [k for k in ("class_acc", "kid_vanilla", "kid_real") if all(k in r and k + "_se" in r for r in res.values())]
    ylabels = {"class_acc": "class accuracy (higher is better)",
               "kid_vanilla": "KID-demo vs vanilla samples (lower is better)",
               "kid_real": "KID-demo vs real crops (lower is better)"}
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4.5), squeeze=False)
    rules = list(dict.fromkeys(r.get("method", m) for m, r in res.items()))
    for ax, key in zip(axes[0], keys):
        for j, rule in enumerate(rules):
            pts = sorted(((r["mal"], r[key], r[key + "_se"], m) for m, r in res.items()
                          if r.get("method", m) == rule), key=lambda t: t[0])
            xs, ys, es, names = zip(*pts)
            ax.errorbar(xs, ys, yerr=es, fmt="o-", color=f"C{j}", capsize=3, ms=4, label=rule)
            if len(pts) > 1:
                for x, y, n in zip(xs, ys, names):
                    ax.annotate(n.split("[", 1)[-1].rstrip("]"), (x, y), textcoords="offset points",
                                xytext=(3, 3), fontsize=6)
        v = res["vanilla"]
        ax.axhspan(v[key] - 2 * v[key + "_se"], v[key] + 2 * v[key + "_se"], color="grey", alpha=0.2,
                   label="vanilla +- 2 SE")
        ax.set_xlabel("mean accepted length (MAL)")
        ax.set_ylabel(ylabels[key])
        ax.legend(fontsize=7)
    s = report["settings"]
    fig.suptitle(f"{s.get('model', '')} {s.get('drafter', '') or ''}: {s['num_images']} images per point, "
                 "error bars 1 SE", fontsize=9)
    fig.tight_layout()
    with atomic_write(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def plot_speed_quality(report: dict, path) -> None:
    """Speed-up vs quality (FD-demo when scored, else mean TVD), one point per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .io import atomic_write

    res = report["results"]
    scored = all("fd_demo" in r for r in res.values())
    key, label = ("fd_demo", "FD-demo (lower is better)") if scored else ("mean_tvd", "mean TVD per step")
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for m, r in res.items():
        ax.scatter(r["speedup"], r[key], s=40)
        ax.annotate(f"{m}\nMAL {r['mal']:.2f}", (r["speedup"], r[key]), textcoords="offset points",
                    xytext=(5, 5), fontsize=8)
    ax.axvline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("speed-up vs vanilla (same run)")
    ax.set_ylabel(label)
    s = report["settings"]
    ax.set_title(f"{s.get('model', '')} {s.get('backend', 'torch')}: {s['num_images']} images", fontsize=9)
    fig.tight_layout()
    with atomic_write(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def dumps(report: dict) -> str:
    return json.dumps(report, indent=2)


# ----------------------------------------------------------------------------- the `lisa-trt bench` entry

def bundle_sources(engine_dir, model, drafter, tables, backend) -> tuple:
    """(model, drafter, tables, backend) of `bench [ENGINE_DIR]`: the ones given, else the files the
    bundle was made from (its generation's `sources`, runtime/outputs.generation_defaults); the
    backend: auto (TensorRT when built, else ONNX Runtime) with a bundle, torch without one."""
    if engine_dir is None:
        if model is None:
            raise InputError("bench needs --model (in-memory models) or ENGINE_DIR (an exported bundle)")
        return model, drafter, tables, backend or "torch"
    from .runtime.bundle import resolve_backend

    src = _recorded_sources(engine_dir)
    model = model or src.get("model")
    if model is None:
        raise InputError(f"{engine_dir} does not record the model it was exported from (an export older than the "
                         "record): pass --model (and --drafter / --tables) as given to `lisa-trt export`")
    return model, drafter or src.get("drafter"), tables or src.get("tables"), \
        resolve_backend(engine_dir, backend or "auto")


def bundle_knobs(engine_dir, backend: str, knobs: dict) -> dict:
    """`knobs` with the bundle's measured knobs (its recorded choice's, e.g. zipar_window 4) where
    not given: the same defaults `run` and `--verify auto` use on that bundle (runtime/autotune.py)."""
    if engine_dir is None:
        return knobs
    from .export.manifest import raw_manifest
    from .runtime.autotune import recorded_choice, recorded_knobs, with_measured

    man = raw_manifest(engine_dir)
    gen = with_measured(man.get("generation") or {}, engine_dir)
    q = man.get("quantization") or "none"
    precision = q if q != "none" else man.get("precision", "fp32")
    c = recorded_choice(gen, backend, precision)
    rec = recorded_knobs(gen, backend, precision, c.method, (man.get("drafter") or {}).get("hash")) if c else {}
    return {**rec, **{k: v for k, v in knobs.items() if v is not None}}


def _recorded_sources(engine_dir) -> dict:
    from .export.manifest import raw_manifest

    return dict((raw_manifest(engine_dir).get("generation") or {}).get("sources") or {})


def _made_from(engine_dir) -> str:
    """'ENGINE_DIR was made from --model M --drafter D --tables T', or why it cannot say."""
    src = _recorded_sources(engine_dir)
    if not src:
        return f"{engine_dir} does not record the files it was made from (exported before the record)"
    return f"{engine_dir} was made from " + " ".join(f"--{k} {v}" for k, v in src.items()) + \
        " (leave them out to use those)"


def bench_command(rc, *, drafter, tables, methods, num_images, classes, captions, encoder_dir, engine_dir, sweeps,
                  quality_cache, json_path, plot_path, echo, record=False, **_):
    """`lisa-trt bench`: in-memory models or a bundle's graphs, one report (JSON, plot, one line per method);
    on a bundle's graphs its never-slower choice recorded for `--verify auto` (`record`)."""
    from .artifacts import default_drafter
    from .runtime.context import spec_artifacts

    _, points = _bench_points(parse_methods(methods), [r for text in sweeps for r in parse_sweep(text)])
    rc = rc.load(counts={"--num-images": num_images}, files={"--json file": json_path, "--plot file": plot_path},
                 captions=captions, encoder_dir=encoder_dir)
    size = rc.given.get("image_size") or _bundle_image_size(engine_dir)  # --image-size, else the bundle's
    conds, texts, requests = rc.conditions.images(rc, num_images, classes=classes, captions=captions,
                                                  encoder_dir=encoder_dir, image_size=size)  # before engines load
    dr, tb = spec_artifacts(rc.source, rc.target, [m for _, m, _ in points], drafter, tables,
                            requests[0].layout.sub_vocab if requests else None)
    engines = (rc.target, dr, None) if rc.backend == "torch" else _graph_engines(rc, engine_dir, dr, tb)
    scorer_fn, decode_fn, quality = _scoring(rc, conds, texts, quality_cache)
    extra = {"model": rc.given["model"], "drafter": drafter or default_drafter(rc.source), "backend": rc.backend,
             "engine_dir": None if engine_dir is None else str(engine_dir),
             "gasv": gasv_in_effect(rc.spec, tb, engine_dir), "command": " ".join(sys.argv),
             **({"captions": texts} if texts is not None else {})}
    report = run_bench(engines[0], engines[1], tb, [], conds, sampling=rc.sampling, spec=rc.spec, seed=rc.seed,
                       gasv=engines[2], scorer_fn=scorer_fn, decode_fn=decode_fn, runs=points,
                       quality=quality, settings_extra=extra, requests=requests)
    save_bench(report, json_path, plot_path)
    _print_report(report, echo, scored=scorer_fn is not None, num_images=num_images)
    if record and engine_dir is not None and rc.backend != "torch":
        _record_choice(engine_dir, report, rc, echo)


def gasv_in_effect(spec, tables, engine_dir) -> Optional[dict]:
    """The GASV constants the bench's gasv points run with: the tables' (the bundle's when its graphs
    run) with the run's knobs (--kappa / --lambda / --delta ...) over them; None without tables."""
    from .speculative.gasv import GASVConfig

    if tables is not None:
        base = tables.config.to_dict()
    elif engine_dir is not None:
        from .export.manifest import raw_manifest

        base = dict((raw_manifest(engine_dir).get("tables") or {}).get("gasv") or {})
    else:
        return None
    if not base:
        return None
    fields = {f.name for f in dataclasses.fields(GASVConfig)}
    return {**{k: v for k, v in base.items() if k in fields}, **spec.gasv.overrides()}


def _record_choice(engine_dir, report: dict, rc, echo) -> None:
    """The bench's never-slower choice for the bundle's backend + precision, written beside its
    manifest (autotune.MEASURED_FILE), so `--verify auto` runs what was measured on it; one line."""
    from .export.manifest import raw_manifest
    from .runtime.autotune import MEASURED_FILE, bench_choice, record_measured

    man = raw_manifest(engine_dir)
    q = man.get("quantization") or "none"
    precision = q if q != "none" else man.get("precision", "fp32")
    tree = {"top_k": rc.spec.tree.top_k, "depth": rc.spec.tree.depth, "total_tokens": rc.spec.tree.total_tokens}
    choice = bench_choice(report["results"], backend=rc.backend, precision=precision,
                          baseline=baseline_method().name, drafter_hash=(man.get("drafter") or {}).get("hash"),
                          tree=tree)
    record_measured(engine_dir, choice)
    echo(f"recorded in {engine_dir}/{MEASURED_FILE}: --verify auto on {rc.backend}/{precision} now runs "
         f"{choice.method} ({choice.reason})")


def _bundle_image_size(engine_dir):
    """The image size an engine directory was exported for (its manifest layout), or None."""
    if engine_dir is None:
        return None
    from .export.manifest import raw_manifest

    return (raw_manifest(engine_dir).get("layout") or {}).get("image_size")  # the engines are checked on opening


def _graph_engines(rc, engine_dir, drafter, tables) -> tuple:
    """Graph engines for `bench --backend B`, checked against the artifacts being benchmarked."""
    from .engines.graph import load_engines
    from .errors import InputError
    from .export.manifest import drafter_hash, tables_hash
    from .models.checkpoints import target_hash

    from .errors import ArtifactMismatchError

    if engine_dir is None:
        raise InputError(f"--backend {rc.backend} needs ENGINE_DIR (make one with `lisa-trt export`)")
    try:
        e = load_engines(engine_dir, rc.backend, target_hash=target_hash(rc.target),
                         drafter_hash=drafter_hash(drafter) if drafter is not None else None,
                         tables_hash=tables_hash(tables) if tables is not None else None)
    except ArtifactMismatchError as err:
        raise ArtifactMismatchError(f"{err}; {_made_from(engine_dir)}") from None
    return e.target, e.drafter, e.gasv


def _scoring(rc, conds, texts, quality_cache) -> tuple:
    """(scorer_fn, decode_fn, quality reference) from the artifact set's scorer, else Nones."""
    from .models.artifact_sets import artifact_set

    aset = artifact_set(rc.source)
    if aset is None or aset.extra("score_images") is None:
        return None, None, None
    score_images, scorer = aset.extra("score_images"), aset.extra("load_demo_scorer")()
    from .runtime.runner import pixels

    vqm, fam, hw = aset.load_vq(), rc.family, rc.target.config.grid_hw

    def decode_fn(tokens):  # the one tokens-to-pixels path (runtime/runner.py)
        return pixels(fam, vqm, tokens.reshape(tokens.shape[0], *hw)).clamp(-1, 1)

    def scorer_fn(images, labels):
        import warnings

        with warnings.catch_warnings():  # too few images for FD: said once below, in words
            warnings.simplefilter("ignore", UserWarning)
            return score_images(images, labels, scorer)

    quality = None
    if texts is None and len(conds) >= 32:
        quality = _quality_reference(rc, scorer, decode_fn, conds, quality_cache)
    return scorer_fn, decode_fn, quality


def _quality_reference(rc, scorer, decode_fn, classes, cache_dir):
    """The quality reference of a bench: real held-out crops and vanilla samples drawn with seeds
    disjoint from the bench's (seed + 1_000_003 + i), cached on disk."""
    import dataclasses

    import torch

    from .io import tensor_hash
    from .quality import QualityReference
    from .speculative.autoregressive import generate as ar_generate

    target, sampling, vseed = rc.target, rc.sampling, rc.seed + 1_000_003

    def vanilla_images():
        cond = torch.as_tensor(classes).long()
        toks = torch.cat([ar_generate(target, cond[i: i + 64], seed=vseed + i, **dataclasses.asdict(sampling))
                          for i in range(0, len(cond), 64)])
        return decode_fn(toks)

    key = {"target": tensor_hash(target.output.weight), "sampling": dataclasses.asdict(sampling),
           "classes": list(map(int, classes)), "seed": vseed}
    return QualityReference(scorer, vanilla_fn=vanilla_images, vanilla_key=key,
                            cache_dir=cache_dir or "runs/quality_cache")


def _print_report(report, echo, *, scored: bool, num_images: int) -> None:
    """One line per method (MAL, speed, TVD, quality), and a word on quality from few images."""
    from .demo.scorer import INDICATIVE_BELOW

    for m, r in report["results"].items():
        fd = r.get("fd_demo", float("nan"))
        q = (f", class_acc {r['class_acc']:.3f}, FD-demo {'n/a' if fd != fd else format(fd, '.2f')}"
             if "class_acc" in r else "")
        if "kid_real" in r:
            q = (f", acc {r['class_acc']:.3f}+-{r['class_acc_se']:.3f}, KID-real {1e3 * r['kid_real']:.2f}"
                 f"+-{1e3 * r['kid_real_se']:.2f}e-3" + (f", KID-vanilla {1e3 * r['kid_vanilla']:.2f}+-"
                 f"{1e3 * r['kid_vanilla_se']:.2f}e-3" if "kid_vanilla" in r else "")
                 + {True: " [neutral]", False: " [not neutral]", None: " [underpowered]"}[r["quality_neutral"]])
        echo(f"{m:8s} MAL {r['mal']:.2f}  {r['seconds_per_image']:.3f} s/img  speed-up {r['speedup']:.2f}x  "
             f"TVD {r['mean_tvd']:.4f}{q}" + (f"  efficiency {r['drafter_efficiency']:.2f}"
                                              if "drafter_efficiency" in r else ""))
    if scored and num_images < INDICATIVE_BELOW:
        echo(f"quality from {num_images} images is indicative only (FD-demo is biased upwards below "
             f"{INDICATIVE_BELOW} images; bench/demo_quality.json uses 256)")
