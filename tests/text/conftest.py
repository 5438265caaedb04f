import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def t5_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from lisa_trt.families.llamagen.tiny_t5 import make_tiny_t5

    return make_tiny_t5(tmp_path_factory.mktemp("t5") / "t5", d_model=12)
