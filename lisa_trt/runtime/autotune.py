"""Tree budgets from a cost model (EAGLE's total_token=-1 idea, driven by measured costs).

Expected speed of a tree (K children per node, D expansion rounds, M drafted nodes) relative to
vanilla decoding:

    speed(K, D, M) = MAL(K, D, M) * t_step(1) / (t_verify(M + 1) + t_draft(K, D))

t_verify(S) is the measured latency of one target forward over S new tokens (CFG batch),
t_draft(K, D) = (D + 1) drafter calls (D expansions of K nodes + one commit call), and MAL
comes from per-depth acceptance rates measured on the model (bench/ records them). The budget
with the highest predicted speed is the default for that backend.

Never slower (`choose_decoding`): per backend and precision, the fastest candidate that beats
vanilla by MIN_GAIN is the default: the best tree (measured speed-ups when a timed run exists, else
the cost model) or any timed decoder (SJD family, ZipAR, a drafter-tree rule, with its knobs) whose
quality the frontier found neutral (lossless rules always are); otherwise vanilla decoding, and the
reason says so. The choices are recorded in the bundle's generation settings (`record_choices`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

# Defaults when nothing was measured: EAGLE-2's GPU budget, and a small CPU budget (a CPU pays
# almost linearly for every verified token; bench/ort_cost_curve.json has the measured curve).
GPU_TREE = {"top_k": 10, "depth": 5, "total_tokens": 60}
CPU_TREE = {"top_k": 3, "depth": 3, "total_tokens": 10}


def default_tree_budgets(config, measured: Optional[dict] = None, *, plan=None) -> dict:
    """Per-backend tree budgets recorded in an engine bundle's generation settings.

    plan: a deploy/memory_plan.Plan of the GPU deployment: the GPU (trt) budget's tree stops growing
    where verification turns compute-bound (`Plan.compute_bound_tree`: beyond it each verified node
    costs FLOPs time instead of riding on the weight read), so total_tokens <= that size."""
    gpu = dict(GPU_TREE)
    knee = getattr(plan, "compute_bound_tree", None)
    if knee:
        gpu["total_tokens"] = max(1, min(gpu["total_tokens"], int(knee)))
        gpu["depth"] = min(gpu["depth"], gpu["total_tokens"])
    budgets = {"default": dict(CPU_TREE), "ort": dict(CPU_TREE), "torch": dict(CPU_TREE), "trt": gpu}
    if measured:
        budgets.update(measured)
    return budgets


GPU_BACKENDS = ("trt", "torch", "auto")  # backends whose run may be on a GPU (torch and auto: when one is visible)


def gpu_plan(source, backend: str, *, gpu=None, batch: int = 1, cfg: Optional[bool] = None):
    """The memory plan (deploy/memory_plan.Plan, with its floors) of a run of `source` on the GPU it
    would use, for `default_tree_budgets(plan=)`: None on a CPU backend, without a visible CUDA device
    the GPU table knows (its peaks), or for a source the planner cannot size.

    Args:
        source: what the run opens (an engine directory, a checkpoint, a known model name).
        backend: the run's backend; only GPU_BACKENDS are planned.
        gpu: a GPUS name or deploy/gpus.GPU (default: the visible CUDA device, gpus.visible_gpu).
        batch: prompts per call (runs decode one prompt per call).
        cfg: doubled rows for CFG (default: the engine directory's, memory_plan.run_uses_cfg; True else).
    """
    from ..deploy.gpus import visible_gpu
    from ..deploy.memory_plan import make_plan, run_uses_cfg
    from ..errors import LisaError

    if backend not in GPU_BACKENDS:
        return None
    gpu = gpu if gpu is not None else visible_gpu()
    if gpu is None:
        return None
    try:
        if cfg is None:  # an engine directory's own CFG default; a name or checkpoint: planned with CFG
            cfg = run_uses_cfg(source) if _is_bundle(source) else True
        return make_plan(source, gpu=gpu, batch=batch, cfg=cfg, search=False)
    except LisaError:  # a source the planner cannot size: the GPU budget stays the default
        return None


def _is_bundle(source) -> bool:
    from pathlib import Path

    from ..export.manifest import manifest_path

    return isinstance(source, (str, Path)) and manifest_path(source) is not None


def expected_mal(accept: Sequence[float], k: int, depth: int, total: int) -> float:
    """MAL of a K-ary tree of D + 1 drafted levels truncated to `total` - 1 nodes.

    accept[d]: probability that the best-ranked draft at depth d + 1 is accepted given its
    parent was; a node with K siblings is accepted with 1 - prod_j (1 - a_d * r^j), r = 0.5
    (lower-ranked siblings are accepted less often). Levels are kept while they fit in the
    node budget (K + K^2 ... capped by the beam width K per level, EAGLE-2 style).
    """
    nodes_left = total - 1
    mal, reach = 1.0, 1.0
    for d in range(depth + 1):
        width = min(k ** (d + 1), k * k if d else k, nodes_left)
        if width <= 0:
            break
        nodes_left -= width
        a = accept[min(d, len(accept) - 1)]
        sib = min(k, width)
        p_level = 1.0 - float(torch.prod(torch.tensor([1.0 - a * 0.5 ** j for j in range(sib)])))
        reach *= p_level
        mal += reach
    return mal


def best_tree(verify_cost: dict, draft_cost: Callable[[int], float], accept: Sequence[float],
              candidates: Optional[Sequence[tuple]] = None) -> tuple[dict, list]:
    """Pick the (top_k, depth, total_tokens) with the best predicted speed-up.

    Args:
        verify_cost: {S: seconds} measured target forwards over S tokens (S = total_tokens).
        draft_cost: n_nodes -> seconds of one drafter call over n nodes.
        accept: per-depth acceptance rates (see expected_mal).
    Returns:
        (best budget dict, table of every candidate with its prediction).
    """
    sizes = sorted(verify_cost)
    t1 = verify_cost[sizes[0]]

    def cost(S):  # linear interpolation of the measured curve
        lo = max([s for s in sizes if s <= S], default=sizes[0])
        hi = min([s for s in sizes if s >= S], default=sizes[-1])
        if hi == lo:
            return verify_cost[lo]
        w = (S - lo) / (hi - lo)
        return verify_cost[lo] * (1 - w) + verify_cost[hi] * w

    candidates = candidates or [(k, d, m) for k in (1, 2, 3, 4, 6, 8, 10) for d in (1, 2, 3, 4, 5, 6)
                                for m in (4, 6, 8, 10, 12, 16, 24, 32, 48, 60) if m - 1 <= k + d * k * k]
    table = []
    for k, d, m in candidates:
        mal = expected_mal(accept, k, d, m)
        t = cost(m) + draft_cost(k) * d + draft_cost(1)
        table.append({"top_k": k, "depth": d, "total_tokens": m, "mal": mal, "step_s": t, "speedup": mal * t1 / t})
    best = max(table, key=lambda r: r["speedup"])
    return {k: best[k] for k in ("top_k", "depth", "total_tokens")}, table


# ----------------------------------------------------------------------------- never slower

# A tree must beat vanilla by this factor before it replaces it: cost-model and timing noise on a
# shared CPU is a few percent, and a tie is not worth the drafter's memory and complexity.
MIN_GAIN = 1.05


@dataclass(frozen=True)
class DecodeChoice:
    """What a backend + precision runs by default, and why (recorded in the bundle).

    method: "tree" (speculative decoding with `tree` and the caller's rule), "vanilla", or a
        registered method's name (sjd, mcsjd, zipar, coupled, ...) that runs as recorded.
    speedup: the expected speed-up over vanilla at the same precision of what is chosen
        (1.0 for vanilla); `measured` says whether it comes from a timed run or the cost model.
    best_tree / best_tree_speedup: the best tree that was considered, even when it lost.
    knobs: the chosen method's flat settings (e.g. {"zipar_window": 4}); applied under explicit ones.
    lossless: whether the chosen method keeps the target's output law (None: not recorded).
    measured_with: {"drafter": hash or None} of the artifacts the timings were made with (None: not
        recorded); `--verify auto` trusts a choice measured with another drafter than the bundle's not.
    """

    backend: str
    precision: str
    method: str
    tree: Optional[dict]
    speedup: float
    measured: bool
    best_tree: Optional[dict]
    best_tree_speedup: Optional[float]
    reason: str
    knobs: Optional[dict] = None
    lossless: Optional[bool] = None
    measured_with: Optional[dict] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DecodeChoice":
        return cls(**{f.name: d.get(f.name) for f in dataclasses.fields(cls)})


def choose_decoding(*, backend: str, precision: str, verify_cost: Optional[dict] = None,
                    draft_cost: Optional[Callable[[int], float]] = None, accept: Optional[Sequence[float]] = None,
                    host_step_s: float = 0.0, measured: Optional[Sequence[dict]] = None,
                    sjd_speedup: Optional[float] = None, decoders: Optional[Sequence[dict]] = None,
                    min_gain: float = MIN_GAIN) -> DecodeChoice:
    """Never slower than vanilla: the fastest tree or decoder that beats vanilla by `min_gain`.

    Args:
        backend / precision: what the choice is for (ort / trt / torch; fp32 / fp16 / int8 / int4).
        verify_cost / draft_cost / accept: the cost model of `best_tree` (measured curve of the
            target at this backend + precision, drafter cost, per-depth acceptance).
        host_step_s: extra host seconds a speculative step pays over a vanilla step (tree
            building, verification rule, cache compaction), added to every tree's step time.
        measured: timed runs, [{"top_k", "depth", "total_tokens", "speedup"}] with speedup =
            vanilla seconds / tree seconds in the same run; they override the predictions.
        sjd_speedup: measured SJD speed-up over vanilla, if SJD was timed (a `decoders` entry).
        decoders: timed decoders, [{"method", "speedup", "lossless", "quality_neutral", "knobs",
            "tree", "label"}]: speedup = vanilla seconds / its seconds in the same run; a relaxed or
            approximate one is eligible only when `quality_neutral` is true (its frontier found its
            quality within 2 SE of vanilla's); lossless ones always are.
        min_gain: least speed-up that counts as a win.
    Returns:
        DecodeChoice (tree | vanilla | a method's name, with the reason in words).
    """
    best, best_s, is_measured = None, None, False
    if measured:
        win = max(measured, key=lambda r: r["speedup"])
        best, best_s, is_measured = {k: int(win[k]) for k in ("top_k", "depth", "total_tokens")}, \
            float(win["speedup"]), True
    elif verify_cost and draft_cost is not None and accept:
        vc = {k: v + host_step_s for k, v in verify_cost.items()}
        best, table = best_tree(vc, draft_cost, accept)
        t1 = verify_cost[min(verify_cost)]  # a vanilla step does not pay the speculative host work
        best_s = max(r["speedup"] for r in table) * t1 / vc[min(vc)]
    where = f"{backend}/{precision}"
    how = "measured" if is_measured else "predicted"
    decoders = list(decoders or [])
    if sjd_speedup is not None:
        decoders.append({"method": "sjd", "speedup": float(sjd_speedup), "lossless": True})
    eligible = [d for d in decoders if d.get("lossless") or d.get("quality_neutral")]
    dec = max(eligible, key=lambda d: d["speedup"], default=None)
    if best is not None and best_s >= min_gain and (dec is None or best_s >= dec["speedup"]):
        return DecodeChoice(backend, precision, "tree", best, best_s, is_measured, best, best_s,
                            f"{where}: tree K{best['top_k']}/D{best['depth']}/{best['total_tokens']} "
                            f"{how} {best_s:.2f}x vanilla")
    lost = ("no tree was measured or predicted" if best is None else
            f"no tree beats vanilla (best K{best['top_k']}/D{best['depth']}/{best['total_tokens']} "
            f"{how} {best_s:.2f}x < {min_gain:.2f}x)" if best_s < min_gain else
            f"best tree K{best['top_k']}/D{best['depth']}/{best['total_tokens']} {how} {best_s:.2f}x")
    if best is None and decoders:
        lost = f"{len(decoders)} timed decoders"
    skipped = sorted((d for d in decoders if d not in eligible and d["speedup"] >= min_gain),
                     key=lambda d: -d["speedup"])
    note = "".join(f"; {_label(d)} ({d['speedup']:.2f}x) "
                   f"{'is not quality-neutral' if d.get('quality_neutral') is False else 'has no quality verdict'}"
                   for d in skipped[:2])
    if dec is not None and dec["speedup"] >= min_gain:
        safe = max((d for d in eligible if d.get("lossless")), key=lambda d: d["speedup"], default=None)
        kind = "lossless" if dec.get("lossless") else "quality-neutral at the frontier" + (
            f"; fastest lossless: {_label(safe)} {safe['speedup']:.2f}x" if safe is not None else "")
        return DecodeChoice(backend, precision, dec["method"], dec.get("tree"), float(dec["speedup"]), True, best,
                            best_s, f"{where}: {lost}; {_label(dec)} measured {dec['speedup']:.2f}x vanilla "
                            f"({kind}){note}; running {_label(dec)}", knobs=dict(dec.get("knobs") or {}) or None,
                            lossless=bool(dec.get("lossless")))
    fast = max(eligible, key=lambda d: d["speedup"], default=None)
    none = (f"; no eligible decoder beats vanilla (best {_label(fast)} {fast['speedup']:.2f}x)"
            if fast is not None else "")
    return DecodeChoice(backend, precision, "vanilla", None, 1.0, is_measured, best, best_s,
                        f"{where}: {lost}{none}{note}; running vanilla decoding", lossless=True)


def _label(d: dict) -> str:
    """'zipar[window=4]' for {"method": "zipar", "knobs": {"zipar_window": 4}} (or its own label)."""
    if d.get("label"):
        return d["label"]
    pre = d["method"].replace("-", "_") + "_"
    kv = ",".join(f"{k[len(pre):] if k.startswith(pre) else k}={v}" for k, v in (d.get("knobs") or {}).items())
    return f"{d['method']}[{kv}]" if kv else d["method"]


def record_choices(generation: dict, choices: Sequence[DecodeChoice], measured_with: Optional[dict] = None) -> dict:
    """generation settings + {"decode": {backend: {precision: choice}}} (and the tree budget of a
    winning tree as that backend's default); returns a new dict for the bundle manifest.
    measured_with: {"drafter": hash} the choices' timings were made with (kept where one says its own)."""
    gen = json.loads(json.dumps(generation or {}))
    for c in choices:
        if measured_with is not None and c.measured_with is None:
            c = dataclasses.replace(c, measured_with=dict(measured_with))
        gen.setdefault("decode", {}).setdefault(c.backend, {})[c.precision] = c.to_dict()
        if c.method == "tree":
            gen.setdefault("tree", {})[c.backend] = dict(c.tree)
    return gen


def recorded_choice(generation: dict, backend: str, precision: str) -> Optional[DecodeChoice]:
    """The choice a bundle recorded for backend + precision (None when nothing was recorded)."""
    d = ((generation or {}).get("decode") or {}).get(backend, {}).get(precision)
    return DecodeChoice.from_dict(d) if d else None


AUTO_HOW = "`lisa-trt bench ENGINE_DIR --record` measures and records it"


def recorded_knobs(generation: dict, backend: str, precision: str, method: str,
                   drafter_hash: Optional[str] = None) -> dict:
    """The knobs a bundle recorded for `method` (its measured choice's, e.g. {"zipar_window": 4}), the
    defaults of that method on the bundle whether auto or asked for by name ({} when it recorded
    another method, or measured it with another drafter than `drafter_hash`)."""
    c = recorded_choice(generation, backend, precision)
    if c is None or c.method != method or not c.knobs:
        return {}
    if drafter_hash is not None and c.measured_with is not None and c.measured_with.get("drafter") != drafter_hash:
        return {}
    return dict(c.knobs)


def default_auto_method(has_drafter: bool, has_tables: bool) -> str:
    """`--verify auto`'s documented default where nothing of the bundle was measured: the bundle's
    drafter first (gasv with its tables, exact without them), vanilla for a bundle without one."""
    return ("gasv" if has_tables else "exact") if has_drafter else "vanilla"


def auto_method(generation: dict, backend: str, precision: str, requested: str = "gasv",
                drafter_hash: Optional[str] = None) -> tuple[str, Optional[dict], str]:
    """(verify method, settings or None, message) for `--verify auto`: the recorded choice when it
    was measured with this bundle's drafter, else `requested` (the documented default: gasv with
    the bundle's drafter). Settings: the recorded tree (top_k / depth / total_tokens) and the
    chosen method's flat knobs (e.g. zipar_window), applied under the caller's explicit ones.

    drafter_hash: the bundle's drafter (None: no drafter, or an in-memory run): a choice recorded
    as measured with another drafter (`DecodeChoice.measured_with`) is not this bundle's."""
    c = recorded_choice(generation, backend, precision)
    where, drafter = f"{backend}/{precision}", " with the bundle's drafter" if drafter_hash else ""
    other = (c is not None and drafter_hash is not None and c.measured_with is not None
             and c.measured_with.get("drafter") != drafter_hash)
    if c is None or other:
        what = (f"the recorded choice ({c.method}) was measured with another drafter" if other
                else "no measurement of this bundle recorded")
        return requested, None, f"{where}: {what} ({AUTO_HOW}); running {requested}{drafter} (the default)"
    if c.method == "tree":
        return requested, c.tree, c.reason
    settings = {**(c.tree or {}), **(c.knobs or {})}
    return c.method, settings or None, c.reason


# `lisa-trt bench ENGINE_DIR`'s measurements of the bundle, beside its manifest (the manifest stays
# the export's record): {"decode": {backend: {precision: DecodeChoice dict}}}, read over the
# manifest's recorded choices when the bundle opens (runtime/bundle.py)
MEASURED_FILE = "measured_choices.json"


def with_measured(generation: dict, engine_dir) -> dict:
    """`generation` with the choices bench recorded in `engine_dir` over the export's."""
    from pathlib import Path

    p = Path(engine_dir) / MEASURED_FILE
    if not p.is_file():
        return generation
    gen = json.loads(json.dumps(generation or {}))
    for backend, per in (json.loads(p.read_text()).get("decode") or {}).items():
        gen.setdefault("decode", {}).setdefault(backend, {}).update(per)
    return gen


def record_measured(engine_dir, choice: DecodeChoice) -> None:
    """Add `choice` (bench's, for its backend + precision) to `engine_dir`'s MEASURED_FILE, atomically."""
    from pathlib import Path

    from ..io import write_json

    p = Path(engine_dir) / MEASURED_FILE
    data = json.loads(p.read_text()) if p.is_file() else {}
    data.setdefault("decode", {}).setdefault(choice.backend, {})[choice.precision] = choice.to_dict()
    write_json(p, data)


def bench_choice(results: dict, *, backend: str, precision: str, baseline: str, drafter_hash: Optional[str],
                 tree: Optional[dict]) -> DecodeChoice:
    """The never-slower choice of one `bench` run (its results by label): every point but the baseline
    is a timed decoder; lossless when its mean TVD is 0, quality-neutral as the bench's quality
    harness found it (None below 32 images: then only lossless ones are eligible); `tree` is recorded
    with the points that decoded with a draft tree (their row's `uses_tree`, harness._measure)."""
    decoders = [{"method": r["method"], "label": label, "speedup": float(r["speedup"]),
                 "lossless": float(r.get("mean_tvd", 1.0)) < 1e-9, "quality_neutral": r.get("quality_neutral"),
                 "knobs": dict(r.get("knobs") or {}) or None,
                 "tree": dict(tree) if tree and r.get("uses_tree") else None}
                for label, r in results.items() if label != baseline]
    c = choose_decoding(backend=backend, precision=precision, decoders=decoders)
    return dataclasses.replace(c, measured_with={"drafter": drafter_hash},
                               reason=c.reason + " (measured by `lisa-trt bench` on this bundle)")


def draft_cost_for_head(measured: Callable[[int], float], measured_cfg, cfg) -> Callable[[int], float]:
    """A drafter call cost for `cfg` from one measured on a drafter of `measured_cfg`.

    The drafter step scales with its FLOPs (models/draft_vocab.drafter_step_flops), whose head
    term is hidden x head_size: a reduced draft vocabulary (`--draft-vocab N`) shrinks it, a
    full 16,384-code head dominates it. The measured cost is rescaled per node count by the
    FLOP ratio, so best_tree() sees the cheaper (or dearer) drafter.
    """
    from ..models.draft_vocab import config_step_flops

    def cost(n: int) -> float:
        return measured(n) * config_step_flops(cfg, n) / config_step_flops(measured_cfg, n)

    return cost
