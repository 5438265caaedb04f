"""Coupled tree drafting (speculative/coupled.py): the position noise is a function of (row seed,
index) only; the decode is the AR loop's Gumbel-max sampler whatever the drafter (token for
token, batch 3 with CFG); the chi-square losslessness test of `exact`; a broken variant failing
it (the test has power); greedy = exact greedy; per-row seeds; the knob's registration (a
Chameleon span: test_chameleon_spec.py)."""

import pytest
import torch

from lisa_trt import generate
from lisa_trt.config import SamplingConfig
from lisa_trt.models.drafter import Drafter
from lisa_trt.speculative import coupled as C
from lisa_trt.speculative.autoregressive import cfg_batch, layout_for, new_target_cache, step_inputs
from lisa_trt.speculative.decode import Guide, SpecConfig, SpeculativeDecoder
from lisa_trt.speculative.methods import FLAT_FIELDS, cli_options, get_method
from lisa_trt.speculative.run import run_method
from lisa_trt.speculative.sampling import make_generator
from lisa_trt.testing import make_cond, make_target

from test_decode import _chi2_homogeneity, chi2_critical

SPEC = SpecConfig.make("coupled", top_k=3, depth=3, total_tokens=10)


def test_position_noise_depends_on_seed_and_index_only():
    n = C.PositionNoise([7, 9], 11, "cpu", span=4)
    a = n(torch.tensor([0, 1]), torch.tensor([[3, 4], [5, 6]]))
    m = C.PositionNoise([7, 9], 11, "cpu", span=4)
    b = m(torch.tensor([1, 0]), torch.tensor([[6], [4]]))  # other order, other rows first
    assert torch.equal(b[0, 0], a[1, 1]) and torch.equal(b[1, 0], a[0, 1])
    assert not torch.equal(a[0, 0], a[0, 1]) and not torch.equal(a[0, 0], a[1, 0])
    assert torch.equal(n(torch.tensor([0]), torch.tensor([[3]]))[0, 0], a[0, 0])  # still held
    with pytest.raises(Exception, match="spans more"):
        n(torch.tensor([0]), torch.tensor([[10, 14]]))


def _gumbel_ar(target, cond, sampling, seed):
    """Independent reference: the AR loop sampling z_i = argmax(log p_i + g_i) with the same noise."""
    B = target.check_cond(cond)
    layout = layout_for(target)
    guide = Guide(sampling, layout)
    noise = C.PositionNoise(C.row_seeds(B, make_generator(seed)), target.config.vocab_size, "cpu", span=4)
    full = cfg_batch(target, cond, sampling.cfg_scale)
    cache = new_target_cache(target, 2 * B if guide.cfg else B, full, layout.n_tokens)
    raw = target.prefill(full, cache).logits[:, -1]
    out = torch.empty(B, layout.n_tokens, dtype=torch.long)
    rows = torch.arange(B)
    for i in range(layout.n_tokens):
        if i:
            x = guide.dup(out[:, i - 1:i])
            pos, slots, mask = step_inputs(cache, x)
            raw = target.forward_tokens(x, pos, slots, mask, cache).logits[:, -1]
            cache.lengths += 1
        idx = torch.full((B,), i)
        out[:, i] = (guide(raw, idx) + noise(rows, idx)).argmax(-1)
    return out


def test_coupled_decode_is_the_gumbel_ar_sampler_whatever_the_drafter():
    m = make_target(std=0.3)
    cond = make_cond(m, batch=3)
    s = SamplingConfig(cfg_scale=2.0, top_k=50)
    ref = _gumbel_ar(m, cond, s, seed=5)
    good = Drafter.from_target(m).eval()
    torch.manual_seed(11)
    other = Drafter.from_target(make_target(std=0.6)).eval()  # a different (worse) drafter
    mals = []
    for d in (good, other):
        toks, st = SpeculativeDecoder(m, d).generate(cond, sampling=s, method=get_method(SPEC.method), spec=SPEC, seed=5)
        assert torch.equal(toks, ref)
        assert float(torch.cat(st.tvd).abs().max()) == 0.0
        mals.append(st.mal)
    assert mals[0] > 1.0
    # scale 0 (exact's top-K drafts) decodes the same tokens too
    toks, _ = SpeculativeDecoder(m, good).generate(cond, sampling=s, method=get_method(SPEC.method), spec=SPEC.replace(coupled_scale=0.0), seed=5)
    assert torch.equal(toks, ref)


