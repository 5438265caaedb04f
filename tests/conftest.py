import os

import pytest
import torch

# Tiny models: one thread is much faster than two on a shared 2-core machine (no oversubscription).
torch.set_num_threads(1)
# ... and the same for the thread policy that every entry point applies (lisa_trt/threads.py).
os.environ.setdefault("LISA_TRT_THREADS", "1")


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
