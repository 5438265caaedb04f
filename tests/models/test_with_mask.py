"""models/prompts.with_mask: the one place prompt ids and an attention mask become a condition pair."""

import pytest
import torch

from lisa_trt.errors import InputError
from lisa_trt.models.prompts import with_mask


def test_ids_and_a_mask_become_a_pair_and_a_pair_refuses_a_second_mask():
    ids, mask = torch.tensor([[1, 2]]), torch.tensor([[True, False]])
    assert with_mask(ids) is ids
    got = with_mask(ids, mask)
    assert got[0] is ids and got[1] is mask
    with pytest.raises(InputError, match="already carries its mask"):
        with_mask((ids, mask), mask)
