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


def _decoder(rc, vq, vq_config):
    """The image decoder: --vq (or the artifact set's); a prompted family's checkpoint directory may
    carry its own (e.g. DIR/vqgan/): None when there is none (tokens only)."""
    from ..artifacts import default_vq
    from ..errors import ConfigError
    from ..runtime.outputs import load_vq_for

    vq = default_vq(rc.source, vq)
    if not rc.family.prompted:
        return load_vq_for(vq, vq_config, tc=rc.target.config) if vq is not None else None
    from ..models.checkpoints import load_vq

    try:
        return load_vq(vq or rc.source)
    except ConfigError:
        if vq is not None:
            raise
        return None


def _generate(rc, *, prompts, out_dir, overwrite, vq, vq_config, classes, captions, encoder_dir, drafter, tables, echo,
              **_):
    """The family-seam `generate`: target in memory, any registered method (speculative/run.py)."""
    import dataclasses

    import torch

    from ..progress import progress_bar
    from ..runtime.context import spec_artifacts
    from ..runtime.outputs import save_generation
    from ..speculative.run import run_method
    from ..validation import check_out_dir

    check_out_dir(out_dir, overwrite=overwrite)
    if rc.family is not None and rc.family.prompted and not prompts:
        rc.request(prompts)  # the missing-prompt error, before the model loads
    rc = rc.load(captions=captions, encoder_dir=encoder_dir)  # the tuned tree; top-k vs the vocabulary
    tc, m, spec, fam = rc.target.config, rc.method, rc.spec, rc.family
    vqm = _decoder(rc, vq, vq_config)  # fails before generating
    request = rc.request(prompts) if fam.prompted else None
    cond = request.cond if request is not None else _conditions(rc, classes, captions, encoder_dir)
    layout = request.layout if request is not None else None
    dr, tb = spec_artifacts(rc.source, rc.target, [m], drafter, tables, getattr(layout, "sub_vocab", None))
    n_img = request.batch if request is not None else len(cond) if torch.is_tensor(cond) else cond[0].shape[0]
    n_tok = layout.n_tokens if layout is not None else tc.block_size
    echo(f"{m.name}: decoding {n_img} image(s), {n_tok} tokens each"
         + ("" if m.kind == "ar" else
            f", Jacobi window {spec.settings('sjd').window}" if m.kind == "sjd" else
            f", draft tree top-k {spec.tree.top_k} / depth {spec.tree.depth} / {spec.tree.total_tokens} nodes "
            "(smaller trees are faster on a CPU: --tree-tokens)") + " ...", err=True)
    show = sys.stderr.isatty()
    bar = progress_bar(n_img * n_tok, show, unit="token")
    tokens, st = run_method(m.name, rc.target, dr, tb, cond, sampling=rc.sampling, spec=spec, seed=rc.seed,
                            on_progress=(lambda done: bar.update(done - bar.n)) if show else None, layout=layout)
    bar.close()
    stats = st.as_dict()
    echo(f"{m.name}: MAL {stats['mal']:.2f}, {stats['target_forwards']} target forwards, "
         f"mean TVD {stats['mean_tvd']:.4f}, {stats['times']['total']:.2f} s")
    record = {"family": fam.name, "verify": m.name, "sampling": dataclasses.asdict(rc.sampling),
              "tree": dataclasses.asdict(spec.tree) if m.kind == "tree" else None, **stats}
    if request is not None:
        record["prompts"], record["grid"] = list(request.prompts), list(request.grid)
        codes = fam.tokens_to_codes(rc.target, tokens, request)  # tokens.npy: the VQ code grids
        out = save_generation(out_dir, codes, record, overwrite=overwrite)
        paths = _save_pixels(fam, vqm, codes, out) if vqm is not None else None
    else:
        from ..runtime.outputs import decode_and_save

        out = save_generation(out_dir, tokens, record, overwrite=overwrite)
        paths = decode_and_save(tokens, vqm, vq_config, tc, out) if vqm is not None else None
    if paths is not None:
        echo(f"wrote {len(paths)} images and tokens.npy to {out}")
    else:
        echo(f"wrote tokens.npy to {out} (pass --vq to decode images)")


def _save_pixels(fam, vqm, codes, out) -> list:
    """The family's decoder and uint8 conversion over code grids -> PNGs in `out`."""
    import torch

    from ..imaging import save_images

    with torch.no_grad():
        return save_images(fam.to_uint8(fam.codes_to_pixels(vqm, codes)), out)


COMMANDS = (generate,)
