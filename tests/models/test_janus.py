"""Janus-Pro family vs transformers' JanusForConditionalGeneration on tiny random checkpoints (fp32).

Proves: the HF directory loads strictly (and wrong directories / missing, unknown or mis-shaped
keys fail naming the problem); generation-head logits under teacher forcing equal transformers'
(cond, unconditional and left-padded rows) to 1e-5; the unconditional rows are the ones
transformers' image `generate` builds; greedy CFG tokens equal `generate(generation_mode="image")`
for G > 1 (one prompt, two prompts, left-padded) and a cond-only greedy loop through transformers'
modules for G == 1; tree-masked forward_tokens equals sequential decoding; tokens_to_pixels equals
`decode_image_tokens`. The reference is always transformers, never lisa-trt itself.
"""

import json
import shutil

import pytest
import torch

from lisa_trt.models.conditioning import TextPrompts
from lisa_trt.errors import CheckpointError, ConfigError, InputError
from lisa_trt.models import family as F

pytest.importorskip("transformers")

from lisa_trt.families import janus as J  # noqa: E402

BOS, PAD, BOI = 1, 0, 7
TEXT_VOCAB, CODES, GRID = 128, 64, 4

CONFIGS = {
    "gqa": {},
    "bias_headdim_rope": {"attention_bias": True, "mlp_bias": True, "head_dim": 12, "num_key_value_heads": 1,
                          "rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}},
}


def hf_config(**text_over):
    from transformers import JanusConfig

    text = dict(model_type="llama", vocab_size=TEXT_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=BOS,
                pad_token_id=PAD, eos_token_id=2)
    text.update(text_over)
    return JanusConfig(
        text_config=text,
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16 * GRID,
                           patch_size=16, projection_dim=32, num_image_tokens=GRID * GRID),
        vq_config=dict(embed_dim=8, num_embeddings=CODES, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 1, 2], num_res_blocks=1, projection_dim=32, image_token_embed_dim=32),
        image_token_id=5)


def _large(name, p, g):
    """Large enough that greedy codes vary: embeddings N(0, 1), matrices 3 / sqrt(fan_in)."""
    if "embed" in name or p.dim() == 1:
        return torch.randn(p.shape, generator=g)
    return 3.0 * torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5


def randomize(model, seed: int) -> None:
    """Every parameter random (norm gammas too)."""
    from hf_fixtures import randomize as _randomize

    _randomize(model, seed, weights=_large)


def make_hf(seed: int = 0, **text_over):
    from transformers import JanusForConditionalGeneration

    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(hf_config(**text_over)).eval()
    randomize(model, seed)
    model.generation_config.generation_kwargs = {"boi_token_id": BOI}
    return model


def save(hf, folder, **kw):
    hf.save_pretrained(str(folder), safe_serialization=True, **kw)
    return folder


def close(a, b, rel=1e-5) -> bool:
    """|a - b| <= rel * max|b| (fp32 logits here reach ~20: 1e-5 relative is ~1e-4 absolute)."""
    a, b = a.detach().float(), b.detach().float()
    return bool((a - b).abs().max() <= rel * max(1.0, float(b.abs().max())))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    hf = make_hf(seed=len(request.param), **CONFIGS[request.param])
    d = save(hf, tmp_path_factory.mktemp(request.param))
    return hf, J.load_janus_target(d), d


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    hf = make_hf(seed=3)
    d = save(hf, tmp_path_factory.mktemp("gqa"))
    return hf, J.load_janus_target(d), d


def prompts(B=2, T=6, seed=1):
    """[BOS] random text [BOI] rows (random ids avoid the special ones)."""
    ids = torch.randint(8, TEXT_VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))
    ids[:, 0], ids[:, -1] = BOS, BOI
    return ids


