"""Issue 52: the wrong file given to --model gets an error naming what it is and the fix."""

import pytest
import torch
from click.testing import CliRunner

from lisa_trt.cli import main
from lisa_trt.errors import CheckpointError
from lisa_trt.models.artifact_sets import bundled_file


def _error(args):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.output.startswith("error: "), r.output
    return r.output


def test_a_gpt_b_file_loaded_as_gpt_l_is_told_gpt_b():
    """The hint names the config whose shapes the file has, not a fixed example."""
    from lisa_trt.families.llamagen.checkpoint import guess_target_config
    from lisa_trt.families.llamagen.model import Transformer
    from lisa_trt.models.checkpoints import strict_load
    from lisa_trt.models.target_config import target_config

    with torch.device("meta"):
        sd = Transformer(target_config("GPT-B")).state_dict()
        model = Transformer(target_config("GPT-L"))
    with pytest.raises(CheckpointError) as e:
        strict_load(model, sd, "target", guess_target_config(sd))
    hint = [ln for ln in str(e.value).splitlines() if "hint" in ln]
    assert hint and "--config GPT-B" in hint[0] and "GPT-L" not in hint[0], str(e.value)


def test_a_custom_shape_is_not_given_a_named_config():
    from lisa_trt.families.llamagen.checkpoint import guess_target_config

    sd = {"tok_embeddings.weight": torch.empty(64, 40, device="meta"),
          "layers.0.attention.wo.weight": torch.empty(40, 40, device="meta")}
    hint = guess_target_config(sd)
    assert "custom config (dim=40, n_layer=1" in hint and "--config" not in hint


@pytest.mark.parametrize("asset,fix", [("drafter_lisa.safetensors", "pass it as --drafter"),
                                       ("medusa_lisa.safetensors", "pass it as --drafter"),
                                       ("tables.safetensors", "pass it as --tables")])
def test_a_drafter_or_tables_passed_as_model(tmp_path, asset, fix):
    path = bundled_file("demo-lisa", "drafters").parent / asset
    if not path.is_file():
        pytest.skip("the bundled demo assets are absent")
    out = _error(["generate", "--model", str(path), "--out", str(tmp_path / "o")])
    assert fix in out and "TargetConfig fields" not in out


def test_a_random_pt_file(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(bytes(range(256)) * 8)
    out = _error(["generate", "--model", str(junk), "--out", str(tmp_path / "o")])
    assert "not a readable PyTorch checkpoint" in out and "torch.save" in out and ".safetensors" in out
    one = tmp_path / "one.pt"
    torch.save(torch.zeros(3), one)
    out = _error(["generate", "--model", str(one), "--out", str(tmp_path / "o")])
    assert "one tensor of shape (3,)" in out and "state dict" in out


def test_random_checkpoint_of_a_family_without_random_init(tmp_path):
    out = _error(["random-checkpoint", str(tmp_path / "c.pt"), "--config", "GPT-B", "--model-type", "chameleon"])
    assert "chameleon family writes no random checkpoint" in out and "--model-type c2i" in out
    assert not (tmp_path / "c.pt").exists()


def test_a_misspelt_bundled_name_gets_did_you_mean(tmp_path):
    out = _error(["generate", "--model", "dmeo", "--out", str(tmp_path / "o")])
    assert "did you mean 'demo'" in out
    out = _error(["generate", "--model", "zzzz", "--out", str(tmp_path / "o")])
    assert "did you mean" not in out
