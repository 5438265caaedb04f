"""Independent check of the Janus-Pro public calls against transformers, on checkpoint
configurations tests/models/test_janus.py does not use (fp32 unless stated).

Each checkpoint is made as a user's download looks: `JanusForConditionalGeneration` built by
transformers, randomised, `generation_config.generation_kwargs = {"boi_token_id": ...}` (what
its image generation reads), written with `save_pretrained`. References are transformers' own:

- `image_logits` vs the generation head over transformers' language model under teacher forcing
  (conditional rows, the unconditional rows, a left-padded batch with its attention mask);
- `generate(target, prompt_ids, cfg_scale=G, greedy=True)` vs `generate(generation_mode="image",
  do_sample=False, guidance_scale=G)` for G > 1 (its unconditional rows, left padding, mask), and
  a conditional-only greedy loop through transformers' modules for G = 1 (its generate doubles
  the batch without a CFG processor and fails there);
- `tokens_to_pixels(load_vq(DIR), codes)` vs `decode_image_tokens` (channels last there).

Also the configurations that used to be refused although transformers runs them: a short
`max_position_embeddings`, prompts longer than the default prompt budget, and a vision config
whose `num_image_tokens` is not the VQ's token grid (transformers' own test configuration).
"""

import pytest
import torch

import lisa_trt
from lisa_trt.errors import ConfigError, InputError

pytest.importorskip("transformers")

from hf_fixtures import randomize  # noqa: E402

BOS, PAD, BOI, EOS = 1, 0, 7, 2


def _large(name, p, g):
    """Large enough that greedy codes vary: embeddings N(0, 1), matrices 3 / sqrt(fan_in)."""
    if "embed" in name or p.dim() == 1:
        return torch.randn(p.shape, generator=g)
    return 3.0 * torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5


def make_hf(text=None, vq=None, vis=None, seed=0, boi=BOI):
    from transformers import JanusConfig, JanusForConditionalGeneration

    t = dict(model_type="llama", vocab_size=90, hidden_size=48, intermediate_size=40, num_hidden_layers=2,
             num_attention_heads=6, num_key_value_heads=6, max_position_embeddings=128, bos_token_id=BOS,
             pad_token_id=PAD, eos_token_id=EOS)
    t.update(text or {})
    h = t["hidden_size"]
    q = dict(embed_dim=6, num_embeddings=40, latent_channels=32, base_channels=32, channel_multiplier=[1, 2],
             num_res_blocks=2, projection_dim=h, image_token_embed_dim=h, num_hidden_layers=1, hidden_act="silu")
    q.update(vq or {})
    v = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=48, patch_size=16,
             projection_dim=h, num_image_tokens=9)
    v.update(vis or {})
    torch.manual_seed(seed)
    hf = JanusForConditionalGeneration(JanusConfig(text_config=t, vision_config=v, vq_config=q, image_token_id=5))
    hf = hf.eval()
    randomize(hf, seed, weights=_large)
    hf.generation_config.generation_kwargs = {"boi_token_id": boi}
    return hf


VARIANTS = {
    # MHA, 3x3 token grid, one-layer aligner, silu generation MLPs, 2 res blocks per VQ level
    "mha_grid3_aligner1_silu": {},
    # GQA 8 -> 2, 2x2 grid, three-layer aligner, rope_theta 1e6, 3 VQ levels, codebook 70
    "gqa_h64_grid2_aligner3_theta": dict(
        text=dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=1,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        vq=dict(num_hidden_layers=3, hidden_act="gelu", channel_multiplier=[1, 1, 2], num_res_blocks=1,
                num_embeddings=70),
        vis=dict(image_size=32, patch_size=16, num_image_tokens=4)),
    # MQA, head_dim 16, linear RoPE, gelu text MLP, rms eps 1e-3, VQ base 64 / latent 64, one level
    "mqa_hd16_linear_gelu_ch64": dict(
        text=dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, hidden_act="gelu", rms_norm_eps=1e-3,
                  rope_parameters={"rope_type": "linear", "rope_theta": 300.0, "factor": 3.0}),
        vq=dict(base_channels=64, channel_multiplier=[1, 1], latent_channels=64)),
    # biases, GQA 6 -> 3, untied text head (the text lm_head is not part of image generation),
    # vq_config.num_hidden_layers 0 (transformers' aligner is then fc1 alone, as with 1)
    # 3 layers, a 6x6 grid of 96 codes, a downsample-8 VQ (4 levels, one res block each)
    "l3_grid6_codes96_down8": dict(text=dict(num_hidden_layers=3),
                                   vq=dict(num_embeddings=96, channel_multiplier=[1, 1, 2, 2], num_res_blocks=1),
                                   vis=dict(image_size=96, patch_size=16, num_image_tokens=36)),
    "bias_kv3_untied_aligner0": dict(text=dict(attention_bias=True, mlp_bias=True, num_key_value_heads=3,
                                               tie_word_embeddings=False), vq=dict(num_hidden_layers=0)),
}