def left_padded():
    """Two prompts of 6 and 4 tokens, the second left-padded with PAD: (ids, bool mask)."""
    a, b = prompts(1, 6, seed=4), prompts(1, 4, seed=5)
    ids = torch.cat([a, torch.cat([torch.full((1, 2), PAD), b], 1)])
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, :2] = False
    return ids, mask


@torch.no_grad()
def hf_teacher_logits(hf, ids, image_tokens, mask=None):
    """Generation-head logits through transformers' modules: prompt text embeddings, then image
    codes through `prepare_embeddings_for_image_generation`; [:, k] predicts image_tokens[:, k]."""
    T, N = ids.shape[1], image_tokens.shape[1]
    codes = hf.prepare_embeddings_for_image_generation(image_tokens[:, :-1])
    emb = torch.cat([hf.get_input_embeddings()(ids), codes], 1)
    am = None
    if mask is not None:
        am = torch.cat([mask.long(), torch.ones(ids.shape[0], N - 1, dtype=torch.long)], 1)
    h = hf.model.language_model(inputs_embeds=emb, attention_mask=am).last_hidden_state
    return hf.model.generation_head(h[:, T - 1:])


@torch.no_grad()
def hf_generate(hf, ids, scale, mask=None):
    mask = torch.ones_like(ids) if mask is None else mask.long()
    return hf.generate(ids, attention_mask=mask, generation_mode="image", do_sample=False, guidance_scale=scale)


@torch.no_grad()
def hf_greedy_cond_only(hf, ids, n):
    """Greedy image codes without CFG by full recompute through transformers' modules."""
    out = torch.zeros(ids.shape[0], 0, dtype=torch.long)
    for _ in range(n):
        nxt = hf_teacher_logits(hf, ids, torch.cat([out, out[:, :1]], 1))[:, -1].argmax(-1, keepdim=True)
        out = torch.cat([out, nxt], 1)
    return out


# ----------------------------------------------------------------------------- loading

def test_strict_load_has_exactly_the_hf_generation_keys(gqa):
    hf, target, d = gqa
    cfg = target.config
    assert target.family == "janus" and cfg.model_type == "janus"
    assert (cfg.block_size, cfg.vocab_size, cfg.grid_hw, cfg.image_size) == (16, CODES, (GRID, GRID), 16)
    assert (cfg.n_layer, cfg.n_head, cfg.kv_heads, cfg.dim, cfg.head_dim) == (3, 4, 2, 32, 8)
    assert J.JanusConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.tap_layers == (2, 1, 0) and (cfg.bos_token_id, cfg.pad_token_id, cfg.boi_token_id) == (BOS, PAD, BOI)
    hf_sd = hf.state_dict()
    want = {k for k in hf_sd if not k.startswith(J.checkpoint.TARGET_IGNORED)}
    assert set(target.state_dict()) == want
    for k, v in target.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, hf_sd[k]), k
    assert target.output is target.model.generation_head.vision_head
    assert torch.equal(target.output.weight, hf.model.generation_head.vision_head.weight)
    vq = J.load_janus_vq(d)
    assert set(vq.state_dict()) == {k[len("model.vqmodel."):] for k in hf_sd if k.startswith("model.vqmodel.")
                                    and not k.startswith(("model.vqmodel.encoder.", "model.vqmodel.quant_conv."))}


def test_family_is_registered_and_claims_janus_dirs(gqa, tmp_path):
    _, target, d = gqa
    fam = F.family_of("janus")
    assert isinstance(fam, J.JanusFamily) and fam is F.family_of(target.config) and fam.name == "janus"
    assert "janus" in F.model_types() and fam.conditioning(target.config) == TextPrompts(negative=True)
    assert fam.claims(d) and fam.claims(str(d))
    assert not fam.claims(tmp_path) and not fam.claims(d / "config.json")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "chameleon"}))
    assert not fam.claims(tmp_path)
    t2 = fam.load_target(d, {"max_prompt_tokens": 32})
    assert t2.config.max_prompt_tokens == 32 and t2.config.with_overrides(max_prompt_tokens=128) == target.config
    assert isinstance(fam.load_decoder(d), J.JanusVQ)


