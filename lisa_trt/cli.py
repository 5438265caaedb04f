"""`lisa-trt` command line. Thin: each command builds one config and makes one library call."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from .errors import LisaError


def _handle_errors(fn):
    """Print LisaError as a one-paragraph message (no traceback) and exit 2."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except LisaError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lisa-trt")
def main():
    """lisa-trt: LISA speculative decoding for autoregressive image generators.

    Pipeline: train (drafter) -> calibrate (GASV tables) -> export (ONNX) -> build (TensorRT)
    -> run. `lisa-trt demo` runs all of it on the bundled CPU model.
    """


# ----------------------------------------------------------------------------- shared options

def model_options(fn):
    fn = click.option("--model", "model", required=True,
                      help="Target checkpoint (.pt official / .safetensors) or 'demo'.")(fn)
    fn = click.option("--config", "config", default=None,
                      help="Target config name (GPT-B ... GPT-7B); default: the file's metadata.")(fn)
    fn = click.option("--image-size", type=int, default=256, show_default=True,
                      help="Image size for official configs (256/384/512).")(fn)
    fn = click.option("--model-type", type=click.Choice(["c2i", "t2i"]), default=None,
                      help="c2i or t2i for official configs (default c2i).")(fn)
    return fn


def sampling_options(fn):
    from .config import SamplingConfig

    d = SamplingConfig()
    fn = click.option("--cfg-scale", type=float, default=None, help=f"CFG scale (default {d.cfg_scale}; demo: its own).")(fn)
    fn = click.option("--temperature", type=float, default=None, help=f"Temperature (default {d.temperature}).")(fn)
    fn = click.option("--top-k", type=int, default=None, help=f"Top-k, 0 = off (default {d.top_k}).")(fn)
    fn = click.option("--top-p", type=float, default=None, help=f"Top-p (default {d.top_p}).")(fn)
    fn = click.option("--cfg-interval", type=int, default=None, help="Guidance off after this step (-1 = always on).")(fn)
    fn = click.option("--greedy", is_flag=True, help="Argmax of the guided logits.")(fn)
    fn = click.option("--seed", type=int, default=0, show_default=True)(fn)
    return fn


def spec_options(fn):
    fn = click.option("--drafter", default=None, help="Drafter .safetensors, or demo-lisa / demo-eagle3 / demo-medusa-lisa (demo default: demo-lisa).")(fn)
    fn = click.option("--verify", type=click.Choice(["vanilla", "greedy", "exact", "lantern", "gasv", "sjd"]),
                      default=None, help="Verification rule (default: vanilla AR loop).")(fn)
    fn = click.option("--tables", default=None, help="Calibration tables (lisa-trt calibrate); demo: bundled.")(fn)
    return spec_options_bench(fn)


def spec_options_bench(fn):
    from .speculative.decode import SpecConfig

    d = SpecConfig()
    fn = click.option("--tree-top-k", type=int, default=d.top_k, show_default=True, help="EAGLE-2 tree: children per node.")(fn)
    fn = click.option("--tree-depth", type=int, default=d.depth, show_default=True, help="EAGLE-2 tree: expansion rounds.")(fn)
    fn = click.option("--tree-tokens", type=int, default=d.total_tokens, show_default=True, help="EAGLE-2 tree: nodes incl. root.")(fn)
    fn = click.option("--lantern-delta", type=float, default=d.lantern_delta, show_default=True)(fn)
    fn = click.option("--gasv-kappa", type=float, default=None, help="Override the tables' kappa.")(fn)
    fn = click.option("--gasv-lambda", type=float, default=None, help="Override the tables' lambda.")(fn)
    return fn


def make_spec(verify, top_k, depth, total, lantern_delta, kappa, lam):
    from .speculative.decode import METHODS, SpecConfig

    method = verify if verify in METHODS else "exact"
    return SpecConfig(method=method, top_k=top_k, depth=depth, total_tokens=total,
                      lantern_delta=lantern_delta, gasv_kappa=kappa, gasv_lambda=lam)


def resolve_spec_artifacts(model, target, methods, drafter, tables):
    """Drafter and tables that `methods` need (the bundled ones for the demo model)."""
    from .artifacts import default_drafter, default_tables, load_drafter_by_name, load_tables_by_name
    from .errors import InputError

    needs_drafter = [m for m in methods if m not in ("vanilla", "sjd", "oracle", None)]
    needs_tables = [m for m in methods if m in ("lantern", "gasv")]
    drafter = drafter or default_drafter(model)
    tables = tables or default_tables(model)
    if needs_drafter and drafter is None:
        raise InputError(f"{needs_drafter[0]} verification needs --drafter (train one with `lisa-trt train`)")
    if needs_tables and tables is None:
        raise InputError(f"{needs_tables[0]} verification needs --tables (make them with `lisa-trt calibrate`)")
    dr = load_drafter_by_name(drafter, target) if needs_drafter else None
    tb = load_tables_by_name(tables, target) if needs_tables else None
    return dr, tb


