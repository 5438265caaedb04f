"""Chameleon-family (Lumina-mGPT) commands: train, calibrate, export and run for `--model DIR`.

The CLI (cli.py) dispatches here when `--model` is a Chameleon checkpoint directory or the
engine directory's manifest says family "chameleon"; everything goes through the family's Python
APIs (models/families/chameleon/drafter.py, calibration/chameleon_tables.py, export/chameleon_onnx.py,
engines/chameleon_ort.py, speculative/chameleon_spec.py).

- `train_cli`: self-distillation captions -> target rollouts (saved once, OUT/data) -> the generic
  trainer (train/trainer.py: TTT unroll, LISA / EAGLE-3 losses, bf16, DDP, checkpoints in
  OUT/checkpoints) -> `drafter.safetensors`. An interrupted run resumes exactly where it stopped
  when started again with the same --out.
- `calibrate_cli`: image-code GASV / LANTERN tables from rollouts.
- `export_cli`: validated ONNX engine directory.
- `run_cli`: captions file -> tree speculation through ONNX Runtime -> PNGs + stats.json.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..errors import InputError

# Self-distillation / calibration captions when none are given (generic, varied scenes).
DEFAULT_CAPTIONS = (
    "a red fox in the snow", "a bowl of ramen on a wooden table", "a lighthouse at sunset",
    "a portrait of an old man with a beard", "a city street at night in the rain", "a cat sleeping on a sofa",
    "a mountain lake with pine trees", "a bouquet of sunflowers in a vase", "an astronaut riding a horse",
    "a watercolor painting of a harbor", "a close-up of a hummingbird", "a cozy library with tall shelves",
)


def read_captions(path) -> list[str]:
    """Captions file: one caption per line; blank lines and lines starting with '#' are skipped."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"captions file {p} does not exist")
    caps = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
    caps = [c for c in caps if c and not c.startswith("#")]
    if not caps:
        raise InputError(f"{p} holds no captions (one caption per line)")
    return caps


