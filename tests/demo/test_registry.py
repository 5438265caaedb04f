"""The `demo` name: shipped files, configs, loading the bundled target and VQ."""

import pytest
import torch

from lisa_trt.models.target_config import target_config, target_names
from lisa_trt.demo import registry
from lisa_trt.errors import CheckpointError

needs_assets = pytest.mark.skipif(not registry.assets_present(),
                                  reason="bundled demo assets not built yet (lisa_trt/assets/demo/; run scripts/demo/*)")


def test_demo_is_a_registered_target_name():
    assert "demo" in target_names()


def test_missing_assets_error_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "DEMO_DIR", tmp_path)
    with pytest.raises(CheckpointError, match="recipe"):
        registry.demo_paths(check=True)


@needs_assets
def test_bundle_is_small():
    total = sum(p.stat().st_size for p in registry.DEMO_DIR.iterdir() if p.is_file())
    assert total < 50e6


@needs_assets
def test_load_bundled_target_and_vq():
    from lisa_trt.models.checkpoints import load_target, load_vq

    tgt = registry.load_demo_target()
    cfg = tgt.config
    assert cfg == target_config("demo")
    assert cfg.n_layer >= 8 and cfg.num_classes == len(registry.class_names())
    vq = registry.load_demo_vq()
    assert vq.config.codebook_size == cfg.vocab_size
    assert 64 // vq.config.downsample == cfg.grid_size
    # name resolution through the generic loaders
    assert torch.equal(load_target("demo").output.weight, tgt.output.weight)
    assert torch.equal(load_vq("demo").codebook(), vq.codebook())
    s = registry.demo_sampling()
    assert s.cfg_scale >= 1.0


@needs_assets
def test_bundled_target_predicts_its_own_tokens():
    """Real (non-random) distributions: teacher-forced loss on real VQ tokens is far below log(V)."""
    import math

    from lisa_trt.demo.data import demo_images, to_float

    tgt, vq = registry.load_demo_target(), registry.load_demo_vq()
    x, y = demo_images("heldout", 1, seed=5)
    with torch.no_grad():
        toks = vq.encode(to_float(x))
        logits = tgt.teacher_forced_logits(y, toks)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), toks.reshape(-1)).item()
    assert ce < 0.8 * math.log(tgt.config.vocab_size)
