"""Issue 40: the LISA loss against the EAGLE-3 loss in sampling regimes that flatten the target.

Stages, each its own command. The recorded run (bench/lisa_regimes.json; the full command lines
are in its settings and decode_runs):

    python bench/lisa_regimes.py train --regime t1.6-cfg1 --loss L --runs R --steps 400 --num-samples 2048
        # L in eagle3, lisa-paper, lisa-ext, lisa-soft, lisa-mean, lisa-additive (same seed, data, budget)
    python bench/lisa_regimes.py decode --regime t1.6-cfg1 --runs R --drafters eagle3,lisa-paper,lisa-ext \
        --images 128 --start 0 --oracle-images 64 --json R/dec_a.json     # and --images 256 --start 128
    python bench/lisa_regimes.py decode ... --drafters lisa-soft,lisa-mean,lisa-additive --oracle-images 0 ...
    python bench/lisa_regimes.py merge R/dec_a.json R/dec_b.json R/abl_a.json R/abl_b.json --json R/t1.6-cfg1.json
    python bench/lisa_regimes.py view --regime G --images 32 --json R/view_G.json   # each regime G
    python bench/lisa_regimes.py report R/t1.6-cfg1.json [shipped decode files] R/view_*.json \
        --runs R --ablation bench/lisa_ablation.json --notes NOTES.json --json bench/lisa_regimes.json \
        --plot bench/lisa_regimes.png

The t1.3-cfg2 regime-matched run added to it the same way: `train --regime t1.3-cfg2` with --loss eagle3,
lisa-paper, lisa-additive (400 steps, 2,048 samples), `decode --drafters eagle3,lisa-paper,lisa-additive` in
two shards (--start 0 --images 128 --oracle-images 64; --start 128 --images 256), `merge`, then
`report R/t1.3-cfg2.json --previous bench/lisa_regimes.json --notes NOTES.json --json ... --plot ...`.

The shipped drafters' decodes (demo-eagle3 / demo-lisa at t1.6-cfg1 and t1.3-cfg2, from an earlier
run) are kept in decode_runs. `train`: a fresh drafter per (regime,
loss) trained by lisa_trt.train.trainer.train_drafter on sequences the target samples IN THAT
REGIME (RUNS/REGIME/tokens.safetensors, made once; target features cached once), same seed, steps
and batch for every loss. The loss targets are the
target's raw logits, as in the trainer; the decode loop applies the regime's guidance and
temperature to the target and the drafter alike, so the regime changes only which prefixes the
drafter is trained on.

`decode`: the drafters and the oracle drafter (the target's own top-k: the ceiling) on the same
prompts and seeds (image i: class i % 8), exact and GASV; per image MAL and class accuracy; the
target's mean normalised entropy U = H(p) / log V of the regime's law over the oracle's (lossless)
samples. `view`: U and LISA's selection statistics (selection_stats) on vanilla samples, no decoding.

`report`: per regime, MAL +- SE, drafter efficiency (per-image MAL / oracle MAL, paired, delta
method), the paired per-image difference to the EAGLE-3-loss drafter (bench/lisa_ablation.py's
`paired` and `ratio_se`), LISA's selection statistics, a Markdown table and a plot."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.speculative.methods import resolve_method

# regime name -> the sampling law it decodes (and self-distils) with; top-k 0 = the whole codebook
REGIMES = {
    "t1.0-cfg2": SamplingConfig(cfg_scale=2.0, temperature=1.0),  # the demo's deployment setting
    "t1.3-cfg2": SamplingConfig(cfg_scale=2.0, temperature=1.3),
    "t1.6-cfg2": SamplingConfig(cfg_scale=2.0, temperature=1.6),
    "t1.0-cfg1": SamplingConfig(cfg_scale=1.0, temperature=1.0),
    "t1.6-cfg1": SamplingConfig(cfg_scale=1.0, temperature=1.6),  # flattest: no guidance, hot
    # top-k sweep at the flattest point (top-k 0 above = the whole 1,024-token codebook)
    "t1.6-cfg1-k16": SamplingConfig(cfg_scale=1.0, temperature=1.6, top_k=16),
    "t1.6-cfg1-k64": SamplingConfig(cfg_scale=1.0, temperature=1.6, top_k=64),
    "t1.6-cfg1-k256": SamplingConfig(cfg_scale=1.0, temperature=1.6, top_k=256),
}
# the shipped drafters: both losses at the same budget (1,600 steps on 8,192 sequences sampled at the
# deployment setting t1.0-cfg2; bench/drafter_runs/README.md) -> their training logs
SHIPPED = {"demo-eagle3": "bench/drafter_runs/eagle3", "demo-lisa": "bench/drafter_runs/lisa"}
GASV = ("gasv[kappa=2,lambda=0.4,delta=0.3]", {"gasv_kappa": 2.0, "gasv_lambda": 0.4, "gasv_delta": 0.3})
TREE = (3, 3, 10)  # top_k, depth, total_tokens: the frontier's tree


def _bench_module(name: str):
    """A sibling bench script as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------- train

def loss_config(name: str):
    """A --loss recipe name -> LossConfig (lisa_trt.train.losses.loss_recipe)."""
    from lisa_trt.train.losses import loss_recipe

    return loss_recipe(name)


