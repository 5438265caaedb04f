"""`lisa-trt generate`: decode images from a checkpoint in memory (no export)."""

from __future__ import annotations

import sys

import click

from ..clitools import handle_errors
from . import options as opt


@click.command()
@opt.model_options()
@opt.vq_options("VQ checkpoint (or 'demo'); without it only tokens are written.")
@opt.classes_option("c2i: comma-separated class ids (or names for the demo).")
@opt.captions_option("t2i: captions .txt (one per line, needs --encoder) or T5 features (.safetensors / .npy).")
@opt.encoder_option()
@opt.prompt_option
@opt.sampling_options
@opt.drafter_option("Drafter .safetensors, or demo-lisa / demo-eagle3 / demo-medusa-lisa (demo default: demo-lisa).")
@opt.verify_option(help="Decoding method (speculative/methods.py; default: vanilla AR loop).")
@opt.tables_option("Calibration tables (lisa-trt calibrate); demo: bundled.")
@opt.tree_options
@opt.knob_options()
@opt.out_option("Output directory (PNGs, tokens.npy, stats.json).", default="outputs")
@opt.overwrite_option
@handle_errors
def generate(model, model_cfg, vq, vq_config, classes, captions, encoder_dir, prompts, sampling, drafter, verify,
             tables, tree, knobs, out_dir, overwrite):
    """Generate images: the reference AR loop, or tree speculation with --drafter/--verify.

    Writes PNGs (when a VQ is known), tokens.npy and stats.json."""
    from ..runtime.context import resolve
    from ..speculative.methods import method_names

    rc = resolve(model, verify=verify, default_verify=method_names("ar")[0], sampling=sampling, tree=tree,
                 knobs=knobs, model_cfg=model_cfg)
    rc.run("generate", _generate, prompts=prompts, out_dir=out_dir, overwrite=overwrite, vq=vq, vq_config=vq_config,
           classes=classes, captions=captions, encoder_dir=encoder_dir, drafter=drafter, tables=tables,
           echo=click.echo)


def _conditions(rc, classes, captions, encoder_dir):
    """Class ids (--classes) or caption features (--captions) for the bound target."""
    import torch

    from ..errors import InputError
    from ..runtime.outputs import class_names_of, parse_classes

    tc = rc.target.config
    if rc.family.class_conditioned(tc):
        if classes is None:
            raise InputError("c2i models need --classes (e.g. --classes 0,1,2)")
        return torch.tensor(parse_classes(classes, tc.num_classes, class_names_of(rc.source)))
    from ..text.train import prompt_conds

    return prompt_conds(tc, captions, encoder_dir, what="generate")[0]


def _generate(rc, *, out_dir, overwrite, vq, vq_config, classes, captions, encoder_dir, drafter, tables, echo, **_):
    """The family-seam `generate`: target in memory, any registered method (speculative/run.py)."""
    import dataclasses

    import torch

    from ..artifacts import default_vq
    from ..progress import progress_bar
    from ..runtime.context import spec_artifacts
    from ..runtime.outputs import decode_and_save, load_vq_for, save_generation
    from ..speculative.run import run_method
    from ..validation import check_out_dir

    check_out_dir(out_dir, overwrite=overwrite)
    rc = rc.load(captions=captions, encoder_dir=encoder_dir)  # the tuned tree; top-k vs the vocabulary
    tc, m, spec = rc.target.config, rc.method, rc.spec
    vq = default_vq(rc.source, vq)
    vqm = load_vq_for(vq, vq_config, tc=tc) if vq is not None else None  # fails before generating
    cond = _conditions(rc, classes, captions, encoder_dir)
    dr, tb = spec_artifacts(rc.source, rc.target, [m], drafter, tables)
    n_img = len(cond) if torch.is_tensor(cond) else cond[0].shape[0]
    echo(f"{m.name}: decoding {n_img} image(s), {tc.block_size} tokens each"
         + ("" if m.kind == "ar" else
            f", draft tree top-k {spec.tree.top_k} / depth {spec.tree.depth} / {spec.tree.total_tokens} nodes "
            "(smaller trees are faster on a CPU: --tree-tokens)") + " ...", err=True)
    show = sys.stderr.isatty()
    bar = progress_bar(n_img * tc.block_size, show, unit="token")
    tokens, st = run_method(m.name, rc.target, dr, tb, cond, sampling=rc.sampling, spec=spec, seed=rc.seed,
                            on_progress=(lambda done: bar.update(done - bar.n)) if show else None)
    bar.close()
    stats = st.as_dict()
    echo(f"{m.name}: MAL {stats['mal']:.2f}, {stats['target_forwards']} target forwards, "
         f"mean TVD {stats['mean_tvd']:.4f}, {stats['times']['total']:.2f} s")
    record = {"verify": m.name, "sampling": dataclasses.asdict(rc.sampling),
              "tree": dataclasses.asdict(spec.tree) if m.kind == "tree" else None, **stats}
    out = save_generation(out_dir, tokens, record, overwrite=overwrite)
    if vqm is not None:
        paths = decode_and_save(tokens, vqm, vq_config, tc, out)
        echo(f"wrote {len(paths)} images and tokens.npy to {out}")
    else:
        echo(f"wrote tokens.npy to {out} (pass --vq to decode images)")


COMMANDS = (generate,)
