"""models/target_config.py: the named-config registries and the published config classes, which
the generic code and the commands use instead of importing a family's config module."""

import pytest
import torch

import lisa_trt
from lisa_trt.errors import ConfigError
from lisa_trt.families.llamagen import config as L
from lisa_trt.models import target_config as T
from lisa_trt.models.drafter import DrafterConfig
from lisa_trt.models.layers import KVCache


def test_the_family_registers_its_names_and_publishes_its_classes():
    assert {"GPT-B", "GPT-7B", "tiny"} <= set(T.target_names())
    assert T.TargetConfig is L.TargetConfig and T.VQConfig is L.VQConfig
    assert lisa_trt.TargetConfig is L.TargetConfig and lisa_trt.target_config is T.target_config
    assert T.target_config("GPT-L", image_size=384) == L.gpt_config("GPT-L", image_size=384)
    assert T.vq_config("VQ-8") == L.VQConfig(**L.VQ_CONFIGS["VQ-8"])


def test_a_fixed_config_ignores_sizes_and_takes_the_model_type():
    c = T.target_config("tiny", image_size=512, downsample=8, model_type="t2i", cls_token_num=6)
    assert c == L.tiny_config(model_type="t2i", cls_token_num=6) and c.block_size == 16
    assert T.target_config("GPT-B", image_size=512, downsample=8).block_size == 64 * 64


def test_registering_a_name_and_an_unknown_one():
    T.register_target("tiny-wide-test", lambda **kw: L.tiny_config(dim=128, **kw))
    try:
        assert T.target_config("tiny-wide-test", model_type="t2i").dim == 128
        assert "tiny-wide-test" in T.target_names()
    finally:
        del T._TARGETS["tiny-wide-test"]
    with pytest.raises(ConfigError, match="valid names: .*GPT-B.*tiny"):
        T.target_config("GPT-Q")


def test_a_second_class_under_a_published_name_is_refused():
    class TargetConfig:  # another family's class of the same name
        pass

    with pytest.raises(ConfigError, match="two config classes are published as 'TargetConfig'"):
        T.publish_config_type(TargetConfig)
    T.publish_config_type(L.TargetConfig)  # the same class again is no conflict
    with pytest.raises(AttributeError, match="published config classes: .*TargetConfig"):
        T.NoSuchConfig  # noqa: B018


def test_the_cache_and_the_drafter_read_the_shape_protocol_only():
    from types import SimpleNamespace

    shape = SimpleNamespace(model_type="x", dim=32, n_layer=3, n_head=4, vocab_size=10, kv_heads=2, head_dim=8)
    cache = KVCache(shape, batch=2, max_len=8, dtype=torch.float32, device="cpu")
    assert len(cache.k) == 3 and cache.k[0].shape == (2, 2, 8, 8)
    cfg = L.tiny_config()
    assert DrafterConfig.for_target(cfg) == DrafterConfig.for_shape(cfg.drafter_shape())
    with pytest.raises(ConfigError, match="for_shape\\(target.drafter_shape\\(\\)\\)"):
        DrafterConfig.for_target(shape)
