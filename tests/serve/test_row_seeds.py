"""Per-row seeds: a prompt's tokens do not depend on which prompts share its batch."""

import pytest
import torch

from lisa_trt.speculative.sampling import RowGenerators


@pytest.mark.parametrize("verify", ["exact", "gasv", "lantern", "vanilla"])
def test_batched_rows_equal_single_rows(pipe, verify):
    prompts, seeds = [1, 3, 3, 7], [11, 5, 6, 11]
    from lisa_trt.runtime.prompts import Prompt

    batch = pipe.generate([Prompt(0, class_id=c, seed=s) for c, s in zip(prompts, seeds)], verify=verify,
                          batch=True, decode=False)
    for i, (c, s) in enumerate(zip(prompts, seeds)):
        one = pipe.generate([c], seed=s, verify=verify, batch=True, decode=False)
        assert torch.equal(one.tokens[0], batch.tokens[i]), (verify, i)
        # the row's stats are its own decode's: the same steps and MAL as decoding it alone
        assert (batch.stats[i]["mal"], batch.stats[i]["forwards"]) == (one.stats[0]["mal"], one.stats[0]["forwards"])
    assert not torch.equal(batch.tokens[1], batch.tokens[2])  # same class, different seeds
    assert batch.stats[0]["batch"] == 4


def test_mixed_cfg_batch_refused(pipe):
    from lisa_trt import LisaError
    from lisa_trt.runtime.prompts import Prompt

    with pytest.raises(LisaError, match="one CFG scale"):
        pipe.generate([Prompt(0, class_id=1, cfg=2.0), Prompt(1, class_id=2, cfg=3.0)], batch=True)


def test_row_generators_layout_is_batch_independent():
    a = RowGenerators([1, 2], cap=8).rand((2, 3, 2))
    b = RowGenerators([2], cap=8).rand((1, 5, 4))
    assert torch.equal(a[1], b[0, :3, :2])
    with pytest.raises(Exception, match="exceeds"):
        RowGenerators([1], cap=4).rand((1, 5))
