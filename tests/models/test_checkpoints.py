"""Loading: official layouts (DDP and raw), safetensors, strict errors, unsafe pickles refused."""

import pytest
import torch

import lisa_trt
from lisa_trt import LisaError
from lisa_trt.models.target_config import target_config, vq_config
from lisa_trt.models.checkpoints import target_hash
from lisa_trt.families.llamagen.checkpoint import guess_target_config
from lisa_trt.families.llamagen.vq import VQModel
from lisa_trt.testing import make_cond, make_target


def test_official_layouts_round_trip(tmp_path):
    m = make_target("c2i")
    sd = m.state_dict()
    sd_extra = dict(sd, freqs_cis=torch.zeros(3), **{"layers.0.attention.kv_cache.k_cache": torch.zeros(1)})
    torch.save({"model": sd_extra, "optimizer": {}, "steps": 3}, tmp_path / "ddp.pt")
    torch.save(sd, tmp_path / "raw.pt")
    cond, toks = make_cond(m), torch.randint(0, 256, (2, 16))
    ref = m.teacher_forced_logits(cond, toks)
    for name in ["ddp.pt", "raw.pt"]:
        got = lisa_trt.load_target(str(tmp_path / name), m.config)
        assert not got.training and got.output.weight.dtype == torch.float32
        assert torch.equal(got.teacher_forced_logits(cond, toks), ref)


def test_safetensors_with_config_metadata(tmp_path):
    from lisa_trt.models.checkpoints import save_model

    m = make_target("t2i")
    save_model(m, m.config, tmp_path / "t.safetensors")
    got = lisa_trt.load_target(str(tmp_path / "t.safetensors"))  # config from metadata
    assert got.config == m.config and target_hash(got) == target_hash(m)
    assert torch.equal(got.cls_embedding.uncond_embedding, m.cls_embedding.uncond_embedding)
    assert (tmp_path / "t.json").exists()


def test_strict_error_names_keys_shapes_and_config(tmp_path):
    big = make_target("c2i", n_layer=5)
    torch.save({"model": big.state_dict()}, tmp_path / "x.pt")
    with pytest.raises(LisaError) as e:
        lisa_trt.load_target(str(tmp_path / "x.pt"), target_config("tiny"))
    msg = str(e.value)
    assert "unexpected keys: layers.4." in msg and "n_layer=5" in msg
    sd = make_target("c2i", dim=96, n_head=4).state_dict()
    sd.pop("norm.weight")
    torch.save(sd, tmp_path / "y.pt")
    with pytest.raises(LisaError) as e:
        lisa_trt.load_target(str(tmp_path / "y.pt"), "tiny")
    msg = str(e.value)
    assert "missing keys: norm.weight" in msg and "shape mismatches: cls_embedding" in msg
    assert "dim=96" in msg


def test_guess_official_config():
    from lisa_trt.families.llamagen.model import Transformer

    with torch.device("meta"):
        sd = Transformer(target_config("GPT-B")).state_dict()
    assert "GPT-B (c2i, vocab_size=16384, num_classes=1000)" in guess_target_config(sd)


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pickle_that_runs_code_is_refused(tmp_path, capsys):
    p = tmp_path / "evil.pt"
    torch.save({"model": {"x": torch.zeros(1)}, "payload": Evil()}, p)
    with pytest.raises(LisaError, match="refusing to load"):
        lisa_trt.load_target(str(p), "tiny")
    assert "pwned" not in capsys.readouterr().out


def test_missing_and_garbage_files(tmp_path):
    with pytest.raises(LisaError, match="not found"):
        lisa_trt.load_target(str(tmp_path / "nope.pt"), "tiny")
    (tmp_path / "g.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(LisaError, match="not a readable"):
        lisa_trt.load_target(str(tmp_path / "g.pt"), "tiny")
    (tmp_path / "g.safetensors").write_bytes(b"garbage")
    with pytest.raises(LisaError, match="safetensors"):
        lisa_trt.load_target(str(tmp_path / "g.safetensors"), "tiny")


def test_vq_official_layout(tmp_path):
    cfg = vq_config("VQ-16", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32,
                    codebook_size=64)
    vq = VQModel(cfg).eval()
    keys = vq.state_dict().keys()
    assert "quantize.codebook_used" in keys and "decoder.conv_blocks.0.attn.2.q.weight" in keys
    assert "encoder.conv_blocks.0.downsample.conv.weight" in keys and "decoder.conv_blocks.0.upsample.conv.weight" in keys
    torch.save({"model": vq.state_dict()}, tmp_path / "vq.pt")
    got = lisa_trt.load_vq(str(tmp_path / "vq.pt"), cfg)
    idx = torch.randint(0, 64, (2, 16))
    img = got.decode_code(idx, (2, 8, 4, 4))
    assert img.shape == (2, 3, 8, 8) and torch.equal(img, vq.decode_code(idx, (2, 8, 4, 4)))
    with pytest.raises(LisaError, match="64 x 8 codebook"):
        lisa_trt.load_vq(str(tmp_path / "vq.pt"), "VQ-16")


def test_a_pt_target_is_mapped_from_its_file_not_copied(tmp_path):
    """Issue 26: the target's weights are loaded once: the model is built on the meta device and
    its parameters are the (memory-mapped) tensors of a zip .pt file; a bf16 file becomes fp32."""
    import gc

    from lisa_trt.families.llamagen.checkpoint import load_llamagen_target

    ref = make_target("c2i").eval()
    cfg = ref.config
    path = tmp_path / "ck.pt"
    torch.save({"model": ref.state_dict()}, path)
    m = lisa_trt.load_target(str(path), cfg)
    mapped = [ln for ln in open("/proc/self/maps").read().splitlines() if ln.endswith(str(path))]
    assert mapped, "the checkpoint file is not mapped"
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), ref.state_dict().values()))
    assert torch.equal(m.freqs_cis, ref.freqs_cis) and not any(t.is_meta for t in m.state_dict().values())
    cond, toks = make_cond(ref), torch.randint(0, 256, (2, 16))
    assert torch.equal(m.teacher_forced_logits(cond, toks), ref.teacher_forced_logits(cond, toks))
    del m
    gc.collect()
    half = tmp_path / "half.pt"
    torch.save({k: v.to(torch.bfloat16) for k, v in ref.state_dict().items()}, half)
    h = load_llamagen_target(half, cfg)
    assert {p.dtype for p in h.parameters()} == {torch.float32} and not h.training