def _rewrite(src, dst, edit_sd=None, edit_cfg=None):
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    for f in ("config.json", "generation_config.json"):
        shutil.copy(src / f, dst / f)
    sd = load_file(str(src / "model.safetensors"))
    if edit_sd:
        edit_sd(sd)
    save_file(sd, str(dst / "model.safetensors"))
    if edit_cfg:
        cfg = json.loads((dst / "config.json").read_text())
        edit_cfg(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_wrong_directories_name_the_fix(gqa, tmp_path):
    _, _, d = gqa
    with pytest.raises(ConfigError, match="config.json.*model_type 'janus'.*save_pretrained"):
        J.load_janus_target(tmp_path)
    with pytest.raises(ConfigError, match="not a directory"):
        J.load_janus_target(d / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "chameleon"}))
    with pytest.raises(ConfigError, match="model_type 'chameleon', not 'janus'"):
        J.load_janus_target(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "multi_modality"}))
    with pytest.raises(ConfigError, match="convert_janus_weights_to_hf"):
        J.load_janus_target(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "janus", "text_config": {}}))
    with pytest.raises(ConfigError, match="no vq_config"):
        J.load_janus_target(tmp_path)
    nofiles = tmp_path / "nofiles"
    nofiles.mkdir()
    shutil.copy(d / "config.json", nofiles / "config.json")
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        J.load_janus_target(nofiles)


