"""`lisa-trt bench`: every method on the same prompts and seeds in one process (lisa_trt/harness.py)."""

from __future__ import annotations

import sys

import click

from ..clitools import handle_errors
from . import options as opt


@click.command()
@opt.model_options()
@opt.drafter_option("Drafter path or demo-lisa / demo-eagle3 / demo-medusa-lisa.")
@opt.tables_option("Calibration tables (demo: bundled).")
@click.option("--methods", default="vanilla,exact,lantern,gasv,sjd", show_default=True,
              help="Comma-separated methods (speculative/methods.py); vanilla, the speed-up baseline, always runs.")
@opt.num_images_option("Images per method (prompt i with seed + i).")
@opt.classes_option("Class ids cycled over the images (default: all classes).")
@opt.captions_option("t2i: prompts cycled over the images (captions .txt with --encoder, or T5 features); "
                     "text-prompt models (Lumina-mGPT, Janus-Pro): a captions .txt (default: the family's list).")
@opt.encoder_option()
@opt.backend_option(opt.backend_choices(), default="torch",
                    help="torch: the in-memory models; any other: the exported graphs of --engine-dir.")
@click.option("--engine-dir", default=None, type=click.Path(),
              help="Exported bundle for a graph backend (ort, trt, ...).")
@opt.sampling_options
@opt.tree_options
@opt.knob_options()
@click.option("--sweep", "sweeps", multiple=True,
              help='Knob grid, repeatable: "gasv:kappa=0.5,1,2;lambda=0.6,0.3", "lantern:delta=0.1,0.2;gamma=1".')
@click.option("--quality-cache", default=None, type=click.Path(), help="Directory caching the quality reference "
              "features (real crops, vanilla samples); default runs/quality_cache.")
@opt.json_option("The report: settings and one result per method / sweep point.", required=True)
@click.option("--plot", "plot_path", default=None, type=click.Path(), help="Speed / quality plot (PNG).")
@handle_errors
def bench(model, model_cfg, drafter, tables, methods, num_images, classes, captions, encoder_dir, backend,
          engine_dir, sampling, tree, knobs, sweeps, quality_cache, json_path, plot_path):
    """Run every method on the same prompts and seeds in one process; JSON + speed/quality plot."""
    from ..runtime.context import resolve

    rc = resolve(model, sampling=sampling, tree=tree, knobs=knobs, model_cfg=model_cfg, backend=backend)
    rc.run("bench", _bench, drafter=drafter, tables=tables, methods=methods, num_images=num_images, classes=classes,
           captions=captions, encoder_dir=encoder_dir, engine_dir=engine_dir, sweeps=sweeps,
           quality_cache=quality_cache, json_path=json_path, plot_path=plot_path, echo=click.echo)


def _bench(rc, *, drafter, tables, methods, num_images, classes, captions, encoder_dir, engine_dir, sweeps, quality_cache, json_path, plot_path, echo, **_):
    """The family-seam bench: in-memory models or a bundle's graphs, one report."""
    from ..artifacts import default_drafter
    from ..harness import parse_methods, parse_sweep, run_bench, save_bench
    from ..runtime.context import spec_artifacts

    ms = parse_methods(methods)
    rc = rc.load(counts={"--num-images": num_images}, files={"--json file": json_path, "--plot file": plot_path},
                 captions=captions, encoder_dir=encoder_dir)
    conds, texts = _prompts(rc, classes, captions, encoder_dir, num_images)  # checked before engines load
    size = rc.given.get("image_size") or _bundle_image_size(engine_dir)  # --image-size, else the bundle's
    requests = [rc.request([t], image_size=size) for t in texts] if rc.family.prompted else None  # one per image
    runs = [r for text in sweeps for r in parse_sweep(text)]
    dr, tb = spec_artifacts(rc.source, rc.target, ms + [m for _, m, _ in runs], drafter, tables,
                            requests[0].layout.sub_vocab if requests else None)
    engines = (rc.target, dr, None) if rc.backend == "torch" else _graph_engines(rc, engine_dir, dr, tb)
    scorer_fn, decode_fn, quality = _scoring(rc, conds, texts, quality_cache)
    extra = {"model": rc.given["model"], "drafter": drafter or default_drafter(rc.source), "backend": rc.backend,
             "command": " ".join(sys.argv), **({"captions": texts} if texts is not None else {})}
    report = run_bench(engines[0], engines[1], tb, ms, conds, sampling=rc.sampling, spec=rc.spec, seed=rc.seed,
                       gasv=engines[2], scorer_fn=scorer_fn, decode_fn=decode_fn, runs=runs,
                       quality=quality, settings_extra=extra, requests=requests)
    save_bench(report, json_path, plot_path)
    _print_report(report, echo, scored=scorer_fn is not None, num_images=num_images)


def _prompts(rc, classes, captions, encoder_dir, num_images) -> tuple:
    """(conditions, caption texts or None): classes cycled over the images, or t2i caption features."""
    from ..runtime.outputs import class_names_of, parse_classes

    tc = rc.target.config
    if rc.family.prompted:  # text prompts (--captions: one per line; else the family's list), cycled
        from ..runtime.prompts import caption_list

        return None, caption_list(rc.family, captions, num_images)
    if not rc.family.class_conditioned(tc):
        from ..text.train import prompt_conds

        return prompt_conds(tc, captions, encoder_dir, n=num_images, what="bench")
    cl = parse_classes(classes, tc.num_classes, class_names_of(rc.source)) if classes else list(range(tc.num_classes))
    return [cl[i % len(cl)] for i in range(num_images)], None


def _bundle_image_size(engine_dir):
    """The image size an engine directory was exported for (its manifest layout), or None."""
    if engine_dir is None:
        return None
    from ..export.manifest import read_manifest

    return (read_manifest(engine_dir).layout or {}).get("image_size")


def _graph_engines(rc, engine_dir, drafter, tables) -> tuple:
    """Graph engines for `bench --backend B`, checked against the artifacts being benchmarked."""
    from ..engines.graph import load_engines
    from ..errors import InputError
    from ..export.manifest import drafter_hash, tables_hash
    from ..models.checkpoints import target_hash

    if engine_dir is None:
        raise InputError(f"--backend {rc.backend} needs --engine-dir (make one with `lisa-trt export`)")
    e = load_engines(engine_dir, rc.backend, target_hash=target_hash(rc.target),
                     drafter_hash=drafter_hash(drafter) if drafter is not None else None,
                     tables_hash=tables_hash(tables) if tables is not None else None)
    return e.target, e.drafter, e.gasv


def _scoring(rc, conds, texts, quality_cache) -> tuple:
    """(scorer_fn, decode_fn, quality reference) from the artifact set's scorer, else Nones."""
    import torch

    from ..models.artifact_sets import artifact_set

    aset = artifact_set(rc.source)
    if aset is None or aset.extra("score_images") is None:
        return None, None, None
    score_images, scorer = aset.extra("score_images"), aset.extra("load_demo_scorer")()
    vqm, g = aset.load_vq(), rc.target.config.grid_size

    def decode_fn(tokens):
        with torch.no_grad():
            return vqm.decode_code(tokens, (tokens.shape[0], vqm.config.codebook_embed_dim, g, g)).clamp(-1, 1)

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

    from ..io import tensor_hash
    from ..quality import QualityReference
    from ..speculative.autoregressive import generate as ar_generate

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
    from ..demo.scorer import INDICATIVE_BELOW

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


COMMANDS = (bench,)
