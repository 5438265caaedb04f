"""The EAGLE-3 drafter: cached steps == concatenated-key steps, tree expansion, artifacts."""

import pytest
import torch

from lisa_trt.errors import ArtifactMismatchError, CheckpointError, ConfigError, InputError
from lisa_trt.io import load_safetensors, save_safetensors
from lisa_trt.models.checkpoints import target_hash
from lisa_trt.models.drafter import Drafter, DrafterConfig, load_drafter, read_drafter_config
from lisa_trt.testing import make_target

torch.set_num_threads(1)  # tiny ops: thread hand-off costs more than the math on a shared CPU


def _drafter(seed=0, **kw):
    t = make_target(seed=seed)
    torch.manual_seed(seed + 100)
    return t, Drafter.from_target(t, target_name="tiny", **kw).eval()


def _entries(d, B, S, seed=0):
    g = torch.Generator().manual_seed(seed)
    cfg = d.config
    hidden = torch.randn(B, S, cfg.hidden, generator=g)
    tokens = torch.randint(0, cfg.vocab_size, (B, S), generator=g)
    return hidden, tokens


def test_config_for_target_and_round_trip():
    t, d = _drafter()
    c = d.config
    assert (c.hidden, c.n_head, c.tap_dim, c.vocab_size) == (64, 4, 192, 256)
    assert c.target_hash == target_hash(t) and c.target_name == "tiny"
    assert DrafterConfig.from_dict(c.to_dict()) == c
    narrow = DrafterConfig.for_target(t.config, hidden=32, n_head=2)
    assert narrow.head_dim == 16 and narrow.target_dim == 64
    with pytest.raises(ConfigError, match="multiple of 4"):
        DrafterConfig.for_target(t.config, hidden=36, n_head=6)
    with pytest.raises(ConfigError, match="unknown DrafterConfig"):
        DrafterConfig.from_dict({**c.to_dict(), "bogus": 1})


def test_parameters_exclude_the_frozen_target_embedding():
    t, d = _drafter()
    names = dict(d.named_parameters())
    assert "embed_weight" not in d.state_dict() and all("embed" not in n for n in names)
    assert d.embed_weight.data_ptr() == t.tok_embeddings.weight.data_ptr()  # shared, not copied
    assert set(d.state_dict()) >= {"fc.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight",
                                   "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight"}
    assert d.midlayer.self_attn.q_proj.weight.shape == (64, 128)  # q/k/v read concat(e, a): 2H
    # init_head_from_target copies the head (warm start)
    assert torch.equal(d.lm_head.weight, t.output.weight)


def test_cached_sequential_steps_equal_one_causal_pass():
    """Entries decoded one at a time through the static cache == one forward_kv with a causal mask."""
    t, d = _drafter()
    B, S, C = 2, 6, d.config.cls_token_num
    hidden, tokens = _entries(d, B, S)
    pos = (C + torch.arange(S))[None].expand(B, S)
    with torch.no_grad():
        ref_logits, ref_hidden, _, _ = d.forward_kv(hidden, tokens, pos, None, None,
                                                    torch.ones(S, S, dtype=torch.bool).tril()[None])
        cache = d.new_cache(B, d.config.seq_len)
        cache.lengths.fill_(C)
        assert not cache.col_valid[:, :C].any() and cache.col_valid[:, C:].all()
        outs = []
        for i in range(S):
            slots = cache.lengths[:, None]
            mask = cache.attention_mask(slots, torch.ones(B, 1, 1, dtype=torch.bool))
            lg, hd = d(hidden[:, i:i + 1], tokens[:, i:i + 1], pos[:, i:i + 1], slots, mask, cache)
            outs.append((lg, hd))
            cache.lengths += 1
    got_logits = torch.cat([o[0] for o in outs], 1)
    got_hidden = torch.cat([o[1] for o in outs], 1)
    assert got_logits.dtype == torch.float32 and got_logits.shape == (B, S, 256)
    assert (got_logits - ref_logits).abs().max() < 1e-5
    assert (got_hidden - ref_hidden).abs().max() < 1e-5
    assert ref_logits.std() > 0.05


