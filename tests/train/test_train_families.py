"""One trainer for every family (issue 24): Chameleon / Lumina-mGPT and Janus-Pro drafters train
through train/trainer.py on tiny random HF checkpoints (transformers builds them).

Proves: Chameleon's teacher forcing equals the decode loop's prefill + cached steps with
left-padded prompts; the TTT unroll with per-row start positions equals chain drafting through
the drafter's cache as the tree decoder runs it (padding, 1-D RoPE), for both families; a
Chameleon drafter trains on the image codes only (its head is the layout's allowed ids, row ends
carry no loss, the VQGAN rows reach the LISA loss through the family's SubVocab) and resumes
exactly after a kill; a Janus drafter trains (the loss decreases) and greedy tree speculation
with it is token-identical to `lisa_trt.generate(greedy=True)`; clear errors for wrong inputs.
"""

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import lisa_trt  # noqa: E402
from chameleon_fixtures import N_CODES, save_model_dir  # noqa: E402
from lisa_trt.config import SamplingConfig  # noqa: E402
from lisa_trt.errors import ConfigError, InputError  # noqa: E402
from lisa_trt.models.drafter import Drafter, load_drafter  # noqa: E402
from lisa_trt.models.family import family_of  # noqa: E402
from lisa_trt.models.prompts import Prompts  # noqa: E402
from lisa_trt.speculative.decode import SpecConfig, SpeculativeDecoder  # noqa: E402
from lisa_trt.train import DataConfig, LossConfig, TrainConfig, train_drafter  # noqa: E402
from lisa_trt.train import trainer as T  # noqa: E402
from lisa_trt.train.requests import prompt_request  # noqa: E402
from lisa_trt.speculative.methods import get_method

torch.set_num_threads(1)
CAPS = ["a red fox", "tok70 tok71 tok72", "x", "tok61 tok62 tok63 tok64"]


@pytest.fixture(scope="module")
def cham(tmp_path_factory):
    d = save_model_dir(tmp_path_factory.mktemp("cham"), seed=5, vq=False, num_key_value_heads=2)
    target = lisa_trt.load_target(d)
    with torch.no_grad():  # a peaked head: the drafter has something to learn
        target.lm_head.weight.mul_(25.0)
    return target


@pytest.fixture(scope="module")
def janus(tmp_path_factory):
    from test_janus import make_hf, save

    return lisa_trt.load_target(str(save(make_hf(seed=3), tmp_path_factory.mktemp("janus"))))


def _janus_prompts(B=6, T=6, seed=11):
    from test_janus import prompts

    return prompts(B=B, T=T, seed=seed)


def _cfg(**kw):
    data = kw.pop("data", DataConfig(num_samples=8, eval_samples=2, gen_batch=8, cfg_scale=2.0, top_k=8))
    base = dict(steps=2, batch_size=4, ttt_steps=3, warmup_steps=1, checkpoint_every=1, log_every=1, lr=3e-3,
                loss=LossConfig(kind="eagle3"), data=data)
    base.update(kw)
    return TrainConfig(**base)


def _metrics(run):
    return [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().splitlines()]


