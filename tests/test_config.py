import pytest

from lisa_trt import LisaError, TargetConfig, VQConfig
from lisa_trt.models.target_config import target_config, vq_config


@pytest.mark.parametrize("name,layers,heads,dim,hidden", [
    ("GPT-B", 12, 12, 768, 2048), ("GPT-L", 24, 16, 1024, 2816), ("GPT-XL", 36, 20, 1280, 3584),
    ("GPT-XXL", 48, 24, 1536, 4096), ("GPT-XXXL", 48, 40, 2560, 6912), ("GPT-1B", 22, 32, 2048, 5632),
    ("GPT-3B", 24, 32, 3200, 8704), ("GPT-7B", 32, 32, 4096, 11008)])
def test_official_shapes(name, layers, heads, dim, hidden):
    c = target_config(name)
    assert (c.n_layer, c.n_head, c.dim, c.ffn_hidden) == (layers, heads, dim, hidden)
    assert c.vocab_size == 16384 and c.cls_token_num == 1 and c.num_classes == 1000


def test_image_size_and_t2i():
    assert target_config("GPT-L", image_size=384).block_size == 576
    c = target_config("GPT-XL", image_size=512, model_type="t2i")
    assert c.block_size == 1024 and c.cls_token_num == 120 and c.caption_dim == 2048
    assert target_config("GPT-3B").head_dim == 100


def test_unknown_names_list_valid_ones():
    with pytest.raises(LisaError, match="GPT-B.*GPT-L"):
        target_config("GPT-Q")
    with pytest.raises(LisaError, match="VQ-16"):
        vq_config("VQ-32")
    with pytest.raises(LisaError, match="multiple of"):
        target_config("GPT-B", image_size=250)


def test_frozen_and_round_trip():
    c = target_config("GPT-B")
    with pytest.raises(Exception):
        c.dim = 3
    assert TargetConfig.from_dict(c.to_dict()) == c
    v = vq_config("VQ-8")
    assert VQConfig.from_dict(v.to_dict()) == v and v.ch == 128 and v.downsample == 8
    with pytest.raises(LisaError, match="unknown TargetConfig fields"):
        TargetConfig.from_dict({"dim": 8, "bogus": 1})
