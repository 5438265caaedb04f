"""Caption encoder: LlamaGen's T5 recipe, mask convention, cache, and errors before any work."""

import sys

import pytest
import torch

from lisa_trt.errors import InputError
from lisa_trt.testing import make_target
from lisa_trt.families.llamagen.captions import CaptionEncoder
from lisa_trt.models.captions import caption_conds, load_caption_features, read_captions, save_caption_features

pytest.importorskip("transformers")


def _reference(t5_dir, captions, L):
    """The official recipe, spelled out: T5 tokenizer padded to max length, encoder last_hidden_state."""
    from transformers import AutoTokenizer, T5EncoderModel

    tok = AutoTokenizer.from_pretrained(str(t5_dir))
    model = T5EncoderModel.from_pretrained(str(t5_dir)).eval()
    b = tok([c.lower().strip() for c in captions], max_length=L, padding="max_length", truncation=True, return_attention_mask=True,
            add_special_tokens=True, return_tensors="pt")
    with torch.no_grad():
        h = model(input_ids=b.input_ids, attention_mask=b.attention_mask).last_hidden_state
    return h, b.attention_mask.bool()


def test_matches_t5_recipe_valid_tokens_first(t5_dir):
    caps = ["A Red car ", "a small dog on the street in the city at night with a big tree"]
    enc = CaptionEncoder(t5_dir, max_length=8)
    feats, mask = enc.encode(caps)
    ref, ref_mask = _reference(t5_dir, caps, 8)
    assert feats.shape == (2, 8, 12) and mask.dtype == torch.bool
    assert torch.equal(mask, ref_mask)
    assert mask[0].tolist() == [True] * 4 + [False] * 4  # 3 words + </s>, valid tokens FIRST
    assert mask[1].all()  # truncated at max_length
    assert torch.allclose(feats[mask], ref[ref_mask], atol=1e-6)
    assert (feats[~mask] == 0).all()  # padded rows zeroed


def test_cache_by_caption_hash(t5_dir, tmp_path, monkeypatch):
    enc = CaptionEncoder(t5_dir, max_length=6, cache_dir=tmp_path / "cache")
    f1, m1 = enc.encode(["a cat", "a dog", "a cat"])
    assert torch.equal(f1[0], f1[2])
    assert len(list((tmp_path / "cache").rglob("*.safetensors"))) == 2  # one entry per distinct caption
    fresh = CaptionEncoder(t5_dir, max_length=6, cache_dir=tmp_path / "cache")
    monkeypatch.setattr(fresh, "_encode_batch", lambda caps: pytest.fail(f"re-encoded {caps}"))
    f2, m2 = fresh.encode(["a dog", "a cat"])
    assert torch.equal(f2[0], f1[1]) and torch.equal(m2[1], m1[0])
    other = CaptionEncoder(t5_dir, max_length=5, cache_dir=tmp_path / "cache")  # other length: other key
    assert other.caption_key("a cat") != enc.caption_key("a cat")


def test_caption_file_errors(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("a cat\n\na dog\n   \n")
    with pytest.raises(InputError, match=r"line\(s\) 2, 4"):
        read_captions(p)
    with pytest.raises(InputError, match="not found"):
        read_captions(tmp_path / "missing.txt")
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(InputError, match="empty"):
        read_captions(tmp_path / "e.txt")
    (tmp_path / "b.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(InputError, match="UTF-8"):
        read_captions(tmp_path / "b.txt")


def test_encoder_errors_before_loading(t5_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("LISA_TRT_TEXT_ENCODER", raising=False)
    with pytest.raises(InputError, match="--encoder"):
        CaptionEncoder(None)
    with pytest.raises(InputError, match="not found"):
        CaptionEncoder(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="config.json"):
        CaptionEncoder(tmp_path / "empty")
    monkeypatch.setitem(sys.modules, "transformers", None)  # not installed
    with pytest.raises(InputError, match=r"lisa-trt\[text\]"):
        CaptionEncoder(t5_dir)


def test_target_checks_and_feature_files(t5_dir, tmp_path):
    target = make_target("t2i")  # 6 slots, 12-wide
    enc = CaptionEncoder(t5_dir, max_length=6)
    enc.check_target(target.config)
    with pytest.raises(InputError, match="c2i"):
        enc.check_target(make_target("c2i").config)
    with pytest.raises(InputError, match="caption slots"):
        CaptionEncoder(t5_dir, max_length=7).check_target(target.config)
    (tmp_path / "c.txt").write_text("a red car\nblue sky\n")
    feats, mask, caps = caption_conds(tmp_path / "c.txt", target.config, encoder=enc)
    assert caps == ["a red car", "blue sky"] and feats.shape == (2, 6, 12)
    save_caption_features(tmp_path / "f.safetensors", feats, mask, caps)
    f2, m2, meta = load_caption_features(tmp_path / "f.safetensors", target.config)
    assert torch.equal(f2, feats) and torch.equal(m2, mask) and meta["captions"] == caps
    with pytest.raises(InputError, match=r"needs \(N, 6, 12\)"):
        save_caption_features(tmp_path / "w.safetensors", torch.zeros(1, 5, 12), torch.ones(1, 5))
        load_caption_features(tmp_path / "w.safetensors", target.config)
    # the target accepts the pair as is (it left-pads internally) and runs
    logits = target.teacher_forced_logits((feats, mask), torch.zeros(2, target.config.block_size, dtype=torch.long))
    assert torch.isfinite(logits).all()


def test_preprocess(t5_dir, monkeypatch):
    enc = CaptionEncoder(t5_dir, max_length=6)
    assert enc.prepare("  A Red Car ") == "a red car"
    raw = CaptionEncoder(t5_dir, max_length=6, preprocess="none")
    assert raw.prepare(" A Red Car") == " A Red Car" and raw.caption_key("x") != enc.caption_key("x")
    seen = []
    tok, model = enc._load()
    monkeypatch.setattr(enc, "_load", lambda: (lambda texts, **kw: seen.extend(texts) or tok(texts, **kw), model))
    enc.encode(["A Photo OF a Cat"])
    assert seen == ["a photo of a cat"]
    with pytest.raises(InputError, match="preprocess"):
        CaptionEncoder(t5_dir, preprocess="clean")
