"""Independent check of the Chameleon public calls against transformers, on checkpoint
configurations the other Chameleon tests do not use (fp32 unless stated).

Each checkpoint is made the way a user's download looks: `ChameleonForConditionalGeneration`
built by transformers from a config, randomised, written with `save_pretrained` (one file, or
small shards, in fp32, bf16 or fp16). The references are transformers' own outputs:

- `teacher_forced_logits` vs transformers' forward with its image-token mask switched off (the
  raw head; lisa-trt promises the whole vocabulary), and vs the masked forward off the image ids;
- `generate(..., greedy=True, image_tokens_only=False)` vs transformers' `generate` (its KV
  cache, left padding and attention mask; the raw head; no EOS stop), and `image_tokens_only=True`
  vs the same with a logits processor allowing only the IMGIMG* ids;
- `tokens_to_pixels(load_vq(DIR), tokens)` vs a decode through transformers' VQ modules:
  transformers has no Chameleon VQ decoder, so the VQGAN (taming layout: vqgan.yaml +
  vqgan.ckpt, as Chameleon ships it) is made from transformers' `ChameleonVQVAE` (encoder,
  codebook) and `JanusVQVAE` (the same taming decoder blocks; its `up` list in reverse order),
  and the reference decodes codes with those modules (codebook lookup without normalisation).
"""

import os

import pytest
import torch

import lisa_trt
from lisa_trt import LisaError

pytest.importorskip("transformers")

from hf_fixtures import randomize  # noqa: E402

VOCAB, CODES = 80, 24


def vocab_map(perm_seed=None):
    """<pad> <s> </s> <image>, CODES IMGIMG* tokens and plain words; with perm_seed the image
    tokens sit at shuffled, non-contiguous ids (code c is not id c + 4)."""
    from chameleon_fixtures import code_name

    ids = list(range(4, VOCAB))
    if perm_seed is not None:
        g = torch.Generator().manual_seed(perm_seed)
        ids = [ids[i] for i in torch.randperm(len(ids), generator=g).tolist()]
    names = {0: "<pad>", 1: "<s>", 2: "</s>", 3: "<image>"}
    for c in range(CODES):
        names[ids[c]] = code_name(c)
    for i in ids[CODES:]:
        names[i] = f"w{i}"
    return {n: i for i, n in names.items()}


def hf_config(vmap=None, **over):
    from transformers import ChameleonConfig

    kw = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=40, num_hidden_layers=3, num_attention_heads=6,
              num_key_value_heads=6, max_position_embeddings=64, vocabulary_map=vmap or vocab_map(),
              vq_config=dict(embed_dim=4, num_embeddings=CODES, latent_channels=32, resolution=32, base_channels=32,
                             channel_multiplier=[1, 1, 2], num_res_blocks=1, attn_resolutions=[]))
    kw.update(over)
    return ChameleonConfig(**kw)


VARIANTS = {
    "mha_h48_l3": {},
    "gqa_8to2_h64_l2": dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=2,
                            intermediate_size=96),
    "mqa_headdim16_swin_l1": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, swin_norm=True,
                                  num_hidden_layers=1),
    "theta1e6_linear4_kv3": dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e6, "factor": 4.0},
                                 num_key_value_heads=3),
    "theta50_tied_gelu_eps": dict(rope_parameters={"rope_type": "default", "rope_theta": 50.0},
                                  tie_word_embeddings=True, hidden_act="gelu", rms_norm_eps=1e-3),
    "bias_eoslist_shuffled_vocab": dict(attention_bias=True, mlp_bias=True, num_key_value_heads=2,
                                        eos_token_id=[2, 3], pad_token_id=0, vmap=vocab_map(perm_seed=7)),
}


def make_hf(seed=0, **over):
    from transformers import ChameleonForConditionalGeneration

    torch.manual_seed(seed)
    cfg = hf_config(**over)
    cfg._attn_implementation = "eager"
    hf = ChameleonForConditionalGeneration(cfg).eval()
    randomize(hf, seed + 3)
    return hf


def raw_head(hf):
    """transformers' forward without the image-token mask of text generation (what lisa-trt's
    raw head promises): the mask is `logits[..., vocabulary_mapping.image_tokens] = min`."""
    hf.model.vocabulary_mapping.__dict__["image_tokens"] = []
    return hf


def image_ids(hf):
    from transformers.models.chameleon.modeling_chameleon import ChameleonImageVocabularyMapping

    return ChameleonImageVocabularyMapping(hf.config.vocabulary_map).image_tokens