def resolve_target(model, config, image_size, model_type):
    from .config import target_config
    from .models.checkpoints import load_target

    cfg = None
    if config is not None:
        cfg = target_config(config, image_size=image_size, model_type=model_type)
    return load_target(model, cfg)


def resolve_sampling(model, **given):
    """SamplingConfig from CLI values; unset values come from the bundle defaults (demo) or
    the dataclass defaults."""
    import dataclasses

    from .config import SamplingConfig

    base = SamplingConfig()
    if model == "demo":
        from .demo import registry

        base = getattr(registry, "demo_sampling", SamplingConfig)()
    return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None and v is not False})


def parse_classes(text: str, num_classes: int, names=None) -> list[int]:
    """'1,2,golden_retriever' -> ids; unknown ids/names are errors listing what is allowed."""
    from .errors import InputError

    ids = []
    for tok in [t.strip() for t in text.split(",") if t.strip()]:
        if tok.lstrip("-").isdigit():
            i = int(tok)
        elif names and tok in names:
            i = names.index(tok)
        else:
            allowed = f"0..{num_classes - 1}" + (f" or one of {', '.join(names)}" if names else "")
            raise InputError(f"unknown class {tok!r}; use ids {allowed}")
        if not 0 <= i < num_classes:
            raise InputError(f"unknown class id {i}; valid ids are 0..{num_classes - 1}")
        ids.append(i)
    if not ids:
        raise InputError("no classes given; pass e.g. --classes 0,1,2")
    return ids


def load_caption_file(path, caption_dim: int):
    """A .safetensors/.npy file of T5 features (+ mask) -> (features, mask) tensors."""
    import numpy as np
    import torch

    from .errors import InputError
    from .io import load_safetensors

    p = Path(path)
    if p.suffix == ".safetensors":
        t, _ = load_safetensors(p)
        if "caption_features" not in t:
            raise InputError(f"{p} must hold 'caption_features' (B, 120, {caption_dim}) and 'caption_mask' (B, 120)")
        feats = t["caption_features"].float()
        mask = t.get("caption_mask", torch.ones(feats.shape[:2]))
    elif p.suffix == ".npy":
        feats = torch.from_numpy(np.load(p)).float()
        mask_path = p.with_name(p.stem + "_mask.npy")
        mask = torch.from_numpy(np.load(mask_path)) if mask_path.exists() else torch.ones(feats.shape[:2])
    else:
        raise InputError(f"caption features must be .safetensors or .npy, got {p.name}")
    if feats.dim() == 2:
        feats, mask = feats[None], mask.reshape(1, -1)
    return feats, mask


# ----------------------------------------------------------------------------- commands

@main.command()
@click.argument("src")
@click.argument("dst")
@click.option("--config", "config", required=True, help="Target config name (GPT-B ...) or VQ-16/VQ-8.")
@click.option("--image-size", type=int, default=256, show_default=True)
@click.option("--model-type", type=click.Choice(["c2i", "t2i"]), default=None)
@_handle_errors
def convert(src, dst, config, image_size, model_type):
    """Convert an official LlamaGen .pt (target or VQ) to safetensors + config JSON."""
    from .config import target_config, vq_config
    from .models.checkpoints import load_target, load_vq, save_model

    if config.startswith("VQ"):
        cfg = vq_config(config)
        model = load_vq(src, cfg)
    else:
        cfg = target_config(config, image_size=image_size, model_type=model_type)
        model = load_target(src, cfg)
    save_model(model, cfg, dst)
    click.echo(f"wrote {dst} (+ {Path(dst).with_suffix('.json').name})")


@main.command("random-checkpoint")
@click.argument("out")
@click.option("--config", "config", required=True, help="GPT-B ... GPT-7B, tiny, or VQ-16/VQ-8.")
@click.option("--image-size", type=int, default=256, show_default=True)
@click.option("--model-type", type=click.Choice(["c2i", "t2i"]), default=None)
@click.option("--seed", type=int, default=0, show_default=True)
@_handle_errors
def random_checkpoint(out, config, image_size, model_type, seed):
    """Write a randomly initialised checkpoint in the official layout ({"model": state_dict})."""
    import torch

    from .config import target_config, vq_config
    from .io import atomic_write
    from .models.llamagen import Transformer
    from .models.vq import VQModel

    torch.manual_seed(seed)
    if config.startswith("VQ"):
        model = VQModel(vq_config(config))
    else:
        model = Transformer(target_config(config, image_size=image_size, model_type=model_type))
    with atomic_write(out) as tmp:
        torch.save({"model": model.state_dict()}, tmp)
    click.echo(f"wrote {out}")