def train(a) -> None:
    """One drafter for (regime, loss) in RUNS/REGIME/LOSS. The regime's sequences are sampled once
    (RUNS/REGIME/tokens.safetensors, the last 32 held out) and its target features cached once
    (RUNS/REGIME/features): every loss reads the same rows in the same order."""
    from lisa_trt.demo.registry import load_demo_target, load_demo_vq
    from lisa_trt.io import save_safetensors
    from lisa_trt.train.data import DataConfig, self_distill_tokens
    from lisa_trt.train.trainer import TrainConfig, train_drafter

    torch.set_num_threads(1)
    s, root = REGIMES[a.regime], Path(a.runs) / a.regime
    target, vq = load_demo_target(), load_demo_vq()
    tokens = root / "tokens.safetensors"
    t0 = time.time()
    if not tokens.is_file():  # self-distillation in the regime (10 % unconditional rows, as the trainer does)
        ds = self_distill_tokens(target, a.num_samples + 32, cfg_scale=s.cfg_scale, temperature=s.temperature,
                                 top_k=s.top_k, top_p=s.top_p, seed=a.seed, progress=False)
        save_safetensors({"tokens": ds.tokens, "classes": ds.cond}, tokens, metadata={"regime": a.regime})
        (root / "sample_wall_s.json").write_text(json.dumps({"wall_s": round(time.time() - t0, 1)}))
    data = DataConfig(source="tokens", token_file=str(tokens), eval_samples=32, cfg_scale=s.cfg_scale,
                      temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, features="cache",
                      cache_dir=str(root / "features"))
    cfg = TrainConfig(steps=a.steps, batch_size=a.batch_size, ttt_steps=a.ttt_steps, seed=a.seed,
                      checkpoint_every=a.steps, target_name="demo", loss=loss_config(a.loss), data=data)
    t0 = time.time()
    train_drafter(target, vq.codebook().detach(), cfg, root / a.loss, progress=False)
    (root / a.loss / "wall_s.json").write_text(json.dumps({"wall_s": round(time.time() - t0, 1)}))


# ----------------------------------------------------------------------------- decode

def target_entropy(target, tokens: torch.Tensor, cond: torch.Tensor, sampling: SamplingConfig) -> list:
    """Per image: the mean over positions of U = H(p) / log V, p the regime's guided, filtered
    target law given the image's own prefix (tokens: (B, N) samples of that law)."""
    from lisa_trt.speculative.decode import Guide

    guide = Guide(sampling)
    null = torch.full_like(cond, target.config.num_classes)
    with torch.no_grad():
        c = torch.cat([cond, null]) if guide.cfg else cond
        raw = target.forward_train(c, guide.dup(tokens)).logits.float()
        lp = guide(raw).log_softmax(-1)
    h = -(lp.exp() * lp).nan_to_num(0.0).sum(-1)  # (B, N)
    return (h / math.log(lp.shape[-1])).mean(-1).tolist()


def selection_stats(target, drafter, codebook, tokens: torch.Tensor, cond: torch.Tensor) -> dict:
    """What LISA's selection sees on these sequences (the trainer's raw target logits, the drafter's
    step-0 logits, the radius estimated on them as the trainer does on its first batch): mean alpha,
    the fraction of positions with a non-zero paper score (drafter top-1 outside N), the fraction
    selected and the share of the loss weight on unselected positions at the last training step
    (w_veto = 1, q_sel = q_sel_end), for the paper's form and for lisa-ext."""
    from lisa_trt.train.losses import estimate_radius, joint_topk_kl, lisa_weights, locality_score, loss_recipe
    from lisa_trt.train.trainer import ttt_unroll

    with torch.no_grad():
        out = target.forward_train(cond, tokens, taps=True)
        s_logits = ttt_unroll(drafter, out.taps, tokens, 1)[0][0].flatten(0, 1)  # entry j predicts tokens[:, j + 1]
        t_logits = out.logits[:, 1:].float().flatten(0, 1)
        p_t, cb = t_logits.softmax(-1), torch.nn.functional.normalize(codebook.float(), dim=-1)
        g = torch.exp(-joint_topk_kl(t_logits, s_logits))
        res = {"positions": len(p_t)}
        for name in ("lisa-paper", "lisa-ext"):
            cfg = loss_recipe(name)
            r = estimate_radius(p_t, cb, cfg.top_kc, cfg.nbhd_size)
            loc = locality_score(p_t, s_logits, cb, r, cfg.top_kc, cfg.mismatch)
            w, sel = lisa_weights(loc["score"], g, 1, 1, cfg)
            res[name] = {"score_nonzero": float((loc["score"] > 0).float().mean()), "selected": float(sel.float().mean()),
                         "weight_share_unselected": float(w[~sel].sum() / w.sum())}
        res["alpha"] = float(loc["alpha"].mean())
    return res


def _drafter_source(runs, regime: str, name: str) -> str:
    """A shipped drafter's name (SHIPPED), else the file `train` wrote for (regime, loss)."""
    return name if name in SHIPPED else str(Path(runs) / regime / name / "drafter.safetensors")


def eagle3_reference(name: str) -> str:
    """The EAGLE-3-loss drafter a drafter is paired against: the shipped one for shipped drafters."""
    return "demo-eagle3" if name in SHIPPED else "eagle3"