def from_pretrained_fp32(d):
    from transformers import ChameleonForConditionalGeneration

    return ChameleonForConditionalGeneration.from_pretrained(str(d), dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    hf = make_hf(seed=len(request.param), **VARIANTS[request.param])
    d = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(str(d))
    return raw_head(hf), lisa_trt.load_target(str(d)), d


def left_padded(B=3, T=7, seed=1):
    """(ids, attention_mask 0/1) of B prompts of T, T-3 and T-1 tokens, left-padded with <pad>."""
    ids = torch.randint(4, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :1] = 0
    return ids.masked_fill(mask == 0, 0), mask


class _Allowed:
    def __init__(self, ids):
        self.ids = list(ids)

    def __call__(self, input_ids, scores):
        keep = torch.full_like(scores, float("-inf"))
        keep[:, self.ids] = 0
        return scores + keep


@torch.no_grad()
def hf_generate(hf, ids, mask, n, allowed=None):
    """transformers' greedy generate over the raw head: exactly n new tokens (no EOS stop)."""
    from transformers import LogitsProcessorList

    hf.generation_config.eos_token_id = None
    lp = LogitsProcessorList([_Allowed(allowed)]) if allowed is not None else None
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0,
                      logits_processor=lp)
    assert out.shape[1] == ids.shape[1] + n
    return out[:, ids.shape[1]:]


# ----------------------------------------------------------------------------- the LM calls

def test_teacher_forced_logits_equal_transformers(variant):
    hf, target, _ = variant
    ids = torch.randint(0, VOCAB, (3, 9), generator=torch.Generator().manual_seed(2))
    ours = lisa_trt.teacher_forced_logits(target, ids)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits.float()
    assert ours.shape == (3, 9, VOCAB) and ours.dtype == torch.float32
    assert (ours - ref).abs().max() < 1e-4
    img = image_ids(hf)
    assert torch.isfinite(ours[..., img]).all() and ours[..., img].abs().max() > 0.1  # raw: image logits kept


