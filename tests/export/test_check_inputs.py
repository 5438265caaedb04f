"""One check of an export's inputs (export/onnx.check_inputs) for every family: LlamaGen's export
calls it, token-prompt families' through prompt_graphs.check_bundle_artifacts (which binds after)."""

import dataclasses
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lisa_trt.errors import ArtifactMismatchError, InputError
from lisa_trt.export.onnx import check_inputs
from lisa_trt.export.prompt_graphs import check_bundle_artifacts
from lisa_trt.models.checkpoints import target_hash
from lisa_trt.speculative.gasv import GASVConfig

_spec = importlib.util.spec_from_file_location("export_artifacts", Path(__file__).with_name("export_artifacts.py"))
A = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(A)

CHECKS = [check_inputs, check_bundle_artifacts]


@pytest.fixture(scope="module")
def art():
    return A.make_artifacts()


def _with_hash(drafter, h):
    class D:
        config = dataclasses.replace(drafter.config, target_hash=h)
    return D()


@pytest.mark.parametrize("check", CHECKS)
def test_matching_artifacts_pass(art, check):
    check(art["target"], art["drafter"], art["tables"])
    check(art["target"], _with_hash(art["drafter"], ""), None)  # a drafter without a recorded target passes


@pytest.mark.parametrize("check", CHECKS)
def test_a_drafter_of_another_target_is_refused(art, check):
    with pytest.raises(ArtifactMismatchError, match="drafter was trained for target 0123456789abcdef, but the "
                                                    "target being exported is .*distilled from"):
        check(art["target"], _with_hash(art["drafter"], "0123456789abcdef"), None)


@pytest.mark.parametrize("check", CHECKS)
def test_tables_of_another_target_or_vocabulary_are_refused(art, check):
    other = A.make_artifacts(seed=5)["target"]
    with pytest.raises(ArtifactMismatchError, match=f"calibrated for target {target_hash(other)}"):
        check(art["target"], None, A.make_tables(other))
    codes = torch.arange(art["tables"].vocab_size - 1)  # tables cover the whole head, not these codes
    with pytest.raises(ArtifactMismatchError, match="vocabulary"):
        check(art["target"], None, art["tables"], codes)
    no_geo = dataclasses.replace(art["tables"], config=GASVConfig(neighbours=12, kappa=1.5, lam=0.3))
    with pytest.raises(InputError, match="theta_geo"):
        check(art["target"], None, no_geo)


def test_check_bundle_artifacts_binds_the_tables_to_the_codes_they_cover(art):
    t = art["target"]
    codes = torch.arange(8, 8 + art["tables"].vocab_size // 2)
    head = SimpleNamespace(output=SimpleNamespace(weight=t.output.weight.detach()[codes]))
    sub = dataclasses.replace(A.make_tables(head), target_hash=target_hash(t), w_tilde=None)  # tables of these codes
    bound = check_bundle_artifacts(t, None, sub, codes)
    assert bound.w_tilde is not None and bound.w_tilde.shape[0] == codes.numel()
    assert check_bundle_artifacts(t, None, None) is None
