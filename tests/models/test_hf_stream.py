"""Sharded HF checkpoints are streamed into the model tensor by tensor (models/hf.stream_weights):
never read whole, bf16 shards converted per tensor, strict errors unchanged."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from chameleon_fixtures import make_hf_model, save_hf  # noqa: E402

from lisa_trt.errors import CheckpointError  # noqa: E402
from lisa_trt.models import hf  # noqa: E402
from lisa_trt.families.chameleon.checkpoint import load_chameleon  # noqa: E402


def _sharded(tmp_path, dtype=torch.float32):
    model = make_hf_model().to(dtype)
    d = save_hf(model, tmp_path / "ck", max_shard_size="40KB")
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    assert len(set(idx["weight_map"].values())) > 2, "the fixture is sharded"
    return model, d


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sharded_checkpoint_streamed(tmp_path, monkeypatch, dtype):
    from safetensors import safe_open as real_open

    hf_model, d = _sharded(tmp_path, dtype)
    from lisa_trt.families.chameleon import checkpoint as ck

    # the whole-checkpoint reader, where the Chameleon loader could reach it (its checkpoint module no
    # longer imports it: only through models/hf)
    assert not hasattr(ck, "read_weights")
    monkeypatch.setattr(hf, "read_weights", lambda *a, **k: pytest.fail("the whole checkpoint was read"))
    reads = []

    class Counting:
        def __init__(self, *a, **k):
            self.h = real_open(*a, **k)

        def __enter__(self):
            self.h.__enter__()
            return self

        def __exit__(self, *a):
            return self.h.__exit__(*a)

        def keys(self):
            return self.h.keys()

        def get_slice(self, k):
            return self.h.get_slice(k)

        def get_tensor(self, k):
            reads.append(k)
            return self.h.get_tensor(k)

    import safetensors

    monkeypatch.setattr(safetensors, "safe_open", Counting)
    m = load_chameleon(d)
    want = {k: v for k, v in hf_model.state_dict().items() if not k.startswith("model.vqmodel.")}
    own = m.state_dict()
    for k, v in own.items():
        if k in want:
            assert own[k].dtype == torch.float32 and torch.equal(own[k], want[k].float()), k
    assert len(reads) == len(set(reads)), "every tensor read once"
    assert not any(k.startswith("model.vqmodel.") for k in reads), "the VQ encoder is never read"


def test_streamed_load_keeps_strict_errors(tmp_path):
    _, d = _sharded(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 64
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="shape mismatches.*mlp"):
        load_chameleon(d)