def _save(hf, d, **kw):
    hf.save_pretrained(str(d), **kw)
    return d


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    hf = make_hf(seed=len(request.param), **VARIANTS[request.param])
    d = _save(hf, tmp_path_factory.mktemp(request.param))
    return hf, lisa_trt.load_target(str(d)), d


def close(a, b, rel=1e-5) -> bool:
    a, b = a.detach().float(), b.detach().float()
    return a.shape == b.shape and bool((a - b).abs().max() <= rel * max(1.0, float(b.abs().max())))


def prompts(hf, B=3, T=7, seed=1):
    """B left-padded prompts of T, T-3 and T-1 tokens: [BOS] text [BOI] (a BOS inside the text
    too, which the unconditional rows keep); (ids, 0/1 attention mask)."""
    V = hf.config.text_config.vocab_size
    ids = torch.randint(8, V, (B, T), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :1] = 0
    ids[:, -1] = BOI
    ids[0, 0], ids[1, 3], ids[2, 1] = BOS, BOS, BOS
    ids[0, 3] = BOS
    return ids.masked_fill(mask == 0, PAD), mask


@torch.no_grad()
def hf_teacher(hf, ids, toks, mask=None):
    """Generation-head logits through transformers' modules; [:, k] predicts toks[:, k]."""
    T, N = ids.shape[1], toks.shape[1]
    emb = torch.cat([hf.get_input_embeddings()(ids), hf.prepare_embeddings_for_image_generation(toks[:, :-1])], 1)
    am = None if mask is None else torch.cat([mask.long(), torch.ones(ids.shape[0], N - 1, dtype=torch.long)], 1)
    h = hf.model.language_model(inputs_embeds=emb, attention_mask=am).last_hidden_state
    return hf.model.generation_head(h[:, T - 1:])


@torch.no_grad()
def hf_generate(hf, ids, mask, g):
    return hf.generate(ids, attention_mask=mask, generation_mode="image", do_sample=False, guidance_scale=g)


@torch.no_grad()
def hf_greedy_cond_only(hf, ids, mask, n):
    out = torch.zeros(ids.shape[0], 0, dtype=torch.long)
    for _ in range(n):
        step = hf_teacher(hf, ids, torch.cat([out, out.new_zeros(out.shape[0], 1)], 1), mask)
        nxt = step[:, -1].argmax(-1, keepdim=True)
        out = torch.cat([out, nxt], 1)
    return out


def hf_null_rows(hf, ids):
    """The unconditional rows as transformers' image generate writes them."""
    gc = hf.generation_config
    keep = (ids == gc.bos_token_id) | (ids == gc.generation_kwargs["boi_token_id"])
    return ids.masked_fill(~keep, gc.pad_token_id)


# ----------------------------------------------------------------------------- the variants

def test_image_logits_equal_transformers(variant):
    hf, target, _ = variant
    ids, mask = prompts(hf)
    N, C = hf.config.vision_config.num_image_tokens, hf.config.vq_config.num_embeddings
    toks = torch.randint(0, C, (3, N), generator=torch.Generator().manual_seed(2))
    ours = lisa_trt.image_logits(target, (ids, mask), toks)
    assert ours.shape == (3, N, C) and ours.dtype == torch.float32
    assert close(ours, hf_teacher(hf, ids, toks, mask))
    null = hf_null_rows(hf, ids)
    assert torch.equal(target.null_cond(ids), null)
    assert close(lisa_trt.image_logits(target, (null, mask), toks), hf_teacher(hf, null, toks, mask))
    assert close(lisa_trt.image_logits(target, ids[:1], toks[:1]), hf_teacher(hf, ids[:1], toks[:1]))


