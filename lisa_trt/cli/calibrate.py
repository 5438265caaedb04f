"""`lisa-trt calibrate`: GASV / LANTERN tables from target rollouts."""

from __future__ import annotations

import click

from ..clitools import handle_errors
from . import options as opt
from .export import overwrite_option


def _gasv_defaults() -> dict:
    """The knobs a calibration stores by default: calibration/profile.CALIBRATION_GASV (the README
    frontier's quality-neutral point), the one source of these defaults, read from the catalogue
    snapshot so --help imports no torch (tests/cli/test_help_and_logs.py keeps it equal)."""
    d = opt._catalogue()["calibrate_defaults"]
    return {k: d[k] for k in ("gasv_kappa", "gasv_lambda", "gasv_delta", "gasv_neighbours")}


def _lantern_k() -> int:
    return int(opt._catalogue()["calibrate_defaults"]["lantern_k"])


@click.command()
@opt.model_options()
@opt.vq_options("VQ checkpoint whose codebook defines the geometry ('demo' for the demo).")
@opt.out_option("Output .safetensors.", dest="out_path", required=True)
@overwrite_option
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
                  helps={"gasv_kappa": "GASV geometric threshold stored in the tables (the default is the "
                                       "README frontier's fastest quality-neutral point).",
                         "gasv_lambda": "GASV cluster threshold stored in the tables.",
                         "gasv_delta": "GASV mass budget stored in the tables (1: no cap).",
                         "gasv_neighbours": "GASV K_n: candidates per draft, also the calibration's N(z)."})
@opt.captions_option("t2i: rollout prompts, cycled to --rollouts (captions .txt with --encoder, or T5 features).")
@opt.encoder_option()
@opt.captions_file_option("Text-prompt models (Lumina-mGPT, Janus-Pro): rollout captions, one per line (default: the "
                          "family's built-in list).")
@opt.sampling_options
@handle_errors
def calibrate(model, model_cfg, vq, vq_config, out_path, overwrite, rollouts, samples_per_pos, quantile, clusters,
              cluster_space, lantern_k, knobs, captions, encoder_dir, captions_file, sampling):
    """GASV whitening / cluster / budget tables and LANTERN neighbour lists, from rollouts.

    An existing --out file is replaced only with --overwrite (refused before any work)."""
    from ..io import refuse_existing
    from ..runtime.commands.calibrate import calibrate as entry
    from ..runtime.context import resolve

    refuse_existing(out_path, overwrite=overwrite)
    rc = resolve(model, sampling=sampling, knobs=knobs, model_cfg=model_cfg)
    rc.run(entry, out_path=out_path, vq=vq, vq_config=vq_config, rollouts=rollouts,
           samples_per_pos=samples_per_pos, quantile=quantile, clusters=clusters, cluster_space=cluster_space,
           lantern_k=lantern_k, captions=captions, encoder_dir=encoder_dir, captions_file=captions_file,
           echo=click.echo)


COMMANDS = (calibrate,)