def test_bad_weights_are_refused_naming_the_keys(gqa, tmp_path):
    _, _, d = gqa
    miss = _rewrite(d, tmp_path / "miss", lambda sd: sd.pop("model.generation_head.vision_head.bias"))
    with pytest.raises(CheckpointError, match="missing keys: model.generation_head.vision_head.bias"):
        J.load_janus_target(miss)
    extra = _rewrite(d, tmp_path / "extra", lambda sd: sd.update({"model.mystery.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match="unexpected keys: model.mystery.weight"):
        J.load_janus_target(extra)
    shape = _rewrite(d, tmp_path / "shape", edit_cfg=lambda c: c["text_config"].update(intermediate_size=48))
    with pytest.raises(CheckpointError, match=r"shape mismatches: .*gate_proj.weight: file \(64, 32\) vs config "
                                              r"\(48, 32\)(.|\n)*intermediate_size 64"):
        J.load_janus_target(shape)
    vq_miss = _rewrite(d, tmp_path / "vqmiss", lambda sd: sd.pop("model.vqmodel.decoder.conv_out.bias"))
    J.load_janus_target(vq_miss)  # the target does not need the VQ ...
    with pytest.raises(CheckpointError, match="missing keys: decoder.conv_out.bias"):
        J.load_janus_vq(vq_miss)  # ... the VQ does
    vq_extra = _rewrite(d, tmp_path / "vqextra", lambda sd: sd.update({"model.vqmodel.decoder.extra": torch.zeros(1)}))
    with pytest.raises(CheckpointError, match="unexpected keys: decoder.extra"):
        J.load_janus_vq(vq_extra)
    # the understanding tower is ignored by prefix: a change there does not matter
    tower = _rewrite(d, tmp_path / "tower", lambda sd: sd.update({"model.vision_model.anything": torch.zeros(3)}))
    J.load_janus_target(tower)


def test_sharded_bf16_and_trimmed_configs_load(tmp_path):
    """Shards + index, bf16 weights (computed in fp32), and a config.json whose text_config
    leaves out keys equal to LlamaConfig's defaults."""
    hf = make_hf(seed=7)
    d = save(hf.to(torch.bfloat16), tmp_path / "sharded", max_shard_size="20KB")
    assert (d / "model.safetensors.index.json").is_file() and len(list(d.glob("model-*.safetensors"))) > 1
    cfg = json.loads((d / "config.json").read_text())
    for k in ("hidden_act", "rms_norm_eps", "attention_bias", "mlp_bias"):
        del cfg["text_config"][k]
    (d / "config.json").write_text(json.dumps(cfg))
    target = J.load_janus_target(d)
    assert target.output.weight.dtype == torch.float32
    ids, codes = prompts(), torch.randint(0, CODES, (2, 16), generator=torch.Generator().manual_seed(0))
    from transformers import JanusForConditionalGeneration

    hf = JanusForConditionalGeneration.from_pretrained(str(d), dtype=torch.float32).eval()
    ref = hf_teacher_logits(hf, ids, codes)  # the same bf16-rounded weights, computed in fp32
    assert close(J.image_logits(target, ids, codes), ref)


# ----------------------------------------------------------------------------- logits and CFG rows

def test_image_logits_equal_transformers_teacher_forcing(pair):
    hf, target, _ = pair
    ids = prompts(B=2, T=6, seed=2)
    uncond = target.null_cond(ids)
    rows = torch.cat([ids, uncond])
    codes = torch.randint(0, CODES, (4, 16), generator=torch.Generator().manual_seed(3))
    ours = J.image_logits(target, rows, codes)
    ref = hf_teacher_logits(hf, rows, codes)
    assert ours.shape == (4, 16, CODES) and ours.dtype == torch.float32
    assert close(ours, ref)
    assert (ours[:2] - ours[2:]).abs().max() > 0.1  # unconditional rows differ: the check has teeth
    pad_ids, mask = left_padded()
    ours = J.image_logits(target, (pad_ids, mask), codes[:2])
    assert close(ours, hf_teacher_logits(hf, pad_ids, codes[:2], mask))
    alone = J.image_logits(target, pad_ids[1:, 2:], codes[1:2])  # the padded row alone, unpadded
    assert close(ours[1:], alone)


def test_null_cond_is_what_transformers_generate_builds(gqa):
    hf, target, _ = gqa
    ids, mask = left_padded()
    ids = ids.clone()
    ids[0, 3] = BOS  # a BOS inside the text is kept too
    seen = []
    hook = hf.get_input_embeddings().register_forward_hook(lambda m, inp, out: seen.append(inp[0].clone()))
    try:
        hf_generate(hf, ids, 5.0, mask)
    finally:
        hook.remove()
    hf_rows = next(x for x in seen if x.shape == (4, 6))  # generate's [cond; uncond] prompt rows
    n_ids, n_mask = target.null_cond((ids, mask))
    assert torch.equal(hf_rows[:2], ids) and torch.equal(hf_rows[2:], n_ids) and torch.equal(n_mask, mask)
    assert torch.equal(F.family_of("janus").null_cond(target.config, ids), n_ids)
    assert not torch.equal(n_ids, ids)


# ----------------------------------------------------------------------------- generation

def test_greedy_cfg_tokens_equal_transformers_generate(pair):
    hf, target, _ = pair
    one = prompts(B=1, T=6, seed=8)
    two = prompts(B=2, T=5, seed=9)
    for ids in (one, two):
        ours = J.generate_image_tokens(target, ids, cfg_scale=5.0)
        assert ours.shape == (ids.shape[0], 16) and ours.dtype == torch.long
        assert torch.equal(ours, hf_generate(hf, ids, 5.0))
        assert ours.unique().numel() > 3  # the codes vary: equality is not trivial
    ours3 = J.generate_image_tokens(target, two, cfg_scale=3.0)
    assert torch.equal(ours3, hf_generate(hf, two, 3.0))
    assert not torch.equal(ours3, J.generate_image_tokens(target, two, cfg_scale=1.0))  # guidance matters


def test_left_padded_batch_equals_transformers_generate(gqa):
    hf, target, _ = gqa
    ids, mask = left_padded()
    ours = J.generate_image_tokens(target, (ids, mask), cfg_scale=5.0)
    assert torch.equal(ours, hf_generate(hf, ids, 5.0, mask))
    assert torch.equal(ours[1:], J.generate_image_tokens(target, ids[1:, 2:], cfg_scale=5.0))


def test_g1_greedy_equals_cond_only_transformers_loop(gqa):
    """G == 1 uses no unconditional rows. transformers 5.24's generate fails for guidance_scale 1
    (it doubles the batch and skips the CFG processor), so the reference is greedy decoding
    through its modules; if its generate works (a later version), it must agree as well."""
    hf, target, _ = gqa
    ids = prompts(B=2, T=5, seed=10)
    ours = J.generate_image_tokens(target, ids, cfg_scale=1.0)
    assert torch.equal(ours, hf_greedy_cond_only(hf, ids, 16))
    try:
        ref = hf_generate(hf, ids, 1.0)
    except RuntimeError:
        return
    assert torch.equal(ours, ref)


def test_sampling_is_seeded_and_in_range(gqa):
    _, target, _ = gqa
    ids = prompts(B=2, T=5, seed=11)
    a = J.generate_image_tokens(target, ids, 4.0, greedy=False, temperature=1.0, seed=5)
    b = J.generate_image_tokens(target, ids, 4.0, greedy=False, temperature=1.0, seed=5)
    assert torch.equal(a, b) and ((a >= 0) & (a < CODES)).all()
    with pytest.raises(InputError, match="temperature"):
        J.generate_image_tokens(target, ids, greedy=False, temperature=0.0)


def test_tree_mask_forward_tokens_equals_sequential(gqa):
    """A branching tree verified in one forward gives each node its path's logits (vs one-token
    steps through a fresh cache, and vs transformers' teacher forcing)."""
    hf, target, _ = gqa
    ids, mask = left_padded()
    cache = target.new_cache(2, extra=8)
    target.prefill((ids, mask), cache)
    # nodes: 0 root; 1 child of 0; 2 child of 1; 3 second child of 0; 4 a sibling of 0
    tok = torch.tensor([[10, 11, 12, 13, 14], [20, 21, 22, 23, 24]])
    anc = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 1, 0], [0, 0, 0, 0, 1]],
                       dtype=torch.bool)[None].expand(2, 5, 5)
    depth = torch.tensor([0, 1, 2, 1, 0])[None].expand(2, 5)
    slots = cache.lengths[:, None] + torch.arange(5)[None]
    tree = target.forward_tokens(tok, cache.positions(cache.lengths[:, None] + depth), slots,
                                 cache.attention_mask(slots, anc), cache).logits
    for node, path in {2: [0, 1, 2], 3: [0, 3], 4: [4]}.items():
        seq = target.new_cache(2)
        out = target.prefill((ids, mask), seq).logits
        for t in path:
            s = seq.lengths[:, None]
            out = target.forward_tokens(tok[:, t:t + 1], seq.positions(s), s,
                                        seq.attention_mask(s, torch.ones(2, 1, 1, dtype=torch.bool)), seq).logits
            seq.lengths += 1
        assert close(tree[:, node], out[:, 0])
        codes = torch.cat([tok[:, path], tok[:, :1]], 1)
        ref = hf_teacher_logits(hf, ids, codes, mask)[:, -1]
        assert close(tree[:, node], ref)


