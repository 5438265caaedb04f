"""GASV tables: save/load round trip, binding, refusal of mismatched tables."""

import json

import pytest
import torch

from lisa_trt.calibration.tables import (FORMAT, SCHEMA_VERSION, GASVTables, check_tables, load_tables,
                                         save_tables, whiten, whitening)
from lisa_trt.errors import ArtifactMismatchError, CheckpointError
from lisa_trt.speculative.gasv import GASV_VERSION, GASVConfig, gasv_gates


def _tables(V=64, H=16, C=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(V, H, generator=g)
    invstd = whitening(W)
    wt = whiten(W, invstd)
    t = GASVTables(invstd=invstd, w_tilde_norm2=(wt * wt).sum(1),
                   cluster=torch.randint(0, C, (V,), generator=g, dtype=torch.int32),
                   centroids=torch.randn(C, 8, generator=g), beta=torch.rand(C, generator=g) + 0.5,
                   lantern_neighbors=torch.randint(0, V, (V, 10), generator=g).to(torch.int16),
                   config=GASVConfig(kappa=1.1, lam=0.6, neighbours=8, theta_geo=3.5), target_hash="abcd" * 4,
                   vocab_size=V, seed=7, settings={"num_rollouts": 4})
    return t, W


def test_whitening_gives_unit_std_and_handles_constant_dims():
    W = torch.randn(100, 6) * torch.tensor([1.0, 2.0, 0.5, 10.0, 1.0, 1.0])
    W[:, 5] = 3.0                                   # zero spread
    inv = whitening(W)
    std = whiten(W, inv).std(0, correction=0)
    torch.testing.assert_close(std[:5], torch.ones(5))
    assert inv[5] == 0 and torch.isfinite(inv).all()


def test_save_load_round_trip(tmp_path):
    t, W = _tables()
    path = tmp_path / "tables.safetensors"
    save_tables(t.bind(W), path)
    assert path.is_file() and not list(tmp_path.glob(".*tmp"))   # atomic: no temp file left
    u = load_tables(path)
    for name in ("invstd", "w_tilde_norm2", "cluster", "centroids", "beta", "lantern_neighbors"):
        a, b = getattr(t, name), getattr(u, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert u.config == t.config and u.target_hash == t.target_hash and u.vocab_size == 64
    assert u.seed == 7 and u.settings == {"num_rollouts": 4} and u.w_tilde is None
    # W~ is not stored (recomputed from the head at bind time) -> the file stays small
    from safetensors import safe_open
    with safe_open(str(path), "pt") as f:
        assert "w_tilde" not in f.keys()
        meta = f.metadata()
    assert json.loads(meta["format"]) == FORMAT and json.loads(meta["schema_version"]) == SCHEMA_VERSION
    assert json.loads(meta["gasv"])["lam"] == 0.6
    bound = load_tables(path, head_weight=W)
    assert json.loads(meta["gasv_version"]) == GASV_VERSION == 2
    logits, tok, par = torch.randn(3, 64), torch.tensor([1, 2, 3]), torch.tensor([-1, 0, 0])
    for a, b in zip(gasv_gates(logits, tok, par, bound), gasv_gates(logits, tok, par, t.bind(W))):
        assert torch.equal(a, b)


def test_check_tables_refuses_other_target_and_names_both_hashes():
    t, _ = _tables()
    check_tables(t, "abcd" * 4, 64)
    with pytest.raises(ArtifactMismatchError) as e:
        check_tables(t, "ffff" * 4, 64)
    msg = str(e.value)
    assert "abcd" * 4 in msg and "ffff" * 4 in msg and "lisa-trt calibrate --model" in msg
    with pytest.raises(ArtifactMismatchError, match="vocabulary"):
        check_tables(t, "abcd" * 4, 128)


def test_bind_refuses_wrong_head_shape():
    t, W = _tables()
    with pytest.raises(ArtifactMismatchError, match="shape"):
        t.bind(W[:, :8])


def test_load_refuses_foreign_and_future_files(tmp_path):
    from lisa_trt.io import save_safetensors
    save_safetensors({"x": torch.zeros(2)}, tmp_path / "other.safetensors", {"format": "something"})
    with pytest.raises(CheckpointError, match="not a lisa-trt GASV tables file"):
        load_tables(tmp_path / "other.safetensors")
    t, _ = _tables()
    meta = t.metadata()
    meta["schema_version"] = SCHEMA_VERSION + 1
    save_safetensors({n: getattr(t, n) for n in ("invstd", "w_tilde_norm2", "cluster", "centroids", "beta",
                                                 "lantern_neighbors")}, tmp_path / "v2.safetensors", meta)
    with pytest.raises(ArtifactMismatchError, match="schema version"):
        load_tables(tmp_path / "v2.safetensors")


def test_inconsistent_tables_are_refused():
    t, _ = _tables()
    with pytest.raises(CheckpointError, match="cluster ids"):
        GASVTables(**{**{k: getattr(t, k) for k in ("invstd", "w_tilde_norm2", "centroids", "beta",
                                                   "lantern_neighbors", "config", "target_hash",
                                                   "vocab_size")},
                      "cluster": torch.full((64,), 9, dtype=torch.int32)})


def test_version_1_tables_are_refused_with_the_fix(tmp_path):
    from lisa_trt.io import save_safetensors

    t, _ = _tables()
    tensors = {n: getattr(t, n) for n in ("invstd", "w_tilde_norm2", "cluster", "centroids", "beta",
                                          "lantern_neighbors")}
    meta = t.metadata()
    meta.pop("gasv_version")
    meta["schema_version"] = 1
    meta["gasv"] = {"kappa": 1.0, "lam": 0.4, "gamma_kappa": 1.0, "gamma_lambda": 1.0, "theta_clu": 8.0,
                    "theta_geo": 60.0, "eps": 1e-6}
    save_safetensors(tensors, tmp_path / "v1.safetensors", meta)
    with pytest.raises(ArtifactMismatchError, match="version-1.*Re-run `lisa-trt calibrate"):
        load_tables(tmp_path / "v1.safetensors")
    meta["schema_version"] = SCHEMA_VERSION                      # a v2 schema without the GASV version
    save_safetensors(tensors, tmp_path / "v1b.safetensors", meta)
    with pytest.raises(ArtifactMismatchError, match="lisa-trt calibrate"):
        load_tables(tmp_path / "v1b.safetensors")
