"""`lisa-trt calibrate`: GASV / LANTERN tables from target rollouts."""

from __future__ import annotations

import click

from ..clitools import handle_errors
from . import options as opt


def _gasv_defaults() -> dict:
    """Calibration records GASVConfig's constants; its defaults are the knobs' defaults here."""
    from ..speculative.gasv import GASVConfig

    d = GASVConfig()
    return {"gasv_kappa": d.kappa, "gasv_lambda": d.lam}


def _lantern_k() -> int:
    from ..speculative.methods import LanternConfig

    return LanternConfig().k


@click.command()
@opt.model_options()
@opt.vq_options("VQ checkpoint whose codebook defines the geometry ('demo' for the demo).")
@opt.out_option("Output .safetensors.", dest="out_path", required=True)
@click.option("--rollouts", type=int, default=64, show_default=True, help="Images generated for the drift budgets.")
@click.option("--samples-per-pos", type=int, default=8, show_default=True,
              help="Alternative tokens sampled per position (drift samples).")
@click.option("--quantile", type=float, default=0.5, show_default=True,
              help="Per-cluster drift quantile kept as the budget, in (0, 1).")
@click.option("--clusters", type=int, default=None, help="Default round(2 sqrt(V)).")
@click.option("--cluster-space", type=click.Choice(["codebook", "w_tilde"]), default="codebook", show_default=True,
              help="k-means on the normalised codebook, or on w_tilde.")
@click.option("--lantern-k", type=int, default=_lantern_k(), show_default=True,
              help="LANTERN neighbours per code (clamped to V - 1).")
@opt.knob_options(only=("gasv_kappa", "gasv_lambda", "gasv_delta", "gasv_neighbours"), defaults=_gasv_defaults(),
                  helps={"gasv_delta": "GASV default mass budget (default 1: no cap).",
                         "gasv_neighbours": "GASV K_n: candidates per draft, also the calibration's N(z) "
                                            "(default 16)."})
@opt.captions_option("t2i: rollout prompts, cycled to --rollouts (captions .txt with --encoder, or T5 features).")
@opt.encoder_option()
@opt.captions_file_option("Text-prompt models (Lumina-mGPT, Janus-Pro): rollout captions, one per line (default: the "
                          "family's built-in list).")
@opt.sampling_options
@handle_errors
def calibrate(model, model_cfg, vq, vq_config, out_path, rollouts, samples_per_pos, quantile, clusters, cluster_space,
              lantern_k, knobs, captions, encoder_dir, captions_file, sampling):
    """GASV whitening / cluster / budget tables and LANTERN neighbour lists, from rollouts."""
    from ..runtime.context import resolve

    rc = resolve(model, sampling=sampling, knobs=knobs, model_cfg=model_cfg)
    rc.run("calibrate", _calibrate, out_path=out_path, vq=vq, vq_config=vq_config, rollouts=rollouts,
           samples_per_pos=samples_per_pos, quantile=quantile, clusters=clusters, cluster_space=cluster_space,
           lantern_k=lantern_k, captions=captions, encoder_dir=encoder_dir, captions_file=captions_file,
           echo=click.echo)


def _calibrate(rc, *, out_path, vq, vq_config, rollouts, samples_per_pos, quantile, clusters, cluster_space,
               lantern_k, captions, encoder_dir, captions_file, echo, **_):
    """The family-seam calibration (calibration/profile.py): one driver, the family's rollouts."""
    from ..calibration.profile import calibrate as run_calibration
    from ..calibration.tables import save_tables
    from ..runtime.context import gasv_calibration

    rc = rc.load(counts={"--rollouts": rollouts, "--samples-per-pos": samples_per_pos, "--clusters": clusters},
                 files={"--out file": out_path}, captions=captions, encoder_dir=encoder_dir)
    fam, kw = rc.family, {}
    vqm = _codebook_source(rc, vq, vq_config)
    if fam.prompted:  # rollouts of the prompter's requests (one per caption, cycled to --rollouts)
        from ..runtime.prompts import caption_list

        req = rc.request(caption_list(fam, captions_file, rollouts))
        size = rc.image_size(fam.default_image_size)
        kw = dict(conds=req.cond, layout=req.layout, settings=dict(width=size, height=size))
    elif not fam.class_conditioned(rc.target.config):
        from ..text.train import prompt_conds

        kw["conds"], _ = prompt_conds(rc.target.config, captions, encoder_dir, n=rollouts, what="calibration rollouts")
    tables = run_calibration(rc.target, fam.codebook(vqm), num_rollouts=rollouts, samples_per_pos=samples_per_pos,
                             quantile=quantile, n_clusters=clusters, cluster_space=cluster_space, lantern_k=lantern_k,
                             seed=rc.seed, sampling=rc.sampling, gasv=gasv_calibration(rc.spec), **kw)
    save_tables(tables, out_path)
    echo(f"wrote {out_path}: {tables.n_clusters} clusters over {tables.vocab_size} codes, theta_geo "
         f"{tables.theta_geo:.3f}, LANTERN k {tables.lantern_neighbors.shape[1]}")


def _codebook_source(rc, vq, vq_config):
    """The VQ whose codebook is the geometry: --vq (or the artifact set's), or a prompted family's
    own decoder in its checkpoint directory."""
    from ..artifacts import default_vq, vq_config_for
    from ..errors import ConfigError, InputError
    from ..models.checkpoints import load_vq

    vq = default_vq(rc.source, vq)
    if vq is None and rc.family.prompted:
        try:
            return load_vq(rc.source)
        except ConfigError as e:
            raise InputError(f"this needs the VQ codebook: pass --vq FOLDER or put the decoder beside the model "
                             f"({e})") from e
    if vq is None:
        raise InputError("calibration needs the VQ codebook: pass --vq (e.g. vq_ds16_c2i.pt)")
    return load_vq(vq, vq_config_for(vq, vq_config))


COMMANDS = (calibrate,)
