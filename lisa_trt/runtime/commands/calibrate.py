"""`lisa-trt calibrate`: GASV / LANTERN tables from the family's target rollouts."""

from __future__ import annotations


def calibrate(rc, *, out_path, vq, vq_config, rollouts, samples_per_pos, quantile, clusters, cluster_space,
              lantern_k, captions, encoder_dir, captions_file, echo, **_):
    """One driver (calibration/profile.py) over the family's rollouts; writes the tables to `out_path`."""
    from ...calibration.profile import calibrate as run_calibration
    from ...calibration.tables import save_tables
    from ...progress import bars_wanted
    from ..context import gasv_calibration

    rc = rc.load(counts={"--rollouts": rollouts, "--samples-per-pos": samples_per_pos, "--clusters": clusters},
                 files={"--out file": out_path}, captions=captions, encoder_dir=encoder_dir)
    fam = rc.family
    vqm = _codebook_source(rc, vq, vq_config)
    kw = rc.conditions.rollouts(rc, rollouts, captions=captions, captions_file=captions_file, encoder_dir=encoder_dir)
    tables = run_calibration(rc.target, fam.codebook(vqm), num_rollouts=rollouts, samples_per_pos=samples_per_pos,
                             quantile=quantile, n_clusters=clusters, cluster_space=cluster_space, lantern_k=lantern_k,
                             seed=rc.seed, sampling=rc.sampling, gasv=gasv_calibration(rc.spec),
                             progress=bars_wanted(), **kw)
    save_tables(tables, out_path)
    echo(f"wrote {out_path}: {tables.n_clusters} clusters over {tables.vocab_size} codes, theta_geo "
         f"{tables.theta_geo:.3f}, LANTERN k {tables.lantern_neighbors.shape[1]}")


def _codebook_source(rc, vq, vq_config):
    """The VQ whose codebook is the geometry (artifacts.find_vq), or an InputError naming the fix."""
    from ...artifacts import find_vq
    from ...errors import InputError

    vqm, why = find_vq(rc.source, vq, vq_config, family=rc.family)
    if vqm is None and why is not None:
        raise InputError(f"this needs the VQ codebook: pass --vq FOLDER or put the decoder beside the model ({why})")
    if vqm is None:
        raise InputError("calibration needs the VQ codebook: pass --vq (e.g. vq_ds16_c2i.pt)")
    return vqm