def test_prefill_logits_taps_and_hidden(gqa):
    hf, target, _ = gqa
    ids = prompts(B=2, T=6, seed=12)
    cache = target.new_cache(2)
    out = target.prefill(ids, cache, taps=True)
    ref = hf_teacher_logits(hf, ids, torch.zeros(2, 1, dtype=torch.long))
    assert out.logits.shape == (2, 1, CODES) and close(out.logits, ref)
    assert out.taps.shape == (2, 1, 3 * 32) and torch.equal(cache.lengths, torch.tensor([6, 6]))
    assert torch.equal(target.output(out.hidden).float(), out.logits)
    full = target.forward_train(ids, torch.zeros(2, 3, dtype=torch.long), taps=True)
    assert full.logits.shape == (2, 3, CODES) and full.taps.shape == (2, 3, 96)
    assert close(full.taps[:, :1], out.taps)


# ----------------------------------------------------------------------------- conditions and cache

def test_conditions_are_checked_with_the_fix(gqa):
    _, target, _ = gqa
    fam, cfg = F.family_of("janus"), target.config
    ids, mask = left_padded()
    assert target.check_cond(ids) == fam.check_cond(cfg, (ids, mask)) == 2
    assert fam.check_cond(cfg, (ids, mask.long())) == 2
    with pytest.raises(InputError, match="2-D integer"):
        target.check_cond(ids.float())
    with pytest.raises(InputError, match=r"0\.\.127"):
        target.check_cond(ids + 200)
    with pytest.raises(InputError, match="LEFT-padded"):
        target.check_cond((ids, mask.flip(1)))
    with pytest.raises(InputError, match="attention_mask must be"):
        target.check_cond((ids, mask[:, :3]))
    with pytest.raises(InputError, match="max_prompt_tokens=128.*set_max_prompt_tokens"):
        fam.check_cond(cfg, torch.ones(1, 129, dtype=torch.long))  # the budget of engines / default caches
    assert target.check_cond(torch.ones(1, 129, dtype=torch.long)) == 1  # a torch target sizes caches per prompt
    with pytest.raises(InputError, match="max_position_embeddings 256; shorten the prompt to at most 240"):
        target.check_cond(torch.ones(1, 241, dtype=torch.long))
    ex = fam.example_cond(cfg, 3, torch.Generator().manual_seed(0))
    assert fam.check_cond(cfg, ex) == 3 and (ex[0][:, -1] == BOI).all()
    first = ex[1].float().argmax(1)
    assert ((ex[0][torch.arange(3), first] == BOS) | (ex[1].sum(1) == 1)).all()
    ins = fam.cond_inputs(cfg, (ids, mask), "cpu", torch.float32)
    assert {k: (v.dtype, tuple(v.shape)) for k, v in ins.items()} == {
        "prompt_ids": (torch.int64, (2, 6)), "prompt_mask": (torch.bool, (2, 6))}
    back = fam.cond_from_inputs(cfg, ins)
    assert torch.equal(back[0], ids) and torch.equal(back[1], mask)
    assert [s[0] for s in fam.cond_specs(cfg)] == ["prompt_ids", "prompt_mask"]
    assert fam.cond_inputs(cfg, ids, "cpu", torch.float32)["prompt_mask"].all()


