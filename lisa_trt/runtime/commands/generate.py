"""`lisa-trt generate`: a checkpoint in memory, any registered method, PNGs + tokens.npy + stats.json."""

from __future__ import annotations

import sys


def generate(rc, *, prompts, out_dir, overwrite, vq, vq_config, classes, captions, encoder_dir, drafter, tables, echo,
             **_):
    """The target in memory decodes with the run's method (speculative/run.py); writes the outputs."""
    from ...artifacts import find_vq
    from ...validation import check_out_dir
    from ..context import spec_artifacts

    check_out_dir(out_dir, overwrite=overwrite)
    if rc.family is not None:
        rc.conditions.precheck(tuple(prompts or ()), None, None)  # a missing prompt, before the model loads
    rc = rc.load(captions=captions, encoder_dir=encoder_dir)  # the tuned tree; top-k vs the vocabulary
    m, fam = rc.method, rc.family
    vqm, _ = find_vq(rc.source, vq, vq_config, family=fam, vocab_size=rc.target.config.vocab_size)  # before decoding
    cond, request = rc.conditions.given(rc, prompts=prompts, classes=classes, captions=captions,
                                        encoder_dir=encoder_dir)
    layout = request.layout if request is not None else None
    dr, tb = spec_artifacts(rc.source, rc.target, [m], drafter, tables, getattr(layout, "sub_vocab", None))
    tokens, stats = _decode(rc, dr, tb, cond, request, echo)
    _save(rc, tokens, stats, request, vqm, vq_config, out_dir, overwrite, echo)


def _decode(rc, drafter, tables, cond, request, echo) -> tuple:
    """(tokens, stats dict): the run's plan over `cond` (runtime/runner.decode, the one runner), with a
    progress bar on a terminal."""
    import torch

    from ...progress import bars_wanted, progress_bar
    from ..runner import Engines, decode

    m, spec, layout = rc.method, rc.spec, getattr(request, "layout", None)
    n_img = request.batch if request is not None else len(cond) if torch.is_tensor(cond) else cond[0].shape[0]
    n_tok = layout.n_tokens if layout is not None else rc.target.config.block_size
    what = m.describe(spec)  # the method's own settings (its Jacobi window, its draft tree)
    hint = " (smaller trees are faster on a CPU: --tree-tokens)" if m.uses_tree else ""
    echo(f"{m.name}: decoding {n_img} image(s), {n_tok} tokens each" + (f", {what}{hint}" if what else "") + " ...",
         err=True)
    show = bars_wanted()
    bar = progress_bar(n_img * n_tok, show, unit="token")
    tokens, st = decode(rc, Engines(rc.target, drafter, tables), cond, layout=layout,
                        on_progress=(lambda done: bar.update(done - bar.n)) if show else None)
    bar.close()
    stats = st.as_dict()
    echo(f"{m.name}: MAL {stats['mal']:.2f}, {stats['target_forwards']} target forwards, "
         f"mean TVD {stats['mean_tvd']:.4f}, {stats['times']['total']:.2f} s")
    return tokens, stats


def _save(rc, tokens, stats, request, vqm, vq_config, out_dir, overwrite, echo) -> None:
    """tokens.npy, stats.json and (with a decoder) the PNGs in `out_dir`."""
    import dataclasses

    from ..outputs import save_code_images, save_generation

    m, fam = rc.method, rc.family
    record = {"family": fam.name, "verify": m.name, "sampling": dataclasses.asdict(rc.sampling),
              "tree": dataclasses.asdict(rc.spec.tree) if m.uses_tree else None, **stats}
    if request is not None:
        record["prompts"], record["grid"] = list(request.prompts), list(request.grid)
        codes = fam.tokens_to_codes(rc.target, tokens, request)  # tokens.npy: the VQ code grids
        out = save_generation(out_dir, codes, record, overwrite=overwrite)
        paths = save_code_images(fam, vqm, codes, out) if vqm is not None else None
    else:
        from ..outputs import decode_and_save

        out = save_generation(out_dir, tokens, record, overwrite=overwrite)
        paths = decode_and_save(tokens, vqm, vq_config, rc.target.config, out, fam) if vqm is not None else None
    if paths is not None:
        echo(f"wrote {len(paths)} images and tokens.npy to {out}")
    else:
        echo(f"wrote tokens.npy to {out} (pass --vq to decode images)")
