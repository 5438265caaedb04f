import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models are 100x slower with competing intra-op threads on this 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
