"""Chameleon VQGAN: official key names (checked against HF's ChameleonVQVAE encoder), decoder
shapes and determinism, strict loading from vqgan.yaml + vqgan.ckpt."""

import pytest
import torch

from lisa_trt import LisaError
from lisa_trt.families.chameleon.vq import (
    ChameleonVQConfig,
    ChameleonVQGAN,
    load_chameleon_vq,
    save_chameleon_vq,
)

TINY = ChameleonVQConfig(embed_dim=8, n_embed=32, z_channels=32, ch=32, ch_mult=(1, 2), num_res_blocks=1,
                         attn_resolutions=(8,), resolution=16)
YAML = """model:
  target: taming.models.vqgan.VQModel
  params:
    embed_dim: 8
    n_embed: 32
    ddconfig:
      double_z: false
      z_channels: 32
      resolution: 16
      in_channels: 3
      out_ch: 3
      ch: 32
      ch_mult: [1, 2]
      num_res_blocks: 1
      attn_resolutions: [8]
      dropout: 0.0
"""


def _randomized(cfg=TINY, seed=0):
    torch.manual_seed(seed)
    m = ChameleonVQGAN(cfg).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("weight") and "norm" not in n:
                p.normal_(0, 0.1)
    return m


def test_decoder_shapes_and_determinism():
    m = _randomized()
    codes = torch.randint(0, 32, (2, 3, 5))
    a, b = m.decode_code(codes), m.decode_code(codes)
    assert a.shape == (2, 3, 6, 10) and torch.equal(a, b) and torch.isfinite(a).all()
    assert not torch.allclose(a[0], a[1])
    with pytest.raises(LisaError, match="0..31"):
        m.decode_code(torch.full((1, 2, 2), 32))


def test_to_uint8_follows_chameleon():
    from lisa_trt.families.chameleon.vq import to_uint8

    x = torch.tensor([-2.0, -1.0, 0.0, 0.5, 1.0, 3.0]).view(1, 1, 1, 6).expand(1, 3, 1, 6)
    assert to_uint8(x)[0, 0, :, 0].tolist() == [0, 0, 127, 191, 255, 255]


def test_official_names_match_hf_encoder():
    pytest.importorskip("transformers")
    from transformers import ChameleonVQVAE, ChameleonVQVAEConfig

    hf_cfg = ChameleonVQVAEConfig(embed_dim=8, num_embeddings=32, latent_channels=32, resolution=16,
                                  base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1,
                                  attn_resolutions=[8])
    torch.manual_seed(1)
    hf = ChameleonVQVAE(hf_cfg).eval()
    ours = ChameleonVQGAN(ChameleonVQConfig.from_hf(hf_cfg.to_dict()))
    res = ours.load_state_dict(hf.state_dict(), strict=False)
    assert not res.unexpected_keys
    assert res.missing_keys and all(k.startswith("decoder.") for k in res.missing_keys)
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        ref = hf.encode(x).image_tokens.view(2, 8, 8)
    assert torch.equal(ours.encode(x), ref)


def test_load_yaml_ckpt_and_safetensors(tmp_path):
    m = _randomized(seed=2)
    sd = dict(m.state_dict(), **{"loss.discriminator.main.0.weight": torch.zeros(2)})
    torch.save({"state_dict": sd, "epoch": 3}, tmp_path / "vqgan.ckpt")
    (tmp_path / "vqgan.yaml").write_text(YAML)
    loaded = load_chameleon_vq(tmp_path)
    codes = torch.randint(0, 32, (1, 4, 4))
    assert torch.equal(loaded.decode_code(codes), m.decode_code(codes))
    save_chameleon_vq(m, tmp_path / "st")
    assert torch.equal(load_chameleon_vq(tmp_path / "st").decode_code(codes), m.decode_code(codes))


def test_mismatched_yaml_fails_clearly(tmp_path):
    torch.save({"state_dict": _randomized().state_dict()}, tmp_path / "vqgan.ckpt")
    (tmp_path / "vqgan.yaml").write_text(YAML.replace("n_embed: 32", "n_embed: 64"))
    with pytest.raises(LisaError, match="quantize.embedding.weight"):
        load_chameleon_vq(tmp_path)
    (tmp_path / "vqgan.yaml").unlink()
    with pytest.raises(LisaError, match="neither vqgan.yaml nor vqgan.json"):
        load_chameleon_vq(tmp_path)
    with pytest.raises(LisaError, match="VQGAN not found"):
        load_chameleon_vq(tmp_path / "nowhere")


def test_load_vq_from_a_model_directory_maps_vocabulary_ids(tmp_path):
    """lisa_trt.load_vq(MODEL_DIR) finds DIR/vqgan/ and decodes what generate returns (vocabulary ids)."""
    pytest.importorskip("transformers")
    import lisa_trt
    from chameleon_fixtures import TINY_VQ, save_model_dir

    d = save_model_dir(tmp_path / "model", seed=1)
    vq = _randomized(ChameleonVQConfig(**TINY_VQ))
    save_chameleon_vq(vq, d / "vqgan")  # random weights, so the pixels say which VQ decoded
    loaded = lisa_trt.load_vq(d)
    codes = torch.randint(0, 32, (1, 4))
    assert torch.equal(lisa_trt.tokens_to_pixels(loaded, codes + 4), vq.decode_code(codes.view(1, 2, 2)))