def _chi2_samples(monkeypatch=None, broken=None):
    V, n = 12, 2000
    m = make_target(vocab_size=V, std=0.25, block_size=4)
    d = Drafter.from_target(m).eval()
    if broken is not None:
        monkeypatch.setattr(C, "verify_coupled", broken)
    s = SamplingConfig(cfg_scale=2.0, temperature=1.0, top_k=8)
    ref = generate(m, torch.full((n,), 3), cfg_scale=2.0, top_k=8, seed=1)
    toks, stats = SpeculativeDecoder(m, d).generate(torch.full((n,), 3), sampling=s, method=get_method(SPEC.method), spec=SPEC.replace(top_k=3, depth=2,
                                                    total_tokens=8), seed=2)
    bad = []
    for j in range(4):
        chi2, df = _chi2_homogeneity(toks[:, j], ref[:, j], V)
        if chi2 >= chi2_critical(df):
            bad.append((j, chi2, df))
    for j in range(3):
        chi2, df = _chi2_homogeneity(toks[:, j] * V + toks[:, j + 1], ref[:, j] * V + ref[:, j + 1], V * V)
        if chi2 >= chi2_critical(df):
            bad.append(("pair", j, chi2, df))
    return bad, stats


def test_coupled_sampling_is_lossless():
    bad, stats = _chi2_samples()
    assert stats.mal > 1.05  # drafts really are accepted (and rejected) along the way
    assert bad == []


def test_a_broken_coupling_fails_the_lossless_test(monkeypatch):
    """Power: drawing the bonus with FRESH randomness after a mismatch (instead of the target's
    own noisy sample there) favours the drafted tokens and breaks the law."""
    def fresh_bonus(logits, tree, noise):
        res = C.V.verify_greedy(logits.float() + noise, tree)
        last = res.path.gather(1, res.accept_len[:, None])[:, 0]
        p = torch.softmax(logits.float()[torch.arange(logits.shape[0]), last], -1)
        bonus = torch.multinomial(p, 1)[:, 0]
        toks = res.tokens.scatter(1, res.accept_len[:, None], bonus[:, None])
        return C.V.VerifyResult(res.path, res.accept_len, bonus, toks, res.pos_tvd)

    bad, _ = _chi2_samples(monkeypatch, fresh_bonus)
    assert bad


def test_greedy_is_exact_greedy_and_row_seeds_are_batch_independent():
    m = make_target(std=0.3)
    cond = make_cond(m, batch=3)
    d = Drafter.from_target(m).eval()
    g = SamplingConfig(cfg_scale=2.0, greedy=True)
    toks, _ = SpeculativeDecoder(m, d).generate(cond, sampling=g, method=get_method(SPEC.method), spec=SPEC, seed=0)
    assert torch.equal(toks, generate(m, cond, cfg_scale=2.0, greedy=True))
    s = SamplingConfig(cfg_scale=2.0)
    both, _ = run_method(get_method("coupled"), m, d, None, cond[:2], sampling=s, spec=SPEC, seed=0, seeds=[4, 8])
    alone, _ = run_method(get_method("coupled"), m, d, None, cond[1:2], sampling=s, spec=SPEC, seed=0, seeds=[8])
    assert torch.equal(both[1:], alone)


def test_coupled_is_registered_with_its_knob():
    m = get_method("coupled")
    assert m.kind == "tree" and m.needs_drafter and m.session is not None and m.settings is not None
    assert "coupled_scale" in FLAT_FIELDS and "--coupled-scale" in {o.flag for o in cli_options()}
    with pytest.raises(Exception, match="scale"):
        SpecConfig.make("coupled", coupled_scale=-1.0).settings("coupled")
