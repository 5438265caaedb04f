"""The family owns its grid: a class-conditional LlamaGen target over 16 x 24
tokens (`grid_shape`) builds its RoPE table, its drafter, trains a drafter, exports every graph
(the VQ decoder's too) and decodes with plain sampling, SJD-PAC, GASV, PJD and gasv-2d on torch and on ONNX
Runtime. Nothing in these paths may assume a square grid."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.errors import ConfigError
from lisa_trt.models.drafter import Drafter, DrafterConfig, load_drafter
from lisa_trt.models.rope import precompute_freqs_cis_2d
from lisa_trt.speculative.methods import SpecConfig
from lisa_trt.speculative.run import run_method
from lisa_trt.testing import make_cond, make_target
from lisa_trt.speculative.methods import get_method, resolve_method

sys.path.insert(0, str(Path(__file__).resolve().parent / "export"))
from export_artifacts import make_tables, make_vq  # noqa: E402

H, W = 16, 24
SAMPLING = SamplingConfig(cfg_scale=2.0, top_k=0)
SPEC = SpecConfig.make(top_k=3, depth=2, total_tokens=8)
METHODS = ["vanilla", "sjd-pac", "gasv", "pjd", "gasv-2d"]


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    t = make_target(block_size=H * W, grid_shape=(H, W), n_layer=2, std=0.3)
    torch.manual_seed(0)
    d = Drafter.from_target(t).eval()
    return dict(target=t, drafter=d, tables=make_tables(t), vq=make_vq(t.config.vocab_size))


@pytest.fixture(scope="module")
def ort_engines(models, tmp_path_factory):
    from lisa_trt.engines.ort import load_ort_engines
    from lisa_trt.export import export_bundle

    m = models
    out = tmp_path_factory.mktemp("grid") / "bundle"
    export_bundle(m["target"], m["drafter"], m["tables"], m["vq"], out, max_tree=48, lint=False, progress=False,
                  validate=False)
    return load_ort_engines(out, threads=1)


def _angles(table, i, cls=1):
    """The (row, column) angles of image token i: the first half of the pairs, the second half."""
    ang = torch.atan2(table[cls + i, :, 1], table[cls + i, :, 0])
    q = ang.shape[0] // 2
    return ang[:q], ang[q:]


def test_the_rope_table_follows_the_families_grid(models):
    t = models["target"]
    tab = precompute_freqs_cis_2d((H, W), t.config.head_dim, t.config.rope_base, 1)
    assert tab.shape == (1 + H * W, t.config.head_dim // 2, 2)
    assert torch.equal(t.freqs_cis, tab) and torch.equal(models["drafter"].freqs_cis, tab)
    step_r, step_c = _angles(tab, W)  # token W is cell (1, 0): row angle = the base frequencies
    for i in (0, 5, W - 1, W, W + 7, H * W - 1):
        r, c = divmod(i, W)  # row-major: token i is cell (i // w, i % w)
        ar, ac = _angles(tab, i)
        assert torch.allclose(torch.cos(ar), torch.cos(r * step_r), atol=1e-5)
        assert torch.allclose(torch.cos(ac), torch.cos(c * step_r), atol=1e-5)
    assert torch.equal(precompute_freqs_cis_2d(4, 16), precompute_freqs_cis_2d((4, 4), 16))


def test_the_drafter_config_keeps_the_grid_and_square_files_read_as_before(models):
    cfg = models["drafter"].config
    assert cfg.grid_hw == (H, W) and cfg.to_dict()["grid_shape"] == [H, W]
    assert DrafterConfig.from_dict(cfg.to_dict()) == cfg
    square = Drafter.from_target(make_target()).config
    assert "grid_shape" not in square.to_dict() and square.grid_hw == (4, 4)
    with pytest.raises(ConfigError, match="grid_shape"):
        DrafterConfig.from_dict({**cfg.to_dict(), "grid_shape": [H, W + 1]})
    with pytest.raises(ConfigError, match="must be a square"):
        DrafterConfig.from_dict({**square.to_dict(), "block_size": 12})


def test_a_drafter_trains_on_the_non_square_target(models, tmp_path):
    import torch.nn.functional as F

    from lisa_trt.train import DataConfig, TrainConfig, train_drafter

    t = models["target"]
    codebook = F.normalize(torch.randn(t.config.vocab_size, 8, generator=torch.Generator().manual_seed(7)), dim=-1)
    data = DataConfig(num_samples=4, eval_samples=2, gen_batch=4, cfg_scale=2.0)
    cfg = TrainConfig(steps=1, batch_size=2, ttt_steps=2, warmup_steps=1, checkpoint_every=1, log_every=1, data=data)
    res = train_drafter(t, codebook, cfg, tmp_path, progress=False)
    d = load_drafter(res["drafter"], t)
    assert d.config.grid_hw == (H, W) and torch.equal(d.freqs_cis, t.freqs_cis)


def _decode_ok(method, target, drafter, tables, check_mal, gasv=None, rows=1):
    cond = make_cond(target, rows)
    toks, st = run_method(resolve_method(method), target, drafter, tables, cond, sampling=SAMPLING, spec=SPEC, seed=3, gasv=gasv)
    assert toks.shape == (rows, H * W)
    assert int(toks.min()) >= 0 and int(toks.max()) < target.config.vocab_size
    check_mal(st.mal, st.target_forwards, H * W, rows=rows)


@pytest.mark.parametrize("method", METHODS)
def test_every_decoder_runs_the_grid_on_torch(models, method, check_mal):
    _decode_ok(method, models["target"], models["drafter"], models["tables"], check_mal, rows=2)


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_every_decoder_runs_the_grid_on_ort(models, ort_engines, method, check_mal):
    e = ort_engines
    _decode_ok(method, e.target, e.drafter, None if e.gasv else models["tables"], check_mal, gasv=e.gasv)


@pytest.mark.slow
def test_greedy_tokens_agree_between_torch_and_ort(models, ort_engines):
    greedy = SamplingConfig(greedy=True)
    cond = make_cond(models["target"], 2)
    a, _ = run_method(get_method("vanilla"), models["target"], None, None, cond, sampling=greedy, spec=SPEC, seed=0)
    b, _ = run_method(get_method("vanilla"), ort_engines.target, None, None, cond, sampling=greedy, spec=SPEC, seed=0)
    assert torch.equal(a, b)


@pytest.mark.slow
def test_the_vq_graph_decodes_the_grid(models, ort_engines):
    toks = torch.randint(0, models["target"].config.vocab_size, (2, H * W), generator=torch.Generator().manual_seed(1))
    ds = models["vq"].config.downsample
    img = ort_engines.vq.decode_code(toks)
    assert img.shape == (2, 3, H * ds, W * ds)
    with torch.no_grad():
        want = models["vq"].tokens_to_pixels(toks.reshape(2, H, W))
    assert torch.allclose(img.float(), want.float(), atol=1e-3)


def test_the_pipeline_decodes_class_conditioned_tokens_on_the_grid(models):
    from lisa_trt.runtime.pipeline import Pipeline

    gen = {"sampling": {"cfg_scale": 2.0, "top_k": 0}, "class_names": [f"c{i}" for i in range(10)]}
    pipe = Pipeline.from_models(models["target"], None, None, models["vq"], generation=gen)
    res = pipe.generate([1], seed=2, verify="zipar")
    ds = models["vq"].config.downsample
    assert res.images[0].size == (W * ds, H * ds)
