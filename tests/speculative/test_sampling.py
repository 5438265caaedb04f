"""CFG, temperature, top-k, top-p against hand-computed cases; the reference loop."""

import torch

from lisa_trt import generate
from lisa_trt.speculative.sampling import cfg_combine, process_logits, top_k_filter, top_p_filter
from lisa_trt.testing import make_cond, make_target

NEG = float("-inf")


def test_cfg_order_and_formula():
    cond = torch.tensor([[1.0, 2.0, 3.0]])
    uncond = torch.tensor([[0.5, 0.0, 4.0]])
    out = cfg_combine(torch.cat([cond, uncond]), 4.0)
    assert torch.allclose(out, torch.tensor([[0.5 + 0.5 * 4, 0 + 2 * 4, 4 - 1 * 4.0]]))


def test_top_k_keeps_ties_and_values():
    x = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.0]])
    assert top_k_filter(x, 2).tolist() == [[NEG, 3.0, NEG, 3.0, NEG]]
    assert top_k_filter(x, 3).tolist() == [[NEG, 3.0, 2.0, 3.0, NEG]]
    assert torch.equal(top_k_filter(x, 0), x)


def test_top_p_hf_semantics():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    x = p.log()
    # cumulative 0.5, 0.8, 0.95, 1.0; drop once cum > p, shifted right so the crossing token stays
    assert torch.isinf(top_p_filter(x, 0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(top_p_filter(x, 0.85)).tolist() == [[False, False, False, True]]
    assert torch.isinf(top_p_filter(x, 0.96)).tolist() == [[False, False, False, False]]
    assert torch.isinf(top_p_filter(x, 0.1)).tolist() == [[False, True, True, True]]  # first kept


def test_process_temperature_then_filter():
    x = torch.tensor([[2.0, 1.0, 0.0]])
    out = process_logits(x, temperature=0.5, top_k=2)
    assert out.tolist() == [[4.0, 2.0, NEG]]
    assert torch.allclose(process_logits(x, temperature=0.0), x / 1e-5)


def test_reference_loop_greedy_is_argmax_chain():
    m = make_target()
    cond = make_cond(m)
    toks = generate(m, cond, cfg_scale=3.0, greedy=True)
    tf = m.teacher_forced_logits(torch.cat([cond, m.null_cond(cond)]), torch.cat([toks, toks]))
    guided = cfg_combine(tf, 3.0)
    assert torch.equal(guided.argmax(-1), toks)


def test_seeded_sampling_is_reproducible_and_private():
    m = make_target()
    cond = make_cond(m)
    torch.manual_seed(123)
    before = torch.rand(1)
    a = generate(m, cond, cfg_scale=2.0, top_k=20, seed=7)
    b = generate(m, cond, cfg_scale=2.0, top_k=20, seed=7)
    c = generate(m, cond, cfg_scale=2.0, top_k=20, seed=8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    torch.manual_seed(123)
    assert torch.equal(before, torch.rand(1))


def test_sampling_distribution_first_token():
    """The first token is drawn from softmax(process(cfg(logits))): chi-square check."""
    m = make_target(vocab_size=256)
    cond = torch.tensor([4])
    full = torch.cat([cond, m.null_cond(cond)])
    cache = m.new_cache(2)
    logits = process_logits(cfg_combine(m.prefill(full, cache).logits[:, -1], 2.0), 1.0, top_k=5)
    p = torch.softmax(logits, -1)[0]
    n = 400
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(256)
    for _ in range(n):
        counts[generate(m, cond, cfg_scale=2.0, top_k=5, num_tokens=1, generator=g)[0, 0]] += 1
    support = p > 0
    assert counts[~support].sum() == 0
    chi2 = (((counts - n * p)[support]) ** 2 / (n * p[support])).sum().item()
    # 4 degrees of freedom; p-value 1e-3 critical value 18.47
    assert chi2 < 18.47, chi2
