"""The Jacobi-family decoders on a tiny random Janus-Pro checkpoint (image head, CFG rows built by
the family): a one-hot law reproduces the family's greedy AR tokens; ZipAR's short window reports
a positive TVD."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from test_janus import make_hf, prompts, save  # noqa: E402

from lisa_trt.config import SamplingConfig  # noqa: E402
from lisa_trt.families import janus as J  # noqa: E402
from lisa_trt.speculative.methods import SpecConfig  # noqa: E402
from lisa_trt.speculative.run import run_method  # noqa: E402
from lisa_trt.speculative.methods import get_method, resolve_method


def test_jacobi_family_on_janus(tmp_path):
    t = J.load_janus_target(save(make_hf(seed=3), tmp_path / "janus"))
    ids = prompts(B=2, T=5, seed=9)
    ref = J.generate_image_tokens(t, ids, cfg_scale=5.0)
    full_row = SpecConfig.make("gasv", zipar_window=t.config.grid_hw[1])
    for m in ("sjd", "mcsjd", "sjd-pac", "gsd", "zipar"):
        got, _ = run_method(resolve_method(m), t, None, None, ids, sampling=SamplingConfig(cfg_scale=5.0, top_k=1), spec=full_row,
                            seed=0, sjd_window=4)
        assert torch.equal(got, ref), m
    _, st = run_method(get_method("zipar"), t, None, None, ids, sampling=SamplingConfig(cfg_scale=5.0),
                       spec=SpecConfig.make("gasv", zipar_window=1), seed=0)
    assert st.mal > 1.2 and st.mean_tvd > 0.01