def test_generate_equals_transformers_generate(variant):
    """A left-padded batch of three prompt lengths through transformers' own KV-cached greedy
    loop; the raw head over the whole vocabulary, and the image codes only."""
    hf, target, _ = variant
    ids, mask = left_padded()
    ours = lisa_trt.generate(target, (ids, mask.bool()), max_new_tokens=10, greedy=True, image_tokens_only=False)
    assert ours.shape == (3, 10) and torch.equal(ours, hf_generate(hf, ids, mask, 10))
    assert ours.unique().numel() > 3
    img = image_ids(hf)
    only = lisa_trt.generate(target, (ids, mask.bool()), max_new_tokens=10, greedy=True, image_tokens_only=True)
    assert torch.equal(only, hf_generate(hf, ids, mask, 10, allowed=img))
    assert set(only.flatten().tolist()) <= set(img)
    one = lisa_trt.generate(target, input_ids=ids[1:2, 3:], max_new_tokens=10, greedy=True)
    assert torch.equal(one, ours[1:2])  # the padded row alone, unpadded
    named = lisa_trt.generate(target, input_ids=ids, attention_mask=mask, max_new_tokens=10, greedy=True)
    assert torch.equal(named, ours)  # transformers' names, a 0/1 mask


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_sharded_checkpoints(dtype, tmp_path):
    """Weights saved in bf16 / fp16 (`dtype` in config.json) in small shards: lisa-trt computes in
    fp32 on the rounded weights, as transformers' from_pretrained(dtype=float32) does."""
    hf = make_hf(seed=11, num_key_value_heads=2, hidden_size=32, num_attention_heads=4).to(dtype)
    hf.save_pretrained(str(tmp_path), max_shard_size="30KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(list(tmp_path.glob("model-*"))) > 2
    target = lisa_trt.load_target(str(tmp_path))
    assert target.lm_head.weight.dtype == torch.float32
    ref = raw_head(from_pretrained_fp32(tmp_path))
    ids, mask = left_padded(seed=3)
    with torch.no_grad():
        want = ref(input_ids=ids).logits.float()
    assert (lisa_trt.teacher_forced_logits(target, ids) - want).abs().max() < 1e-4
    ours = lisa_trt.generate(target, (ids, mask.bool()), max_new_tokens=8, greedy=True, image_tokens_only=False)
    assert torch.equal(ours, hf_generate(ref, ids, mask, 8))


def test_unsupported_rope_types_are_refused_naming_the_supported_ones(tmp_path):
    hf = make_hf(seed=1, rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    hf.save_pretrained(str(tmp_path))
    with pytest.raises(LisaError, match="RoPE scaling 'dynamic' is not supported.*default, linear"):
        lisa_trt.load_target(str(tmp_path))


# ----------------------------------------------------------------------------- the VQ

def make_vqgan(folder, *, embed=4, n=CODES, z=32, ch=32, mult=(1, 2, 2), nres=1, res=32, attn=False, seed=0):
    """A Chameleon VQGAN folder (taming vqgan.yaml + vqgan.ckpt) whose weights come from
    transformers' modules; returns the transformers JanusVQVAE holding its decoder half."""
    import yaml
    from transformers import ChameleonVQVAE, ChameleonVQVAEConfig, JanusVQVAE, JanusVQVAEConfig

    levels = len(mult)
    attn_res = [res // 2 ** (levels - 1)] if attn else []
    torch.manual_seed(seed)
    enc = ChameleonVQVAE(ChameleonVQVAEConfig(embed_dim=embed, num_embeddings=n, latent_channels=z, resolution=res,
                                              base_channels=ch, channel_multiplier=list(mult), num_res_blocks=nres,
                                              attn_resolutions=attn_res)).eval()
    dec = JanusVQVAE(JanusVQVAEConfig(embed_dim=embed, num_embeddings=n, latent_channels=z, base_channels=ch,
                                      channel_multiplier=list(mult), num_res_blocks=nres,
                                      num_patches=res // 2 ** (levels - 1))).eval()
    if not attn:  # transformers' decoder always attends at its coarsest level; taming only at attn_resolutions
        dec.decoder.up[0].attn = torch.nn.ModuleList()
    randomize(enc, seed)
    randomize(dec, seed + 1)
    dec.quantize.embedding.weight.data.copy_(enc.quantize.embedding.weight.data)
    sd = {k: v for k, v in enc.state_dict().items() if not k.startswith("post_quant_conv.")}
    for k, v in dec.state_dict().items():
        if k.startswith("decoder.up."):  # transformers: up[0] coarsest; taming: up[0] finest
            parts = k.split(".")
            parts[2] = str(levels - 1 - int(parts[2]))
            k = ".".join(parts)
        if k.startswith(("decoder.", "post_quant_conv.")):
            sd[k] = v
    os.makedirs(folder, exist_ok=True)
    torch.save({"state_dict": sd}, os.path.join(folder, "vqgan.ckpt"))
    dd = dict(double_z=False, z_channels=z, resolution=res, in_channels=3, out_ch=3, ch=ch, ch_mult=list(mult),
              num_res_blocks=nres, attn_resolutions=attn_res, dropout=0.0)
    with open(os.path.join(folder, "vqgan.yaml"), "w") as f:
        yaml.safe_dump({"model": {"target": "taming.models.vqgan.VQModel",
                                  "params": {"embed_dim": embed, "n_embed": n, "ddconfig": dd}}}, f)
    return enc, dec


@torch.no_grad()
def hf_decode(dec, codes):
    """Codes (B, h, w) through transformers' modules: codebook rows, post_quant_conv, decoder."""
    return dec.decoder(dec.post_quant_conv(dec.quantize.embedding(codes).permute(0, 3, 1, 2)))


VQS = {"3lvl_noattn": {}, "attn_2res_embed6": dict(mult=(1, 1, 2), nres=2, attn=True, n=40, embed=6),
       "ch64_2lvl_z16": dict(ch=64, mult=(1, 2), z=16, attn=True)}


@pytest.mark.parametrize("name", sorted(VQS))
def test_tokens_to_pixels_equals_transformers_vq_modules(name, tmp_path):
    kw = VQS[name]
    enc, dec = make_vqgan(tmp_path, **kw)
    vq = lisa_trt.load_vq(str(tmp_path))
    n = kw.get("n", CODES)
    for shape in ((2, 3, 3), (2, 2, 4), (1, 4, 2)):  # square and non-square grids
        codes = torch.randint(0, n, shape, generator=torch.Generator().manual_seed(sum(shape)))
        px = lisa_trt.tokens_to_pixels(vq, codes)
        ref = hf_decode(dec, codes)
        ds = 2 ** (len(kw.get("mult", (1, 2, 2))) - 1)
        assert px.shape == ref.shape == (shape[0], 3, shape[1] * ds, shape[2] * ds)
        assert (px - ref).abs().max() <= 1e-5 * max(1.0, float(ref.abs().max()))
        assert px.abs().max() > 1.0  # raw decoder output: neither clamped nor rescaled
    flat = torch.randint(0, n, (2, 9))
    assert torch.equal(lisa_trt.tokens_to_pixels(vq, flat), lisa_trt.tokens_to_pixels(vq, flat.view(2, 3, 3)))
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        want = enc.encode(x).image_tokens
    assert torch.equal(vq.encode(x).flatten(), want.flatten())  # the encoder half is transformers' too


def _close(a, b) -> bool:
    """Pixels equal to transformers' decoder up to fp32 rounding: the VQ attention is written in the
    form TensorRT fuses (the scale on Q before the first matmul), transformers scales the scores."""
    return a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1e-5)


def test_model_dir_vq_decodes_generated_vocabulary_ids(tmp_path):
    """load_vq(MODEL_DIR) finds DIR/vqgan/ and decodes vocabulary ids (what generate returns),
    mapped to codes as transformers' ChameleonImageVocabularyMapping maps them (shuffled ids)."""
    hf = make_hf(seed=4, vmap=vocab_map(perm_seed=3))
    hf.save_pretrained(str(tmp_path))
    _, dec = make_vqgan(tmp_path / "vqgan")
    vq = lisa_trt.load_vq(str(tmp_path))
    mapping = hf.model.vocabulary_mapping
    codes = torch.randint(0, CODES, (2, 2, 3), generator=torch.Generator().manual_seed(5))
    tokens = mapping.convert_img2bpe(codes).long()  # transformers: VQ code -> vocabulary id
    assert not torch.equal(tokens, codes + 4)  # shuffled: the mapping is exercised
    ref = hf_decode(dec, codes)
    assert _close(lisa_trt.tokens_to_pixels(vq, tokens), ref)  # (B, h, w) vocabulary ids
    square = mapping.convert_img2bpe(codes[:, :, :2].reshape(2, 4)).long()  # (B, N) ids, N square
    assert _close(lisa_trt.tokens_to_pixels(vq, square), hf_decode(dec, codes[:, :, :2].reshape(2, 2, 2)))
    row_end = next(i for n, i in hf.config.vocabulary_map.items() if n.startswith("w"))
    span = torch.cat([tokens, torch.full((2, 2, 1), row_end)], 2).view(2, 8)  # codes, row end, codes, row end
    assert _close(lisa_trt.tokens_to_pixels(vq, span), ref)
    with pytest.raises(LisaError, match="not one after each row.*vocabulary ids.*load_vq\\(DIR/vqgan\\)"):
        lisa_trt.tokens_to_pixels(vq, span[:, [0, 3, 1, 2, 4, 5, 6, 7]])  # a row end mid-row: not a span
    with pytest.raises(LisaError, match="vocabulary ids"):
        lisa_trt.tokens_to_pixels(vq, torch.arange(9)[None])  # plain VQ codes (0..3 are not image ids)
    target = lisa_trt.load_target(str(tmp_path))
    gen = lisa_trt.generate(target, torch.randint(4, VOCAB, (2, 5)), max_new_tokens=9, greedy=True,
                            image_tokens_only=True)
    as_codes = torch.tensor([mapping.bpe2img[t] for t in gen.flatten().tolist()]).view(2, 3, 3)  # id -> code
    assert _close(lisa_trt.tokens_to_pixels(vq, gen), hf_decode(dec, as_codes))


def test_transformers_dir_without_a_vqgan_names_the_missing_decoder(tmp_path):
    """transformers' Chameleon checkpoints carry the VQ encoder only (model.vqmodel.*)."""
    make_hf(seed=2).save_pretrained(str(tmp_path))
    with pytest.raises(LisaError, match="no VQGAN in .*DIR/vqgan/.*holds only the VQ encoder"):
        lisa_trt.load_vq(str(tmp_path))


def test_sequences_past_max_position_embeddings_are_refused_with_the_fix(variant):
    """transformers computes RoPE past max_position_embeddings; lisa-trt's caches stop there."""
    _, target, _ = variant
    with pytest.raises(LisaError, match="70 tokens .* exceed max_position_embeddings 64.*generate fewer tokens"):
        lisa_trt.generate(target, torch.randint(4, VOCAB, (1, 60)), max_new_tokens=10, greedy=True)