def _points(drafters: list, oracle: bool = True) -> list:
    """(label, drafter name or None for the oracle, method, SpecConfig overrides)."""
    pts = [("oracle:exact", None, "exact", {})] if oracle else []
    for d in drafters:
        pts += [(f"{d}:exact", d, "exact", {}), (f"{d}:{GASV[0]}", d, "gasv", GASV[1])]
    return pts


def decode(a) -> None:
    """Every point on the same images (rounds of --batch from --start), JSON rewritten after every
    round. The oracle decodes only the rounds below --oracle-images (it drafts with the target: the
    costliest point); U and LISA's view come from its samples, or from the first exact drafter's
    when the oracle does not run (exact verification is lossless: both are the regime's law). The
    demo scorer's features of every image go to JSON.features.safetensors (FD / KID in `merge`)."""
    from lisa_trt.artifacts import load_drafter_by_name, load_tables_by_name
    from lisa_trt.demo.registry import load_demo_scorer, load_demo_target, load_demo_vq
    from lisa_trt.io import save_safetensors, write_json
    from lisa_trt.quality import accuracy
    from lisa_trt.speculative.decode import SpecConfig, SpeculativeDecoder
    from lisa_trt.speculative.oracle import oracle_pair

    torch.set_num_threads(1)
    if a.start % a.batch:
        raise SystemExit(f"--start {a.start} is not a multiple of --batch {a.batch}: the rounds (and their seeds) "
                         "would not line up with an unsharded run")
    s = REGIMES[a.regime]
    oracle_images = a.images if a.oracle_images is None else a.oracle_images
    target, vq, scorer = load_demo_target(), load_demo_vq(), load_demo_scorer()
    tables = load_tables_by_name("demo", target)
    names = [d for d in a.drafters.split(",") if d]
    drafters = {d: load_drafter_by_name(_drafter_source(a.runs, a.regime, d), target).eval() for d in names}
    decs = {d: SpeculativeDecoder(target, m, tables) for d, m in drafters.items()}
    sel = {d: [] for d in names}
    decs[None] = SpeculativeDecoder(*oracle_pair(target), tables)
    base = SpecConfig.make(top_k=TREE[0], depth=TREE[1], total_tokens=TREE[2])
    acc = {p[0]: {"mal": [], "correct": [], "tvd": [], "seconds": 0.0, "features": []} for p in _points(names)}
    entropy, t_start, ncls = [], time.time(), target.config.num_classes
    for i0 in range(a.start, a.images, a.batch):
        cond = torch.arange(i0, min(i0 + a.batch, a.images)) % ncls
        pts = _points(names, oracle=i0 < oracle_images)
        lossless = pts[0][1]  # the oracle when it runs this round, else the first drafter's exact point
        for label, d, method, over in pts:
            t0 = time.perf_counter()
            toks, st = decs[d].generate(cond, sampling=s, method=resolve_method(method), spec=base.replace(method=method, **over), seed=a.seed + i0)
            acc[label]["seconds"] += time.perf_counter() - t0
            acc[label]["mal"] += [round(st.row(b)["mal"], 4) for b in range(len(cond))]
            acc[label]["tvd"] += [st.row(b)["mean_tvd"] for b in range(len(cond))]
            feats, correct = _score(scorer, vq, toks, cond, target.config.grid_size)
            acc[label]["correct"] += correct
            acc[label]["features"].append(feats)
            if d == lossless and method == "exact":
                _observe(target, vq, drafters, toks, cond, s, entropy, sel)
        rep = _decode_report(a, s, acc, entropy, time.time() - t_start, accuracy)
        rep["settings"].update(start=a.start, oracle_images=min(oracle_images, a.images))
        write_json(a.json, dict(rep, lisa_selection={n: _pool(v) for n, v in sel.items()}))
        save_safetensors({k: torch.cat(r["features"]) for k, r in acc.items() if r["features"]},
                         Path(a.json).with_suffix(".features.safetensors"))
        print(f"{len(entropy)} images, {time.time() - t_start:.0f} s", flush=True)


def _observe(target, vq, drafters: dict, toks, cond, s, entropy: list, sel: dict) -> None:
    """Append the images' U to `entropy` and each drafter's selection_stats to sel[drafter]."""
    entropy += [round(u, 5) for u in target_entropy(target, toks, cond, s)]
    for name, m in drafters.items():
        sel[name].append(selection_stats(target, m, vq.codebook().detach(), toks, cond))


def _pool(stats: list) -> dict:
    """Position-weighted means of selection_stats over batches (nested dicts pooled key by key)."""
    n = sum(x["positions"] for x in stats)

    def mean(key):
        if isinstance(stats[0][key], dict):
            return _pool([dict(x[key], positions=x["positions"]) for x in stats])
        return sum(x[key] * x["positions"] for x in stats) / n

    return {k: mean(k) for k in stats[0] if k != "positions"} | {"positions": n}


def _score(scorer, vq, toks, cond, g) -> tuple:
    """The demo scorer's (features (B, F), per image 1.0 when it classifies the decoded image as its
    prompt's class)."""
    from lisa_trt.demo.scorer import extract

    with torch.no_grad():
        img = vq.decode_code(toks, (toks.shape[0], vq.config.codebook_embed_dim, g, g)).clamp(-1, 1)
    feats, logits = extract(scorer, img)
    return feats, (logits.argmax(-1) == cond).float().tolist()


