"""artifacts.find_vq: the one place a command finds its image decoder (--vq, the artifact set's,
or a family's own beside the checkpoint)."""

from types import SimpleNamespace

import pytest

from lisa_trt.artifacts import find_vq
from lisa_trt.errors import ConfigError, InputError

CODES = SimpleNamespace(vq_beside_checkpoint=False)  # a family whose tokens are VQ codes (LlamaGen)
PROMPTED = SimpleNamespace(vq_beside_checkpoint=True)  # a family whose decoder sits beside its checkpoint


@pytest.fixture
def loads(monkeypatch):
    """Records load_vq's calls; a path starting 'missing' raises like a folder without a decoder."""
    import lisa_trt.models.checkpoints as C

    calls = []

    def fake(path, config=None, device="cpu"):
        calls.append((path, config))
        if str(path).startswith("missing"):
            raise ConfigError(f"no VQGAN in {path}")
        return SimpleNamespace(config=SimpleNamespace(codebook_size=16))

    monkeypatch.setattr(C, "load_vq", fake)
    return calls


def test_the_artifact_set_supplies_its_own_vq():
    vqm, why = find_vq("demo", family=CODES)
    assert why is None and hasattr(vqm, "decode_code")


def test_a_named_vq_loads_with_its_config_and_is_checked_against_the_vocabulary(loads):
    vqm, why = find_vq("run/t.safetensors", "vq.pt", "VQ-8", family=CODES, vocab_size=16)
    assert vqm is not None and why is None and loads == [("vq.pt", "VQ-8")]
    find_vq("run/t.safetensors", "vq.safetensors", "VQ-8", family=CODES)
    assert loads[-1] == ("vq.safetensors", None)  # self-describing
    with pytest.raises(InputError, match="--vq vq.pt has 16 codes but the target's vocabulary is 32"):
        find_vq("run/t.safetensors", "vq.pt", family=CODES, vocab_size=32)


def test_without_a_vq_a_code_family_has_none_and_no_reason(loads):
    assert find_vq("run/t.safetensors", family=CODES) == (None, None) and loads == []


def test_a_prompted_family_finds_its_own_decoder_or_says_why(loads):
    vqm, why = find_vq("ckpt", family=PROMPTED, vocab_size=65536)  # its vocabulary holds text tokens too
    assert vqm is not None and why is None and loads == [("ckpt", None)]
    assert find_vq("missing-dir", family=PROMPTED) == (None, "no VQGAN in missing-dir")
    find_vq("ckpt", "vqgan", "VQ-16", family=PROMPTED)
    assert loads[-1] == ("vqgan", None)  # its decoders describe themselves
    with pytest.raises(ConfigError, match="no VQGAN in missing-vqgan"):  # a named VQ that fails is an error
        find_vq("ckpt", "missing-vqgan", family=PROMPTED)