@main.command()
@model_options
@click.option("--vq", "vq", default=None, help="VQ checkpoint (or 'demo'); without it only tokens are written.")
@click.option("--vq-config", default="VQ-16", show_default=True)
@click.option("--classes", default=None, help="c2i: comma-separated class ids (or names for the demo).")
@click.option("--captions", default=None, type=click.Path(exists=True),
              help="t2i: .safetensors (caption_features, caption_mask) or .npy of T5 features.")
@sampling_options
@spec_options
@click.option("--out", "out_dir", default="outputs", show_default=True, type=click.Path())
@_handle_errors
def generate(model, config, image_size, model_type, vq, vq_config, classes, captions, cfg_scale,
             temperature, top_k, top_p, cfg_interval, greedy, seed, drafter, verify, tables,
             tree_top_k, tree_depth, tree_tokens, lantern_delta, gasv_kappa, gasv_lambda, out_dir):
    """Generate images: the reference AR loop, or tree speculation with --drafter/--verify.

    Writes PNGs (when a VQ is known), tokens.npy and stats.json."""
    import dataclasses

    import numpy as np
    import torch

    from . import generate as ar_generate
    from .errors import InputError

    target = resolve_target(model, config, image_size, model_type)
    tc = target.config
    s = resolve_sampling(model, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k,
                         top_p=top_p, cfg_interval=cfg_interval, greedy=greedy)
    if tc.model_type == "c2i":
        if classes is None:
            raise InputError("c2i models need --classes (e.g. --classes 0,1,2)")
        names = _class_names(model)
        cond = torch.tensor(parse_classes(classes, tc.num_classes, names))
    else:
        if captions is None:
            raise InputError("t2i models need --captions FILE (T5 features + mask)")
        cond = load_caption_file(captions, tc.caption_dim)
    stats = {}
    if verify in (None, "vanilla"):
        tokens = ar_generate(target, cond, seed=seed, **dataclasses.asdict(s))
    else:
        from .bench import run_method

        dr, tb = resolve_spec_artifacts(model, target, [verify], drafter, tables)
        spec = make_spec(verify, tree_top_k, tree_depth, tree_tokens, lantern_delta, gasv_kappa, gasv_lambda)
        tokens, st = run_method(verify, target, dr, tb, cond, sampling=s, spec=spec, seed=seed)
        stats = st.as_dict()
        click.echo(f"{verify}: MAL {stats['mal']:.2f}, {stats['target_forwards']} target forwards, "
                   f"mean TVD {stats['mean_tvd']:.4f}, {stats['times']['total']:.2f} s")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from .io import atomic_write

    with atomic_write(out / "tokens.npy") as tmp:
        with open(tmp, "wb") as f:
            np.save(f, tokens.cpu().numpy())
    from .io import write_json

    write_json(out / "stats.json", {"verify": verify or "vanilla", "sampling": dataclasses.asdict(s), **stats})
    if vq is None and model == "demo":
        vq = "demo"
    if vq is not None:
        paths = decode_and_save(tokens, vq, vq_config, tc, out)
        click.echo(f"wrote {len(paths)} images and tokens.npy to {out}")
    else:
        click.echo(f"wrote tokens.npy to {out} (pass --vq to decode images)")


def _class_names(model):
    if model == "demo":
        from .demo.registry import class_names

        return list(class_names())
    return None


def decode_and_save(tokens, vq, vq_config_name, tc, out):
    import torch

    from .imaging import save_images, to_uint8
    from .models.checkpoints import load_vq

    vqm = load_vq(vq, None if vq == "demo" or str(vq).endswith(".safetensors") else vq_config_name)
    g = tc.grid_size
    with torch.no_grad():
        imgs = vqm.decode_code(tokens, (tokens.shape[0], vqm.config.codebook_embed_dim, g, g))
    return save_images(to_uint8(imgs), out)