def _decode_report(a, s, acc, entropy, elapsed, accuracy) -> dict:
    res = {}
    for label, r in acc.items():
        n = len(r["mal"])
        if n == 0:
            continue
        mal = sum(r["mal"]) / n
        se = math.sqrt(sum((x - mal) ** 2 for x in r["mal"]) / (n - 1) / n) if n > 1 else None
        ca = sum(r["correct"]) / n
        res[label] = {"images": n, "mal": mal, "mal_se": se, "mal_per_image": r["mal"],
                      "correct_per_image": r["correct"], "tvd_per_image": r["tvd"], "class_acc": ca, "class_acc_se": math.sqrt(ca * (1 - ca) / n),
                      "mean_tvd": sum(r["tvd"]) / n, "cpu_seconds_per_image_batched": r["seconds"] / n}
    return {"settings": {"regime": a.regime, "sampling": dataclasses.asdict(s), "tree": list(TREE), "seed": a.seed,
                         "images": len(entropy), "batch": a.batch, "elapsed_s": round(elapsed, 1),
                         "command": " ".join(["python"] + sys.argv)},
            "target_entropy_U": {"mean": sum(entropy) / len(entropy), "per_image": entropy},
            "results": res}


def merge(a) -> None:
    """Shards of one decode (`decode --start`, same regime, seed and batch; shards of the same rounds
    may decode different drafters, each drafter once per round range) -> one decode file, per-image lists in image order, aggregates recomputed; with the features sidecars, image
    quality per point: FD-demo and KID-demo against the real held-out crops, and KID-demo against
    the pooled exact-verification samples of the regime (lossless: the regime's own law)."""
    from lisa_trt.demo.registry import load_demo_scorer
    from lisa_trt.demo.scorer import feature_stats, frechet_distance
    from lisa_trt.errors import InputError
    from lisa_trt.io import load_safetensors, save_safetensors, write_json
    from lisa_trt.quality import QualityReference, kid

    shards = sorted((json.loads(Path(f).read_text()) | {"_path": f} for f in a.files),
                    key=lambda d: d["settings"].get("start", 0))
    keys = ("regime", "seed", "batch", "tree")
    for d in shards[1:]:
        if any(d["settings"][k] != shards[0]["settings"][k] for k in keys):
            raise SystemExit(f"{d['_path']}: {', '.join(keys)} differ from {shards[0]['_path']}: not shards of one run")
    labels = list(dict.fromkeys(lab for d in shards for lab in d["results"]))
    seen = set()
    for d in shards:
        for lab in d["results"]:
            if (lab, d["settings"].get("start", 0)) in seen:
                raise SystemExit(f"{d['_path']}: {lab} decoded twice from image {d['settings'].get('start', 0)}")
            seen.add((lab, d["settings"].get("start", 0)))
    feats = {lab: [] for lab in labels}
    acc = {lab: {"mal": [], "correct": [], "tvd": [], "seconds": 0.0} for lab in labels}
    entropy, sel, elapsed, starts = [], {}, 0.0, set()
    for d in shards:
        side = Path(d["_path"]).with_suffix(".features.safetensors")
        f = load_safetensors(side)[0] if side.is_file() else {}
        for lab, r in d["results"].items():
            acc[lab]["mal"] += r["mal_per_image"]
            acc[lab]["correct"] += r["correct_per_image"]
            acc[lab]["tvd"] += r["tvd_per_image"]
            acc[lab]["seconds"] += r["cpu_seconds_per_image_batched"] * r["images"]
            if lab in f:
                feats[lab].append(f[lab])
        if d["settings"].get("start", 0) not in starts:  # shards of one round range with other drafters share its U
            starts.add(d["settings"].get("start", 0))
            entropy += d["target_entropy_U"]["per_image"]
        for n, v in d.get("lisa_selection", {}).items():
            sel.setdefault(n, []).append(v)
        elapsed += d["settings"]["elapsed_s"]
    s0 = shards[0]["settings"]
    ns = argparse.Namespace(regime=s0["regime"], seed=s0["seed"], batch=s0["batch"])
    rep = _decode_report(ns, REGIMES[s0["regime"]], acc, entropy, elapsed, None)
    rep["settings"].update(shards=[d["_path"] for d in shards], oracle_images=len(acc.get("oracle:exact", {}).get("mal", [])),
                           command=" ".join(["python"] + sys.argv))
    rep["lisa_selection"] = {n: _pool(v) for n, v in sel.items()}
    if all(feats[lab] for lab in labels):
        ref = QualityReference(load_demo_scorer())
        fx = {lab: torch.cat(v) for lab, v in feats.items()}
        lossless = torch.cat([fx[lab] for lab in labels if lab.endswith(":exact")])
        mu_r, sig_r = feature_stats(ref.real)
        for lab, x in fx.items():
            q = rep["results"][lab]
            q["fd_demo"] = frechet_distance(*feature_stats(x), mu_r, sig_r)
            try:  # KID's subsets need enough images per set: a point below that gets none
                q["kid_real"], q["kid_real_se"] = kid(x, ref.real)
                q["kid_lossless"], q["kid_lossless_se"] = kid(x, lossless)
            except InputError as e:
                q["kid_skipped"] = str(e)
        rep["settings"]["quality"] = ("demo scorer features: FD-demo and KID-demo vs the real held-out crops "
                                      f"({len(ref.real)}), KID-demo vs the pooled exact-verification samples ({len(lossless)})")
        save_safetensors(fx, Path(a.json).with_suffix(".features.safetensors"))
    write_json(a.json, rep)
    print(f"{a.json}: {len(entropy)} images from {len(shards)} shards")