def test_tree_expansion_on_scratch_slots():
    """K beam nodes written to scratch slots see the committed prefix + their ancestors only."""
    t, d = _drafter(seed=1)
    B, P, C = 2, 5, d.config.cls_token_num
    hidden, tokens = _entries(d, B, P + 3, seed=3)
    pos_prefix = (C + torch.arange(P))[None].expand(B, P)
    with torch.no_grad():
        cache = d.new_cache(B, d.config.seq_len + 8)
        cache.lengths.fill_(C)
        slots = pos_prefix
        mask = cache.attention_mask(slots, torch.ones(P, P, dtype=torch.bool).tril()[None].expand(B, P, P))
        _, h_prefix = d(hidden[:, :P], tokens[:, :P], pos_prefix, slots, mask, cache)
        cache.lengths += P
        # a chain of depth 2 (node 1 is the child of node 0) plus a sibling of node 0 (node 2)
        anc = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)[None].expand(B, 3, 3)
        node_tok = tokens[:, P:]
        node_pos = torch.tensor([P, P + 1, P])[None].expand(B, 3) + C
        scratch = cache.lengths[:, None] + torch.arange(3)[None]
        node_hidden = torch.stack([h_prefix[:, -1], hidden[:, P + 1], h_prefix[:, -1]], 1)
        tmask = cache.attention_mask(scratch, anc)
        lg, _ = d(node_hidden, node_tok, node_pos, scratch, tmask, cache)
        # reference: each root->node path run as its own causal sequence without a cache
        for node, path in ((0, [0]), (1, [0, 1]), (2, [2])):
            h = torch.cat([hidden[:, :P], node_hidden[:, path]], 1)
            x = torch.cat([tokens[:, :P], node_tok[:, path]], 1)
            p = torch.cat([pos_prefix, node_pos[:, path]], 1)
            L = x.shape[1]
            ref, _, _, _ = d.forward_kv(h, x, p, None, None, torch.ones(L, L, dtype=torch.bool).tril()[None])
            assert (lg[:, node] - ref[:, -1]).abs().max() < 1e-5
        # compact the accepted path (nodes 0 and 1): the cache holds their K/V contiguously
        k_nodes = cache.k[0].gather(2, scratch[:, None, :2, None].expand(B, d.config.n_head, 2, d.config.head_dim))
        cache.compact(scratch[:, :2], torch.tensor([2, 1]))
        assert cache.lengths.tolist() == [C + P + 2, C + P + 1]
        start = C + P
        assert torch.equal(cache.k[0][0, :, start:start + 2], k_nodes[0])
        assert torch.equal(cache.k[0][1, :, start:start + 1], k_nodes[1, :, :1])


def test_embedding_gets_no_gradient_and_positions_are_checked():
    t, d = _drafter()
    d.train()
    hidden, tokens = _entries(d, 1, 3)
    pos = (1 + torch.arange(3))[None]
    logits, _, _, _ = d.forward_kv(hidden, tokens, pos, None, None, torch.ones(3, 3, dtype=torch.bool).tril()[None])
    logits.sum().backward()
    assert t.tok_embeddings.weight.grad is None and d.fc.weight.grad is None  # fc unused: hidden given
    assert d.midlayer.self_attn.q_proj.weight.grad is not None
    with pytest.raises(InputError, match="past the end"):
        d.forward_kv(hidden, tokens, pos + d.config.seq_len, None, None,
                     torch.ones(3, 3, dtype=torch.bool).tril()[None])
    with pytest.raises(InputError, match="token ids"):
        d.forward_kv(hidden, tokens + 1000, pos, None, None, torch.ones(3, 3, dtype=torch.bool).tril()[None])
    taps = torch.randn(1, 3, 192)
    assert d.project_taps(taps).shape == (1, 3, 64)


def test_save_load_round_trip(tmp_path):
    t, d = _drafter()
    with torch.no_grad():
        d.fc.weight.add_(0.5)
    path = tmp_path / "drafter.safetensors"
    d.save(path)
    tensors, meta = load_safetensors(path)
    assert "embed_weight" not in tensors and "freqs_cis" not in tensors
    assert meta["config"]["target_hash"] == target_hash(t)
    assert read_drafter_config(path) == d.config
    d2 = load_drafter(path, t)
    for k, v in d.state_dict().items():
        assert torch.equal(v, d2.state_dict()[k]), k
    hidden, tokens = _entries(d, 1, 4)
    pos = (1 + torch.arange(4))[None]
    m = torch.ones(4, 4, dtype=torch.bool).tril()[None]
    with torch.no_grad():
        assert torch.equal(d.forward_kv(hidden, tokens, pos, None, None, m)[0],
                           Drafter.load(path, t).forward_kv(hidden, tokens, pos, None, None, m)[0])


def test_drafter_for_another_target_is_refused(tmp_path):
    t, d = _drafter()
    path = tmp_path / "drafter.safetensors"
    d.save(path)
    other = make_target(seed=5)
    with pytest.raises(ArtifactMismatchError, match="trained for target hash") as e:
        load_drafter(path, other)
    assert target_hash(other) in str(e.value) and "lisa-trt train" in str(e.value)
    save_safetensors({"x": torch.zeros(1)}, tmp_path / "other.safetensors", metadata={"kind": "tables"})
    with pytest.raises(CheckpointError, match="not a lisa-trt drafter"):
        load_drafter(tmp_path / "other.safetensors", t)