def test_chameleon_forward_train_equals_prefill_and_cached_steps(cham):
    target = cham
    p = Prompts.from_rows([[1, 60, 61, 62, 40, 45, 45], [1, 70, 40, 45, 45]], "cpu")  # left-padded
    tokens = torch.randint(4, 4 + N_CODES, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tf = target.forward_train(p, tokens, taps=True)
        cache = target.new_cache(2, prompt_len=7, n_tokens=5)
        pre = target.prefill(p, cache, taps=True)
        logits, taps = [pre.logits[:, -1]], [pre.taps[:, -1]]
        for i in range(4):
            slots = cache.lengths[:, None]
            out = target.forward_tokens(tokens[:, i:i + 1], cache.positions(slots), slots,
                                        cache.attention_mask(slots, torch.ones(2, 1, 1, dtype=torch.bool)), cache,
                                        taps=True)
            cache.lengths += 1
            logits.append(out.logits[:, -1])
            taps.append(out.taps[:, -1])
    assert tf.logits.shape == (2, 5, target.config.vocab_size)
    assert torch.allclose(tf.logits, torch.stack(logits, 1), atol=1e-4)
    assert torch.allclose(tf.taps, torch.stack(taps, 1), atol=1e-4)
    assert target.start_positions(p).tolist() == [7, 5]
    with pytest.raises(InputError, match="tokens must be"):
        target.forward_train(p, tokens[0])


def _chain_check(target, cond, tokens):
    """ttt_unroll entries == the tree decoder's drafter cache (per-row pad, positions = slots - pad)."""
    torch.manual_seed(1)
    d = Drafter.from_target(target, init_head_from_target=False).eval()
    B, N = tokens.shape
    T0 = target.prompt_len(cond)
    with torch.no_grad():
        out = target.forward_train(cond, tokens, taps=True)
        start = target.start_positions(cond)
        outs = T.ttt_unroll(d, out.taps, tokens, 3, start)
        pad = T0 - start
        for m in (0, 3, N - 4):
            cache = d.new_cache(B, T0 + N + 8)
            cache.col_valid[:, :T0] = False
            cache.lengths.fill_(T0)
            cache.pad = pad.clone()
            slots = (T0 + torch.arange(m + 1))[None].expand(B, m + 1)
            causal = torch.ones(m + 1, m + 1, dtype=torch.bool).tril()[None].expand(B, -1, -1)
            lg, h = d(d.project_taps(out.taps[:, : m + 1]), tokens[:, : m + 1], cache.positions(slots), slots,
                      cache.attention_mask(slots, causal), cache)
            cache.lengths += m + 1
            assert (lg[:, m] - outs[0][0][:, m]).abs().max() < 1e-4
            h, used = h[:, m:m + 1], []
            for s in (1, 2):
                slot = cache.lengths[:, None] + s - 1
                used.append(slot)
                tm = cache.attention_mask(torch.cat(used, 1), torch.ones(B, s, s, dtype=torch.bool).tril())[:, -1:]
                pos = (start + m + s)[:, None]
                lg, h = d(h, tokens[:, m + s: m + s + 1], pos, slot, tm, cache)
                assert (lg[:, 0] - outs[s][0][:, m]).abs().max() < 1e-4, (m, s)


def test_ttt_unroll_equals_chain_drafting_with_left_padded_prompts(cham, janus):
    p = Prompts.from_rows([[1, 60, 61, 62, 40, 45, 45], [1, 70, 40, 45, 45]], "cpu")
    _chain_check(cham, p, torch.randint(4, 4 + N_CODES, (2, 10), generator=torch.Generator().manual_seed(2)))
    from test_janus import left_padded

    ids, mask = left_padded()
    _chain_check(janus, (ids, mask), torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(3)))


def test_chameleon_drafter_trains_on_the_image_codes(cham, tmp_path):
    target = cham
    fam = family_of(target.config)
    req = fam.prompter(target).encode(CAPS, image_size=64, cfg=True)
    vq_rows = torch.randn(N_CODES, 8, generator=torch.Generator().manual_seed(0))  # the VQGAN's own rows
    cfg = _cfg(steps=25, checkpoint_every=25, loss=LossConfig(kind="lisa"))
    res = train_drafter(target, vq_rows, cfg, tmp_path / "run", progress=False, request=req)
    rows = _metrics(tmp_path / "run")
    assert rows[-1]["loss"] < 0.8 * rows[0]["loss"] and rows[-1]["top1_s"][0] > rows[0]["top1_s"][0]
    assert all(0 <= r["in_nbhd_s"][0] <= 1 for r in rows) and res["radius"] > 0
    d = load_drafter(res["drafter"], target, family="chameleon")
    assert torch.equal(d.d2t, req.layout.allowed) and d.config.rope == "1d"  # the head: image codes only
    assert res["eval"]["mal_proxy"] >= 1.0 and res["eval"]["sequences"] == 2
    # greedy speculation with the trained drafter == the reference loop (Lumina spans, CFG)
    from lumina_calls import LuminaTokenizer, generate_image_tokens
    from lumina_calls import LuminaSpec, speculative_image_tokens

    tok = LuminaTokenizer(target.source_dir)
    ref = generate_image_tokens(target, tok, CAPS[:2], 64, 64, cfg_scale=2.0, greedy=True)
    spec = LuminaSpec(method="greedy", cfg_scale=2.0, tree_top_k=3, depth=3, total_tokens=8)
    got, st = speculative_image_tokens(target, d, tok, CAPS[:2], 64, 64, spec)
    assert torch.equal(got.tokens, ref.tokens) and st.mal > 1.0