def view(a) -> None:
    """Without decoding: the regime's U and LISA's selection statistics on --images vanilla samples."""
    from lisa_trt.artifacts import load_drafter_by_name
    from lisa_trt.demo.registry import load_demo_target, load_demo_vq
    from lisa_trt.io import write_json
    from lisa_trt.speculative.autoregressive import generate

    torch.set_num_threads(1)
    s, t0 = REGIMES[a.regime], time.time()
    target, vq = load_demo_target(), load_demo_vq()
    drafters = {d: load_drafter_by_name(_drafter_source(a.runs, a.regime, d), target).eval()
                for d in a.drafters.split(",") if d}
    entropy, sel = [], {d: [] for d in drafters}
    for i0 in range(0, a.images, a.batch):
        cond = torch.arange(i0, min(i0 + a.batch, a.images)) % target.config.num_classes
        _observe(target, vq, drafters, generate(target, cond, seed=a.seed + i0, **dataclasses.asdict(s)), cond, s,
                 entropy, sel)
    write_json(a.json, {"settings": {"regime": a.regime, "sampling": dataclasses.asdict(s), "images": len(entropy),
                                     "seed": a.seed, "elapsed_s": round(time.time() - t0, 1),
                                     "command": " ".join(["python"] + sys.argv)},
                        "target_entropy_U": {"mean": sum(entropy) / len(entropy), "per_image": entropy},
                        "lisa_selection": {d: _pool(v) for d, v in sel.items()}})


# ----------------------------------------------------------------------------- report

