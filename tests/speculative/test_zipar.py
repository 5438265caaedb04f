"""ZipAR (speculative/zipar.py): the row schedule (staggered rows, fewer forwards), a full-row
window is the AR loop (same tokens under a one-hot law, TVD 0 when sampling), a short window
reports a positive per-token TVD with valid tokens under batch 2 + CFG, and its knob is
registered with it."""

import pytest
import torch

from lisa_trt import generate
from lisa_trt.config import SamplingConfig
from lisa_trt.errors import InputError
from lisa_trt.models.family import SequenceLayout
from lisa_trt.speculative.methods import FLAT_FIELDS, SpecConfig, cli_options, get_method
from lisa_trt.speculative.run import run_method
from lisa_trt.speculative.zipar import row_length, schedule
from lisa_trt.testing import make_target


def test_schedule_staggers_rows_by_the_window():
    steps = schedule(16, 4, 2)  # 4 rows of 4
    assert len(steps) == (4 - 1) + 4 + 2 * 2  # row 0 alone, row 1 after it, then rows 2 tokens apart
    made = [f[2] for s in steps for f in s if f[2] >= 0]
    assert sorted(made) == list(range(1, 16))
    # a row starts from the row above's last decoded token, fed just before the row start
    assert (7, 5, 8) in steps[5]
    assert len(schedule(16, 4, 4)) == 15 and len(schedule(16, 4, 1)) < len(steps)
    assert all(len(s) == 1 for s in schedule(16, 4, 4))  # a full-row window: one token per forward


def test_row_length_from_the_layout_or_the_grid():
    t = make_target(std=0.3)
    assert row_length(t, SequenceLayout(t.config.block_size)) == t.config.grid_hw[1]
    ends = torch.tensor([-1, -1, 7] * 3)
    assert row_length(t, SequenceLayout(9, forced=ends)) == 3
    with pytest.raises(InputError, match="row ends"):
        row_length(t, SequenceLayout(9, forced=torch.tensor([-1, 7, -1] + [-1] * 6)))


@pytest.fixture(scope="module")
def tiny():
    return make_target(std=0.3)


def _run(t, window, sampling, cond=torch.tensor([1, 4]), seed=0):
    return run_method(get_method("zipar"), t, None, None, cond, sampling=sampling,
                      spec=SpecConfig.make("gasv", zipar_window=window), seed=seed)


def test_a_full_row_window_is_the_ar_loop(tiny):
    w = tiny.config.grid_hw[1]
    ref = generate(tiny, torch.tensor([1, 4]), cfg_scale=2.0, top_k=1)
    toks, st = _run(tiny, w, SamplingConfig(cfg_scale=2.0, top_k=1))
    assert torch.equal(toks, ref) and st.target_forwards == tiny.config.block_size
    _, st = _run(tiny, w, SamplingConfig(cfg_scale=2.0))
    assert st.mean_tvd < 1e-5  # every token drawn from its exact raster conditional


def test_a_short_window_is_faster_and_reports_its_distortion(tiny):
    toks, st = _run(tiny, 1, SamplingConfig(cfg_scale=2.0))
    N = tiny.config.block_size
    assert toks.shape == (2, N) and ((toks >= 0) & (toks < tiny.config.vocab_size)).all()
    assert st.target_forwards < N and st.mal > 1.2
    assert st.mean_tvd > 0.01 and float(torch.cat(st.tvd).max()) <= 1.0
    again, _ = _run(tiny, 1, SamplingConfig(cfg_scale=2.0))
    assert torch.equal(toks, again)


def test_zipar_is_registered_with_its_own_knob():
    m = get_method("zipar")
    assert m.kind == "sjd" and not m.needs_drafter and m.settings is not None
    assert "zipar_window" in FLAT_FIELDS and "--zipar-window" in {o.flag for o in cli_options()}
    assert SpecConfig.make("gasv", zipar_window=3).settings("zipar").window == 3
    with pytest.raises(InputError, match="window"):
        SpecConfig.make("gasv", zipar_window=0)


