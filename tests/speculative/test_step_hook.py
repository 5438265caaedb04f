"""The per-step hook of every decode loop (run_method's `on_step`): each call's committed tokens
are a prefix of the row's final tokens, the prefixes only grow, the last call has the whole
image, and the hook changes nothing in the decode."""

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.models.drafter import Drafter
from lisa_trt.speculative.methods import SpecConfig
from lisa_trt.speculative.run import run_method
from lisa_trt.testing import make_target
from lisa_trt.speculative.methods import resolve_method


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    t = make_target(std=0.3)
    return t, Drafter.from_target(t).eval()


# the AR loop, the tree decoder and every Jacobi-family loop that needs no tables
@pytest.mark.parametrize("method", ["vanilla", "exact", "sjd", "mcsjd", "sjd-pac", "gsd", "zipar"])
def test_hook_prefixes_grow_into_the_final_tokens(models, method):
    t, d = models
    cond, sampling = torch.tensor([1, 5]), SamplingConfig(cfg_scale=2.0, temperature=1.0, top_k=0)
    spec = SpecConfig.make("exact", top_k=3, depth=2, total_tokens=8).replace(sjd_window=4)
    seen = []

    def hook(tokens, done):
        done = done.tolist()
        seen.append([tokens[b, :n].tolist() for b, n in enumerate(done)])

    toks, _ = run_method(resolve_method(method), t, d, None, cond, sampling=sampling, spec=spec, seed=3, on_step=hook)
    ref, _ = run_method(resolve_method(method), t, d, None, cond, sampling=sampling, spec=spec, seed=3)
    assert torch.equal(toks, ref)  # the hook only reads
    final = toks.tolist()
    assert len(seen) > 1
    for b in range(len(final)):
        lens = [len(s[b]) for s in seen]
        assert lens == sorted(lens) and lens[0] < len(final[b])
        assert all(s[b] == final[b][:len(s[b])] for s in seen)
        assert seen[-1][b] == final[b]