@main.command()
@model_options
@click.option("--vq", "vq", default=None, help="VQ checkpoint whose codebook defines the geometry ('demo' for the demo).")
@click.option("--vq-config", default="VQ-16", show_default=True)
@click.option("--out", "out_path", required=True, type=click.Path(), help="Output .safetensors.")
@click.option("--rollouts", type=int, default=64, show_default=True, help="Images generated for the drift budgets.")
@click.option("--samples-per-pos", type=int, default=8, show_default=True)
@click.option("--quantile", type=float, default=0.5, show_default=True)
@click.option("--clusters", type=int, default=None, help="Default round(2 sqrt(V)).")
@click.option("--cluster-space", type=click.Choice(["codebook", "w_tilde"]), default="codebook", show_default=True)
@click.option("--lantern-k", type=int, default=1000, show_default=True)
@click.option("--kappa", type=float, default=1.0, show_default=True)
@click.option("--lambda", "lam", type=float, default=0.4, show_default=True)
@sampling_options
@_handle_errors
def calibrate(model, config, image_size, model_type, vq, vq_config, out_path, rollouts, samples_per_pos,
              quantile, clusters, cluster_space, lantern_k, kappa, lam, cfg_scale, temperature, top_k,
              top_p, cfg_interval, greedy, seed):
    """GASV whitening / cluster / budget tables and LANTERN neighbour lists, from rollouts."""
    from .calibration.profile import calibrate as run_calibration
    from .calibration.tables import save_tables
    from .models.checkpoints import load_vq
    from .speculative.gasv import GASVConfig

    target = resolve_target(model, config, image_size, model_type)
    vq = vq or ("demo" if model == "demo" else None)
    if vq is None:
        from .errors import InputError

        raise InputError("calibration needs the VQ codebook: pass --vq (e.g. vq_ds16_c2i.pt)")
    vqm = load_vq(vq, None if vq == "demo" or str(vq).endswith(".safetensors") else vq_config)
    s = resolve_sampling(model, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k, top_p=top_p,
                         cfg_interval=cfg_interval, greedy=greedy)
    tables = run_calibration(target, vqm.codebook().detach(), num_rollouts=rollouts,
                             samples_per_pos=samples_per_pos, quantile=quantile, n_clusters=clusters,
                             cluster_space=cluster_space, lantern_k=lantern_k, seed=seed, sampling=s,
                             gasv=GASVConfig(kappa=kappa, lam=lam))
    save_tables(tables, out_path)
    click.echo(f"wrote {out_path}: {tables.n_clusters} clusters, theta_geo {tables.theta_geo:.3f}, "
               f"LANTERN k {tables.lantern_neighbors.shape[1]}")


@main.command()
@model_options
@click.option("--vq", "vq", default=None, help="VQ checkpoint (codebook geometry for the LISA loss); 'demo' for the demo.")
@click.option("--vq-config", default="VQ-16", show_default=True)
@click.option("--out", "out_dir", required=True, type=click.Path(), help="Run directory (resumed if it has checkpoints).")
@click.option("--loss", type=click.Choice(["lisa", "eagle3", "eagle1"]), default="lisa", show_default=True)
@click.option("--steps", type=int, default=None)
@click.option("--batch-size", type=int, default=None)
@click.option("--lr", type=float, default=None)
@click.option("--ttt-steps", type=int, default=None)
@click.option("--data", "source", type=click.Choice(["self", "tokens", "images"]), default="self", show_default=True,
              help="self: target-generated sequences; tokens: --token-file; images: --image-dir encoded with the VQ.")
@click.option("--token-file", default=None, type=click.Path())
@click.option("--image-dir", default=None, type=click.Path(), help="One sub-folder of images per class (--data images).")
@click.option("--num-samples", type=int, default=None, help="Self-distillation sequences.")
@click.option("--features", type=click.Choice(["online", "cache"]), default="online", show_default=True)
@click.option("--cfg-scale", type=float, default=None, help="Deployment CFG scale for self-distillation.")
@click.option("--drafter-hidden", type=int, default=None)
@click.option("--drafter-heads", type=int, default=None)
@click.option("--loss-off", default="", help="LISA terms to switch off (ablation), comma-separated: "
              "selection, soft_gate, veto, truncated_ce, kd.")
@click.option("--eval-every", type=int, default=0, show_default=True,
              help="Every N steps: held-out MAL proxy, top-1/top-3 agreement and real decoding MAL "
                   "(--eval-images prompts) logged to metrics.jsonl; 0 = only at the end.")
@click.option("--arch", type=click.Choice(["eagle3", "medusa"]), default="eagle3", show_default=True,
              help="Drafter architecture: EAGLE-3 drafter, or Medusa heads on the target's last hidden state.")