def _captions(path, n: Optional[int] = None) -> list[str]:
    caps = read_captions(path) if path else list(DEFAULT_CAPTIONS)
    if n is not None:
        caps = (caps * (n // len(caps) + 1))[:n]
    return caps


def _load(model_dir):
    from ..models.families.chameleon.checkpoint import load_chameleon
    from ..speculative.lumina import LuminaTokenizer

    return load_chameleon(model_dir), LuminaTokenizer(model_dir)


def _vq(model_dir, vq):
    from ..models.families.chameleon.vq import load_chameleon_vq
    from ..speculative.lumina import find_vq_dir

    d = Path(vq) if vq else find_vq_dir(Path(model_dir))
    return load_chameleon_vq(d) if d is not None else None


# ----------------------------------------------------------------------------- train

def train_cli(model_dir, out_dir, *, image_size: int, captions_file=None, num_samples: int = 32, steps: int = 100,
              batch_size: int = 4, lr: float = 1e-3, cfg_scale: float = 3.0, top_k: int = 2000,
              drafter_hidden: Optional[int] = None, drafter_heads: Optional[int] = None,
              checkpoint_every: int = 50, seed: int = 0, vq=None, loss: Optional[str] = None,
              ttt_steps: Optional[int] = None, bf16: bool = False, features: str = "online",
              eval_samples: Optional[int] = None, extend: Optional[bool] = None, device=None,
              progress: bool = False, **train_kw) -> dict:
    """`lisa-trt train --model DIR`: the generic drafter trainer (train/trainer.py) on Lumina spans.

    Self-distillation rollouts of the captions (the family prompter's requests, stored once under
    OUT/data), the EAGLE-3 TTT unroll with the LISA loss when the VQGAN codebook is found
    (MODEL_DIR/vqgan or `vq`; else the EAGLE-3 loss), bf16, DDP under torchrun (the target on
    cuda:LOCAL_RANK when CUDA is there, or `device`), atomic resumable checkpoints
    (OUT/checkpoints), metrics.jsonl and the MAL-proxy eval (eval.json). Started again with the
    same OUT, a run resumes where it stopped, keeping the rollout settings of its first start;
    with more `steps` it continues (extend=None: automatically).

    train_kw: any other TrainConfig field (warmup_steps, weight_decay, draft_vocab, ...).
    Returns (and writes to OUT/train_log.json on rank 0) {"family", "steps", "loss", "seconds",
    "sequences", "losses_this_run", "eval"}; the drafter is OUT/drafter.safetensors
    (models/families/chameleon/drafter.load_chameleon_drafter).
    """
    import json
    import os

    from ..io import write_json
    from ..models.families.chameleon.checkpoint import load_chameleon
    from ..models.family import family_of
    from ..train.data import DataConfig
    from ..train.losses import LossConfig
    from ..train.trainer import TrainConfig, train_drafter

    out = Path(out_dir)
    if device is None:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"
    target = load_chameleon(model_dir, device=device)
    vqm = _vq(model_dir, vq)
    codebook = None if vqm is None else vqm.codebook.detach()
    data = dict(num_samples=num_samples, cfg_scale=cfg_scale, top_k=top_k, features=features, gen_batch=8,
                eval_samples=num_samples // 8 if eval_samples is None else eval_samples)
    if (out / "train_config.json").is_file():  # a run keeps the rollouts of its first start
        saved = json.loads((out / "train_config.json").read_text()).get("data", {})
        data.update({k: saved[k] for k in data if k in saved})
    cfg = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, checkpoint_every=checkpoint_every, log_every=1,
                      seed=seed, warmup_steps=min(50, steps // 20), drafter_hidden=drafter_hidden,
                      drafter_heads=drafter_heads, bf16=bf16, target_name="chameleon",
                      **({} if ttt_steps is None else {"ttt_steps": ttt_steps}), **train_kw,
                      loss=LossConfig(kind=loss or ("lisa" if codebook is not None else "eagle3")),
                      data=DataConfig(**data))
    captions = _captions(captions_file, data["num_samples"] + data["eval_samples"])
    request = family_of(target.config).prompter(target, model_dir).encode(captions, image_size=image_size, cfg=True)
    latest = out / "checkpoints" / "latest.json"
    start = json.loads(latest.read_text())["step"] if latest.is_file() else 0
    t0 = time.perf_counter()
    res = train_drafter(target, codebook, cfg, out, progress=progress, request=request,
                        extend=0 < start < steps if extend is None else extend)
    info = {"family": "chameleon", "steps": steps, "loss": cfg.loss.kind, "seconds": round(time.perf_counter() - t0, 2),
            "sequences": [len(captions), request.layout.n_tokens], "eval": res.get("eval", {})}
    if int(os.environ.get("RANK", "0")) == 0:
        recs = [json.loads(ln) for ln in Path(res["metrics"]).read_text().splitlines() if ln.strip()]
        info["losses_this_run"] = [r["loss"] for r in recs if "loss" in r and r["step"] > start]
        write_json(out / "train_log.json", info)
    return info


# ----------------------------------------------------------------------------- calibrate

def calibrate_cli(model_dir, out_path, *, image_size: int, vq=None, captions_file=None, rollouts: int = 16,
                  samples_per_pos: int = 8, quantile: float = 0.5, clusters: Optional[int] = None,
                  cluster_space: str = "codebook", lantern_k: int = 1000, gasv=None, kappa: Optional[float] = None,
                  lam: Optional[float] = None, delta: Optional[float] = None, neighbours: Optional[int] = None,
                  scope: Optional[str] = None, cfg_scale: float = 3.0, temperature: float = 1.0, top_k: int = 2000,
                  top_p: float = 1.0, cfg_interval: int = -1, greedy: bool = False, seed: int = 0,
                  batch_size: int = 8, progress: bool = True):
    """`lisa-trt calibrate --model DIR`: image-code GASV version-2 tables (needs the VQGAN codebook),
    made by the one calibration driver (calibration/profile.py) over Lumina-mGPT's span layout.

    The GASV constants recorded are `gasv` (a GASVConfig; default docs/spec/lisa.md's) with every
    knob given here applied (kappa, lambda, delta, neighbours, scope; None keeps it), exactly as
    for LlamaGen targets; `neighbours` is clamped to the neighbour table's width."""
    import dataclasses

    from ..calibration.profile import calibrate
    from ..calibration.tables import save_tables
    from ..config import SamplingConfig
    from ..speculative.gasv import GASVConfig
    from ..speculative.lumina import span_request
    from ..speculative.sampling import cfg_active

    knobs = dict(kappa=kappa, lam=lam, delta=delta, neighbours=neighbours, scope=scope)
    gasv = dataclasses.replace(gasv or GASVConfig(), **{k: v for k, v in knobs.items() if v is not None})
    sampling = SamplingConfig(cfg_scale=cfg_scale, temperature=temperature, top_k=top_k, top_p=top_p,
                              cfg_interval=cfg_interval, greedy=greedy)
    target, tok = _load(model_dir)
    vqm = _vq(model_dir, vq)
    if vqm is None:
        raise InputError("calibration needs the VQGAN codebook: pass --vq FOLDER (vqgan.yaml + vqgan.ckpt) or "
                         "put it in MODEL_DIR/vqgan/ (see docs/chameleon.md)")
    captions = _captions(captions_file, rollouts)
    prompts, layout, _ = span_request(target, tok, captions, image_size, image_size, cfg_active(cfg_scale))
    tables = calibrate(target, vqm.codebook.detach(), conds=prompts, layout=layout, samples_per_pos=samples_per_pos,
                       quantile=quantile, n_clusters=clusters, cluster_space=cluster_space, lantern_k=lantern_k,
                       seed=seed, sampling=sampling, gasv=gasv, batch_size=batch_size, progress=progress,
                       settings=dict(width=image_size, height=image_size))
    save_tables(tables, out_path)
    return tables


# ----------------------------------------------------------------------------- export / run

def export_cli(model_dir, out_dir, *, image_size: int, drafter=None, tables=None, vq=None,
               max_prompt: Optional[int] = None, max_tree: Optional[int] = None, opset: Optional[int] = None,
               generation: Optional[dict] = None, validate: bool = True, fp16: bool = False,
               quantize: str = "none") -> dict:
    """`lisa-trt export --model DIR`: target, drafter, GASV and VQGAN graphs, validated.

    fp16: fp16 target / drafter graphs; quantize: "none" | "int8" | "int4" weights of an fp32
    export (export/quantize.py). Returns the manifest as a dict (graphs[name]["validation"] holds
    each graph's errors vs PyTorch: max_error scaled, max_abs raw)."""
    from ..calibration.chameleon_tables import load_chameleon_tables
    from ..export import chameleon_onnx as X
    from ..models.families.chameleon.drafter import load_chameleon_drafter

    target, tok = _load(model_dir)
    dr = load_chameleon_drafter(drafter, target) if drafter else None
    tb = load_chameleon_tables(tables, target, tok.newline) if tables else None
    man = X.export_chameleon(target, dr, tb, _vq(model_dir, vq), model_dir, out_dir, image_size=image_size,
                             max_prompt=max_prompt or X.DEFAULT_MAX_PROMPT, max_tree=max_tree or X.DEFAULT_MAX_TREE,
                             opset=opset or X.DEFAULT_OPSET, generation=generation, validate=validate, fp16=fp16,
                             quantize=quantize)
    return man.to_dict()


def run_engine(engine_dir, captions: Sequence[str], out_dir, *, verify: str = "gasv", cfg_scale=None,
               temperature=None, top_k=None, greedy: bool = False, seed: int = 0, tree=(None, None, None),
               threads: Optional[int] = None) -> dict:
    """Generate one image per caption through the engine directory's ONNX graphs.

    verify: vanilla (reference loop on the target graphs) or greedy / exact / lantern / gasv tree
    speculation (drafter graphs; lantern / gasv need the exported tables). Writes img_NNNN.png
    (with a VQGAN graph), tokens.npy (code grids) and stats.json; returns the stats."""
    import numpy as np

    from ..engines.chameleon_ort import load_chameleon_engines
    from ..imaging import save_images
    from ..io import atomic_write, write_json
    from ..models.families.chameleon.vq import to_uint8
    from ..speculative.lumina import generate_image_tokens
    from ..speculative.chameleon_spec import LuminaSpec, speculative_image_tokens

    eng = load_chameleon_engines(engine_dir, threads=threads)
    man = eng.manifest
    size, max_prompt = int(man.layout["image_size"]), int(man.layout["max_prompt"])
    gen = man.generation or {}
    cfg_scale = gen.get("cfg_scale", 3.0) if cfg_scale is None else cfg_scale
    temperature = gen.get("temperature", 1.0) if temperature is None else temperature
    top_k = gen.get("top_k", 2000) if top_k is None else top_k
    longest = max(len(eng.tokenizer.prompt_ids(c, size, size)) for c in captions)
    if longest > max_prompt:
        raise InputError(f"a caption takes {longest} prompt tokens; the engines were exported for at most "
                         f"{max_prompt}: shorten it or re-export with a larger --max-prompt")
    t0 = time.perf_counter()
    if verify == "vanilla":
        res = generate_image_tokens(eng.target, eng.tokenizer, captions, size, size, cfg_scale=cfg_scale,
                                    temperature=temperature, top_k=top_k, greedy=greedy, seed=seed)
        stats = {}
    else:
        from ..speculative.methods import get_method

        if get_method(verify).kind == "sjd":
            raise InputError(f"--verify {verify} (a Jacobi decoder) is not available for the Chameleon family "
                             "(vanilla, greedy, exact, lantern or gasv)")
        if eng.drafter is None:
            raise InputError(f"--verify {verify} needs drafter graphs: export with --drafter")
        if verify in ("lantern", "gasv") and eng.tables is None:
            raise InputError(f"--verify {verify} needs the image-code tables: export with --tables")
        kw = {k: v for k, v in zip(("tree_top_k", "depth", "total_tokens"), tree) if v is not None}
        spec = LuminaSpec(method=verify, greedy=greedy, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k,
                          **kw)
        res, st = speculative_image_tokens(eng.target, eng.drafter, eng.tokenizer, captions, size, size, spec,
                                           seed=seed, tables=eng.tables,
                                           gasv=eng.gasv if verify == "gasv" else None)
        stats = st.as_dict()
    seconds = time.perf_counter() - t0
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "tokens.npy") as tmp:
        with open(tmp, "wb") as f:
            np.save(f, res.codes.cpu().numpy())
    paths = save_images(to_uint8(eng.vq.decode_code(res.codes).cpu()), out) if eng.vq is not None else []
    quant = man.quantization if man.quantization != "none" else man.precision
    info = {"family": "chameleon", "backend": "ort", "precision": quant, "verify": verify, "captions": list(captions),
            "image_size": size, "cfg_scale": cfg_scale, "temperature": temperature, "top_k": top_k,
            "greedy": greedy, "seed": seed, "seconds": round(seconds, 3), "images": [p.name for p in paths], **stats}
    write_json(out / "stats.json", info)
    return info


def run_cli(engine_dir, prompts_file, out_dir, **kw) -> dict:
    """`lisa-trt run ENGINE_DIR CAPTIONS.txt` for a Chameleon engine directory."""
    return run_engine(engine_dir, read_captions(prompts_file), out_dir, **kw)


# ----------------------------------------------------------------------------- lisa-trt generate --model DIR

def generate_images(model_dir, captions: Sequence[str], out_dir, *, image_size: int = 512, vq=None,
                    cfg_scale: float = 3.0, temperature: float = 1.0, top_k: int = 2000, greedy: bool = False,
                    seed: int = 0, drafter=None, verify: Optional[str] = None, tree=(4, 4, 16),
                    tables=None) -> dict:
    """`lisa-trt generate --model DIR --prompt ...`: tokens.npy always, PNGs when a VQGAN is found.

    With `drafter` (a file from save_chameleon_drafter) and verify "greedy" / "exact" (or
    "lantern" / "gasv" with image-code `tables` from calibrate_chameleon + save_tables), the span
    is decoded with tree speculation (speculative/chameleon_spec.py)."""
    import numpy as np

    from ..imaging import save_images
    from ..io import atomic_write, write_json
    from ..models.families.chameleon.checkpoint import load_chameleon
    from ..models.families.chameleon.vq import load_chameleon_vq, to_uint8
    from ..speculative.lumina import LuminaTokenizer, find_vq_dir, generate_image_tokens

    model_dir, out = Path(model_dir), Path(out_dir)
    target = load_chameleon(model_dir)
    tok = LuminaTokenizer(model_dir)
    stats = {}
    if verify in (None, "vanilla"):
        res = generate_image_tokens(target, tok, captions, image_size, image_size, cfg_scale=cfg_scale,
                                    temperature=temperature, top_k=top_k, greedy=greedy, seed=seed)
    else:
        from ..speculative.chameleon_spec import LuminaSpec, speculative_image_tokens
        from ..models.families.chameleon.drafter import load_chameleon_drafter

        if drafter is None:
            raise InputError(f"--verify {verify} needs --drafter FILE (a Chameleon-family drafter)")
        spec = LuminaSpec(method=verify, greedy=greedy, cfg_scale=cfg_scale, temperature=temperature,
                          top_k=top_k, tree_top_k=tree[0], depth=tree[1], total_tokens=tree[2])
        tb = None
        if verify in ("lantern", "gasv"):
            from ..calibration.chameleon_tables import load_chameleon_tables

            if tables is None:
                raise InputError(f"--verify {verify} needs --tables FILE (image-code tables, see docs/chameleon.md)")
            tb = load_chameleon_tables(tables, target, tok.newline)
        res, st = speculative_image_tokens(target, load_chameleon_drafter(drafter, target), tok, captions,
                                           image_size, image_size, spec, seed=seed, tables=tb)
        stats = st.as_dict()
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "tokens.npy") as tmp:
        with open(tmp, "wb") as f:
            np.save(f, res.codes.numpy())
    write_json(out / "stats.json", {"family": "chameleon", "captions": list(captions), "image_size": image_size,
                                    "cfg_scale": cfg_scale, "temperature": temperature, "top_k": top_k,
                                    "greedy": greedy, "seed": seed, "verify": verify or "vanilla", **stats})
    vq_dir = Path(vq) if vq else find_vq_dir(model_dir)
    paths = []
    if vq_dir is not None:
        vqm = load_chameleon_vq(vq_dir)
        paths = save_images(to_uint8(vqm.decode_code(res.codes)), out)
    return {"codes": res.codes, "images": paths, "stats": stats}


def cli_generate(model_dir, prompts, out_dir, image_size, vq, cfg_scale, temperature, top_k, greedy, seed,
                 verify, drafter=None, tree=(4, 4, 16), tables=None) -> None:
    """The `lisa-trt generate --model DIR --prompt TEXT` path (Lumina-mGPT defaults where None)."""
    import click

    if not prompts:
        raise InputError("Chameleon / Lumina-mGPT models need --prompt TEXT (repeat it for a batch)")
    if verify not in (None, "vanilla", "greedy", "exact", "lantern", "gasv"):
        raise InputError(f"--verify {verify} is not available for the Chameleon family "
                         "(vanilla, greedy, exact, lantern or gasv)")
    res = generate_images(model_dir, list(prompts), out_dir, image_size=image_size or 512, vq=vq,
                          cfg_scale=3.0 if cfg_scale is None else cfg_scale,
                          temperature=1.0 if temperature is None else temperature,
                          top_k=2000 if top_k is None else top_k, greedy=greedy, seed=seed,
                          drafter=drafter, verify=verify, tree=tree, tables=tables)
    if res["stats"]:
        click.echo(f"{verify}: MAL {res['stats']['mal']:.2f}, {res['stats']['target_forwards']} target forwards")
    if res["images"]:
        click.echo(f"wrote {len(res['images'])} images and tokens.npy to {out_dir}")
    else:
        click.echo(f"wrote tokens.npy (VQ codes) to {out_dir}; no VQGAN found: pass --vq FOLDER "
                   "(vqgan.yaml + vqgan.ckpt) or put it in MODEL_DIR/vqgan/")
