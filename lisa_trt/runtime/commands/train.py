"""`lisa-trt train`: distil a drafter (LISA loss, EAGLE-3 / EAGLE-1 baselines, Medusa heads) for the run's target."""

from __future__ import annotations

import sys
import time
from pathlib import Path


LOSS_TERMS = ("selection", "soft_gate", "veto", "truncated_ce", "kd")


def loss_switches(text: str, loss: str = "lisa") -> dict:
    """--loss-off "selection,kd" -> {"selection": False, "kd": False} (LossConfig switches of the
    LISA recipe `loss`; InputError for switches given with a loss that has none)."""
    from ...errors import InputError
    from ...train.losses import loss_recipe

    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    bad = [n for n in names if n not in LOSS_TERMS]
    if bad:
        raise InputError(f"unknown LISA term(s) {bad} in --loss-off; valid: {', '.join(LOSS_TERMS)}")
    if names and loss_recipe(loss).kind != "lisa":
        raise InputError(f"--loss-off switches terms of the LISA loss; --loss {loss} has none: add --loss lisa "
                         "(or a lisa-* recipe), or leave --loss-off out")
    return {n: False for n in names}


def _data_config(rc, vqm, out_dir, o: dict):
    """DataConfig: captions encoded (t2i) and an image folder tokenised before any training."""
    from ...errors import InputError
    from ...train.data import DataConfig

    tc, source, token_file = rc.target.config, o["data"], o["token_file"]
    # captions encoded before any data work (None: the kind trains on no captions)
    caption_file = rc.conditions.training_captions(tc, o["captions"], o["encoder_dir"], out_dir, source)
    if source == "images":
        from ...train.data import encode_image_folder

        if o["image_dir"] is None:
            raise InputError("--data images needs --image-dir (one sub-folder of images per class)")
        token_file = str(encode_image_folder(vqm, o["image_dir"], Path(out_dir) / "image_tokens.safetensors",
                                             grid=tc.grid_hw))
        source = "tokens"
    kw = dict(source=source, token_file=token_file, features=o["features"], caption_file=caption_file)
    if o["num_samples"] is not None:
        kw["num_samples"] = o["num_samples"]
    if rc.given["sampling"].get("cfg_scale") is not None or _is_set(rc.source):
        kw["cfg_scale"] = rc.sampling.cfg_scale  # given, else an artifact set's deployment scale
    for k in ("temperature", "top_k", "top_p"):  # the deployment's sampling law, when given (docs/drafters.md)
        if rc.given["sampling"].get(k) is not None:
            kw[k] = getattr(rc.sampling, k)
    return DataConfig(**kw)


def _is_set(source) -> bool:
    from ...models.artifact_sets import artifact_set

    return artifact_set(source) is not None


def _check_capabilities(fam, o: dict) -> None:
    """Refuse what the family's training does not support (models/family.py `train_data`), naming the fix."""
    from ...errors import InputError

    if fam is None:
        return
    if o["data"] not in fam.train_data:
        raise InputError(f"{fam.name} models train on {' / '.join('--data ' + d for d in fam.train_data)} only "
                         f"(target rollouts of the prompts), not --data {o['data']}; see docs/families.md")


def train(rc, *, out_dir, vq, vq_config, echo, **o):
    """The run's family trains (train/trainer.py, train/medusa.py); writes the drafter, logs and eval."""
    _check_capabilities(rc.family, o)
    loss_switches(o["loss_off"], o["loss"])  # refused before any model loads
    counts = {"--" + n.replace("_", "-"): o[n] for n in ("steps", "batch_size", "num_samples", "checkpoint_every")}
    rc = rc.load(counts=counts, counts_or_zero={"--eval-images": o["eval_images"]},
                 dirs={"--out run directory": out_dir}, captions=o["captions"], encoder_dir=o["encoder_dir"])
    _check_capabilities(rc.family, o)
    vqm, codebook = _codebook(rc, vq, vq_config, o["loss"])
    rollouts = rc.conditions.training_rollouts(rc, out_dir, o)  # a prompter's requests, or None: a DataConfig source
    data, request, held_out = rollouts if rollouts is not None else (_data_config(rc, vqm, out_dir, o), None, None)
    cfg = _train_config(rc, o, data, prompted=request is not None)
    start, t0 = _step_done(out_dir), time.perf_counter()
    result = _fit(rc.target, codebook, cfg, out_dir, o, echo, request, held_out)
    _train_log(rc, cfg, result, out_dir, start, time.perf_counter() - t0)
    echo(f"wrote {result.get('drafter', Path(out_dir) / 'drafter.safetensors')}")
    from ...train.messages import format_eval

    echo(format_eval(result.get("eval", {})))
    _held_out_decoding(rc.target, result, cfg, out_dir, o["eval_images"], echo, held_out,
                       finished=start >= cfg.steps)


