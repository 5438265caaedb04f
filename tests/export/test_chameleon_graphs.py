"""Chameleon target graphs through ONNX Runtime vs the torch target: a left-padded prefill with
the CFG-style unconditional row, then a draft-tree verify step, with the static KV cache
updated in place (same buffers, same contents as torch's cache)."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import lisa_trt  # noqa: E402
from chameleon_fixtures import save_model_dir  # noqa: E402


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from lumina_calls import load_chameleon_engines
    from lisa_trt.families.chameleon.export import export_chameleon

    root = tmp_path_factory.mktemp("cham_graphs")
    d = save_model_dir(root / "model", seed=7, vq=False, num_key_value_heads=2)
    target = lisa_trt.load_target(d)
    man = export_chameleon(target, None, None, None, d, root / "eng", image_size=32, max_prompt=16, max_tree=8)
    assert set(man.graphs) == {"target_prefill", "target_verify"}
    from lisa_trt.export.manifest import bundle_family

    assert man.family == "chameleon" and bundle_family(root / "eng") == "chameleon"
    for g in man.graphs.values():  # validated against the torch target's prefill / forward_tokens
        assert g.validation["ok"] and g.validation["max_error"] < 1e-4, g.validation
    return target, load_chameleon_engines(root / "eng", threads=1)


def test_prefill_and_tree_verify_match_torch(engines):
    target, eng = engines
    ort_t = eng.target
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 96, (3, 9), generator=g)
    valid = torch.ones(3, 9, dtype=torch.bool)
    valid[1, :4] = False  # a shorter prompt, left-padded
    valid[2, :6] = False  # the "unconditional" row: 3 tokens from position 0
    L = ort_t.max_cache_len
    tc, oc = target.new_cache(3, L), ort_t.new_cache(3, L)
    assert tc.max_len == oc.max_len == L
    a, b = target.prefill(ids, tc, valid, taps=True), ort_t.prefill(ids, oc, valid, taps=True)
    assert b.logits.shape == (3, 1, 96) and torch.allclose(a.logits, b.logits, atol=1e-4)
    assert torch.allclose(a.taps, b.taps, atol=1e-4)
    ptrs = [t.data_ptr() for t in oc.k + oc.v]
    # a 4-node tree: root, two children of the root, one grandchild
    anc = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    toks = torch.randint(0, 96, (3, 4), generator=g)
    depth = torch.tensor([0, 1, 1, 2])
    slots = tc.lengths[:, None] + torch.arange(4)[None]
    pos = tc.positions(tc.lengths[:, None]) + depth[None]
    mask = tc.attention_mask(slots, anc[None].expand(3, 4, 4))
    a = target.forward_tokens(toks, pos, slots, mask, tc, taps=True)
    b = ort_t.forward_tokens(toks, pos, slots, mask, oc, taps=True)
    assert torch.allclose(a.logits, b.logits, atol=1e-4) and torch.allclose(a.taps, b.taps, atol=1e-4)
    assert [t.data_ptr() for t in oc.k + oc.v] == ptrs  # updated in place
    for x, y in zip(tc.k + tc.v, oc.k + oc.v):
        assert torch.allclose(x, y, atol=1e-4)


def test_runner_errors_are_clear(engines):
    target, eng = engines
    with pytest.raises(lisa_trt.LisaError, match="static length"):
        eng.target.new_cache(1, eng.target.max_cache_len + 1)
    cache = eng.target.new_cache(1, 8)
    with pytest.raises(lisa_trt.LisaError, match="token ids"):
        eng.target.prefill(torch.tensor([[1, 200]]), cache)
    with pytest.raises(lisa_trt.LisaError, match="left-padded"):
        eng.target.prefill(torch.tensor([[1, 2]]), cache, torch.tensor([[True, False]]))
