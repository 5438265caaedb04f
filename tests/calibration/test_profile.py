"""Calibration by rollout profiling on a tiny random target: determinism, formulas, refusal."""

import math

import pytest
import torch
import torch.nn.functional as F

from lisa_trt.calibration.profile import (calibrate, cluster_budgets, default_n_clusters, drift_samples,
                                          kmeans, lantern_neighbors)
from lisa_trt.calibration.tables import check_tables, load_tables, save_tables
from lisa_trt.config import SamplingConfig
from lisa_trt.errors import ArtifactMismatchError, InputError

testing = pytest.importorskip("lisa_trt.testing")


@pytest.fixture(scope="module")
def tiny():
    model = testing.make_target(seed=0)
    codebook = F.normalize(torch.randn(256, 8, generator=torch.Generator().manual_seed(1)), dim=1)
    return model, codebook


def _cal(model, codebook, seed, **kw):
    kw = {"num_rollouts": 6, "batch_size": 4, "lantern_k": 20, "progress": False,
          "sampling": SamplingConfig(cfg_scale=2.0, top_k=40), **kw}
    return calibrate(model, codebook, seed=seed, **kw)


def test_deterministic_for_a_seed(tiny):
    a, b = _cal(*tiny, seed=5), _cal(*tiny, seed=5)
    c = _cal(*tiny, seed=6)
    for name in ("invstd", "w_tilde_norm2", "cluster", "centroids", "beta", "lantern_neighbors"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.theta_geo == b.theta_geo
    assert not torch.equal(a.beta, c.beta)          # the seed matters (rollouts, samples, k-means)


def test_tables_content_and_round_trip(tiny, tmp_path):
    model, codebook = tiny
    t = _cal(model, codebook, seed=0)
    V = 256
    assert t.n_clusters == default_n_clusters(V) == 32
    assert t.cluster.dtype == torch.int32 and t.lantern_neighbors.shape == (V, 20)
    assert t.lantern_neighbors.dtype == torch.int16
    assert math.isclose(t.theta_geo, 8.0 / float(t.beta.median()), rel_tol=1e-6)
    assert torch.all(t.beta > 0)
    assert 0 < t.settings["n_samples"] <= 6 * 16 * 8
    torch.testing.assert_close(t.w_tilde_norm2, (t.w_tilde ** 2).sum(1))
    from lisa_trt.models.checkpoints import target_hash
    check_tables(t, target_hash(model), V)
    save_tables(t, tmp_path / "t.safetensors")
    u = load_tables(tmp_path / "t.safetensors", head_weight=model.output.weight)
    assert torch.equal(u.beta, t.beta) and u.theta_geo == t.theta_geo
    other = testing.make_target(seed=1)
    with pytest.raises(ArtifactMismatchError, match=t.target_hash):
        check_tables(u, target_hash(other), V)


def test_kmeans_is_deterministic_and_separates_blobs():
    g = torch.Generator().manual_seed(0)
    centers = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    x = torch.cat([c + 0.1 * torch.randn(40, 2, generator=g) for c in centers])
    a1, c1 = kmeans(x, 3, seed=1)
    a2, c2 = kmeans(x, 3, seed=1)
    assert torch.equal(a1, a2) and torch.equal(c1, c2)
    for blob in range(3):                         # every blob is exactly one cluster
        assert len(set(a1[blob * 40:(blob + 1) * 40].tolist())) == 1
    assert len(set(a1.tolist())) == 3
    a, _ = kmeans(torch.zeros(10, 2), 4, seed=0)  # degenerate points: no empty cluster
    assert torch.bincount(a.long(), minlength=4).min() >= 1


def test_lantern_neighbors_nearest_first_self_excluded():
    g = torch.Generator().manual_seed(2)
    e = F.normalize(torch.randn(50, 4, generator=g), dim=1)
    nb = lantern_neighbors(e * 3.0, 7)            # raw scale is normalised away
    d = torch.cdist(e, e)
    for v in range(50):
        ids = nb[v].long()
        assert v not in ids.tolist()
        assert torch.all(d[v, ids][1:] >= d[v, ids][:-1])
        others = torch.ones(50, dtype=torch.bool)
        others[v] = False
        others[ids] = False
        assert d[v, ids].max() <= d[v, others].min() + 1e-6
    with pytest.raises(InputError, match="lantern_k"):
        lantern_neighbors(e, 50)


def test_drift_samples_are_the_runtime_statistic_over_neighbours():
    """s(v|z) = |l_z - l_v| / ||W~_z - W~_v||, z the sampled token, v drawn from p restricted to N(z)."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 30, generator=g)
    logits[4] = float("-inf")
    logits[4, 2] = 1.0                             # single-token support: no candidate mass
    w = torch.randn(30, 6, generator=g)
    nb = torch.stack([torch.randperm(30, generator=g)[:4] for _ in range(30)])
    nb = torch.where(nb == torch.arange(30)[:, None], (nb + 1) % 30, nb)    # self excluded
    z = torch.tensor([0, 5, 7, 9, 2])
    s, zz = drift_samples(logits, z, w, nb, 16, torch.Generator().manual_seed(0))
    assert s.shape == (4, 16) and torch.equal(zz, z[:4])
    for r in range(4):
        zr = int(z[r])
        allowed = (logits[r, zr] - logits[r, nb[zr]]).abs() / ((w[zr] - w[nb[zr]]).norm(dim=1) + 1e-6)
        assert all(torch.isclose(allowed, x, rtol=1e-5).any() for x in s[r])   # only N(z) is sampled
    # the sampled token is the anchor, not the top-1: the statistic changes with z
    s2, _ = drift_samples(logits, torch.tensor([1, 5, 7, 9, 2]), w, nb, 16, torch.Generator().manual_seed(0))
    assert not torch.equal(s, s2)


def test_cluster_budgets_quantiles_and_fallback():
    s = torch.cat([torch.arange(1.0, 101.0), torch.tensor([500.0, 600.0])])
    c = torch.cat([torch.zeros(100, dtype=torch.long), torch.ones(2, dtype=torch.long)])
    beta, counts = cluster_budgets(s, c, 3, 0.5, min_samples=32)
    assert counts.tolist() == [100, 2, 0]
    assert beta[0] == pytest.approx(50.5)
    glob = float(torch.quantile(s.double(), 0.5))
    assert beta[1] == pytest.approx(glob) and beta[2] == pytest.approx(glob)
    with pytest.raises(InputError, match="no candidate"):
        cluster_budgets(torch.empty(0), torch.empty(0, dtype=torch.long), 3, 0.5)


def test_bad_inputs_are_refused(tiny):
    model, codebook = tiny
    with pytest.raises(InputError, match="codebook"):
        calibrate(model, codebook[:100], progress=False)
    with pytest.raises(InputError, match="cluster_space"):
        calibrate(model, codebook, cluster_space="pixels", progress=False)
    with pytest.raises(InputError, match="no candidate"):
        _cal(model, codebook, seed=0, sampling=SamplingConfig(top_k=1))
    # GASV's candidates N(z) are the neighbour table's first K_n columns: a narrower table clamps
    # K_n (recorded in the tables' config), for every family alike
    assert _cal(model, codebook, seed=0, lantern_k=8).config.neighbours == 8


def test_t2i_needs_conditions_and_works_with_them(tiny):
    _, codebook = tiny
    model = testing.make_target("t2i", seed=2)
    with pytest.raises(InputError, match="conds"):
        _cal(model, codebook, seed=0)
    t = _cal(model, codebook, seed=0, conds=testing.make_cond(model, batch=3))
    assert t.settings["num_rollouts"] == 3 and t.theta_geo > 0


def test_cluster_space_w_tilde(tiny):
    t = _cal(*tiny, seed=0, cluster_space="w_tilde", n_clusters=10)
    assert t.cluster_space == "w_tilde" and t.centroids.shape == (10, 64)