@click.option("--medusa-heads", type=int, default=4, show_default=True, help="Number of Medusa heads (--arch medusa).")
@click.option("--draft-vocab", type=int, default=None,
              help="Reduced draft vocabulary: the head predicts only the N most frequent training codes (EAGLE-3 d2t).")
@click.option("--checkpoint-every", type=int, default=None)
@click.option("--bf16", is_flag=True)
@click.option("--eval-images", type=int, default=4, show_default=True,
              help="Held-out prompts decoded with the trained drafter (real MAL, exact verification); 0 = skip.")
@click.option("--seed", type=int, default=0, show_default=True)
@_handle_errors
def train(model, config, image_size, model_type, vq, vq_config, out_dir, loss, steps, batch_size, lr,
          ttt_steps, source, token_file, image_dir, num_samples, features, cfg_scale, drafter_hidden, drafter_heads,
          checkpoint_every, bf16, eval_images, seed, loss_off, eval_every, arch, medusa_heads, draft_vocab):
    """Distil a drafter (LISA locality-informed loss, or EAGLE-3/EAGLE-1 baselines).

    Resumes from OUT/checkpoints after an interruption. Multi-GPU: run under torchrun."""
    from .models.checkpoints import load_vq
    from .train.data import DataConfig
    from .train.losses import LossConfig
    from .train.trainer import TrainConfig, train_drafter

    target = resolve_target(model, config, image_size, model_type)
    vq = vq or ("demo" if model == "demo" else None)
    if vq is None:
        from .errors import InputError

        raise InputError("training needs the VQ codebook (LISA locality geometry): pass --vq")
    vqm = load_vq(vq, None if vq == "demo" or str(vq).endswith(".safetensors") else vq_config)
    if source == "images":
        from .errors import InputError
        from .train.data import encode_image_folder

        if image_dir is None:
            raise InputError("--data images needs --image-dir (one sub-folder of images per class)")
        token_file = str(encode_image_folder(vqm, image_dir, Path(out_dir) / "image_tokens.safetensors",
                                             grid=target.config.grid_size))
        source = "tokens"
    data_kw = dict(source=source, token_file=token_file, features=features)
    if num_samples is not None:
        data_kw["num_samples"] = num_samples
    if cfg_scale is not None:
        data_kw["cfg_scale"] = cfg_scale
    elif model == "demo":
        data_kw["cfg_scale"] = resolve_sampling(model).cfg_scale
    kw = dict(steps=steps, batch_size=batch_size, lr=lr, ttt_steps=ttt_steps, drafter_hidden=drafter_hidden,
              drafter_heads=drafter_heads, checkpoint_every=checkpoint_every, seed=seed, draft_vocab=draft_vocab,
              eval_every=eval_every or None)
    cfg = TrainConfig(**{k: v for k, v in kw.items() if v is not None}, bf16=bf16, target_name=model,
                      loss=LossConfig(kind=loss, **_loss_switches(loss_off)), data=DataConfig(**data_kw))
    if arch == "medusa":
        from .train.medusa import train_medusa

        if draft_vocab or eval_every:
            from .errors import InputError

            raise InputError("--draft-vocab and --eval-every apply to the EAGLE-3 drafter (--arch eagle3); "
                             "Medusa heads keep the full vocabulary and evaluate once at the end")

        result = train_medusa(target, vqm.codebook().detach(), cfg, out_dir, n_heads=medusa_heads)
    else:
        def eval_fn(drafter, step):  # real decoding MAL on held-out prompts (exact verification)
            return {"decode_mal": decode_eval(target, drafter, cfg, eval_images)["mal"]} if eval_images else {}

        result = train_drafter(target, vqm.codebook().detach(), cfg, out_dir, eval_fn=eval_fn)
    click.echo(f"wrote {result['drafter']}; eval: {json.dumps(result.get('eval', {}))}")
    import os

    if eval_images and int(os.environ.get("RANK", "0")) == 0:  # one rank under torchrun
        from .artifacts import load_drafter_by_name

        ev = decode_eval(target, load_drafter_by_name(result["drafter"], target), cfg, eval_images)
        from .io import write_json

        write_json(Path(out_dir) / "eval_decode.json", ev)
        click.echo(f"held-out decoding ({eval_images} images, exact verification): MAL {ev['mal']:.3f}")


def _loss_switches(text: str) -> dict:
    """--loss-off "selection,kd" -> {"selection": False, "kd": False} (LossConfig switches)."""
    from .errors import InputError

    valid = ("selection", "soft_gate", "veto", "truncated_ce", "kd")
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    bad = [n for n in names if n not in valid]
    if bad:
        raise InputError(f"unknown LISA term(s) {bad} in --loss-off; valid: {', '.join(valid)}")
    return {n: False for n in names}