def training_stats(run: Path) -> dict:
    """A training run's wall time, steps and LISA diagnostics (step-0 means over the logged second half)."""
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    recs = [r for r in recs if "loss" in r]
    late = recs[len(recs) // 2:]

    def mean(key):
        vals = [r[key] for r in late if key in r]
        return sum(vals) / len(vals) if vals else None

    top1_out = mean("in_nbhd_0")
    wall = run / "wall_s.json"
    return {"steps": recs[-1]["step"], "wall_s": json.loads(wall.read_text())["wall_s"] if wall.is_file() else None,
            "sel_frac": mean("sel_frac_0"), "top1_outside_nbhd": None if top1_out is None else 1 - top1_out,
            "alpha": mean("alpha_0"), "ce_0": mean("ce_0"),
            "held_out": json.loads((run / "eval.json").read_text()) if (run / "eval.json").is_file() else None}


def from_ablation(path) -> dict:
    """The deployment regime t1.0-cfg2 from bench/lisa_ablation.json (the shipped drafters' 256
    images, decoded by gasv_frontier.py with its own seeds) as a decode file (no U: a `view` run
    of the regime adds it)."""
    ab = json.loads(Path(path).read_text())
    names = {"eagle3-1600": "demo-eagle3", "lisa-1600": "demo-lisa"}
    res = {"oracle:exact": ab["results"]["oracle"]}
    for label, r in ab["results"].items():
        name, _, rule = label.partition(":")
        if name in names:
            res[f"{names[name]}:{rule}"] = r
    return {"settings": {"regime": "t1.0-cfg2", "sampling": ab["settings"]["sampling"],
                         "images": ab["results"]["oracle"]["images"], "decoded_by": str(path)}, "results": res}


def mean_se(xs: list) -> tuple:
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def summarize_regime(dec: dict, runs: Path) -> dict:
    """One regime's rows: MAL +- SE, efficiency vs the oracle (exact), paired difference to the
    EAGLE-3-loss drafter; U over the oracle's samples when the decode file has it."""
    ab = _bench_module("lisa_ablation")
    res, o = dec["results"], dec["results"]["oracle:exact"]
    out = {"sampling": dec["settings"]["sampling"], "images": dec["settings"]["images"],
           "oracle_mal": o["mal"], "oracle_mal_se": o["mal_se"], "oracle_class_acc": o["class_acc"],
           "oracle_class_acc_se": o["class_acc_se"], "drafters": {}, "rows": {}}
    if "target_entropy_U" in dec:
        out["U"], out["U_se"] = mean_se(dec["target_entropy_U"]["per_image"])
    if dec.get("lisa_selection"):  # what LISA's selection marks on the regime's exact samples, per drafter
        out["selection"] = dec["lisa_selection"]
    for label, r in res.items():
        name, rule = label.split(":", 1)
        if name == "oracle":
            continue
        row = {k: r[k] for k in ("mal", "mal_se", "class_acc", "class_acc_se", "mean_tvd", "images", "fd_demo",
                                 "kid_real", "kid_real_se", "kid_lossless", "kid_lossless_se") if k in r}
        if rule == "exact":  # paired on the images the oracle decoded (the first --oracle-images)
            n_o = len(o["mal_per_image"])
            mine = r["mal_per_image"][:n_o]
            row["efficiency"] = sum(mine) / sum(o["mal_per_image"])
            row["efficiency_se"] = ab.ratio_se(mine, o["mal_per_image"])
            row["efficiency_images"] = n_o
        ref = res.get(f"{eagle3_reference(name)}:{rule}")
        if ref is not None and name != eagle3_reference(name):
            row["vs_eagle3"] = ab.paired(r["mal_per_image"], ref["mal_per_image"])
        out["rows"][label] = row
        run = Path(SHIPPED[name]) if name in SHIPPED else runs / dec["settings"]["regime"] / name
        if name not in out["drafters"] and (run / "metrics.jsonl").is_file():
            out["drafters"][name] = training_stats(run)
    return out


def _key(dec: dict) -> str:
    """A decode file's row group: its regime, marked "matched" when its drafters were trained in it
    (`train`) rather than shipped."""
    names = {lab.split(":", 1)[0] for lab in dec["results"]} - {"oracle"}
    return dec["settings"]["regime"] + ("" if names <= set(SHIPPED) else ", matched")


def add_view(summary: dict, v: dict) -> None:
    """A `view` file's U and LISA selection statistics into its regime's entry (made if absent)."""
    key = v["settings"]["regime"] + ("" if set(v["lisa_selection"]) <= set(SHIPPED) else ", matched")
    reg = summary.setdefault(key, {"sampling": v["settings"]["sampling"], "rows": {}})
    u, se = mean_se(v["target_entropy_U"]["per_image"])
    reg["view"] = {"images": v["settings"]["images"], "U": u, "U_se": se, "lisa_selection": v["lisa_selection"]}
    reg.setdefault("U", u)
    reg.setdefault("U_se", se)


def markdown(summary: dict) -> str:
    """The loss x regime x rule table (Markdown)."""
    out = ["| regime | U +- SE | drafter | score > 0 / selected | rule | MAL +- SE | efficiency | "
           "d vs EAGLE-3 loss (paired) | class acc | FD-demo | KID vs exact samples |", "|" + "---|" * 11]
    for reg, s in summary.items():
        if "oracle_mal" not in s:  # a regime with a view only
            out.append(f"| {reg} | {s['U']:.3f} +- {s['U_se']:.3f} | (not decoded) | | | | | | | | |")
            continue
        out.append(f"| {reg} | {s['U']:.3f} +- {s['U_se']:.3f} | oracle | | exact | {s['oracle_mal']:.3f} +- "
                   f"{s['oracle_mal_se']:.3f} | 1 | | {s['oracle_class_acc']:.3f} +- {s['oracle_class_acc_se']:.3f} | | |")
        for label, r in s["rows"].items():
            name, rule = label.split(":", 1)
            # per drafter: a view's statistics, else the decode's own
            seen = {**s.get("selection", {}), **s.get("view", {}).get("lisa_selection", {})}
            v = seen.get(name, {}).get("lisa-paper")
            sel = f"{v['score_nonzero']:.3f} / {v['selected']:.3f}" if v and rule == "exact" else ""
            eff = f"{r['efficiency']:.3f} +- {r['efficiency_se']:.3f}" if "efficiency" in r else ""
            p = r.get("vs_eagle3")
            d = f"{p['diff']:+.3f} +- {p['se']:.3f}{' *' if p['beyond_2se'] else ''}" if p else ""
            out.append(f"| {reg} | | {name} | {sel} | {rule} | {r['mal']:.3f} +- "
                       f"{r['mal_se']:.3f} | {eff} | {d} | {r['class_acc']:.3f} +- {r['class_acc_se']:.3f} | "
                       f"{_num(r, 'fd_demo')} | {_num(r, 'kid_lossless')} |")
    out.append("\n`*`: paired difference beyond 2 standard errors.")
    return "\n".join(out)


def _num(r: dict, key: str) -> str:
    """A row's value (+- its SE when it has one) for the table, blank when not measured."""
    if r.get(key) is None:
        return ""
    se = r.get(f"{key}_se")
    return f"{r[key]:.3f}" + (f" +- {se:.3f}" if se is not None else "")


def _plot_rule(ax, summary: dict, rule: str) -> None:
    """MAL (2 SE bars) against U for every drafter decoded with `rule` (and the oracle, exact)."""
    decoded = {r: s for r, s in summary.items() if s["rows"]}
    names = sorted({lab.split(":")[0] for s in decoded.values() for lab in s["rows"] if lab.endswith(":" + rule)})
    for i, name in enumerate(names):
        pts = sorted((s["U"], s["rows"][f"{name}:{rule}"]) for s in decoded.values() if f"{name}:{rule}" in s["rows"])
        ax.errorbar([u + 0.004 * i for u, _ in pts], [r["mal"] for _, r in pts], yerr=[2 * r["mal_se"] for _, r in pts],
                    marker="o", capsize=3, label=name)
    if rule == "exact":
        pts = sorted((s["U"], s["oracle_mal"], s["oracle_mal_se"]) for s in decoded.values())
        ax.errorbar([q[0] - 0.004 for q in pts], [q[1] for q in pts], yerr=[2 * q[2] for q in pts], color="k", ls="--",
                    marker="s", capsize=3, label="oracle drafter")
    for reg, s in decoded.items():
        ax.annotate(reg, (s["U"], 0.08 if reg.endswith("matched") else 0.02), xycoords=("data", "axes fraction"),
                    fontsize=7)  # a matched regime's label above the shipped drafters' at the same U
    ax.set_xlabel("target entropy U = H(p) / log V (mean over positions)")
    ax.set_ylabel("MAL (bars: 2 SE over images, unpaired)")
    ax.set_title(rule, fontsize=9)
    ax.legend(fontsize=7)


def _plot_selection(ax, summary: dict) -> None:
    """LISA's view of each regime (demo-lisa's step-0 logits): positions with a non-zero paper score,
    and the share of the loss weight left on unselected positions (paper form vs lisa-ext)."""
    pts = sorted((s["view"]["U"], s["view"]["lisa_selection"]["demo-lisa"]) for s in summary.values()
                 if "demo-lisa" in s.get("view", {}).get("lisa_selection", {}))
    u = [q[0] for q in pts]
    ax.plot(u, [q[1]["lisa-paper"]["score_nonzero"] for q in pts], "o-", label="paper: score > 0 (= selected)")
    ax.plot(u, [q[1]["lisa-paper"]["weight_share_unselected"] for q in pts], "s--", label="paper: weight on unselected")
    ax.plot(u, [q[1]["lisa-ext"]["weight_share_unselected"] for q in pts], "^--", label="lisa-ext: weight on unselected")
    ax.set_xlabel("target entropy U (vanilla samples of the regime)")
    ax.set_ylabel("fraction of positions / of the loss weight")
    ax.set_title("what LISA's selection sees (demo-lisa, last-step schedule)", fontsize=9)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)


