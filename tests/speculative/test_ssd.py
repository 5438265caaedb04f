"""pjd-ssd2d (speculative/ssd.py): PJD with fresh drafts from a 2-D below head, on a non-square grid.

Without a head the loop is PJD token for token; with one lane and greedy sampling it is plain
greedy decoding (the head only changes draft laws); the hidden states it records are the
target's own at each committed token; a head for another grid is refused."""

from __future__ import annotations

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.errors import InputError
from lisa_trt.models.head2d import Heads2D
from lisa_trt.speculative.methods import SpecConfig, get_method
from lisa_trt.speculative.pjd import PJDSettings
from lisa_trt.speculative.run import run_method
from lisa_trt.speculative.ssd import UNTRAINED, BelowLaws, PJDSSDDecoder
from lisa_trt.testing import make_target

H, W = 6, 10
SAMPLING = SamplingConfig(cfg_scale=2.0, top_k=0)
COND = torch.tensor([1, 5])


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return make_target(block_size=H * W, grid_shape=(H, W), n_layer=2, std=0.3)


def _decode(t, heads, settings=PJDSettings(), sampling=SAMPLING, keep=None):
    dec = PJDSSDDecoder(t, settings, heads)
    if keep is not None:  # record the BelowLaws the decode builds
        inner = dec.fresh_laws

        def laws(*a):
            law_of, below = inner(*a)
            keep.append(below)
            return law_of, below
        dec.fresh_laws = laws
    return dec.decode(dec.open(COND, sampling=sampling, seed=3))


def test_without_a_head_the_loop_is_pjd(target):
    ref, st = run_method(get_method("pjd"), target, None, None, COND, sampling=SAMPLING, spec=SpecConfig(), seed=3)
    toks, st2 = _decode(target, None)
    assert torch.equal(toks, ref) and st.target_forwards == st2.target_forwards
    assert st2.settings["pjd_ssd2d_head"] == "off"


def test_the_method_runs_with_the_untrained_head(target):
    toks, st = run_method(get_method("pjd-ssd2d"), target, None, None, COND, sampling=SAMPLING, spec=SpecConfig(), seed=3)
    assert toks.shape == (2, H * W) and bool((toks >= 0).all())
    assert st.settings["pjd_ssd2d_head"] == "untrained" and st.target_forwards >= H


def test_one_lane_greedy_is_greedy_decoding(target):
    greedy = SamplingConfig(cfg_scale=2.0, greedy=True)
    ref, _ = run_method(get_method("vanilla"), target, None, None, COND, sampling=greedy, spec=SpecConfig(), seed=3)
    toks, _ = _decode(target, UNTRAINED, PJDSettings(rows=1), greedy)
    assert torch.equal(toks, ref)


def test_the_recorded_hidden_states_are_the_targets(target):
    """One lane (exact raster context): every committed token's recorded hidden state (both CFG
    halves) is the target's teacher-forced hidden state at that token."""
    kept = []
    toks, _ = _decode(target, UNTRAINED, PJDSettings(rows=1, window=4), keep=kept)
    below = kept[0]
    assert isinstance(below, BelowLaws) and bool(below.known[:, : H * W - 1].all())
    for half, cond in enumerate((COND, target.null_cond(COND))):
        ref = target.forward_train(cond, toks).hidden[:, 1:]  # [:, j + 1] is token j's
        got = below.hidden[half * 2:(half + 1) * 2, : H * W - 1]
        assert torch.allclose(got, ref, atol=1e-4), (half, (got - ref).abs().max())