def decode_eval(target, drafter, cfg, n: int) -> dict:
    """Real MAL of the trained drafter: exact (lossless) tree speculation on held-out prompts
    (seeds disjoint from the self-distillation data)."""
    import dataclasses

    import torch

    from .config import SamplingConfig
    from .speculative.decode import SpecConfig, SpeculativeDecoder

    d = cfg.data
    s = SamplingConfig(cfg_scale=d.cfg_scale, temperature=d.temperature, top_k=d.top_k, top_p=d.top_p)
    spec = SpecConfig(method="exact", top_k=3, depth=3, total_tokens=10)
    cond = torch.arange(n) % target.config.num_classes
    from .speculative.medusa import speculative_engines

    _, st = SpeculativeDecoder(*speculative_engines(target, drafter.eval())).generate(
        cond, sampling=s, spec=spec, seed=1_000_003 + cfg.seed)
    return {"mal": st.mal, "images": n, "sampling": dataclasses.asdict(s), "spec": dataclasses.asdict(spec),
            "target_forwards": st.target_forwards}


@main.command()
@model_options
@click.option("--drafter", default=None, help="Drafter path or demo-lisa / demo-eagle3 / demo-medusa-lisa.")
@click.option("--tables", default=None, help="Calibration tables (demo: bundled).")
@click.option("--methods", default="vanilla,exact,lantern,gasv,sjd", show_default=True)
@click.option("--num-images", type=int, default=8, show_default=True)
@click.option("--classes", default=None, help="Class ids cycled over the images (default: all classes).")
@click.option("--backend", type=click.Choice(["torch", "ort"]), default="torch", show_default=True)
@click.option("--engine-dir", default=None, type=click.Path(), help="Exported bundle for --backend ort.")
@click.option("--sjd-window", type=int, default=16, show_default=True)
@sampling_options
@spec_options_bench
@click.option("--json", "json_path", required=True, type=click.Path())
@click.option("--plot", "plot_path", default=None, type=click.Path())
@_handle_errors
def bench(model, config, image_size, model_type, drafter, tables, methods, num_images, classes, backend,
          engine_dir, sjd_window, cfg_scale, temperature, top_k, top_p, cfg_interval, greedy, seed,
          tree_top_k, tree_depth, tree_tokens, lantern_delta, gasv_kappa, gasv_lambda, json_path, plot_path):
    """Run every method on the same prompts and seeds in one process; JSON + speed/quality plot."""
    import torch

    from .bench import parse_methods, run_bench, save_bench

    ms = parse_methods(methods)
    target = resolve_target(model, config, image_size, model_type)
    s = resolve_sampling(model, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k, top_p=top_p,
                         cfg_interval=cfg_interval, greedy=greedy)
    dr, tb = resolve_spec_artifacts(model, target, ms, drafter, tables)
    tgt_engine, dr_engine, gasv_engine = target, dr, None
    if backend == "ort":
        tgt_engine, dr_engine, gasv_engine = _ort_bench_engines(engine_dir, target, dr, tb)
    names = _class_names(model)
    ncls = target.config.num_classes
    cl = parse_classes(classes, ncls, names) if classes else list(range(ncls))
    cl = [cl[i % len(cl)] for i in range(num_images)]
    scorer_fn = decode_fn = None
    if model == "demo":
        from .demo.registry import load_demo_scorer, load_demo_vq
        from .demo.scorer import score_images

        vqm, scorer = load_demo_vq(), load_demo_scorer()
        g = target.config.grid_size

        def decode_fn(tokens):
            with torch.no_grad():
                return vqm.decode_code(tokens, (tokens.shape[0], vqm.config.codebook_embed_dim, g, g)).clamp(-1, 1)

        def scorer_fn(images, labels):
            return score_images(images, labels, scorer)

    spec = make_spec("gasv", tree_top_k, tree_depth, tree_tokens, lantern_delta, gasv_kappa, gasv_lambda)
    report = run_bench(tgt_engine, dr_engine, tb, ms, cl, sampling=s, spec=spec, seed=seed, gasv=gasv_engine,
                       scorer_fn=scorer_fn, decode_fn=decode_fn, sjd_window=sjd_window,
                       settings_extra={"model": model, "drafter": drafter or (model == "demo" and "demo-lisa") or None,
                                       "backend": backend, "command": " ".join(sys.argv)})
    save_bench(report, json_path, plot_path)
    for m, r in report["results"].items():
        q = f", class_acc {r['class_acc']:.3f}, FD-demo {r['fd_demo']:.2f}" if "class_acc" in r else ""
        click.echo(f"{m:8s} MAL {r['mal']:.2f}  {r['seconds_per_image']:.3f} s/img  speed-up {r['speedup']:.2f}x  "
                   f"TVD {r['mean_tvd']:.4f}{q}" + (f"  efficiency {r['drafter_efficiency']:.2f}"
                                                    if "drafter_efficiency" in r else ""))


