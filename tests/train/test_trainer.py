"""TTT unroll == tree inference, a two-step run, exact resume after a kill, data sources."""

import json

import numpy as np
import pytest
import torch

from lisa_trt.errors import ArtifactMismatchError, ConfigError, InputError
from lisa_trt.models.drafter import Drafter, load_drafter
from lisa_trt.testing import make_target
from lisa_trt.train import DataConfig, LossConfig, TrainConfig, train_drafter
from lisa_trt.train import data as D
from lisa_trt.train import trainer as T


def small_cfg(**kw):
    data = kw.pop("data", DataConfig(num_samples=8, eval_samples=2, gen_batch=8, cfg_scale=2.0))
    base = dict(steps=2, batch_size=4, ttt_steps=2, warmup_steps=1, checkpoint_every=1, log_every=1, data=data)
    base.update(kw)
    return TrainConfig(**base)


def test_unroll_mask_by_hand():
    m = T.unroll_mask(3, 2)[0].int().tolist()
    assert m == [[1, 0, 0, 1, 0, 0, 1, 0, 0],
                 [1, 1, 0, 0, 1, 0, 0, 1, 0],
                 [1, 1, 1, 0, 0, 1, 0, 0, 1]]


def test_ttt_unroll_equals_chain_drafting_through_the_cache(target):
    """Entry j at unroll step s == the depth-s chain node below root j at inference."""
    torch.manual_seed(1)
    d = Drafter.from_target(target, init_head_from_target=False).eval()
    C, N = target.config.cls_token_num, target.config.block_size
    tokens = torch.randint(0, 256, (2, N))
    with torch.no_grad():
        out = target.forward_train(torch.tensor([3, 4]), tokens, taps=True)
        outs = T.ttt_unroll(d, out.taps, tokens, 3)
        assert len(outs) == 3 and outs[0][0].shape == (2, N - 1, 256)
        for m in (0, 5, N - 4):
            cache = d.new_cache(2, target.config.seq_len + 8)
            cache.lengths.fill_(C)
            pos = (C + torch.arange(m + 1))[None].expand(2, m + 1)
            mask = cache.attention_mask(pos, torch.ones(m + 1, m + 1, dtype=torch.bool).tril()[None].expand(2, -1, -1))
            lg, h = d(d.project_taps(out.taps[:, : m + 1]), tokens[:, : m + 1], pos, pos, mask, cache)
            cache.lengths += m + 1
            assert (lg[:, m] - outs[0][0][:, m]).abs().max() < 1e-5
            h, slots = h[:, m:m + 1], []
            for s in (1, 2):
                slot = cache.lengths[:, None] + s - 1
                slots.append(slot)
                cols = torch.cat(slots, 1)  # ancestors' slots + own slot
                tm = cache.attention_mask(cols, torch.ones(2, s, s, dtype=torch.bool).tril())[:, -1:]
                pos = torch.full((2, 1), C + m + s)
                lg, h = d(h, tokens[:, m + s: m + s + 1], pos, slot, tm, cache)
                assert (lg[:, 0] - outs[s][0][:, m]).abs().max() < 1e-5, (m, s)


def test_two_step_training_run(tmp_path, target, codebook):
    cfg = small_cfg(target_name="tiny", loss=LossConfig())  # the paper's LISA form: its statistics are logged
    res = train_drafter(target, codebook, cfg, tmp_path, progress=False)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    for r in lines:
        assert len(r["top1_s"]) == 2 and len(r["in_nbhd_s"]) == 2 and np.isfinite(r["loss"])
        assert 0 <= r["sel_frac_0"] <= 1
    ev = json.loads((tmp_path / "eval.json").read_text())
    assert ev == res["eval"] and ev["depth"] == 2 and 1.0 <= ev["mal_proxy"] <= 3.0
    assert res["radius"] > 0
    d = load_drafter(res["drafter"], target)
    assert d.config.target_name == "tiny"
    assert TrainConfig.from_dict(json.loads((tmp_path / "train_config.json").read_text())) == cfg
    assert len(list((tmp_path / "checkpoints").glob("step_*.pt"))) == 2  # keep_checkpoints


def test_bf16_autocast_run(tmp_path, target, codebook):
    res = train_drafter(target, codebook, small_cfg(steps=1, bf16=True), tmp_path, progress=False)
    rec = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert np.isfinite(rec["loss"]) and np.isfinite(rec["grad_norm"])
    assert load_drafter(res["drafter"], target).fc.weight.dtype == torch.float32  # fp32 master weights


def _params(path, target):
    return load_drafter(path, target).state_dict()


