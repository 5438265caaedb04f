"""`lisa-trt train`: distil a drafter (LISA loss, EAGLE-3 / EAGLE-1 baselines, Medusa heads)."""

from __future__ import annotations

import click

from ..clitools import handle_errors
from . import options as opt


def _defaults():
    """TrainConfig's defaults, shown in --help (the dataclass is the one source; catalogue.py's
    snapshot of it, so that --help does not import torch)."""
    from types import SimpleNamespace

    return SimpleNamespace(**opt._catalogue()["train_defaults"])


_T = _defaults()


@click.command()
@opt.model_options()
@opt.vq_options("VQ checkpoint (codebook geometry for the LISA loss); 'demo' for the demo.")
@opt.out_option("Run directory (resumed if it has checkpoints).", required=True)
@click.option("--loss", type=click.Choice(["lisa", "lisa-paper", "lisa-soft", "lisa-mean", "lisa-additive", "lisa-ext",
                                          "eagle3", "eagle1"]), default="eagle3", show_default=True,
              help="eagle3: the EAGLE-3 loss (the default: it tied or beat every LISA form on the demo in every "
                   "sampling regime measured, docs/drafters.md); lisa = lisa-paper: the paper's locality-informed "
                   "loss; lisa-*: its extensions (docs/spec/lisa.md; lisa-additive keeps every position's "
                   "supervision); eagle1: the EAGLE-1 baseline.")
@click.option("--steps", type=int, default=None, help=f"Optimiser steps (default {_T.steps}).")
@click.option("--batch-size", type=int, default=None,
              help=f"Global batch in sequences, split over DDP ranks (default {_T.batch_size}).")
@click.option("--lr", type=float, default=None,
              help=f"Peak AdamW learning rate, warmup then cosine decay (default {_T.lr}).")
@click.option("--ttt-steps", type=int, default=None,
              help=f"Training-time-test steps of the drafter loss (default {_T.ttt_steps}).")
@click.option("--data", "data", type=click.Choice(["self", "tokens", "images"]), default="self", show_default=True,
              help="self: target-generated sequences; tokens: --token-file; images: --image-dir encoded with the VQ.")
@click.option("--token-file", default=None, type=click.Path(),
              help="Token ids (.pt / .npy / .npz / .safetensors) for --data tokens.")
@click.option("--image-dir", default=None, type=click.Path(),
              help="One sub-folder of images per class (--data images).")
@opt.captions_option("t2i: captions .txt (needs --encoder) or caption features .safetensors (encode-captions).",
                     exists=False)
@opt.encoder_option("t2i: local flan-t5-xl directory.")
@click.option("--num-samples", type=int, default=None, help="Self-distillation sequences.")
@click.option("--features", type=click.Choice(["online", "cache"]), default="online", show_default=True,
              help="Target features: computed every step, or once into OUT/features (safetensors shards).")
@opt.cfg_scale_option("Deployment CFG scale for self-distillation.", checked=False)
@opt.temperature_option("Deployment temperature for self-distillation samples (default 1; an artifact set's own).")
@opt.top_k_option("Deployment top-k for self-distillation samples, 0 = off (default 0; an artifact set's own).")
@opt.top_p_option("Deployment top-p for self-distillation samples (default 1; an artifact set's own).")
@click.option("--drafter-hidden", type=int, default=None, help="Drafter width (default: the target's dim).")
@click.option("--drafter-heads", type=int, default=None, help="Drafter attention heads (default: the target's).")
@click.option("--loss-off", default="", help="LISA terms to switch off (ablation), comma-separated: "
              "selection, soft_gate, veto, truncated_ce, kd.")
@click.option("--eval-every", type=int, default=0, show_default=True,
              help="Every N steps: held-out MAL proxy, top-1/top-3 agreement and real decoding MAL "
                   "(--eval-images prompts) logged to metrics.jsonl; 0 = only at the end.")
@click.option("--arch", type=click.Choice(["eagle3", "medusa", "ssd"]), default="eagle3", show_default=True,
              help="Drafter architecture: EAGLE-3 drafter, Medusa heads on the target's last hidden state, or "
                   "ssd: 2-D heads (SSD's right / below) that draft a row's tokens from the row above "
                   "(the pjd-ssd2d method, docs/ssd_head.md).")
@click.option("--medusa-heads", type=int, default=4, show_default=True, help="Number of Medusa heads (--arch medusa).")
@click.option("--ssd-directions", default=None,
              help="--arch ssd: the neighbours the 2-D heads predict, comma-separated from right, below, below-right "
                   "(default below,below-right; right is the target's own next-token law).")
@click.option("--draft-vocab", type=int, default=None,
              help="Reduced draft vocabulary: the head predicts only the N most frequent training codes (EAGLE-3 d2t).")