def test_the_below_law_reads_the_token_above(target):
    """A head that returns its input: the law at (r, c) is the hidden recorded at (r - 1, c)."""
    kept = []
    _decode(target, UNTRAINED, PJDSettings(rows=2, window=3), keep=kept)
    below = kept[0]
    V = target.config.vocab_size
    below.heads.head_logits = lambda h, k: h[..., :V] * 50.0 if h.shape[-1] >= V else torch.nn.functional.pad(
        h * 50.0, (0, V - h.shape[-1]))
    below.hidden.zero_()
    below.hidden[:, 3, 7] = 1.0  # (row 0, col 3) -> the law at (row 1, col 3) peaks at id 7
    law = below(torch.tensor([[[W + 3, W + 4]]]).expand(2, 1, 2))
    assert bool((law[:, 0, 0].argmax(-1) == 7).all()) and float(law[0, 0, 0, 7]) > 0.5
    below.known[:, :] = False
    assert torch.allclose(below(torch.tensor([[[W + 3]]]).expand(2, 1, 1)), below.prior(torch.tensor([[[W + 3]]]).expand(2, 1, 1)))


def test_a_head_for_another_grid_is_refused(target):
    other = Heads2D.from_target(target, W + 2, H * (W + 2))
    with pytest.raises(InputError, match="trained for rows of 12 in 72 tokens"):
        _decode(target, other)


def test_forced_row_ends_on_chameleon(tmp_path):
    """A span layout (left-padded prompts, forced row ends, image codes only): the untrained head's
    laws pass the layout (row ends forced, codes only), and one greedy lane is the AR loop."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    import sys
    from pathlib import Path

    import lisa_trt

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
    from chameleon_fixtures import N_CODES, save_model_dir
    from lumina_calls import LuminaTokenizer, generate_image_tokens, row_end_mask, span_request

    d = save_model_dir(tmp_path, seed=5, vq=False, num_key_value_heads=2)
    t, tok = lisa_trt.load_target(d), LuminaTokenizer(d)
    caps = ["a red fox", "tok70 tok71 tok72"]
    prompts, layout, (h, w) = span_request(t, tok, caps, 64, 96, True)
    got, _ = run_method(get_method("pjd-ssd2d"), t, None, None, prompts, sampling=SamplingConfig(cfg_scale=3.0, top_k=10),
                        spec=SpecConfig(), seed=0, layout=layout)
    ends = row_end_mask(h, w)
    assert (got[:, ends] == tok.newline).all() and ((got[:, ~ends] >= 4) & (got[:, ~ends] < 4 + N_CODES)).all()
    ref = generate_image_tokens(t, tok, caps, 64, 96, cfg_scale=3.0, greedy=True)
    one, _ = run_method(get_method("pjd-ssd2d"), t, None, None, prompts, sampling=SamplingConfig(cfg_scale=3.0, top_k=1),
                        spec=SpecConfig().replace(pjd_rows=1), seed=0, layout=layout)
    assert torch.equal(one, ref.tokens)


def test_bad_head_files_are_refused(target, tmp_path):
    from lisa_trt.errors import ArtifactMismatchError, CheckpointError, ConfigError
    from lisa_trt.io import save_safetensors
    from lisa_trt.models.head2d import save_heads2d

    def run(path):
        return run_method(get_method("pjd-ssd2d"), target, None, None, COND, sampling=SAMPLING,
                          spec=SpecConfig().replace(pjd_ssd2d_head=str(path)), seed=3)

    with pytest.raises(CheckpointError, match="no 2-D head file"):
        run(tmp_path / "missing.safetensors")
    save_safetensors({"x": torch.zeros(2)}, tmp_path / "other.safetensors", metadata={"kind": "lisa-trt-medusa"})
    with pytest.raises(CheckpointError, match="not a lisa-trt 2-D heads artifact"):
        run(tmp_path / "other.safetensors")
    other = make_target(block_size=H * W, grid_shape=(H, W), n_layer=2, std=0.3, seed=1)
    save_heads2d(Heads2D.from_target(other, W, H * W), tmp_path / "h.safetensors")
    with pytest.raises(ArtifactMismatchError, match="were trained for target hash"):
        run(tmp_path / "h.safetensors")
    save_heads2d(Heads2D.from_target(target, W, H * W, ((1, 1),)), tmp_path / "diag.safetensors")
    with pytest.raises(ConfigError, match="not \\(1, 0\\)"):
        run(tmp_path / "diag.safetensors")