def _plot_paired(ax, matched: dict) -> None:
    """Each regime-matched loss's paired MAL difference to the EAGLE-3 loss (2 SE bars), per rule."""
    names = sorted({lab.split(":")[0] for s in matched.values() for lab in s["rows"] if "vs_eagle3" in s["rows"][lab]})
    series = [(reg, rule) for reg, s in matched.items()
              for rule in sorted({lab.split(":", 1)[1] for lab in s["rows"]}, key=lambda r: r != "exact")]
    width = 0.8 / max(len(series), 1)
    for j, (reg, rule) in enumerate(series):  # one marker per (regime, rule) beside each loss
        s = matched[reg]
        pts = [(i, s["rows"][f"{n}:{rule}"]["vs_eagle3"]) for i, n in enumerate(names)
               if "vs_eagle3" in s["rows"].get(f"{n}:{rule}", {})]
        ax.errorbar([i - 0.4 + width * (j + 0.5) for i, _ in pts], [p["diff"] for _, p in pts],
                    yerr=[2 * p["se"] for _, p in pts], fmt="o", capsize=3, label=f"{reg.split(',')[0]}: {rule}")
    ax.set_xticks(range(len(names)), names, rotation=20, fontsize=7)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_ylabel("MAL minus the EAGLE-3 loss's (paired, bars 2 SE)")
    ax.set_title("regime-matched drafters, 256 images", fontsize=9)
    ax.legend(fontsize=6)