def test_forced_tokens_carry_no_loss(cham):
    """Row-end indices are dropped from the loss and count as accepted in the MAL proxy."""
    target = cham
    req = family_of(target.config).prompter(target).encode(CAPS[:2], image_size=64, cfg=False)
    vocab = T.TrainVocab.of(req.layout)
    assert int((~vocab.trained).sum()) == 4  # one row end per latent row of a 64 px span
    tokens = torch.where(req.layout.forced >= 0, req.layout.forced, 4)[None].expand(2, -1).clone()
    from lisa_trt.train.data import Batch

    with torch.no_grad():
        out = target.forward_train(req.cond, tokens, taps=True)
    batch = Batch(None, tokens, out.taps, out.logits, out.hidden, target.start_positions(req.cond))
    d = Drafter.from_target(target, d2t=req.layout.allowed)
    outs = T.ttt_unroll(d, batch.taps, tokens, 2, batch.start)
    loss, _ = T.ttt_loss(outs, batch, LossConfig(kind="eagle3"), d2t=d.d2t, vocab=vocab)
    # the same loss with the forced columns' target logits scrambled: they are not read
    scrambled = Batch(None, tokens, out.taps, torch.where((req.layout.forced >= 0)[None, :, None],
                                                          torch.randn_like(out.logits), out.logits), out.hidden,
                      batch.start)
    again, _ = T.ttt_loss(outs, scrambled, LossConfig(kind="eagle3"), d2t=d.d2t, vocab=vocab)
    assert torch.allclose(loss, again)


def test_chameleon_resume_after_kill_is_exact(cham, tmp_path, kill_training):
    target = cham
    req = family_of(target.config).prompter(target).encode(CAPS, image_size=32, cfg=True)
    cfg = _cfg(steps=4, checkpoint_every=2, drafter_hidden=16, drafter_heads=2)
    full = train_drafter(target, None, cfg, tmp_path / "full", progress=False, request=req)

    kill_training(lambda: train_drafter(target, None, cfg, tmp_path / "run", progress=False, request=req))
    torch.manual_seed(99)
    resumed = train_drafter(target, None, cfg, tmp_path / "run", progress=False, request=req)
    a, b = load_drafter(full["drafter"], target).state_dict(), load_drafter(resumed["drafter"], target).state_dict()
    for k in a:
        assert (a[k] - b[k]).abs().max() <= 1e-6, k
    assert [r["step"] for r in _metrics(tmp_path / "run")] == [1, 2, 3, 4]
    # the stored rollouts belong to the run: other prompts are refused, not silently re-sampled
    other = family_of(target.config).prompter(target).encode(CAPS[::-1], image_size=32, cfg=True)
    with pytest.raises(ConfigError, match="other prompts"):
        train_drafter(target, None, cfg, tmp_path / "run", progress=False, request=other)


def test_janus_drafter_trains_and_speculates_losslessly(janus, tmp_path):
    target = janus
    cfg = _cfg(steps=20, checkpoint_every=20, data=DataConfig(num_samples=8, eval_samples=2, gen_batch=8,
                                                               cfg_scale=3.0, top_k=8))
    res = train_drafter(target, None, cfg, tmp_path / "run", progress=False,
                        request=prompt_request(target, _janus_prompts()))
    rows = _metrics(tmp_path / "run")
    assert rows[-1]["loss"] < 0.9 * rows[0]["loss"]
    drafter = load_drafter(res["drafter"], target)
    assert drafter.family == "janus" and drafter.config.vocab_size == target.config.codebook_size
    ids = _janus_prompts(B=2, T=5, seed=21)
    spec = SpecConfig.make("greedy", top_k=3, depth=3, total_tokens=8)
    for g in (1.0, 3.0):
        ref = lisa_trt.generate(target, ids, greedy=True, cfg_scale=g)
        got, st = SpeculativeDecoder(target, drafter).generate(ids, sampling=SamplingConfig(cfg_scale=g, greedy=True),
                                                               method=get_method(spec.method), spec=spec)
        assert torch.equal(got, ref) and st.mal > 1.0


