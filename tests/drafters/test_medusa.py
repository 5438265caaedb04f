"""Medusa heads: model, the decode loop adapter, training (plain and LISA); in a bundle: test_medusa_bundle.py."""

import json

import pytest
import torch
import torch.nn.functional as F

from lisa_trt import generate
from lisa_trt.config import SamplingConfig
from lisa_trt.errors import ArtifactMismatchError, ConfigError
from lisa_trt.models.medusa import MedusaConfig, MedusaHeads, load_medusa, save_medusa
from lisa_trt.speculative.decode import SpecConfig, SpeculativeDecoder
from lisa_trt.speculative.medusa import medusa_pair
from lisa_trt.testing import make_target
from lisa_trt.speculative.methods import get_method

torch.set_num_threads(1)


def test_fresh_heads_equal_the_target_head_and_depth_selects_the_head():
    t = make_target(std=0.3)
    m = MedusaHeads.from_target(t, n_heads=3)
    h = torch.randn(2, 5, t.config.dim)
    out = m(h)
    assert out.shape == (2, 5, 3, t.config.vocab_size)
    assert torch.allclose(out[:, :, 0], t.output(h).float(), atol=1e-5)
    with torch.no_grad():
        m.heads[1].weight.mul_(2.0)
    depth = torch.tensor([[0, 1, 2, 3, 1]] * 2)
    lo = m.head_logits(h, depth)
    assert torch.allclose(lo[:, 1], m(h)[:, 1, 1]) and torch.allclose(lo[:, 0], m(h)[:, 0, 0])
    assert (lo[:, 3] == 0).all()  # past the last head: flat


@pytest.mark.parametrize("cfg_scale", [1.0, 2.0])
def test_greedy_medusa_speculation_is_token_identical(cfg_scale, check_stats):
    t = make_target(std=0.3)
    cond = torch.tensor([1, 5])
    ref = generate(t, cond, cfg_scale=cfg_scale, greedy=True)
    proxy, dr = medusa_pair(t, MedusaHeads.from_target(t, n_heads=3).eval())
    toks, st = SpeculativeDecoder(proxy, dr).generate(cond, sampling=SamplingConfig(cfg_scale=cfg_scale, greedy=True),
                                                      method=get_method("exact"), spec=SpecConfig.make("exact", top_k=2, depth=2, total_tokens=6))
    assert torch.equal(toks, ref)
    check_stats(st, toks)


@pytest.mark.parametrize("loss", ["eagle3", "lisa"])
def test_train_save_and_load(tmp_path, loss):
    from lisa_trt.train import DataConfig, LossConfig, TrainConfig
    from lisa_trt.train.medusa import train_medusa

    t = make_target(seed=0)
    codebook = F.normalize(torch.randn(256, 8, generator=torch.Generator().manual_seed(7)), dim=-1)
    cfg = TrainConfig(steps=3, batch_size=4, warmup_steps=1, log_every=1, loss=LossConfig(kind=loss),
                      data=DataConfig(num_samples=8, eval_samples=2, gen_batch=8, cfg_scale=2.0))
    res = train_medusa(t, codebook, cfg, tmp_path, n_heads=2, progress=False)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3] and all(len(r["top1_h"]) == 2 for r in lines)
    assert len(res["eval"]["accept_h"]) == 2
    assert load_medusa(res["drafter"], t).config.n_heads == 2  # saved for this target, loads


def test_artifact_checks(tmp_path):
    t = make_target(seed=0)
    m = MedusaHeads.from_target(t, n_heads=2)
    save_medusa(m, tmp_path / "m.safetensors")
    with pytest.raises(ArtifactMismatchError):
        load_medusa(tmp_path / "m.safetensors", make_target(seed=1))
    with pytest.raises(ConfigError):
        MedusaHeads.from_target(t, n_heads=0)


def test_bundled_demo_medusa_lisa_loads_by_name_and_decodes():
    from lisa_trt.artifacts import load_drafter_by_name
    from lisa_trt.models.artifact_sets import bundled_file
    from lisa_trt.demo.registry import assets_present, demo_sampling, load_demo_target
    from lisa_trt.speculative.medusa import speculative_engines

    if not (assets_present() and bundled_file("demo-medusa-lisa", "drafters") is not None
            and bundled_file("demo-medusa-lisa", "drafters").is_file()):
        pytest.skip("demo assets not present")
    target = load_demo_target()
    heads = load_drafter_by_name("demo-medusa-lisa", target)
    assert isinstance(heads, MedusaHeads) and heads.config.n_heads == 4
    ref = generate(target, torch.tensor([2]), cfg_scale=2.0, greedy=True)[:, :24]
    toks, st = SpeculativeDecoder(*speculative_engines(target, heads)).generate(
        torch.tensor([2]), sampling=SamplingConfig(cfg_scale=2.0, greedy=True),
        method=get_method("exact"), spec=SpecConfig.make("exact", top_k=3, depth=3, total_tokens=10), num_tokens=24)
    assert torch.equal(toks, ref) and st.mal > 1.0


