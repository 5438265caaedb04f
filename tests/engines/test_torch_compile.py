"""The torch backend with torch.compile (issue 12 item 4): Inductor on this CPU gives the eager
backend's logits and the eager models' tokens; CUDA graphs are refused off CUDA with the fix."""

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.engines.graph import load_engines
from lisa_trt.engines.torch_runner import compile_mode
from lisa_trt.errors import InputError
from lisa_trt.speculative.methods import SpecConfig
from lisa_trt.speculative.run import run_method
from lisa_trt.speculative.methods import resolve_method


def test_compile_modes_and_their_errors():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compile_mode(None, cpu) is None and compile_mode(False, cpu) is None and compile_mode("off", cpu) is None
    assert compile_mode(True, cpu) == "default" and compile_mode("auto", cuda) == "reduce-overhead"
    assert compile_mode("cuda-graphs", cuda) == "reduce-overhead"
    with pytest.raises(InputError, match="needs device='cuda'.*compile='default'"):
        compile_mode("cuda-graphs", cpu)
    with pytest.raises(InputError, match="use one of off, auto, default, cuda-graphs"):
        compile_mode("fast", cpu)


@pytest.mark.slow
def test_inductor_compiled_step_gives_the_eager_tokens(bundle, artifacts):
    """Same tokens as the eager models (exact and GASV, CFG, batch 2, a tree whose size changes at the
    end of the image, so the compiled graphs see several shapes); only the step graphs are compiled."""
    a = artifacts
    cond = torch.tensor([1, 4])
    s = SamplingConfig(cfg_scale=2.0, temperature=1.0)
    with load_engines(bundle, "torch", compile="default") as eng:
        assert eng.target._verify.mode == "default" and eng.target._prefill.mode is None
        for method in ("exact", "gasv"):
            spec = SpecConfig.make(method, top_k=3, depth=3, total_tokens=10)
            got, _ = run_method(resolve_method(method), eng.target, eng.drafter, a["tables"], cond, sampling=s, spec=spec, seed=7,
                                gasv=eng.gasv)
            want, _ = run_method(resolve_method(method), a["target"], a["drafter"], a["tables"], cond, sampling=s, spec=spec,
                                 seed=7)
            assert torch.equal(got.cpu(), want.cpu()), method