def test_generate_equals_transformers(variant):
    hf, target, _ = variant
    ids, mask = prompts(hf, seed=3)
    for g in (5.0, 2.0):
        ours = lisa_trt.generate(target, (ids, mask), cfg_scale=g, greedy=True)
        assert ours.shape == (3, hf.config.vision_config.num_image_tokens) and ours.dtype == torch.long
        assert torch.equal(ours, hf_generate(hf, ids, mask, g))
    assert ours.unique().numel() > 2
    assert torch.equal(lisa_trt.generate(target, ids, attention_mask=mask, cfg_scale=2.0, greedy=True), ours)
    one = lisa_trt.generate(target, ids[:1], cfg_scale=5.0, greedy=True)
    assert torch.equal(one, hf_generate(hf, ids[:1], torch.ones_like(ids[:1]), 5.0))
    g1 = lisa_trt.generate(target, (ids, mask), cfg_scale=1.0, greedy=True)  # no CFG: no unconditional rows
    assert torch.equal(g1, hf_greedy_cond_only(hf, ids, mask, ours.shape[1]))


def test_tokens_to_pixels_equals_decode_image_tokens(variant):
    hf, _, d = variant
    vq = lisa_trt.load_vq(str(d))
    grid = hf.config.vision_config.image_size // hf.config.vision_config.patch_size
    codes = torch.randint(0, hf.config.vq_config.num_embeddings, (2, grid * grid),
                          generator=torch.Generator().manual_seed(4))
    px = lisa_trt.tokens_to_pixels(vq, codes)
    with torch.no_grad():
        ref = hf.decode_image_tokens(codes).permute(0, 3, 1, 2)
    ds = 2 ** (len(hf.config.vq_config.channel_multiplier) - 1)
    assert px.shape == (2, 3, grid * ds, grid * ds) and close(px, ref)
    assert px.abs().max() > 1.0  # raw: neither clamped nor rescaled
    assert torch.equal(lisa_trt.tokens_to_pixels(vq, codes.view(2, grid, grid)), px)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_sharded_checkpoints(dtype, tmp_path):
    """bf16 / fp16 weights in small shards, computed in fp32 by both sides on the rounded weights."""
    from transformers import JanusForConditionalGeneration

    d = _save(make_hf(text=dict(num_key_value_heads=2), seed=9).to(dtype), tmp_path, max_shard_size="30KB")
    assert (d / "model.safetensors.index.json").is_file() and len(list(d.glob("model-*"))) > 2
    target = lisa_trt.load_target(str(d))
    assert target.output.weight.dtype == torch.float32
    hf = JanusForConditionalGeneration.from_pretrained(str(d), dtype=torch.float32).eval()
    hf.generation_config.generation_kwargs = {"boi_token_id": BOI}  # from_pretrained drops it (_from_model_config)
    ids, mask = prompts(hf, seed=5)
    toks = torch.randint(0, 40, (3, 9), generator=torch.Generator().manual_seed(6))
    assert close(lisa_trt.image_logits(target, (ids, mask), toks), hf_teacher(hf, ids, toks, mask))
    assert torch.equal(lisa_trt.generate(target, (ids, mask), cfg_scale=5.0, greedy=True),
                       hf_generate(hf, ids, mask, 5.0))
    with torch.no_grad():
        ref = hf.decode_image_tokens(toks).permute(0, 3, 1, 2)
    assert close(lisa_trt.tokens_to_pixels(lisa_trt.load_vq(str(d)), toks), ref)


# ----------------------------------------------------------------------------- formerly refused

def test_short_max_position_embeddings_load_with_a_smaller_prompt_budget(tmp_path):
    """max_position_embeddings 40 < the default prompt budget (128) + 9 image tokens: the budget
    shrinks to what the positions leave (31) instead of refusing the checkpoint."""
    hf = make_hf(text=dict(max_position_embeddings=40), seed=12)
    d = _save(hf, tmp_path / "short")
    target = lisa_trt.load_target(str(d))
    assert target.config.max_prompt_tokens == 31 and target.new_cache(1).prompt_budget == 31
    ids, mask = prompts(hf, seed=7)
    assert torch.equal(lisa_trt.generate(target, (ids, mask), cfg_scale=5.0, greedy=True),
                       hf_generate(hf, ids, mask, 5.0))
    with pytest.raises(InputError, match="shorten the prompt to at most 31"):
        target.check_cond(torch.ones(1, 32, dtype=torch.long))
    none = _save(make_hf(text=dict(max_position_embeddings=9), seed=12), tmp_path / "none")
    with pytest.raises(ConfigError, match="max_position_embeddings 9 leaves no room for a prompt"):
        lisa_trt.load_target(str(none))