# ----------------------------------------------------------------------------- a layout's vocabulary

def test_heads_over_allowed_ids_warm_start_scatter_and_round_trip(tmp_path):
    """With a layout's allowed ids (d2t) the heads predict those ids only: warm-started from the
    target rows d2t, scattered back to head-vocabulary logits (out-of-vocabulary elsewhere), saved
    and loaded with their map."""
    from lisa_trt.models.draft_vocab import OUT_OF_VOCAB_LOGIT

    t = make_target(std=0.3)
    ids = torch.tensor([3, 7, 8, 20, 100])
    m = MedusaHeads.from_target(t, n_heads=2, d2t=ids)
    assert m.config.draft_vocab == 5 and m.heads[0].weight.shape == (5, t.config.dim)
    h = torch.randn(1, 4, t.config.dim)
    full, own = m(h), m.draft_logits(h)
    assert full.shape == (1, 4, 2, t.config.vocab_size) and own.shape == (1, 4, 2, 5)
    assert torch.allclose(full[..., ids], own)
    assert torch.allclose(own[:, :, 0], t.output(h)[..., ids].float(), atol=1e-5)  # warm start: the target rows
    rest = torch.ones(t.config.vocab_size, dtype=torch.bool)
    rest[ids] = False
    assert (full[..., rest] == OUT_OF_VOCAB_LOGIT).all()
    lo = m.head_logits(h, torch.tensor([[0, 1, 2, 1]]))
    assert torch.allclose(lo[:, 1, ids], own[:, 1, 1]) and (lo[:, 2, ids] == 0).all()  # past the last head: flat
    save_medusa(m, tmp_path / "m.safetensors")
    back = load_medusa(tmp_path / "m.safetensors", t)
    assert torch.equal(back.d2t, ids) and torch.equal(back.head_logits(h, torch.tensor([[0, 1, 2, 1]])), lo)
    with pytest.raises(ConfigError, match="ascending"):
        MedusaHeads.from_target(t, n_heads=2, d2t=torch.tensor([7, 3]))


def test_head_losses_skip_forced_indices_and_compare_over_the_allowed_ids():
    """Head i's entry j predicts index j + 1 + i: no loss where the layout forces that index, and the
    teacher is read over the allowed ids only (changing its logits elsewhere changes nothing)."""
    import types

    from lisa_trt.train import LossConfig, TrainConfig
    from lisa_trt.train.medusa import head_pairs, medusa_loss
    from lisa_trt.train.trainer import TrainVocab

    g = torch.Generator().manual_seed(0)
    V, N, dim, ids = 12, 7, 8, torch.tensor([1, 2, 4, 5, 9])
    m = MedusaHeads(MedusaConfig(dim=dim, vocab_size=V, n_heads=3, draft_vocab=5), d2t=ids)
    trained = torch.tensor([True, True, False, True, True, False, True])  # indices 2 and 5 forced
    vocab = TrainVocab(ids, trained)
    batch = types.SimpleNamespace(tokens=torch.zeros(2, N, dtype=torch.long), logits=torch.randn(2, N, V, generator=g),
                                  hidden=torch.randn(2, N, dim, generator=g))
    pairs = head_pairs(m, batch, vocab)
    for i, t_l, s_l in pairs:
        want = int(trained[1 + i: N].sum()) * 2  # entries j = 0 .. N-2-i whose index j + 1 + i is trained
        assert t_l.shape == s_l.shape == (want, 5)
    cfg = TrainConfig(steps=1, loss=LossConfig(kind="eagle3"))
    loss, st = medusa_loss(m, batch, cfg, vocab=vocab)
    other = types.SimpleNamespace(**vars(batch))
    other.logits = batch.logits.clone()
    other.logits[:, [2, 5]] = 50 * torch.randn(2, 2, V, generator=g)  # forced indices
    out = torch.ones(V, dtype=torch.bool)
    out[ids] = False
    other.logits[..., out] += 9.0  # ids the layout never samples
    assert torch.allclose(medusa_loss(m, other, cfg, vocab=vocab)[0], loss)
    assert len(st["loss_h"]) == 3
    all_forced = TrainVocab(ids, torch.zeros(N, dtype=torch.bool))
    with pytest.raises(ConfigError, match="forced"):
        medusa_loss(m, batch, cfg, vocab=all_forced)