def plot(summary: dict, path: Path) -> None:
    """One panel per verification rule (MAL against U), then LISA's selection statistics against U."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lisa_trt.io import atomic_write

    rules = sorted({lab.split(":", 1)[1] for s in summary.values() for lab in s["rows"]}, key=lambda r: r != "exact")
    matched = {r: s for r, s in summary.items() if r.endswith(", matched") and s["rows"]}
    extra = 1 + bool(matched)
    fig, axes = plt.subplots(1, len(rules) + extra, figsize=(5.5 * (len(rules) + extra), 4), squeeze=False)
    for ax, rule in zip(axes[0], rules):
        _plot_rule(ax, summary, rule)
    _plot_selection(axes[0][len(rules)], summary)
    if matched:
        _plot_paired(axes[0][-1], matched)
    fig.suptitle("LISA vs EAGLE-3 loss across sampling regimes (demo model; shipped drafters: 1,600 steps on "
                 "t1.0-cfg2 sequences; matched: 400 steps on sequences of the regime)", fontsize=9)
    fig.tight_layout()
    with atomic_write(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def extend(previous: dict, summary: dict, decs: list) -> tuple:
    """A recorded report (`previous`: its summary and decode_runs) extended by new regimes: the
    new decode files' rows are added, a regime decoded again is replaced (its view kept), and the
    recorded ones (whose run directories may be gone: their training statistics live in the
    summary) are kept as they are. -> (summary, decode_runs)."""
    new_keys = {_key(d) for d in decs}
    old = [d for d in previous["decode_runs"] if _key(d) not in new_keys]
    merged = dict(previous["summary"])
    for key, s in summary.items():
        view = merged.get(key, {}).get("view")
        merged[key] = {**s, **({"view": view} if view is not None and "view" not in s else {})}
    return merged, old + decs


def matched_table(summary: dict) -> str:
    """Loss x regime x rule over the regime-matched drafters (Markdown): MAL +- SE and the paired
    difference to the EAGLE-3 loss per rule, drafter efficiency vs the oracle, class accuracy."""
    out = ["| regime (U) | loss | exact MAL +- SE | d exact vs EAGLE-3 | efficiency | GASV MAL +- SE | "
           "d GASV vs EAGLE-3 | class acc exact / GASV |", "|" + "---|" * 8]
    for reg, s in summary.items():
        if not reg.endswith(", matched"):
            continue
        names = sorted({lab.split(":")[0] for lab in s["rows"]}, key=lambda n: (n != "eagle3", n))
        for name in names:
            ex, gv = s["rows"].get(f"{name}:exact"), s["rows"].get(f"{name}:{GASV[0]}")

            def cell(r, key):
                p = (r or {}).get(key)
                return "" if p is None else f"{p['diff']:+.3f} +- {p['se']:.3f}{' *' if p['beyond_2se'] else ''}"

            def mal(r):
                return "" if r is None else f"{r['mal']:.3f} +- {r['mal_se']:.3f}"

            eff = f"{ex['efficiency']:.3f} +- {ex['efficiency_se']:.3f}" if ex and "efficiency" in ex else ""
            acc = " / ".join(f"{r['class_acc']:.2f}" for r in (ex, gv) if r is not None)
            out.append(f"| {reg.split(',')[0]} ({s['U']:.2f}) | {name} | {mal(ex)} | {cell(ex, 'vs_eagle3')} | {eff} | "
                       f"{mal(gv)} | {cell(gv, 'vs_eagle3')} | {acc} |")
    out.append("\n`*`: paired per-image difference beyond 2 standard errors; efficiency: MAL / the oracle "
               "drafter's exact MAL on the images it decoded.")
    return "\n".join(out)


def report(a) -> None:
    """Join the decode files (one per regime) into --json (+ --plot) and print the tables; with
    --previous, extend a recorded report (bench/lisa_regimes.json) by the new regimes."""
    from lisa_trt.io import write_json

    files = [json.loads(Path(f).read_text()) for f in a.files]
    decs = ([from_ablation(a.ablation)] if a.ablation else []) + [f for f in files if "results" in f]
    summary = {_key(d): summarize_regime(d, Path(a.runs)) for d in decs}
    for v in (f for f in files if "results" not in f):
        add_view(summary, v)
    notes = json.loads(Path(a.notes).read_text()) if a.notes else {}
    settings = {"command": " ".join(["python"] + sys.argv), **notes}
    if a.previous:
        prev = json.loads(Path(a.previous).read_text())
        summary, decs = extend(prev, summary, decs)
        settings = {**prev["settings"], **notes, "extended_by": settings["command"],
                    "previous_command": prev["settings"].get("command")}
        settings.pop("command", None)
    summary = dict(sorted(summary.items(), key=lambda kv: kv[1]["U"]))
    write_json(a.json, {"settings": settings, "summary": summary, "decode_runs": decs})
    if a.plot:
        plot(summary, Path(a.plot))
    print(markdown(summary))
    print()
    print(matched_table(summary))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--regime", choices=sorted(REGIMES), required=True)
    t.add_argument("--loss", required=True, help="a recipe of lisa_trt.train.losses.LOSS_RECIPES")
    t.add_argument("--runs", default="runs/regimes")
    t.add_argument("--steps", type=int, default=300)
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--num-samples", type=int, default=1024)
    t.add_argument("--ttt-steps", type=int, default=4)
    t.add_argument("--seed", type=int, default=0)
    d = sub.add_parser("decode")
    d.add_argument("--regime", choices=sorted(REGIMES), required=True)
    d.add_argument("--runs", default="runs/regimes")
    d.add_argument("--drafters", required=True, help="comma-separated loss names trained in RUNS/REGIME")
    d.add_argument("--images", type=int, default=128)
    d.add_argument("--batch", type=int, default=32)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--json", required=True)
    d.add_argument("--start", type=int, default=0, help="first image (a multiple of --batch): one shard of a run")
    d.add_argument("--oracle-images", type=int, default=None,
                   help="decode the oracle on the rounds below this image only (default: all)")
    m = sub.add_parser("merge")
    m.add_argument("files", nargs="+")
    m.add_argument("--json", required=True)
    v = sub.add_parser("view")
    v.add_argument("--regime", choices=sorted(REGIMES), required=True)
    v.add_argument("--runs", default="runs/regimes")
    v.add_argument("--drafters", default="demo-eagle3,demo-lisa")
    v.add_argument("--images", type=int, default=64)
    v.add_argument("--batch", type=int, default=32)
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--json", required=True)
    r = sub.add_parser("report")
    r.add_argument("files", nargs="+")
    r.add_argument("--runs", default="runs/regimes")
    r.add_argument("--json", required=True)
    r.add_argument("--plot", default=None)
    r.add_argument("--notes", default=None, help="a JSON file of settings to record (machine state, budget)")
    r.add_argument("--previous", default=None, metavar="JSON",
                   help="a recorded report (bench/lisa_regimes.json) to extend by these decode files")
    r.add_argument("--ablation", default=None, metavar="JSON",
                   help="add t1.0-cfg2 (the shipped drafters) from bench/lisa_ablation.json")
    a = ap.parse_args(argv)
    {"train": train, "decode": decode, "merge": merge, "view": view, "report": report}[a.cmd](a)


if __name__ == "__main__":
    main()
