import pytest
import torch
import torch.nn.functional as F

from lisa_trt.testing import make_target

# Tiny models: the thread hand-off costs far more than the math on a shared 2-core CPU.
torch.set_num_threads(1)


@pytest.fixture
def target():
    return make_target(seed=0)


@pytest.fixture
def codebook():
    g = torch.Generator().manual_seed(7)
    return F.normalize(torch.randn(256, 8, generator=g), dim=-1)