@click.option("--checkpoint-every", type=int, default=None,
              help=f"Steps between resumable checkpoints (default {_T.checkpoint_every}).")
@click.option("--bf16", is_flag=True, help="bf16 autocast (default fp32).")
@click.option("--eval-images", type=int, default=4, show_default=True,
              help="Held-out prompts decoded with the trained drafter (real MAL, exact verification); 0 = skip.")
@opt.seed_option
@click.option("--extend", is_flag=True,
              help="Continue a finished (or interrupted) run in OUT to a larger --steps; only the logging / "
                   "checkpoint / eval cadence may change too. The cosine schedule is stretched to the new total "
                   "(a warm restart).")
@opt.captions_file_option("Text-prompt models (Lumina-mGPT, Janus-Pro): self-distillation captions, one per line "
                          "(default: the family's built-in list).")
@handle_errors
def train(model, model_cfg, vq, vq_config, out_dir, cfg_scale, temperature, top_k, top_p, seed, **options):
    """Distil a drafter (LISA locality-informed loss, or EAGLE-3/EAGLE-1 baselines).

    Resumes from OUT/checkpoints after an interruption. Multi-GPU: run under torchrun."""
    from ..runtime.commands.train import train as entry
    from ..runtime.context import resolve

    rc = resolve(model, sampling={"cfg_scale": cfg_scale, "temperature": temperature, "top_k": top_k, "top_p": top_p,
                                  "seed": seed}, model_cfg=model_cfg)
    if options["arch"] == "ssd":
        entry = _train_ssd
    elif options.pop("ssd_directions") is not None:
        from ..errors import InputError

        raise InputError(f"--ssd-directions applies to --arch ssd, not --arch {options['arch']}; leave it out")
    rc.run(entry, out_dir=out_dir, vq=vq, vq_config=vq_config, echo=click.echo, **options)


SSD_DEFAULT = "below,below-right"
_SSD_REFUSED = {"draft_vocab": "--draft-vocab", "eval_every": "--eval-every", "extend": "--extend",
                "loss_off": "--loss-off", "drafter_hidden": "--drafter-hidden", "drafter_heads": "--drafter-heads",
                "ttt_steps": "--ttt-steps"}


def _train_ssd(rc, *, out_dir, vq, vq_config, echo, **o):
    """`--arch ssd`: 2-D heads (train/ssd.py) through the run's data path (runtime/commands/train.py's
    helpers: the same data, defaults and capability checks as every drafter); bad options refused
    before any model loads."""
    from ..errors import InputError
    from ..models.head2d import parse_directions
    from ..runtime.commands import train as base
    from ..train.messages import resume_hint
    from ..train.ssd import grid_of, train_heads2d

    offsets = parse_directions(o.pop("ssd_directions") or SSD_DEFAULT)
    given = [flag for k, flag in _SSD_REFUSED.items() if o.get(k)]
    if given or o["loss"] != "eagle3":
        raise InputError(f"{', '.join(given) or '--loss ' + o['loss']} do(es) not apply to --arch ssd: 2-D heads "
                         "train with --loss eagle3 on the target's final hidden state; leave it out")
    base._check_capabilities(rc.family, o)
    counts = {"--" + n.replace("_", "-"): o[n] for n in ("steps", "batch_size", "num_samples", "checkpoint_every")}
    rc = rc.load(counts=counts, dirs={"--out run directory": out_dir}, captions=o["captions"],
                 encoder_dir=o["encoder_dir"])
    rollouts = rc.conditions.training_rollouts(rc, out_dir, o)  # a prompter's requests (no rollout yet), or None
    request = rollouts[1] if rollouts is not None else None
    grid_of(rc.target, None if request is None else request.layout)  # no grid of rows: refused before data work
    vqm = base._codebook(rc, vq, vq_config, "eagle3")[0] if o["data"] == "images" else None
    data = rollouts[0] if rollouts is not None else base._data_config(rc, vqm, out_dir, o)
    cfg = base._train_config(rc, o, data, prompted=request is not None)
    try:
        result = train_heads2d(rc.target, cfg, out_dir, offsets=offsets, request=request)
    except KeyboardInterrupt:
        echo("\n" + resume_hint(out_dir, cfg.steps), err=True)
        raise SystemExit(130) from None
    echo(f"wrote {result['drafter']}")
    if not result["eval"]["heads"]:
        echo("no held-out sequences to evaluate the heads on")
    for name, h in result["eval"]["heads"].items():
        echo(f"held-out {name}: top-1 {h['top1']:.3f} (target argmax), accept {h['accept']:.3f} "
             f"(uniform prior {h['uniform_accept']:.3f}), sampled token in top-{result['eval']['k']} "
             f"{h['token_topk']:.3f} (uniform {h['uniform_token_topk']:.3f})")


COMMANDS = (train,)