def test_resume_after_kill_is_exact(tmp_path, target, codebook, kill_training):
    cfg = small_cfg(steps=4, checkpoint_every=2, lr=3e-3)
    full = train_drafter(target, codebook, cfg, tmp_path / "full", progress=False)

    # the step-3 update happens but is never checkpointed
    kill_training(lambda: train_drafter(target, codebook, cfg, tmp_path / "run", progress=False))
    assert json.loads((tmp_path / "run" / "checkpoints" / "latest.json").read_text())["step"] == 2
    state = T.load_latest_checkpoint(tmp_path / "run")  # weights_only load
    assert state["step"] == 2 and {"model", "optimizer", "scheduler", "rng", "data", "radius"} <= set(state)
    assert sorted(state["data"]["order"].tolist()) == list(range(8))
    torch.manual_seed(1234)  # a fresh process would have other global RNG state
    resumed = train_drafter(target, codebook, cfg, tmp_path / "run", progress=False)
    a, b = _params(full["drafter"], target), _params(resumed["drafter"], target)
    for k in a:
        assert (a[k] - b[k]).abs().max() <= 1e-6, k
    assert sum((a[k] - Drafter.from_target(target).state_dict()[k]).abs().sum() for k in a) > 0
    la = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lb] == [1, 2, 3, 4]
    assert [r["loss"] for r in la] == pytest.approx([r["loss"] for r in lb], abs=1e-6)
    with pytest.raises(ConfigError, match="different TrainConfig"):
        train_drafter(target, codebook, small_cfg(steps=4, checkpoint_every=2, lr=1e-3), tmp_path / "run",
                      progress=False)
    with pytest.raises(ArtifactMismatchError, match="not for this target"):
        train_drafter(make_target(seed=3), codebook, cfg, tmp_path / "run", progress=False)


def test_extend_a_finished_run(tmp_path, target, codebook, capsys):
    """--extend continues a finished run to more steps (cosine stretched); without it a larger --steps is refused."""
    cfg = small_cfg(steps=2, checkpoint_every=1, lr=3e-3)
    first = train_drafter(target, codebook, cfg, tmp_path / "run", progress=False)
    before = _params(first["drafter"], target)
    longer = small_cfg(steps=4, checkpoint_every=2, lr=3e-3)  # a new checkpoint cadence is allowed too
    with pytest.raises(ConfigError, match="pass --extend"):
        train_drafter(target, codebook, longer, tmp_path / "run", progress=False)
    # nothing to extend: refused before any data is made
    with pytest.raises(ConfigError, match="no checkpoint to continue"):
        train_drafter(target, codebook, longer, tmp_path / "typo", progress=False, extend=True)
    assert not (tmp_path / "typo").exists()
    with pytest.raises(ConfigError, match="more steps than the checkpoint"):
        train_drafter(target, codebook, small_cfg(steps=1, checkpoint_every=1, lr=3e-3), tmp_path / "run",
                      progress=False, extend=True)
    with pytest.raises(ConfigError, match=r"different TrainConfig \(lr, steps differ\)"):
        train_drafter(target, codebook, small_cfg(steps=4, checkpoint_every=1, lr=1e-3), tmp_path / "run",
                      progress=False, extend=True)
    capsys.readouterr()
    out = train_drafter(target, codebook, longer, tmp_path / "run", progress=False, extend=True)
    assert "extending" in capsys.readouterr().err and out["steps"] == 4
    assert json.loads((tmp_path / "run" / "checkpoints" / "latest.json").read_text())["step"] == 4
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # the learning rate of the extension follows the 4-step cosine, not the finished 2-step one
    assert rows[2]["lr"] == pytest.approx(3e-3 * T.lr_factor(3, longer))
    after = _params(out["drafter"], target)
    assert sum(float((after[k] - before[k]).abs().sum()) for k in after) > 0


def test_token_file_cached_features_and_baseline_losses(tmp_path, target, capsys):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (10, 16), generator=g)
    classes = torch.randint(0, 11, (10,), generator=g)
    D.TokenDataset(tokens, classes).save(tmp_path / "tok.safetensors")
    data = DataConfig(source="tokens", token_file=str(tmp_path / "tok.safetensors"), eval_samples=2,
                      features="cache", shard_size=3)
    for kind in ("eagle3", "eagle1"):
        cfg = small_cfg(data=data, loss=LossConfig(kind=kind))
        res = train_drafter(target, None, cfg, tmp_path / kind, progress=False)
        assert res["radius"] is None and res["eval"]["sequences"] == 2
    assert "feature cache: 8 sequences" in capsys.readouterr().out
    # the cached features reproduce the online ones (fp32 cache)
    train, _ = D.load_token_file(tmp_path / "tok.safetensors", target.config).split(2)
    cache = D.FeatureCache(target, train, tmp_path / "eagle3" / "features", shard_size=3)
    assert cache.complete() and cache.n_shards == 3
    rows = torch.tensor([7, 0, 4])
    a, b = cache.batch(rows), D.OnlineFeatures(target, train).batch(rows)
    for f in ("taps", "logits", "hidden", "tokens", "cond"):
        assert torch.allclose(getattr(a, f).float(), getattr(b, f).float(), atol=1e-5), f
    assert D.estimate_cache_bytes(8, target.config) == 8 * 16 * 4 * 64 * 4
    with pytest.raises(ConfigError, match="needs the VQ codebook"):
        train_drafter(target, None, small_cfg(data=data, loss=LossConfig()), tmp_path / "lisa", progress=False)
    # the default loss is EAGLE-3's (docs/drafters.md): it trains without the codebook
    assert TrainConfig().loss == LossConfig(kind="eagle3") and small_cfg().loss.kind == "eagle3"


