"""`pjd-gasv-2d` (speculative/twod.py): PJD with GASV's relaxed acceptance on every lane. One lane
is the 1-D rule (sjd-gasv's relaxed SJD test), the rows below stop at their first relaxed
rejection, no mass moved is PJD token for token, the mask stays row-causal, and the forced tokens
of a Lumina-like (row ends) and an Emu3-like (row ends and a tail of distinct forced tokens)
layout are committed at batch > 1."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.errors import InputError
from lisa_trt.models.family import SequenceLayout
from lisa_trt.speculative import pjd as P
from lisa_trt.speculative.methods import SpecConfig, get_method, resolve_method
from lisa_trt.speculative.run import run_method
from lisa_trt.speculative.twod import PJDGASVDecoder, PJDGASVSettings, gasv_slot_tvd
from lisa_trt.speculative.verify import ratio_accept, sjd_accept
from lisa_trt.testing import make_cond, make_target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from export_artifacts import make_tables  # noqa: E402
from test_pjd import _Recording  # noqa: E402  (the target wrapper recording each forward's slots and mask)

S = SamplingConfig(cfg_scale=2.0, top_k=0)


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    t = make_target(std=0.3, block_size=64)  # an 8 x 8 grid
    return t, make_tables(t)


def test_one_lane_is_the_1d_relaxed_rule_and_the_rows_below_stop_at_their_first_rejection():
    """The leading lane with mass M lent to its draft commits sjd_accept's law under the relaxed
    probability min(1, p / q + M) (sjd-gasv's rule); a lane below accepts at that rate and commits
    nothing else."""
    V, n = 5, 40000
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.2, 0.1, 0.1, 0.1])
    q = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])
    M = torch.tensor([0.0, 0.3, 0.4, 0.2, 0.1])  # mass lent to each token as a draft
    d = torch.multinomial(q.expand(n, V), 2, replacement=True, generator=g)  # (n, 2): 2 lanes, K = 1
    moved = M[d][..., None]
    committed, tokens, _ = P.pjd_accept(p.expand(n, 2, 2, V), q.expand(n, 2, 1, V), d[..., None],
                                        torch.full((n, 2), 5), g, greedy=False, moved=moved)
    a = torch.minimum(p / q + M, torch.ones(V))
    rate = (q * a).sum()
    ref = sjd_accept(p.expand(n, 1, V), q.expand(n, 1, V), d[:, :1], g, accept_prob=a[d[:, :1]])
    one_d = torch.where(ref.accept_len > 0, d[:, 0], ref.token)
    law = torch.bincount(tokens[:, 0, 0], minlength=V).float() / n
    assert (law - torch.bincount(one_d, minlength=V).float() / n).abs().max() < 0.012
    assert (law - p).abs().max() > 0.05  # the relaxed rule moved mass off p
    assert abs((committed[:, 0] == 2).float().mean() - rate) < 0.01
    assert set(committed[:, 1].unique().tolist()) <= {0, 1}
    assert abs(committed[:, 1].float().mean() - rate) < 0.01
    assert torch.equal(tokens[:, 1, 0], d[:, 1])
    # the reported TVD: (a' - a)(1 - R(x)) per draft, 0 where nothing moves
    tv = gasv_slot_tvd(p.expand(1, 1, 5, V), q.expand(1, 1, 5, V), torch.arange(V).view(1, 1, V), M.view(1, 1, V))
    resid = (p - q).clamp(min=0)
    want = (a - ratio_accept(p, q)) * (1 - resid / resid.sum())
    assert torch.allclose(tv[0, 0], want) and tv[0, 0, 0] == 0


def test_without_mass_to_move_it_is_pjd_token_for_token(models):
    t, tab = models
    cond = make_cond(t, 2)
    kw = dict(rows=3, window=4, lag=1)
    ref, st_ref = run_method(get_method("pjd"), t, None, None, cond, sampling=S, seed=5,
                             spec=SpecConfig.make(**{f"pjd_{k}": v for k, v in kw.items()}))
    got, st = run_method(get_method("pjd-gasv-2d"), t, None, tab, cond, sampling=S, seed=5,
                         spec=SpecConfig.make(gasv_delta=0.0, **{f"pjd_gasv_2d_{k}": v for k, v in kw.items()}))
    assert torch.equal(got, ref) and st.target_forwards == st_ref.target_forwards
    assert abs(st.mean_tvd - st_ref.mean_tvd) < 1e-6
    assert st.settings["pjd_gasv_2d_rows"] == 3 and st.settings["gasv_delta"] == 0.0
    moved, st_m = run_method(get_method("pjd-gasv-2d"), t, None, tab, cond, sampling=S, seed=5,
                             spec=SpecConfig.make(gasv_delta=1.0, **{f"pjd_gasv_2d_{k}": v for k, v in kw.items()}))
    assert not torch.equal(moved, ref) and st_m.mean_tvd > st_ref.mean_tvd  # mass moved, and reported


def test_greedy_with_one_lane_is_plain_greedy(models):
    from lisa_trt.speculative.autoregressive import generate

    t, tab = models
    cond = make_cond(t, 2)
    toks, _ = run_method(get_method("pjd-gasv-2d"), t, None, tab, cond, sampling=SamplingConfig(cfg_scale=2.0, greedy=True),
                         spec=SpecConfig.make(pjd_gasv_2d_rows=1), seed=0)
    assert torch.equal(toks, generate(t, cond, cfg_scale=2.0, greedy=True))


def test_the_mask_is_row_causal(models):
    """No lane's query reads another lane's drafts or a row below its own; rows run in parallel."""
    t, tab = models
    rec = _Recording(t)
    spec = SpecConfig.make(pjd_gasv_2d_rows=3, pjd_gasv_2d_window=3, pjd_gasv_2d_lag=1)
    dec = PJDGASVDecoder(rec, tab, None, spec)
    toks, st = dec.decode(dec.open(make_cond(t, 1), sampling=S, seed=0))
    assert bool((toks >= 0).all())
    R, K1 = 3, 4
    steps = [c for c in rec.calls if c[0].shape[1] == R * K1 + 1]
    assert 2 <= len(steps) < 63
    for slots, mask, base in steps:
        lanes = slots[0, :-1].view(R, K1)
        for r in range(R):
            for qi, q in enumerate(lanes[r].tolist()):
                seen = set(mask[0, r * K1 + qi].nonzero()[:, 0].tolist())
                others = {s for o in range(R) if o != r for s in lanes[o, 1:].tolist()} - set(lanes[r].tolist())
                assert not seen & others, "another row's drafts"
                img = [c - base for c in seen if base <= c < base + 64]
                assert q - base >= 64 or all(i // 8 <= (q - base) // 8 for i in img), "a row below"


def _layouts(V):
    """Lumina-like: 8 rows of 7 codes + a forced row end; Emu3-like: 7 such rows, then a tail row of
    8 distinct forced tokens (end of line, frame, image, sequence ...)."""
    end = V - 1
    lumina = torch.tensor(([-1] * 7 + [end]) * 8)
    emu3 = torch.tensor(([-1] * 7 + [end]) * 7 + list(range(V - 9, V - 1)))
    return {"lumina": SequenceLayout(64, forced=lumina), "emu3": SequenceLayout(64, forced=emu3)}


@pytest.mark.parametrize("family", ["lumina", "emu3"])
@pytest.mark.parametrize("method", ["pjd", "pjd-gasv-2d"])
def test_forced_tokens_are_committed_at_batch_above_one(models, family, method):
    t, tab = models
    layout = _layouts(t.config.vocab_size)[family]
    forced = layout.forced >= 0
    for greedy in (False, True):
        toks, st = run_method(resolve_method(method), t, None, tab, make_cond(t, 3), sampling=SamplingConfig(cfg_scale=2.0,
                              greedy=greedy), seed=1, layout=layout,
                              spec=SpecConfig.make(pjd_rows=3, pjd_lag=1, pjd_gasv_2d_rows=3, pjd_gasv_2d_lag=1))
        assert torch.equal(toks[:, forced], layout.forced[forced].expand(3, -1))
        assert bool((toks[:, ~forced] >= 0).all()) and bool((toks[:, ~forced] < t.config.vocab_size).all())
        assert sum(int(c.sum()) for c in st.committed) == 3 * 63  # every row commits every token once


def test_bad_settings_are_refused(models):
    with pytest.raises(InputError, match="pjd_gasv_2d_rows"):
        PJDGASVSettings(rows=0)
    with pytest.raises(InputError, match="pjd_gasv_2d_reuse"):
        PJDGASVSettings(reuse=-1.0)
    t, _ = models
    with pytest.raises(InputError, match="tables"):
        run_method(get_method("pjd-gasv-2d"), t, None, None, make_cond(t, 1), sampling=S, spec=SpecConfig.make(), seed=0)
