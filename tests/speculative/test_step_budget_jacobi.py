"""The Jacobi decoders (sjd, mcsjd, sjd-pac, gsd, sjd-gasv: the one loop of speculative/sjd.py) and
ZipAR run a fixed window (issue 49): every target forward of a decode has the same input shapes,
the last steps included (no window shrinking to what is left of the image), a steady-state step
reads at most one value back to the host (the Jacobi loop: the rows' committed counts; ZipAR's
static schedule: none) and calls the target once. Counted by bench/step_budget.py's counter on the
tiny torch models, batch 1 and 2 with CFG."""

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.speculative.methods import SpecConfig, resolve_method
from lisa_trt.speculative.run import run_method
from lisa_trt.testing import make_cond, make_target

WINDOW = 4
# host reads per steady-state step (the ceiling): the Jacobi loop's one read, none for ZipAR
CEILING = {"sjd": 1, "mcsjd": 1, "sjd-pac": 1, "gsd": 1, "sjd-gasv": 1, "zipar": 0}


@pytest.fixture(scope="module")
def models():
    from test_step_budget import _tables  # the synthetic GASV tables bound to the target's head

    torch.manual_seed(0)
    t = make_target(std=0.3)
    return t, _tables(t)


def _budget(bench, models, method: str, batch: int):
    """Decode under the counter -> (steady-state summary, every step's records, tokens)."""
    t, tables = models
    b = bench.StepBudget(count=True, sites=True)
    for m in ("prefill", "forward_tokens"):
        b.watch(t, (m,), f"target.{m}")
    spec = SpecConfig.make(method).replace(sjd_window=WINDOW, zipar_window=2)
    try:
        with b:
            toks, _ = run_method(resolve_method(method), t, None, tables, make_cond(t, batch=batch),
                                 sampling=SamplingConfig(cfg_scale=2.0), spec=spec, seed=3, on_step=b.on_step)
    finally:
        b.unwatch()
    return b.summary(margin=2 * WINDOW + 1, n_tokens=toks.shape[1]), b.steps, toks


def _all_shapes(steps) -> set:
    """The target's input-shape signatures over every step of the decode (the last ones included)."""
    return set().union(*(s["shapes"].get("target.forward_tokens", set()) for s in steps))


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("method", sorted(CEILING))
def test_a_jacobi_step_has_one_shape_one_target_call_and_at_most_one_read(bench, models, method, batch):
    s, steps, toks = _budget(bench, models, method, batch)
    assert s["steady_steps"] >= 2, s
    assert s["host_reads_max"] <= CEILING[method], s["host_read_sites"]
    assert s["calls_per_step"] == {"target.forward_tokens": 1.0}, s["calls_per_step"]
    # one input shape for the whole decode: the tail steps feed the same window as the steady ones
    assert len(steps) >= 4 and len(_all_shapes(steps)) == 1, _all_shapes(steps)
    assert ((toks >= 0) & (toks < models[0].config.vocab_size)).all()


def test_a_planted_host_read_in_the_jacobi_step_fails_the_ceiling(bench, models, monkeypatch):
    """The counter sees a `.item()` added to the Jacobi step (here: in the committed TVD)."""
    import lisa_trt.speculative.sjd as S

    inner = S._step_tvd

    def leaky(slot_tvd, k, from_bonus, W):
        k.max().item()
        return inner(slot_tvd, k, from_bonus, W)

    monkeypatch.setattr(S, "_step_tvd", leaky)
    s, _, _ = _budget(bench, models, "mcsjd", 2)
    assert s["host_reads_max"] > CEILING["mcsjd"]
    assert any("sjd.py" in k and "_local_scalar_dense" in k for k in s["host_read_sites"]), s["host_read_sites"]