def test_token_file_formats(tmp_path, target):
    tcfg = target.config
    tok = np.random.default_rng(0).integers(0, 256, (5, 16))
    cls = np.arange(5)
    np.save(tmp_path / "a.npy", np.concatenate([cls[:, None], tok], 1))
    np.save(tmp_path / "b.npy", tok)
    np.save(tmp_path / "b.classes.npy", cls)
    np.savez(tmp_path / "c.npz", tokens=tok, classes=cls)
    torch.save({"tokens": torch.from_numpy(tok), "classes": torch.from_numpy(cls)}, tmp_path / "d.pt")
    for name in ("a.npy", "b.npy", "c.npz", "d.pt"):
        ds = D.load_token_file(tmp_path / name, tcfg)
        assert torch.equal(ds.tokens, torch.from_numpy(tok)) and ds.cond.tolist() == cls.tolist(), name
    np.save(tmp_path / "e.npy", tok)
    with pytest.raises(InputError, match="class ids"):
        D.load_token_file(tmp_path / "e.npy", tcfg)
    np.savez(tmp_path / "f.npz", tokens=tok + 300, classes=cls)
    with pytest.raises(InputError, match=r"\[0, 256\)"):
        D.load_token_file(tmp_path / "f.npz", tcfg)
    np.savez(tmp_path / "g.npz", tokens=tok[:, :10], classes=cls)
    with pytest.raises(InputError, match="expected"):
        D.load_token_file(tmp_path / "g.npz", tcfg)


def test_self_distillation_data(target):
    ds = D.self_distill_tokens(target, 10, cfg_scale=2.0, uncond_frac=0.2, seed=3, batch_size=4, progress=False)
    assert ds.tokens.shape == (10, 16) and (ds.cond == target.config.num_classes).sum() == 2
    again = D.self_distill_tokens(target, 10, cfg_scale=2.0, uncond_frac=0.2, seed=3, batch_size=4, progress=False)
    assert torch.equal(ds.tokens, again.tokens) and torch.equal(ds.cond, again.cond)


def test_batch_order_is_a_function_of_the_step():
    a = D.batch_indices(5, 20, 4, seed=1)
    assert torch.equal(a, D.batch_indices(5, 20, 4, seed=1)) and len(a) == 4
    epoch = torch.cat([D.batch_indices(s, 20, 4, seed=1) for s in range(5)])
    assert sorted(epoch.tolist()) == list(range(20))  # one epoch visits every row once
    ranks = [D.batch_indices(7, 20, 4, seed=1, rank=r, world=2) for r in range(2)]
    assert sorted(torch.cat(ranks).tolist()) == sorted(D.batch_indices(7, 20, 4, seed=1).tolist())
    with pytest.raises(InputError, match="fewer than one global batch"):
        D.batch_indices(0, 3, 4, seed=0)


def test_lr_schedule():
    cfg = TrainConfig(steps=11, warmup_steps=2, min_lr_ratio=0.1)
    f = [T.lr_factor(s, cfg) for s in range(11)]
    assert f[0] == pytest.approx(0.5) and f[1] == pytest.approx(1.0) and f[2] == pytest.approx(1.0)
    assert f[-1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * 8 / 9)))
    assert all(x >= y for x, y in zip(f[1:], f[2:]))


@pytest.mark.slow
def test_ddp_two_ranks_match_single_process(tmp_path, target):
    """torchrun --nproc_per_node 2 (gloo on CPU) == one process with the same global batch."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("ddp_worker.py")
    import lisa_trt

    root = str(Path(lisa_trt.__file__).resolve().parents[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    env.pop("WORLD_SIZE", None)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(worker), str(tmp_path / "ddp")], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len((tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()) == 2  # rank 0 writes once
    cfg = small_cfg(lr=3e-3, loss=LossConfig(kind="eagle3"))
    single = train_drafter(target, torch.zeros(256, 8), cfg, tmp_path / "single", progress=False)
    a, b = _params(tmp_path / "ddp" / "drafter.safetensors", target), _params(single["drafter"], target)
    for k in a:
        assert (a[k] - b[k]).abs().max() < 1e-5, k