def test_cache_budget_and_prompt_refusal(gqa):
    _, target, _ = gqa
    cache = target.new_cache(2, extra=5)
    assert cache.max_len >= 128 + 16 + 5 and cache.prompt_budget == 128 and cache.max_len % 8 == 0
    small = target.new_cache(1, prompt_len=4)
    assert small.prompt_budget == 4
    with pytest.raises(InputError, match="prompt budget of 4.*prompt_len=6"):
        target.prefill(prompts(1, 6), small)
    with pytest.raises(InputError, match="does not match the cache batch"):
        target.prefill(prompts(2, 4), small)
    with pytest.raises(InputError, match="max_position_embeddings"):
        target.new_cache(1, max_len=1000)
    t = J.load_janus_target(target.source_dir)
    t.set_max_prompt_tokens(200)
    assert t.check_cond(torch.ones(1, 150, dtype=torch.long)) == 1 and t.new_cache(1).prompt_budget == 200


def test_cfg_needs_the_special_tokens(tmp_path):
    hf = make_hf(seed=13)
    hf.generation_config.generation_kwargs = {}
    d = save(hf, tmp_path / "noboi")
    target = J.load_janus_target(d)
    assert target.config.boi_token_id is None
    ids = prompts(1, 5)
    assert J.generate_image_tokens(target, ids, cfg_scale=1.0).shape == (1, 16)
    with pytest.raises(ConfigError, match="boi_token_id"):
        J.generate_image_tokens(target, ids, cfg_scale=5.0)
    assert J.load_janus_target(d, {"boi_token_id": BOI}).config.boi_token_id == BOI