def test_codebooks_and_wrong_inputs_are_clear(cham, janus, tmp_path):
    req = family_of(cham.config).prompter(cham).encode(CAPS[:1], image_size=32, cfg=True)
    rows = torch.randn(N_CODES, 8)
    full = T.vocab_codebook(rows, cham.config.vocab_size, req.layout)
    sv = req.layout.sub_vocab
    assert full.shape == (cham.config.vocab_size, 8)
    assert torch.allclose(full[sv.code_ids], torch.nn.functional.normalize(rows[sv.codes], dim=-1))
    with pytest.raises(ConfigError, match="codebook has 5 rows"):
        T.vocab_codebook(torch.randn(5, 8), cham.config.vocab_size, req.layout)
    with pytest.raises(InputError, match="prompt-conditioned"):
        train_drafter(janus, None, _cfg(), tmp_path / "x", progress=False)
    with pytest.raises(ConfigError, match="draft-vocab"):
        T._d2t_within(torch.tensor([4, 5]), req.layout.allowed, N_CODES + 1)


def test_cached_features_and_bf16_for_prompt_families(janus, cham, tmp_path):
    from lisa_trt.train import data as D

    target = janus
    cfg = _cfg(steps=1, data=DataConfig(num_samples=6, eval_samples=2, gen_batch=8, cfg_scale=3.0, top_k=8,
                                        features="cache", shard_size=4))
    req = prompt_request(target, _janus_prompts())
    train_drafter(target, None, cfg, tmp_path / "cache", progress=False, request=req)
    train, _ = D.build_dataset(target, cfg.data, cfg.seed, tmp_path / "cache" / "data", request=req)
    cache = D.FeatureCache(target, train, tmp_path / "cache" / "features", shard_size=4)
    assert cache.complete()
    rows = torch.tensor([5, 0, 3])
    a, b = cache.batch(rows), D.OnlineFeatures(target, train).batch(rows)
    for f in ("taps", "logits", "hidden", "tokens", "start"):
        assert torch.allclose(getattr(a, f).float(), getattr(b, f).float(), atol=1e-5), f
    req = family_of(cham.config).prompter(cham).encode(CAPS, image_size=32, cfg=True)
    res = train_drafter(cham, None, _cfg(steps=1, bf16=True), tmp_path / "bf16", progress=False, request=req)
    assert torch.isfinite(torch.tensor(_metrics(tmp_path / "bf16")[0]["loss"])) and res["steps"] == 1


@pytest.mark.slow
def test_ddp_two_ranks_match_single_process_janus(janus, tmp_path):
    """torchrun --nproc_per_node 2 (gloo on CPU) on a Janus drafter == one process, same global batch."""
    import importlib.util
    import os
    import subprocess

    worker = Path(__file__).with_name("ddp_family_worker.py")
    spec = importlib.util.spec_from_file_location("ddp_family_worker", worker)
    w = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(w)
    root = str(Path(lisa_trt.__file__).resolve().parents[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    env.pop("WORLD_SIZE", None)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(worker), janus.source_dir, str(tmp_path / "ddp")], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len((tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()) == 2  # rank 0 writes once
    single = train_drafter(janus, None, w.config(), tmp_path / "single", progress=False, request=w.request(janus))
    a = load_drafter(tmp_path / "ddp" / "drafter.safetensors", janus).state_dict()
    b = load_drafter(single["drafter"], janus).state_dict()
    for k in a:
        assert (a[k] - b[k]).abs().max() < 1e-5, k
