"""Each LISA / EAGLE loss term against a hand-computed small case."""

import math

import pytest
import torch

from lisa_trt.errors import ConfigError
from lisa_trt.train import losses as L

torch.set_num_threads(1)

# Codebook of 3 unit vectors in 2-D: e0 = +x, e1 = +y, e2 = -x.
E = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])


def logits_of(p):
    return torch.tensor(p, dtype=torch.float32).log()


def test_centroid_neighbourhood_and_score_by_hand():
    p = torch.tensor([[0.5, 0.3, 0.2]])
    # top-2 renormalised: (0.625, 0.375); c = (0.625, 0.375) / |.|
    n = math.hypot(0.625, 0.375)
    c = L.target_centroid(p, E, k=2)
    assert torch.allclose(c, torch.tensor([[0.625 / n, 0.375 / n]]), atol=1e-6)
    d = L.cosine_distance(c, E)
    assert torch.allclose(d, torch.tensor([[1 - 0.625 / n, 1 - 0.375 / n, 1 + 0.625 / n]]), atol=1e-6)
    # r = 0.2: N = {0}; alpha = 0.5
    miss = L.locality_score(p, logits_of([[0.1, 0.8, 0.1]]), E, radius=0.2, k=2)
    hit = L.locality_score(p, logits_of([[0.8, 0.1, 0.1]]), E, radius=0.2, k=2)
    assert miss["alpha"].item() == pytest.approx(0.5) and miss["in_nbhd"].item() == 0.0
    assert miss["score"].item() == pytest.approx(0.5) and hit["score"].item() == 0.0
    assert miss["size"].item() == 1
    # r = 0.6 also holds e1 (distance 1 - 0.375/n = 0.4855): alpha = 0.8, the draft hits
    wide = L.locality_score(p, logits_of([[0.1, 0.8, 0.1]]), E, radius=0.6, k=2)
    assert wide["alpha"].item() == pytest.approx(0.8) and wide["score"].item() == 0.0
    # the radius giving |N| = 2 at the median is the 2nd smallest distance
    assert L.estimate_radius(p, E, k=2, size=2) == pytest.approx(1 - 0.375 / n, abs=1e-6)


def test_schedules():
    assert L.q_sel_schedule(0, 11) == pytest.approx(0.9)
    assert L.q_sel_schedule(5, 11) == pytest.approx(0.7)
    assert L.q_sel_schedule(10, 11) == pytest.approx(0.5)
    assert L.q_sel_schedule(50, 11) == pytest.approx(0.5)
    assert [L.veto_schedule(s, 100, 0.1) for s in (0, 5, 10, 60)] == [0.0, 0.5, 1.0, 1.0]
    assert L.veto_schedule(0, 100, 0.0) == 1.0
    assert L.ttt_weights(3) == pytest.approx([1.0, 0.8, 0.64])
    assert float(L.combine_ttt([torch.tensor(1.0)] * 3)) == pytest.approx(2.44)


def test_quantile_selection():
    s = torch.tensor([0.0, 0.1, 0.5, 0.9])
    # linear-interpolated median of the four scores = 0.3
    assert L.select_positions(s, 0.5).tolist() == [False, False, True, True]
    assert L.select_positions(s, 0.9).tolist() == [False, False, False, True]
    assert not L.select_positions(torch.zeros(5), 0.5).any()  # no mismatch -> nothing selected


def test_joint_topk_kl_by_hand():
    pt, ps = [0.5, 0.3, 0.1, 0.1], [0.1, 0.2, 0.6, 0.1]
    t, s = logits_of([pt]), logits_of([ps])
    # k = 1: K = {0} U {2}; p~t = (5/6, 1/6), p~s = (1/7, 6/7)
    want = 5 / 6 * math.log((5 / 6) / (1 / 7)) + 1 / 6 * math.log((1 / 6) / (6 / 7))
    assert L.joint_topk_kl(t, s, k=1).item() == pytest.approx(want, rel=1e-5)
    # k = 2: K = {0, 1} U {2, 1} = {0, 1, 2} (token 1 counted once)
    a, b = [x / 0.9 for x in pt[:3]], [x / 0.9 for x in ps[:3]]
    want = sum(x * math.log(x / y) for x, y in zip(a, b))
    assert L.joint_topk_kl(t, s, k=2).item() == pytest.approx(want, rel=1e-5)
    # temperature 2 on K = {0, 2}: renormalised sqrt-probabilities
    a = [math.sqrt(0.5), math.sqrt(0.1)]
    b = [math.sqrt(0.1), math.sqrt(0.6)]
    a, b = [x / sum(a) for x in a], [x / sum(b) for x in b]
    want = sum(x * math.log(x / y) for x, y in zip(a, b))
    assert L.joint_topk_kl(t, s, k=1, tau=2.0).item() == pytest.approx(want, rel=1e-5)
    assert L.joint_topk_kl(t, t, k=2).item() == pytest.approx(0.0, abs=1e-6)