# ----------------------------------------------------------------------------- VQ

def test_tokens_to_pixels_equals_decode_image_tokens(gqa):
    hf, _, d = gqa
    vq = F.family_of("janus").load_decoder(d)
    codes = torch.randint(0, CODES, (2, 16), generator=torch.Generator().manual_seed(14))
    px = J.tokens_to_pixels(vq, codes)
    with torch.no_grad():
        ref = hf.decode_image_tokens(codes)  # (B, H, W, 3), channels last
    assert px.shape == (2, 3, 16, 16) and ref.shape == (2, 16, 16, 3)
    assert close(px, ref.permute(0, 3, 1, 2))
    assert px.abs().max() > 1.0  # raw: neither clamped nor rescaled
    assert torch.equal(vq.tokens_to_pixels(codes.view(2, GRID, GRID)), px)
    assert torch.equal(F.family_of("janus").tokens_to_pixels(vq, codes), px)
    with pytest.raises(InputError, match=r"\(B, 16\) or \(B, 4, 4\)"):
        vq.tokens_to_pixels(codes[:, :9])
    with pytest.raises(InputError, match="0..63"):
        vq.tokens_to_pixels(codes + CODES)


# ----------------------------------------------------------------------------- public calls

def test_public_calls_equal_transformers(pair):
    """lisa_trt.load_target / generate / image_logits / load_vq / tokens_to_pixels on a Janus
    directory: the generic decode loop equals transformers' image generation."""
    import lisa_trt

    hf, _, d = pair
    target = lisa_trt.load_target(str(d))
    assert target.family == "janus"
    ids = prompts(B=2, T=5, seed=21)
    for g in (5.0, 3.0):
        toks = lisa_trt.generate(target, ids, cfg_scale=g, greedy=True)
        assert torch.equal(toks, hf_generate(hf, ids, g))
        assert torch.equal(toks, J.generate_image_tokens(target, ids, cfg_scale=g))
    assert torch.equal(lisa_trt.generate(target, ids, cfg_scale=1.0, greedy=True),
                       J.generate_image_tokens(target, ids, cfg_scale=1.0))
    pids, mask = left_padded()
    assert torch.equal(lisa_trt.generate(target, (pids, mask), cfg_scale=5.0, greedy=True),
                       hf_generate(hf, pids, 5.0, mask))
    assert close(lisa_trt.image_logits(target, ids, toks), hf_teacher_logits(hf, ids, toks))
    null = target.null_cond(ids)
    assert close(lisa_trt.image_logits(target, null, toks), hf_teacher_logits(hf, null, toks))
    vq = lisa_trt.load_vq(str(d))
    with torch.no_grad():
        ref = hf.decode_image_tokens(toks).permute(0, 3, 1, 2)
    assert close(lisa_trt.tokens_to_pixels(vq, toks), ref)


