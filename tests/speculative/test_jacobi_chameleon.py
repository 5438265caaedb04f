"""The Jacobi-family decoders (sjd, mcsjd, sjd-pac, gsd, zipar) on a tiny random Chameleon
checkpoint through the generic loops and the family's span layout: left-padded prompts with
their CFG rows, forced row ends (never drafted: one-hot laws), image codes only. A one-hot target
law makes every lossless decoder reproduce the AR loop token for token; sampled runs keep the
span structure; ZipAR treats a row end as the last token of its row."""

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
from lumina_calls import LuminaTokenizer, generate_image_tokens, load_chameleon_engines, row_end_mask, span_request  # noqa: E402
from lisa_trt.speculative.methods import SpecConfig  # noqa: E402
from lisa_trt.speculative.run import run_method  # noqa: E402
from lisa_trt.speculative.methods import resolve_method

CAPS = ["a red fox", "tok70 tok71 tok72"]  # two prompts of different lengths (left padding)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = save_model_dir(tmp_path_factory.mktemp("jacobi"), seed=5, vq=False, num_key_value_heads=2)
    return lisa_trt.load_target(d), LuminaTokenizer(d)


@pytest.mark.parametrize("method", ["sjd", "mcsjd", "sjd-pac", "zipar"])
def test_one_hot_law_reproduces_the_ar_loop(setup, method):
    target, tok = setup
    ref = generate_image_tokens(target, tok, CAPS, 64, 96, cfg_scale=3.0, greedy=True)
    prompts, layout, (h, w) = span_request(target, tok, CAPS, 64, 96, True)
    spec = SpecConfig.make("gasv", zipar_window=w + 1)  # zipar: a full row (row end included) = AR
    got, st = run_method(resolve_method(method), target, None, None, prompts, sampling=SamplingConfig(cfg_scale=3.0, top_k=1),
                         spec=spec, seed=0, sjd_window=4, layout=layout)
    assert torch.equal(got, ref.tokens), method
    assert st.mean_tvd == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("method", ["sjd", "mcsjd", "sjd-pac", "gsd", "zipar"])
def test_sampled_spans_keep_their_structure(setup, method):
    target, tok = setup
    prompts, layout, (h, w) = span_request(target, tok, CAPS, 64, 96, True)
    spec = SpecConfig.make("gasv", zipar_window=1)
    got, st = run_method(resolve_method(method), target, None, None, prompts, sampling=SamplingConfig(cfg_scale=3.0, top_k=10),
                         spec=spec, seed=0, sjd_window=4, layout=layout)
    ends = row_end_mask(h, w)
    assert (got[:, ends] == tok.newline).all()
    assert ((got[:, ~ends] >= 4) & (got[:, ~ends] < 4 + N_CODES)).all()
    assert st.target_forwards < got.shape[1]
    if method in ("gsd", "zipar"):
        assert st.mean_tvd > 0
    else:
        assert st.mean_tvd == 0.0


@pytest.mark.slow
def test_the_jacobi_family_runs_on_the_onnx_runtime_graphs(setup, tmp_path):
    """The exported target graphs (engines/prompt_graph.py) through the same generic loops: a
    one-hot law gives the eager AR loop's tokens for every Jacobi-family decoder."""
    pytest.importorskip("onnxruntime")
    from click.testing import CliRunner

    from lisa_trt.cli import main

    target, tok = setup
    r = CliRunner().invoke(main, ["export", "--model", str(target.source_dir), "--image-size", "64", "--out",
                                  str(tmp_path / "eng"), "--max-prompt", "32", "--max-tree", "24"])
    assert r.exit_code == 0, r.output
    eng = load_chameleon_engines(tmp_path / "eng", threads=1)
    ref = generate_image_tokens(target, tok, CAPS, 64, 64, cfg_scale=3.0, greedy=True)
    for method in ("sjd", "mcsjd", "sjd-pac", "gsd", "zipar"):
        prompts, layout, (h, w) = span_request(eng.target, eng.tokenizer, CAPS, 64, 64, True)
        spec = SpecConfig.make("gasv", zipar_window=2, sjd_pac_tree_width=2)  # the tree fits --max-tree 24
        got, st = run_method(resolve_method(method), eng.target, None, None, prompts, sampling=SamplingConfig(cfg_scale=3.0, top_k=1),
                             spec=spec, seed=0, sjd_window=4, layout=layout)
        if method == "zipar":  # approximate: the span structure, not the AR tokens
            ends = row_end_mask(h, w)
            assert (got[:, ends] == tok.newline).all() and st.target_forwards < got.shape[1]
        else:
            assert torch.equal(got.cpu(), ref.tokens), method