def test_cross_entropies_by_hand():
    pt, q = [0.5, 0.3, 0.15, 0.05], [0.4, 0.3, 0.2, 0.1]
    t, s = logits_of([pt]), logits_of([q])
    full = -sum(a * math.log(b) for a, b in zip(pt, q))
    assert L.soft_ce(t, s).item() == pytest.approx(full, rel=1e-5)
    # top-p 0.9: cumulative mass before each token (0, .5, .8, .95) < .9 keeps the first three
    trunc = -sum(a / 0.95 * math.log(b) for a, b in zip(pt[:3], q[:3]))
    assert L.nucleus_ce(t, s, 0.9).item() == pytest.approx(trunc, rel=1e-5)
    assert L.nucleus_ce(t, s, 0.1).item() == pytest.approx(-math.log(0.4), rel=1e-5)  # argmax kept
    assert L.nucleus_ce(t, s, 1.0).item() == pytest.approx(full, rel=1e-5)
    assert L.eagle3_loss(logits_of([[0.5, 0.5]]), logits_of([[0.25, 0.75]])).item() == pytest.approx(
        -(0.5 * math.log(0.25) + 0.5 * math.log(0.75)), rel=1e-6)


def test_eagle1_loss_by_hand():
    pred, tgt = torch.tensor([[0.0, 2.0]]), torch.tensor([[0.5, 0.0]])
    t, s = logits_of([[0.5, 0.5]]), logits_of([[0.25, 0.75]])
    # SmoothL1 (beta 1): 0.5 * 0.5^2 = 0.125 and 2 - 0.5 = 1.5 -> mean 0.8125
    ce = -(0.5 * math.log(0.25) + 0.5 * math.log(0.75))
    assert L.eagle1_loss(pred, tgt, t, s).item() == pytest.approx(0.8125 + 0.1 * ce, rel=1e-6)


def test_lisa_weights_by_hand():
    """Raw weights (w_base / w_veto (1 + beta_sel (1 - g_align))) divided by their batch mean (spec v2)."""
    cfg = L.LossConfig()
    score = torch.tensor([0.0, 0.1, 0.5, 0.9])
    g = torch.tensor([1.0, 0.5, 0.5, 0.2])

    def normed(raw):
        return [x * len(raw) / sum(raw) for x in raw]

    # last of 21 steps: q_sel = 0.5 (threshold 0.3), w_veto = 1
    w, sel = L.lisa_weights(score, g, 20, 21, cfg)
    assert sel.tolist() == [False, False, True, True]
    assert w.tolist() == pytest.approx(normed([0.1, 0.1, 1 + 2 * 0.5, 1 + 2 * 0.8]))
    assert float(w.mean()) == pytest.approx(1.0)
    # step 1 of 20 -> w_veto = 1 / 2 = 0.5, q_sel = 0.9 - 0.4/19 ~ 0.879 (threshold ~0.78) -> only the last
    w, sel = L.lisa_weights(score, g, 1, 20, cfg)
    assert sel.tolist() == [False, False, False, True]
    assert w.tolist() == pytest.approx(normed([0.1, 0.1, 0.1, 0.5 * (1 + 2 * 0.8)]))
    w, _ = L.lisa_weights(score, g, 1, 20, L.LossConfig(soft_gate=False))
    assert w.tolist() == pytest.approx(normed([0.1, 0.1, 0.1, 0.5]))
    w, _ = L.lisa_weights(score, g, 1, 20, L.LossConfig(veto=False))
    assert w.tolist() == pytest.approx(normed([0.1, 0.1, 0.1, 2.6]))
    # the selected position gets 26x an unselected one, whatever the batch mean
    assert float(w[3] / w[0]) == pytest.approx(26.0)
    w, sel = L.lisa_weights(score, g, 1, 20, L.LossConfig(selection=False))
    assert w.tolist() == [1.0] * 4 and not sel.any()