def save_tokenizer(folder):
    """A word-level tokenizer.json over the tiny text vocabulary with Janus' special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<pad>": PAD, "<s>": BOS, "</s>": 2, "<|User|>:": 3, "<|Assistant|>:": 4, "<begin_of_image>": BOI}
    vocab.update({f"w{i}": i for i in range(8, TEXT_VOCAB)})
    vocab["<unk>"] = 5
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|User|>:", "<|Assistant|>:", "<begin_of_image>", "<s>", "</s>", "<pad>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    tok.save(str(folder / "tokenizer.json"))


def test_text_prompts_through_the_family_prompter(gqa, tmp_path):
    """Request of the family's prompter: BOS + conversation format + BOI, left-padded; the generic
    loop on it equals transformers generate on the same ids and mask."""
    import shutil as sh

    import lisa_trt

    hf, _, d = gqa
    d2 = tmp_path / "withtok"
    sh.copytree(d, d2)
    save_tokenizer(d2)
    target = lisa_trt.load_target(str(d2))
    req = F.family_of("janus").prompter(target).encode(["w10 w11 w12", "w20"], cfg=True)
    ids, valid = req.cond
    assert ids[0].tolist() == [BOS, 3, 10, 11, 12, 4, BOI] and ids[1, 2:].tolist() == [BOS, 3, 20, 4, BOI]
    assert valid[0].all() and valid[1].tolist() == [False, False] + [True] * 5
    assert req.layout.n_tokens == 16 and req.grid == (GRID, GRID)
    toks = lisa_trt.generate(target, req.cond, cfg_scale=5.0, greedy=True)
    assert torch.equal(toks, hf_generate(hf, ids, 5.0, valid))
    with pytest.raises(InputError, match="generates 16 x 16 images only"):
        F.family_of("janus").prompter(target).encode(["w10"], image_size=32)


def test_every_cli_command_runs_janus_directories(gqa, tmp_path, check_mal):
    """generate / calibrate / train / export through the generic entries on a tiny Janus directory
    (with its tokenizer); tests/export/test_janus_export.py runs the bundles end to end."""
    import shutil as sh

    import numpy as np
    from click.testing import CliRunner

    from lisa_trt.cli import main

    _, _, d0 = gqa
    d = tmp_path / "janus"
    sh.copytree(d0, d)
    save_tokenizer(d)

    def cli(*args):
        return CliRunner().invoke(main, [str(a) for a in args])

    r = cli("generate", "--model", d, "--out", tmp_path / "o")
    assert r.exit_code == 2 and "--prompt" in r.output and not (tmp_path / "o").exists()
    r = cli("generate", "--model", d, "--prompt", "w10 w11", "--prompt", "w20", "--greedy", "--out", tmp_path / "g")
    assert r.exit_code == 0, r.output
    assert np.load(tmp_path / "g" / "tokens.npy").shape == (2, GRID, GRID)
    assert len(list((tmp_path / "g").glob("*.png"))) == 2
    st = json.loads((tmp_path / "g" / "stats.json").read_text())
    assert st["family"] == "janus" and st["sampling"]["cfg_scale"] == 5.0  # the family's guidance default
    r = cli("calibrate", "--model", d, "--out", tmp_path / "t.safetensors", "--rollouts", "2", "--samples-per-pos", "2",
            "--clusters", "2", "--lantern-k", "4")
    assert r.exit_code == 0, r.output
    r = cli("train", "--model", d, "--out", tmp_path / "run", "--steps", "1", "--num-samples", "2", "--batch-size", "2",
            "--eval-images", "2")
    assert r.exit_code == 0 and "held-out decoding (2 images" in r.output, r.output
    ev = json.loads((tmp_path / "run" / "eval_decode.json").read_text())  # real decoding of held-out prompts
    assert ev["images"] == 2 and len(ev["prompts"]) == 2
    check_mal(ev["mal"], ev["target_forwards"], GRID * GRID, rows=2)  # the held-out decode's own MAL
    r = cli("generate", "--model", d, "--prompt", "w10", "--verify", "gasv", "--drafter",
            tmp_path / "run" / "drafter.safetensors", "--tables", tmp_path / "t.safetensors", "--tree-tokens", "6",
            "--out", tmp_path / "s")
    assert r.exit_code == 0 and "gasv: MAL" in r.output, r.output
    r = cli("export", "--model", d, "--out", tmp_path / "e", "--max-prompt", "16", "--max-tree", "8")
    assert r.exit_code == 0, r.output  # the family's export plugin (families/janus/export.py)
    assert json.loads((tmp_path / "e" / "manifest.json").read_text())["family"] == "janus"
