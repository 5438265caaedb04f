"""Chameleon-architecture target vs transformers on tiny random checkpoints (fp32).

Proves: raw-head logits within 1e-4 of HF for several configs (swin_norm, GQA, biases, linear
RoPE scaling, tied head); KV-cached greedy == full-recompute greedy == HF greedy over the raw
head; tree-style masked verification matches sequential decoding; sharded checkpoints load;
wrong directories and mismatched weights fail with clear errors.
"""

import json

import pytest
import torch

import lisa_trt
from lisa_trt import LisaError

pytest.importorskip("transformers")

from chameleon_fixtures import (N_CODES, hf_greedy_raw, hf_raw_logits, make_hf_model,  # noqa: E402
                                save_hf)

CONFIGS = {
    "plain": {},
    "swin": {"swin_norm": True},
    "gqa": {"num_key_value_heads": 2},
    "swin_gqa_bias": {"swin_norm": True, "num_key_value_heads": 1, "attention_bias": True, "mlp_bias": True},
    "rope_linear": {"rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}},
    "tied": {"tie_word_embeddings": True},
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    hf = make_hf_model(seed=len(request.param), **CONFIGS[request.param])
    d = save_hf(hf, tmp_path_factory.mktemp(request.param))
    return hf, lisa_trt.load_target(str(d)), d


def _ids(B=2, T=9, seed=1):
    return torch.randint(0, 96, (B, T), generator=torch.Generator().manual_seed(seed))


def test_logits_match_transformers_raw_head(pair):
    hf, target, _ = pair
    ids = _ids()
    ours = lisa_trt.teacher_forced_logits(target, ids)
    ref = hf_raw_logits(hf, ids)
    assert ours.shape == (2, 9, 96) and ours.dtype == torch.float32
    assert (ours - ref).abs().max().item() < 1e-4
    # the raw head keeps image tokens, which HF's forward masks for text generation
    masked = hf(input_ids=ids).logits
    assert torch.isfinite(ours[..., 4:4 + N_CODES]).all()
    assert (masked[..., 4:4 + N_CODES] < -1e30).all()


def test_cached_greedy_equals_full_recompute_and_hf(pair):
    hf, target, _ = pair
    ids = _ids(T=5, seed=2)
    new = lisa_trt.generate(target, ids, max_new_tokens=12, greedy=True, image_tokens_only=False)
    assert new.shape == (2, 12)
    full = ids
    for _ in range(12):
        nxt = lisa_trt.teacher_forced_logits(target, full)[:, -1].argmax(-1, keepdim=True)
        full = torch.cat([full, nxt], 1)
    assert torch.equal(new, full[:, 5:])
    assert torch.equal(new, hf_greedy_raw(hf, ids, 12))
    kw = lisa_trt.generate(target, input_ids=ids, max_new_tokens=3, greedy=True)
    assert torch.equal(kw, new[:, :3])
    assert torch.equal(lisa_trt.teacher_forced_logits(target, input_ids=ids), lisa_trt.teacher_forced_logits(target, ids))


def test_image_tokens_only_restricts_to_codes(pair):
    _, target, _ = pair
    new = lisa_trt.generate(target, _ids(T=4), max_new_tokens=6, greedy=True, image_tokens_only=True)
    assert ((new >= 4) & (new < 4 + N_CODES)).all()
    sampled = lisa_trt.generate(target, _ids(T=4), max_new_tokens=6, greedy=False, image_tokens_only=True,
                                seed=3, top_k=5)
    assert ((sampled >= 4) & (sampled < 4 + N_CODES)).all()


def test_left_padded_batch_matches_unpadded_rows(pair):
    _, target, _ = pair
    a, b = _ids(1, 7, seed=4), _ids(1, 4, seed=5)
    padded = torch.cat([a, torch.cat([torch.zeros(1, 3, dtype=torch.long), b], 1)])
    valid = torch.ones(2, 7, dtype=torch.bool)
    valid[1, :3] = False
    both = lisa_trt.generate(target, (padded, valid), max_new_tokens=6, greedy=True)
    assert torch.equal(both[0], lisa_trt.generate(target, a, max_new_tokens=6, greedy=True)[0])
    assert torch.equal(both[1], lisa_trt.generate(target, b, max_new_tokens=6, greedy=True)[0])


def test_tree_mask_verification_matches_sequential(pair):
    """A branching tree verified in one forward gives each node its path's logits."""
    _, target, _ = pair
    ids = _ids(1, 6, seed=6)
    cache = target.new_cache(1, 32)
    target.prefill(ids, cache)
    # nodes: 0 root child a; 1 child of 0; 2 sibling of 0 (second branch)
    tok = torch.tensor([[10, 11, 12]])
    anc = torch.tensor([[[1, 0, 0], [1, 1, 0], [0, 0, 1]]], dtype=torch.bool)
    depth = torch.tensor([[0, 1, 0]])
    slots = cache.lengths[:, None] + torch.arange(3)[None]
    logits = target.forward_tokens(tok, cache.positions(cache.lengths[:, None] + depth), slots,
                                   cache.attention_mask(slots, anc), cache).logits
    full = lisa_trt.teacher_forced_logits
    assert torch.allclose(logits[0, 1], full(target, torch.cat([ids, tok[:, :2]], 1))[0, -1], atol=1e-5)
    assert torch.allclose(logits[0, 2], full(target, torch.cat([ids, tok[:, 2:]], 1))[0, -1], atol=1e-5)


def test_sharded_checkpoint_loads(tmp_path):
    hf = make_hf_model(seed=7, num_key_value_heads=2)
    d = save_hf(hf, tmp_path / "sharded", max_shard_size="20KB")
    assert (d / "model.safetensors.index.json").is_file()
    assert len(list(d.glob("model-*.safetensors"))) > 1
    target = lisa_trt.load_target(str(d))
    ids = _ids()
    assert (lisa_trt.teacher_forced_logits(target, ids) - hf_raw_logits(hf, ids)).abs().max() < 1e-4


def test_transformers4_config_layout_and_bf16_weights(tmp_path):
    """config.json as transformers 4.x wrote it (rope_theta / rope_scaling) and bf16 shards."""
    hf = make_hf_model(seed=9, num_key_value_heads=2)
    d = save_hf(hf.to(torch.bfloat16), tmp_path / "old")
    cfg = json.loads((d / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg.update(rope_theta=rope["rope_theta"], rope_scaling=None, torch_dtype="bfloat16")
    (d / "config.json").write_text(json.dumps(cfg))
    target = lisa_trt.load_target(d)
    assert target.lm_head.weight.dtype == torch.float32
    ids = _ids()
    from transformers import ChameleonForConditionalGeneration

    hf = ChameleonForConditionalGeneration.from_pretrained(str(d), dtype=torch.float32).eval()
    ref = hf_raw_logits(hf, ids)  # the same bf16-rounded weights, computed in fp32
    assert (lisa_trt.teacher_forced_logits(target, ids) - ref).abs().max() < 1e-4
    cfg["rope_scaling"] = {"type": "dynamic", "factor": 2.0}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LisaError, match="RoPE scaling 'dynamic' is not supported"):
        lisa_trt.load_target(d)


def test_wrong_directories_fail_clearly(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LisaError, match="no config.json"):
        lisa_trt.load_target(str(empty))
    other = tmp_path / "llama"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(LisaError, match="model_type 'llama'"):
        lisa_trt.load_target(str(other))
    noweights = tmp_path / "noweights"
    make_hf_model().config.save_pretrained(str(noweights))
    with pytest.raises(LisaError, match="no model.safetensors"):
        lisa_trt.load_target(str(noweights))


def test_mismatched_weights_name_the_implied_config(tmp_path):
    d = save_hf(make_hf_model(num_key_value_heads=2), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_key_value_heads"], cfg["num_hidden_layers"] = 4, 3
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LisaError) as e:
        lisa_trt.load_target(str(d))
    msg = str(e.value)
    assert "missing keys: model.layers.2." in msg and "shape mismatches" in msg
    assert "num_hidden_layers=2" in msg and "num_key_value_heads=2" in msg


def test_unexpected_keys_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    d = save_hf(make_hf_model(), tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    sd["model.layers.0.self_attn.extra.weight"] = torch.zeros(2)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(LisaError, match="unexpected keys: model.layers.0.self_attn.extra.weight"):
        lisa_trt.load_target(str(d))


def test_llamagen_generate_unchanged():
    from lisa_trt.testing import make_cond, make_target

    m = make_target("c2i")
    out = lisa_trt.generate(m, make_cond(m), greedy=True, num_tokens=4)
    assert out.shape[1] == 4