@main.command()
@click.argument("engine_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--max-batch", type=int, default=1, show_default=True, help="Prompts per call (CFG doubles it).")
@click.option("--max-tree", type=int, default=None, help="Largest tree verified at once (default: the export's).")
@click.option("--timing-cache", default=None, type=click.Path(), help="Reuse/update a TensorRT timing cache.")
@click.option("--refit", is_flag=True, help="Build refittable engines (weight swaps without rebuild).")
@click.option("--workspace", type=int, default=None, help="Builder workspace limit in MiB.")
@click.option("--dry-run", is_flag=True, help="Check compatibility and print the profiles; build nothing.")
@_handle_errors
def build(engine_dir, max_batch, max_tree, timing_cache, refit, workspace, dry_run):
    """TensorRT engines for every graph of an exported bundle (Polygraphy loaders, strongly typed).

    Needs TensorRT and an NVIDIA GPU; without them it says what is missing and how to run the
    bundle through ONNX Runtime instead (`lisa-trt run ENGINE_DIR PROMPTS --backend ort`)."""
    from .engines.build import build_engines

    rec = build_engines(engine_dir, profiles=None, timing_cache=timing_cache, refit=refit,
                        workspace=(workspace << 20) if workspace else None, max_batch=max_batch,
                        max_tree=max_tree, dry_run=dry_run)
    click.echo(json.dumps(rec, indent=2, default=str))


def _ort_bench_engines(engine_dir, target, drafter, tables):
    """ORT engines for `bench --backend ort`, checked against the artifacts being benchmarked."""
    from .errors import InputError
    from .engines.ort import load_ort_engines
    from .export.manifest import drafter_hash, tables_hash
    from .models.checkpoints import target_hash

    if engine_dir is None:
        raise InputError("--backend ort needs --engine-dir (make one with `lisa-trt export`)")
    e = load_ort_engines(engine_dir, target_hash=target_hash(target),
                         drafter_hash=drafter_hash(drafter) if drafter is not None else None,
                         tables_hash=tables_hash(tables) if tables is not None else None)
    return e.target, e.drafter, e.gasv


def _export_generation(model, target, sampling):
    """Default generation settings recorded in the bundle (sampling, class names, tree budgets)."""
    import dataclasses

    from .runtime.autotune import default_tree_budgets

    measured = None
    if model == "demo":
        from .runtime.demo import _measured_budgets

        measured = _measured_budgets()
    gen = {"sampling": dataclasses.asdict(sampling), "tree": default_tree_budgets(target.config, measured)}
    names = _class_names(model)
    if names:
        gen["class_names"] = names
    return gen


@main.command("export")
@model_options
@click.option("--drafter", default=None, help="Drafter (.safetensors or demo-lisa / demo-eagle3 / demo-medusa-lisa; demo default demo-lisa).")
@click.option("--tables", default=None, help="Calibration tables (demo: bundled).")
@click.option("--vq", "vq", default=None, help="VQ checkpoint for the decoder graph (demo: bundled).")
@click.option("--vq-config", default="VQ-16", show_default=True)
@click.option("--out", "out_dir", required=True, type=click.Path(), help="Engine directory to write.")
@click.option("--fp16", is_flag=True, help="fp16 graphs (norm statistics, softmax, logits kept fp32).")
@click.option("--opset", type=int, default=None, help="ONNX opset (default 23: ONNX Attention).")
@click.option("--max-tree", type=int, default=None, help="Largest tree the engines verify (static cache length).")
@click.option("--no-validate", is_flag=True, help="Skip the ORT-vs-PyTorch check of every graph.")
@sampling_options
@_handle_errors
def export_cmd(model, config, image_size, model_type, drafter, tables, vq, vq_config, out_dir, fp16, opset, max_tree,
               no_validate, cfg_scale, temperature, top_k, top_p, cfg_interval, greedy, seed):
    """ONNX graphs for target, drafter, GASV and VQ decoder + manifest (validated, atomic)."""
    from .artifacts import default_drafter, default_tables, load_drafter_by_name, load_tables_by_name
    from .models.checkpoints import load_vq
    from .runtime.bundle import export_full_bundle

    target = resolve_target(model, config, image_size, model_type)
    drafter = drafter or default_drafter(model)
    tables = tables or default_tables(model)
    vq = vq or ("demo" if model == "demo" else None)
    dr = load_drafter_by_name(drafter, target) if drafter else None
    tb = load_tables_by_name(tables, target) if tables else None
    vqm = load_vq(vq, None if vq == "demo" or str(vq).endswith(".safetensors") else vq_config) if vq else None
    s = resolve_sampling(model, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k, top_p=top_p,
                         cfg_interval=cfg_interval, greedy=greedy)
    man = export_full_bundle(target, dr, tb, vqm, out_dir, fp16=fp16, opset=opset, max_tree=max_tree,
                             generation=_export_generation(model, target, s), validate=not no_validate)
    for name, g in man.graphs.items():
        err = (g.validation or {}).get("max_error")
        click.echo(f"{name:16s} {g.precision}  max|ORT - torch| {err if err is not None else 'n/a'}")
    click.echo(f"wrote {out_dir} ({len(man.graphs)} graphs, {man.precision}, opset {man.opset})")