def _train_config(rc, o: dict, data, *, prompted: bool):
    """TrainConfig of the given options; a prompted family's self-distillation runs take its
    `train_defaults` where an option is not given."""
    from ...train.losses import loss_recipe
    from ...train.trainer import TrainConfig

    kw = {k: o[k] for k in ("steps", "batch_size", "lr", "ttt_steps", "drafter_hidden", "drafter_heads",
                            "checkpoint_every", "draft_vocab")}
    kw.update(seed=rc.seed, eval_every=o["eval_every"] or None)
    if prompted:
        import dataclasses

        names = {f.name for f in dataclasses.fields(TrainConfig)}
        for k, v in rc.family.train_defaults.items():
            if k in names and kw.get(k) is None:
                kw[k] = v
        kw.setdefault("warmup_steps", min(50, (kw["steps"] or TrainConfig().steps) // 20))
    return TrainConfig(**{k: v for k, v in kw.items() if v is not None}, bf16=o["bf16"],
                       target_name=rc.family.name if prompted else str(rc.source),
                       loss=loss_recipe(o["loss"], **loss_switches(o["loss_off"], o["loss"])), data=data)


def _fit(target, codebook, cfg, out_dir, o: dict, echo, request=None, held_out=None) -> dict:
    """Train the EAGLE-3 drafter or the Medusa heads; Ctrl-C says how to resume (exit 130).

    request: a prompted family's self-distillation Request (the prompter's); held_out: its
    held-out decoding Request (`--eval-images` prompts), or None."""
    from ...errors import InputError
    from ...train.evaluate import decode_eval
    from ...train.messages import resume_hint
    from ...train.trainer import train_drafter

    eval_images = o["eval_images"]
    try:
        if o["arch"] == "medusa":
            from ...train.medusa import train_medusa

            if o["draft_vocab"] or o["eval_every"] or o["extend"]:
                raise InputError("--draft-vocab, --eval-every and --extend apply to the EAGLE-3 drafter "
                                 "(--arch eagle3); Medusa heads predict the ids the layout allows and evaluate "
                                 "once at the end")
            return train_medusa(target, codebook, cfg, out_dir, n_heads=o["medusa_heads"], request=request)

        def eval_fn(drafter, step):  # real decoding MAL on held-out prompts (exact verification)
            if not eval_images:
                return {}
            return {"decode_mal": decode_eval(target, drafter, cfg, eval_images, held_out)["mal"]}

        if request is not None:
            return train_drafter(target, codebook, cfg, out_dir, request=request, eval_fn=eval_fn,
                                 extend=o["extend"] or _resuming_shorter(out_dir, cfg.steps))
        return train_drafter(target, codebook, cfg, out_dir, eval_fn=eval_fn, extend=o["extend"])
    except KeyboardInterrupt:
        echo("\n" + resume_hint(out_dir, cfg.steps), err=True)
        sys.exit(130)


def _codebook(rc, vq, vq_config, loss: str) -> tuple:
    """(VQ, its codebook: the LISA locality geometry) from artifacts.find_vq; (None, None) only for
    a prompted family's EAGLE losses without a decoder."""
    from ...artifacts import find_vq
    from ...errors import InputError

    vqm, why = find_vq(rc.source, vq, vq_config, family=rc.family)
    if vqm is not None:
        return vqm, rc.family.codebook(vqm)
    if why is None:
        raise InputError("training needs the VQ codebook (LISA locality geometry): pass --vq")
    from ...train.losses import loss_recipe

    if loss_recipe(loss).kind == "lisa":  # every lisa-* recipe reads the codebook
        raise InputError(f"the LISA loss needs the VQ codebook: pass --vq FOLDER, put the decoder beside the "
                         f"model, or train with --loss eagle3 ({why})")
    return None, None


def _step_done(out_dir) -> int:
    """The step of OUT's latest checkpoint (0: a fresh run)."""
    import json

    latest = Path(out_dir) / "checkpoints" / "latest.json"
    return json.loads(latest.read_text())["step"] if latest.is_file() else 0


def _train_log(rc, cfg, result, out_dir, start: int, seconds: float) -> None:
    """OUT/train_log.json (rank 0): family, steps, loss kind, seconds, this run's losses, the eval."""
    import json
    import os

    from ...io import write_json

    if int(os.environ.get("RANK", "0")) != 0:
        return
    metrics = Path(result.get("metrics", Path(out_dir) / "metrics.jsonl"))
    recs = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()] if metrics.is_file() else []
    write_json(Path(out_dir) / "train_log.json",
               {"family": rc.family.name, "steps": cfg.steps, "loss": cfg.loss.kind, "seconds": round(seconds, 2),
                "losses_this_run": [r["loss"] for r in recs if "loss" in r and r.get("step", 0) > start],
                "eval": result.get("eval", {})})


def _resuming_shorter(out_dir, steps: int) -> bool:
    """True when OUT holds an interrupted / finished run with fewer steps (self-distillation of
    prompts continues it automatically, as its first start recorded the rollouts)."""
    import json

    latest = Path(out_dir) / "checkpoints" / "latest.json"
    return latest.is_file() and 0 < json.loads(latest.read_text())["step"] < steps


def _held_out_decoding(target, result, cfg, out_dir, eval_images, echo, held_out=None, finished=False) -> None:
    """Decode held-out prompts with the trained drafter (one rank under torchrun) -> eval_decode.json
    (held_out: a prompted family's held-out Request); a run `finished` before this call keeps the
    one it recorded (the same images: it is not repeated)."""
    import json
    import os

    if not eval_images or int(os.environ.get("RANK", "0")) != 0:
        return
    recorded = Path(out_dir) / "eval_decode.json"
    if finished and recorded.is_file() and json.loads(recorded.read_text()).get("images") == eval_images:
        ev = json.loads(recorded.read_text())
        echo(f"held-out decoding ({eval_images} images, exact verification, recorded): MAL {ev['mal']:.3f}")
        return
    from ...artifacts import load_drafter_by_name
    from ...io import write_json
    from ...train.evaluate import decode_eval

    ev = decode_eval(target, load_drafter_by_name(str(result["drafter"]), target), cfg, eval_images, held_out)
    write_json(Path(out_dir) / "eval_decode.json", ev)
    echo(f"held-out decoding ({eval_images} images, exact verification): MAL {ev['mal']:.3f}")