def test_sparse_laws_and_chunked_tvd_pass_are_exact(tiny):
    """The TVD bookkeeping: top-k-sparse laws give the dense TVD; the teacher-forced pass over the
    session's cache gives the same TVD in chunks of 3 as in one chunk (and again on the same cache)."""
    from lisa_trt.speculative.sampling import process_logits, tvd
    from lisa_trt.speculative.session import open_session
    from lisa_trt.speculative.zipar import _Laws, _raster_tvd

    g = torch.Generator().manual_seed(1)
    p = torch.softmax(process_logits(torch.randn(2, 5, 40, generator=g), 1.0, 6, 1.0), -1)
    q = torch.softmax(torch.randn(2, 5, 40, generator=g), -1)
    laws = _Laws(2, 5, 40, 6, "cpu")
    laws.put(torch.arange(5), p)
    assert torch.allclose(laws.tvd(q, 0, 5), tvd(p, q), atol=1e-6)
    toks, _ = _run(tiny, 1, SamplingConfig(cfg_scale=2.0, top_k=8))
    N = toks.shape[1]
    dense = _Laws(2, N, tiny.config.vocab_size, 0, "cpu")
    dense.put(torch.arange(N), torch.full((2, N, tiny.config.vocab_size), 1.0 / tiny.config.vocab_size))
    session = open_session(tiny, torch.tensor([1, 4]), sampling=SamplingConfig(cfg_scale=2.0, top_k=8), extra=1)
    session.out.copy_(toks)
    base = session.cache.lengths.clone()
    a = _raster_tvd(session, base, dense, chunk=3)
    b = _raster_tvd(session, base, dense, chunk=256)
    assert torch.allclose(a, b, atol=1e-5) and float(a[:, 1:].min()) > 0.5


def test_per_row_seeds_batch_rows_that_decode_as_they_would_alone(tiny):
    """ZipAR takes one generator per row (Method.row_seeds: the serving path batches its rows):
    each row of a batch gets the tokens it gets decoded alone with its seed, whatever its
    batch-mates; the per-row stats cover every row."""
    s, cond, seeds = SamplingConfig(cfg_scale=2.0), torch.tensor([1, 4, 6]), [11, 12, 13]
    spec = SpecConfig.make("gasv", zipar_window=1)
    assert get_method("zipar").row_seeds and not get_method("sjd").row_seeds
    toks, st = run_method(get_method("zipar"), tiny, None, None, cond, sampling=s, spec=spec, seed=0, seeds=seeds)
    for b in range(3):
        alone, _ = run_method(get_method("zipar"), tiny, None, None, cond[b:b + 1], sampling=s, spec=spec, seed=seeds[b])
        assert torch.equal(toks[b:b + 1], alone), b
        assert st.row(b)["mal"] == st.mal and st.row(b)["steps"] == len(st.committed)
    other, _ = run_method(get_method("zipar"), tiny, None, None, cond[[1, 0]], sampling=s, spec=spec, seed=0, seeds=seeds[1::-1])
    assert torch.equal(other, toks[[1, 0]])  # the batch-mates do not matter
    with pytest.raises(InputError, match="2 seeds for 3 prompts"):
        run_method(get_method("zipar"), tiny, None, None, cond, sampling=s, spec=spec, seed=0, seeds=seeds[:2])
    with pytest.raises(InputError, match="no per-row generators"):
        run_method(get_method("mcsjd"), tiny, None, None, cond, sampling=s, spec=spec, seed=0, seeds=seeds)


def test_the_pads_of_a_fixed_width_step_are_invisible(tiny, monkeypatch):
    """Every ZipAR forward feeds the widest step's width (StepPlan: one input shape); no real query
    sees what the pads feed: whatever tokens the pads carry, the real tokens are the same (greedy
    laws). (Pads written over a live slot, or seen by a real query, change them.)"""
    from lisa_trt.speculative.zipar import schedule

    N, w, V = tiny.config.block_size, tiny.config.grid_hw[1], tiny.config.vocab_size
    widths = [len(st) for st in schedule(N, w, 1)]
    assert len(set(widths)) > 1  # steps of several widths: the narrow ones are padded
    s, spec = SamplingConfig(cfg_scale=2.0, top_k=1), SpecConfig.make("gasv", zipar_window=1, zipar_measure_tvd=False)
    cond = torch.tensor([1, 4])
    base, _ = run_method(get_method("zipar"), tiny, None, None, cond, sampling=s, spec=spec, seed=0)
    inner, shapes = tiny.forward_tokens, []

    def other_pad_tokens(tokens, positions, slots, mask, cache):
        pad = torch.arange(tokens.shape[1]) >= widths[len(shapes)]  # step t's columns past its own feeds
        shapes.append(tuple(tokens.shape))
        return inner(torch.where(pad[None], (tokens + 5) % V, tokens), positions, slots, mask, cache)

    monkeypatch.setattr(tiny, "forward_tokens", other_pad_tokens)
    moved, _ = run_method(get_method("zipar"), tiny, None, None, cond, sampling=s, spec=spec, seed=0)
    assert len(shapes) == len(widths) and len(set(shapes)) == 1, shapes
    assert torch.equal(base, moved)
