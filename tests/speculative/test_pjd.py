"""PJD (speculative/pjd.py): the row-causal mask, SJD's rule on the leading row, the other rows
stopping at their first rejection, draft reuse, the lane shift, and lossless-ness where it holds
(one active row: token-identical to plain greedy decoding)."""

from __future__ import annotations

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.errors import InputError
from lisa_trt.speculative import pjd as P
from lisa_trt.speculative.autoregressive import generate
from lisa_trt.speculative.methods import SpecConfig
from lisa_trt.speculative.run import run_method
from lisa_trt.testing import make_cond, make_target
from lisa_trt.speculative.methods import get_method


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return make_target(std=0.3, block_size=64)  # an 8 x 8 grid


def test_the_image_part_of_the_mask_is_row_causal():
    g = P.RowGrid(12, 4, 2, "cpu")  # 3 rows of 4
    n_rows = torch.tensor([[4, 3, 1, 0, 0]])  # row 0 done, row 1 three tokens, row 2 one
    q_index = torch.tensor([[5, 6, 8, 9, 11]])
    q_row = q_index // 4
    vis = P.row_causal_visible(q_index, q_row, n_rows, g)[0]
    decoded = torch.tensor([c < n_rows[0, i // 4] for i, c in ((i, i % 4) for i in range(12))])
    for s in range(q_index.shape[1]):
        for i in range(12):
            want = bool(decoded[i]) and (i // 4 < q_row[0, s] or (i // 4 == q_row[0, s] and i < q_index[0, s]))
            assert bool(vis[s, i]) == want, (s, i)
    # a token of row 2 sees the decoded part of row 1 even right of its own column, nothing of a row below
    assert bool(vis[2, 6]) and not vis[1, 8] and not vis[2, 7]
    anc = P.window_ancestors(3, 2, "cpu")  # 3 lanes of root + 2 drafts
    lane = torch.arange(3).repeat_interleave(3)
    assert not (anc & (lane[:, None] != lane[None, :])).any()  # never another row's drafts
    assert torch.equal(anc[:3, :3], torch.tril(torch.ones(3, 3, dtype=torch.bool)))


class _Recording:
    """A target wrapper recording every verification forward's slots and mask."""

    def __init__(self, target):
        self.t, self.calls = target, []

    def __getattr__(self, name):
        return getattr(self.t, name)

    def forward_tokens(self, tokens, positions, slots, mask, cache, **kw):
        self.calls.append((slots.clone(), mask.clone(), int(cache.lengths[0])))
        return self.t.forward_tokens(tokens, positions, slots, mask, cache, **kw)


def test_no_query_reads_another_rows_drafts_or_a_row_below(target):
    rec = _Recording(target)
    st = P.PJDSettings(rows=3, window=3, lag=1)
    dec = P.PJDDecoder(rec, st)
    toks, _ = dec.decode(dec.open(make_cond(target, 1), sampling=SamplingConfig(top_k=0), seed=0))
    assert bool((toks >= 0).all())
    K1, L = st.window + 1, 8
    steps = [c for c in rec.calls if c[0].shape[1] == st.rows * K1 + 1]  # (then the teacher-forced TVD pass)
    assert len(steps) < len(rec.calls)
    for slots, mask, base in steps:
        lanes = slots[0, :-1].view(st.rows, K1)
        for r in range(st.rows):
            own = set(lanes[r].tolist())
            for q in lanes[r].tolist():
                qi = lanes[r].tolist().index(q)
                seen = set(mask[0, r * K1 + qi].nonzero()[:, 0].tolist())
                for o in range(st.rows):
                    if o != r:
                        assert not (seen & (set(lanes[o, 1:].tolist()) - own)), "another row's drafts"
                img = [c - base for c in seen if base <= c < base + 64]
                assert all(i // L <= (q - base) // L or q - base >= 64 for i in img), "a row below"
                if q < base + 64:  # an image query never reads a scratch slot (a row start's auxiliary token)
                    assert not [c for c in seen if c >= base + 64], "an auxiliary token"
    assert len(steps) < 63  # rows in parallel: fewer forwards than tokens


def test_leading_row_is_sjds_rule_and_the_other_rows_stop_at_their_first_rejection():
    V, n = 5, 40000
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.2, 0.1, 0.1, 0.1])
    q = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])
    d = torch.multinomial(q.expand(n, V), 2, replacement=True, generator=g)  # (n, 2) drafts of 2 lanes
    p_now = p.expand(n, 2, 2, V)  # (B, R, K + 1, V) with K = 1
    p_prev = q.expand(n, 2, 1, V)
    free = torch.full((n, 2), 5)
    committed, tokens, ratio = P.pjd_accept(p_now, p_prev, d[..., None], free, g, greedy=False)
    # the leading row: accept with min(1, p / q), else resample from norm(max(p - q, 0)): the token is ~ p
    law = torch.bincount(tokens[:, 0, 0], minlength=V).float() / n
    assert (law - p).abs().max() < 0.01
    assert torch.allclose(ratio[:, 0, 0], p[d[:, 0]] / q[d[:, 0]])
    acc = torch.minimum(p / q, torch.ones(V))
    assert abs((committed[:, 0] == 2).float().mean() - (q * acc).sum()) < 0.01  # accepted draft + bonus
    assert bool((committed[:, 0] >= 1).all())
    # another row: its accepted drafts only (no resample), accepted at SJD's rate
    assert set(committed[:, 1].unique().tolist()) <= {0, 1}
    assert abs(committed[:, 1].float().mean() - (q * acc).sum()) < 0.01
    assert torch.equal(tokens[:, 1, 0], d[:, 1])
    # no free column: nothing committed; one free column and a rejection: the resample only
    c0, _, _ = P.pjd_accept(p_now[:4], p_prev[:4], d[:4, :, None], torch.zeros(4, 2, dtype=torch.long), g, False)
    assert not c0.any()


def test_greedy_leading_row_and_bonus():
    p = torch.tensor([[[[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]]])  # (1, 1, 3, 3), K = 2
    prev = torch.full((1, 1, 2, 3), 1 / 3)
    c, t, _ = P.pjd_accept(p, prev, torch.tensor([[[1, 0]]]), torch.tensor([[9]]), None, greedy=True)
    assert c.tolist() == [[3]] and t[0, 0].tolist() == [1, 0, 2]  # both accepted + the bonus argmax
    c, t, _ = P.pjd_accept(p, prev, torch.tensor([[[1, 2]]]), torch.tensor([[9]]), None, greedy=True)
    assert c.tolist() == [[2]] and t[0, 0, :2].tolist() == [1, 0]  # the rejection replaced by argmax
    c, t, _ = P.pjd_accept(p, prev, torch.tensor([[[1, 0]]]), torch.tensor([[2]]), None, greedy=True)
    assert c.tolist() == [[2]]  # the row ends after two columns: no bonus


@pytest.mark.parametrize("cfg,rows,lag", [(1.0, 1, 2), (2.0, 1, 2), (2.0, 3, 8)])
def test_one_active_row_is_token_identical_to_plain_greedy(target, cfg, rows, lag):
    """rows = 1, or a lag of a whole row (8): the only lane is the leading row, every query sees
    its whole raster prefix, and greedy PJD is plain greedy decoding."""
    cond = make_cond(target, 2)
    ref = generate(target, cond, cfg_scale=cfg, greedy=True)
    toks, st = run_method(get_method("pjd"), target, None, None, cond, sampling=SamplingConfig(cfg_scale=cfg, greedy=True),
                          spec=SpecConfig.make(pjd_rows=rows, pjd_lag=lag, pjd_window=4), seed=0)
    assert torch.equal(toks, ref)
    assert st.settings["pjd_rows"] == rows


def test_several_rows_advance_together(target, check_mal):
    cond = make_cond(target, 2)
    seen = []  # per step: some row holds a token while the row above it is still open

    def step(t, done):
        dec = (t >= 0).view(t.shape[0], 8, 8)
        seen.append(bool((~dec.all(2)[:, :-1] & dec.any(2)[:, 1:]).any()))

    toks, st = run_method(get_method("pjd"), target, None, None, cond, sampling=SamplingConfig(cfg_scale=2.0, top_k=0),
                          spec=SpecConfig.make(pjd_rows=4, pjd_lag=1), seed=1, on_step=step)
    assert toks.shape == (2, 64) and bool((toks >= 0).all())
    assert any(seen)
    check_mal(st.mal, st.target_forwards, 64, rows=2)
    assert st.mean_tvd > 1e-3  # rows decided without the right part of the rows above: measured
    one, st1 = run_method(get_method("pjd"), target, None, None, cond, sampling=SamplingConfig(cfg_scale=2.0, top_k=0),
                          spec=SpecConfig.make(pjd_rows=1), seed=1)
    assert not torch.equal(one, toks)
    assert st1.mean_tvd < 1e-5  # one row in flight: every law is the raster conditional


def test_reuse_keeps_high_ratio_drafts_and_zero_redraws():
    g = torch.Generator().manual_seed(0)
    V = 4
    p_now = torch.zeros(1, 1, 3, V)
    p_now[..., 3] = 1.0  # the new law puts everything on token 3
    prev = torch.full((1, 1, 2, V), 0.25)
    drafts = torch.tensor([[[0, 1]]])
    ratio = torch.tensor([[[0.1, 0.9]]])
    committed = torch.zeros(1, 1, dtype=torch.long)
    prior = torch.full((1, 1, 2, V), 0.25)
    kept, law = P.next_drafts(p_now, prev, drafts, ratio, committed, prior, 0.5, g, greedy=False)
    assert kept.tolist() == [[[3, 1]]] and torch.equal(law, p_now[:, :, :2])  # draft 1's ratio 0.9 > 0.5: kept
    redrawn, _ = P.next_drafts(p_now, prev, drafts, ratio, committed, prior, 0.0, g, greedy=False)
    assert redrawn.tolist() == [[[3, 3]]]
    # after two committed columns the window slides: slot 0 takes query 2's law, slot 1 the prior
    moved, law = P.next_drafts(p_now, prev, drafts, ratio, torch.tensor([[2]]), prior, 0.5, g, greedy=False)
    assert moved[0, 0, 0] == 3 and torch.equal(law[0, 0, 1], prior[0, 0, 1])


def test_the_lanes_shift_when_the_leading_row_finishes():
    state = torch.arange(6).view(2, 3)
    fresh = torch.tensor([10, 11])
    (out,) = P.shift_lanes(torch.tensor([True, False]), (state, fresh))
    assert out.tolist() == [[1, 2, 10], [3, 4, 5]]
    g = P.RowGrid(10, 4, 2, "cpu")  # rows of 4, 4, 2
    assert g.row_len.tolist() == [4, 4, 2, 0, 0]
    rows, n, cap = P.lane_state(torch.tensor([[4, 3, 0, 0, 0]]), torch.tensor([1]), g, 2, 2)
    assert rows.tolist() == [[1, 2]] and n.tolist() == [[3, 0]] and cap.tolist() == [[4, 1]]


def test_bad_settings_are_refused():
    for bad in (dict(rows=0), dict(window=0), dict(lag=0), dict(reuse=-1.0), dict(rows=1.5)):
        with pytest.raises(InputError, match="pjd"):
            P.PJDSettings(**bad)
