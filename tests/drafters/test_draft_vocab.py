"""Reduced draft vocabulary: d2t counted on the data, mapped back to target ids, saved, exported."""

import json

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.errors import ConfigError
from lisa_trt.models.draft_vocab import (OUT_OF_VOCAB_LOGIT, build_d2t, config_step_flops, coverage, restrict,
                                         to_full_vocab)
from lisa_trt.models.drafter import Drafter, load_drafter, save_drafter
from lisa_trt.speculative.decode import SpecConfig, SpeculativeDecoder
from lisa_trt.testing import make_target
from lisa_trt.speculative.methods import get_method

torch.set_num_threads(1)


def test_build_d2t_keeps_the_most_frequent_codes():
    toks = torch.tensor([5, 5, 5, 2, 2, 9, 1, 1, 1, 1])
    assert build_d2t(toks, 10, 2).tolist() == [1, 5]
    assert build_d2t(toks, 10, 3).tolist() == [1, 2, 5]
    assert build_d2t(toks, 10, 10).tolist() == list(range(10))
    assert coverage(toks, torch.tensor([1, 5])) == pytest.approx(0.7)
    with pytest.raises(ConfigError, match="draft-vocab"):
        build_d2t(toks, 10, 11)


def test_full_vocab_mapping_and_restriction():
    d2t = torch.tensor([1, 4, 6])
    small = torch.tensor([[0.5, -1.0, 2.0]])
    full = to_full_vocab(small, d2t, 8)
    assert full.shape == (1, 8)
    assert full[0, [1, 4, 6]].tolist() == small[0].tolist()
    assert (full[0, [0, 2, 3, 5, 7]] == OUT_OF_VOCAB_LOGIT).all()
    # CFG of two mapped rows stays finite and keeps the out-of-vocab codes out
    g = full + 2.0 * (full - full)
    assert torch.isfinite(g).all() and torch.softmax(g, -1)[0, 0] == 0
    t = torch.randn(3, 8)
    tr, sr, cb = restrict(t, full.expand(3, 8), d2t, torch.randn(8, 2))
    assert tr.shape == (3, 3) and sr.shape == (3, 3) and cb.shape == (3, 2)


def _reduced_drafter(target, n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    d2t = torch.randperm(target.config.vocab_size, generator=g)[:n].sort().values
    torch.manual_seed(seed)
    return Drafter.from_target(target, d2t=d2t).eval(), d2t


def test_reduced_head_proposes_only_draft_codes_and_round_trips(tmp_path):
    target = make_target(std=0.3)
    drafter, d2t = _reduced_drafter(target)
    assert drafter.lm_head.weight.shape[0] == 64 and drafter.config.draft_vocab == 64
    # warm start: the head rows are the target's rows d2t
    assert torch.equal(drafter.lm_head.weight, target.output.weight[d2t])
    save_drafter(drafter, tmp_path / "d.safetensors")
    back = load_drafter(tmp_path / "d.safetensors", target)
    assert torch.equal(back.d2t, d2t)
    assert json.loads((tmp_path / "d.json").read_text())["config"]["draft_vocab"] == 64
    cond = torch.tensor([0, 3])
    dec = SpeculativeDecoder(target, back)
    seen = []
    orig = back.forward

    def spy(*a, **k):
        lo, h = orig(*a, **k)
        seen.append(lo.topk(4, -1).indices.flatten())
        return lo, h

    back.forward = spy
    dec.generate(cond, sampling=SamplingConfig(cfg_scale=2.0), method=get_method("exact"), spec=SpecConfig.make("exact", top_k=3, depth=2,
                                                                                total_tokens=8), seed=0)
    proposed = torch.cat(seen).unique()
    assert torch.isin(proposed, d2t).all()


def test_training_with_a_draft_vocab(tmp_path):
    from lisa_trt.train import DataConfig, TrainConfig, train_drafter

    import torch.nn.functional as F

    target = make_target(seed=0)
    codebook = F.normalize(torch.randn(256, 8, generator=torch.Generator().manual_seed(7)), dim=-1)
    cfg = TrainConfig(steps=2, batch_size=4, ttt_steps=2, warmup_steps=1, checkpoint_every=2, log_every=1,
                      draft_vocab=32, data=DataConfig(num_samples=8, eval_samples=2, gen_batch=8, cfg_scale=2.0))
    res = train_drafter(target, codebook, cfg, tmp_path, progress=False)
    d = load_drafter(res["drafter"], target)
    assert d.config.draft_vocab == 32 and d.d2t.numel() == 32
    from lisa_trt.train.data import load_safetensors

    toks = load_safetensors(tmp_path / "data" / "selfdistill.safetensors")[0]["tokens"][:-2]
    assert torch.equal(d.d2t, build_d2t(toks, 256, 32))
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(0 < r["in_vocab_mass_0"] <= 1 and r["loss"] == r["loss"] for r in lines)


def test_cost_model_counts_the_head():
    target = make_target(std=0.3)
    full = Drafter.from_target(target).config
    small, _ = _reduced_drafter(target, n=32)
    assert config_step_flops(small.config, 10) < config_step_flops(full, 10)
    from lisa_trt.runtime.autotune import draft_cost_for_head

    cost = draft_cost_for_head(lambda n: 1e-3 * n, full, small.config)
    assert cost(10) < 1e-2


def test_export_and_ort_keep_the_interface(tmp_path):
    pytest.importorskip("onnxruntime")
    from lisa_trt.engines.ort import load_ort_engines
    from lisa_trt.export import export_bundle

    target = make_target(std=0.3)
    drafter, d2t = _reduced_drafter(target)
    export_bundle(target, drafter, None, None, tmp_path / "e", max_tree=8, lint=False, progress=False)
    eng = load_ort_engines(tmp_path / "e", threads=1)
    cond = torch.tensor([1])
    s, spec = SamplingConfig(cfg_scale=2.0, greedy=True), SpecConfig.make("exact", top_k=2, depth=2, total_tokens=6)
    a, sa = SpeculativeDecoder(eng.target, eng.drafter).generate(cond, sampling=s, method=get_method(spec.method), spec=spec)
    b, sb = SpeculativeDecoder(target, drafter).generate(cond, sampling=s, method=get_method(spec.method), spec=spec)
    assert torch.equal(a, b) and sa.mal == pytest.approx(sb.mal)