def test_prompts_longer_than_the_default_budget(tmp_path):
    """A 150-token prompt (default budget 128): the public calls size the cache per prompt, as
    transformers does; the budget still bounds default caches and exported engines."""
    from lisa_trt.models.family import family_of

    hf = make_hf(text=dict(max_position_embeddings=256), seed=13)
    target = lisa_trt.load_target(str(_save(hf, tmp_path)))
    assert target.config.max_prompt_tokens == 128
    ids = torch.randint(8, 90, (2, 150), generator=torch.Generator().manual_seed(8))
    ids[:, 0], ids[:, -1] = BOS, BOI
    mask = torch.ones_like(ids)
    assert torch.equal(lisa_trt.generate(target, ids, cfg_scale=5.0, greedy=True), hf_generate(hf, ids, mask, 5.0))
    toks = torch.randint(0, 40, (2, 9))
    assert close(lisa_trt.image_logits(target, ids, toks), hf_teacher(hf, ids, toks))
    with pytest.raises(InputError, match="max_prompt_tokens=128"):
        family_of(target.config).check_cond(target.config, ids)
    with pytest.raises(InputError, match="prompt budget of 128"):
        target.prefill(ids, target.new_cache(2))


def test_num_image_tokens_other_than_the_grid(tmp_path):
    """transformers' own test configuration: vision image_size 20 / patch 5 (a 4 x 4 VQ grid) but
    num_image_tokens 4, pad == bos. transformers generates 4 codes and decodes 16: so do the
    public calls; what needs one image = one grid refuses, naming the key to fix."""
    hf = make_hf(text=dict(vocab_size=99, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                           intermediate_size=37, hidden_act="gelu", max_position_embeddings=512, pad_token_id=1),
                 vq=dict(embed_dim=12, num_embeddings=12, latent_channels=12, channel_multiplier=[1, 1],
                         projection_dim=32, image_token_embed_dim=32, num_hidden_layers=2, hidden_act="gelu"),
                 vis=dict(image_size=20, patch_size=5, num_image_tokens=4, hidden_size=32, projection_dim=32),
                 seed=14)
    d = _save(hf, tmp_path)
    target = lisa_trt.load_target(str(d))
    ids = torch.randint(8, 99, (2, 6), generator=torch.Generator().manual_seed(9))
    ids[:, 0], ids[:, -1] = BOS, BOI
    mask = torch.ones_like(ids)
    toks = lisa_trt.generate(target, ids, cfg_scale=4.0, greedy=True)
    assert toks.shape == (2, 4) and torch.equal(toks, hf_generate(hf, ids, mask, 4.0))
    assert close(lisa_trt.image_logits(target, ids, toks), hf_teacher(hf, ids, toks))
    codes = torch.randint(0, 12, (2, 16))
    with torch.no_grad():
        ref = hf.decode_image_tokens(codes).permute(0, 3, 1, 2)
    vq = lisa_trt.load_vq(str(d))
    assert close(lisa_trt.tokens_to_pixels(vq, codes), ref)
    with pytest.raises(InputError, match=r"\(B, 16\)"):
        lisa_trt.tokens_to_pixels(vq, toks)
    with pytest.raises(ConfigError, match="generates 4 image tokens.*4 x 4 grid.*set num_image_tokens to 16"):
        target.config.grid_hw


def test_a_text_model_other_than_llama_is_refused(tmp_path):
    """JanusConfig takes any text_config; the Janus target is transformers' Llama."""
    import json

    d = _save(make_hf(seed=15), tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["model_type"] = "qwen2"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="text_config model_type 'qwen2' is not supported.*Llama"):
        lisa_trt.load_target(str(d))


def test_public_calls_take_a_hugging_face_name_from_the_local_cache(variant, tmp_path, monkeypatch):
    """load_target / load_vq("org/name") resolve through the Hugging Face cache (offline), as
    `--model org/name` does: the snapshot directory is a save_pretrained directory."""
    import shutil

    pytest.importorskip("huggingface_hub")
    hf, target, d = variant
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--tiny-janus"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(d, repo / "snapshots" / commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    named = lisa_trt.load_target("someone/tiny-janus")
    ids, mask = prompts(hf, seed=10)
    assert torch.equal(lisa_trt.generate(named, (ids, mask), cfg_scale=5.0, greedy=True),
                       lisa_trt.generate(target, (ids, mask), cfg_scale=5.0, greedy=True))
    grid = hf.config.vision_config.image_size // hf.config.vision_config.patch_size
    codes = torch.zeros(1, grid * grid, dtype=torch.long)
    assert torch.equal(lisa_trt.tokens_to_pixels(lisa_trt.load_vq("someone/tiny-janus@main"), codes),
                       lisa_trt.tokens_to_pixels(lisa_trt.load_vq(str(d)), codes))
    with pytest.raises(InputError, match="hf download someone/other"):
        lisa_trt.load_target("someone/other")