@main.command()
@click.argument("engine_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("prompts", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", default="outputs", show_default=True, type=click.Path())
@click.option("--backend", type=click.Choice(["auto", "trt", "ort", "torch"]), default="auto", show_default=True)
@click.option("--verify", type=click.Choice(["vanilla", "greedy", "exact", "lantern", "gasv", "sjd"]),
              default="gasv", show_default=True)
@click.option("--threads", type=int, default=None, help="ORT intra-op threads (default: physical cores).")
@sampling_options
@click.option("--tree-top-k", type=int, default=None)
@click.option("--tree-depth", type=int, default=None)
@click.option("--tree-tokens", type=int, default=None)
@_handle_errors
def run(engine_dir, prompts, out_dir, backend, verify, threads, cfg_scale, temperature, top_k, top_p, cfg_interval,
        greedy, seed, tree_top_k, tree_depth, tree_tokens):
    """Tree speculation + GASV over an engine directory: PNGs and per-image stats.

    PROMPTS: a text file (one class id or name per line) or JSONL ({"class": ..., "seed": ..,
    "cfg": ..}); malformed lines are reported with their numbers before any work starts."""
    from .io import write_json
    from .runtime.pipeline import Pipeline
    from .runtime.prompts import parse_prompts

    pipe = Pipeline.from_dir(engine_dir, backend=backend, threads=threads)
    cfg = pipe.config
    ps = parse_prompts(prompts, model_type=cfg.model_type, num_classes=cfg.num_classes, class_names=pipe.class_names)
    res = pipe.generate(ps, seed=seed, verify=verify, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k,
                        top_p=top_p, greedy=greedy, tree_top_k=tree_top_k, tree_depth=tree_depth,
                        tree_tokens=tree_tokens)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from .imaging import save_png

    import numpy as np

    for i, (img, p) in enumerate(zip(res.images, ps)):
        save_png(np.asarray(img), out / f"img_{i:04d}_line{p.line}.png")
    write_json(out / "stats.json", {"backend": pipe.backend, "verify": verify, "images": res.stats})
    mal = sum(st["mal"] for st in res.stats) / len(res.stats)
    secs = sum(st["seconds"] for st in res.stats)
    click.echo(f"{len(res.images)} images -> {out} ({pipe.backend}, {verify}): mean MAL {mal:.2f}, {secs:.2f} s")


@main.command()
@click.option("--out", "out_dir", default="lisa-trt-demo", show_default=True, type=click.Path())
@click.option("--num-images", type=int, default=8, show_default=True, help="Images per method (one per class, cycled).")
@click.option("--backend", type=click.Choice(["ort", "torch"]), default="ort", show_default=True)
@click.option("--verify", type=click.Choice(["exact", "lantern", "gasv"]), default="gasv", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@_handle_errors
def demo(out_dir, num_images, backend, verify, seed):
    """The whole pipeline on the bundled CPU model: export (cached), then vanilla vs LISA
    through ONNX Runtime; prints speed-up, MAL and quality, writes a side-by-side PNG grid."""
    from .runtime.demo import run_demo

    summary = run_demo(Path(out_dir), num_images=num_images, backend=backend, verify=verify, seed=seed,
                       echo=click.echo)
    click.echo(json.dumps(summary["results"], indent=2))


if __name__ == "__main__":  # pragma: no cover
    main()