def test_lisa_loss_composition_by_hand():
    """Two positions; position 1 is selected (mismatch), position 0 is not."""
    t = logits_of([[0.7, 0.2, 0.1], [0.5, 0.3, 0.2]])
    s = logits_of([[0.6, 0.3, 0.1], [0.1, 0.1, 0.8]])  # row 1's argmax (e2) is outside N
    cfg = L.LossConfig(top_kc=2, joint_top_k=1, nucleus_p=0.6, veto=False, q_sel_start=0.5, q_sel_end=0.5)
    loss, st = L.lisa_loss(t, s, E, 0.2, step=0, total_steps=1, cfg=cfg)
    # row 0: centroid of (0.7, 0.2)/0.9 -> N(0.2) = {e0}, draft argmax e0 -> s = 0
    # row 1: N = {e0}, alpha = 0.5, draft argmax e2 -> s = 0.5 > median 0.25 -> selected
    # KL on K: row 0 K = {0}: KL = 0; row 1 K = {0, 2}: p~t = (5/7, 2/7), p~s = (1/9, 8/9)
    kl1 = 5 / 7 * math.log((5 / 7) / (1 / 9)) + 2 / 7 * math.log((2 / 7) / (8 / 9))
    raw1 = 1 + 2 * (1 - math.exp(-kl1))
    w0, w1 = 0.1 * 2 / (0.1 + raw1), raw1 * 2 / (0.1 + raw1)  # divided by the batch mean (spec v2)
    # nucleus 0.6: row 0 keeps {0} (0.7), row 1 keeps {0, 1} (0.5 then 0.8) renormalised (5/8, 3/8)
    ce0 = -math.log(0.6)
    ce1 = -(5 / 8 * math.log(0.1) + 3 / 8 * math.log(0.1))
    want = (w0 * ce0 + w1 * ce1) / 2 + (w0 * 0.0 + w1 * kl1) / 2
    assert loss.item() == pytest.approx(want, rel=1e-5)
    assert st["sel_frac"].item() == 0.5 and st["w_mean"].item() == pytest.approx(1.0)
    # gradient flows to the draft logits only through CE and KD (weights are constants)
    s_req = s.clone().requires_grad_(True)
    L.lisa_loss(t, s_req, E, 0.2, 0, 1, cfg)[0].backward()
    assert torch.isfinite(s_req.grad).all() and s_req.grad.abs().sum() > 0


def test_lisa_with_terms_off_is_the_eagle3_loss():
    g = torch.Generator().manual_seed(0)
    t, s = torch.randn(7, 11, generator=g), torch.randn(7, 11, generator=g)
    cfg = L.LossConfig(selection=False, truncated_ce=False, kd=False)
    loss, _ = L.lisa_loss(t, s, None, None, 3, 10, cfg)
    assert loss.item() == pytest.approx(L.eagle3_loss(t, s).item(), rel=1e-6)
    loss, _ = L.step_loss(t, s, L.LossConfig(kind="eagle3"))
    assert loss.item() == pytest.approx(L.eagle3_loss(t, s).item(), rel=1e-6)
    with pytest.raises(ConfigError, match="codebook"):
        L.lisa_loss(t, s, None, None, 0, 1, L.LossConfig())
    with pytest.raises(ConfigError, match="unknown loss kind"):
        L.LossConfig(kind="medusa")


def test_acceptance_proxies_by_hand():
    st = L.agreement_stats(logits_of([[0.5, 0.5, 0.0 + 1e-9]]), logits_of([[0.2, 0.7, 0.1]]))
    assert st["accept"].item() == pytest.approx(0.7, abs=1e-6)  # min(.5,.2) + min(.5,.7) + ~0
    assert st["top1"].item() == 0.0
    assert L.mal_proxy(torch.tensor([[0.5], [0.5], [1.0]])).item() == pytest.approx(1 + 0.5 + 0.25 + 0.25)
