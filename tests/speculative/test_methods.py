"""The method registry: one list for decode / Pipeline / bench / CLI, nested SpecConfig, and a toy
verification rule added in this one file."""

import dataclasses

import pytest
import torch

from lisa_trt.harness import parse_methods
from lisa_trt.config import SamplingConfig
from lisa_trt.errors import InputError
from lisa_trt.models.drafter import Drafter
from lisa_trt.speculative import verify as V
from lisa_trt.speculative.decode import SpeculativeDecoder, tree_decoder
from lisa_trt.speculative.methods import (FLAT_FIELDS, METHODS, LanternConfig, Method, MethodOption, SpecConfig,
                                          TreeConfig, cli_options, get_method, method_names, register_method,
                                          unregister_method)
from lisa_trt.speculative.run import check_artifacts, run_method
from lisa_trt.testing import make_target
from lisa_trt.speculative.methods import get_method


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    t = make_target(std=0.3)
    return t, Drafter.from_target(t).eval()


def test_spec_config_nests_rule_parameters_and_reads_flat_names():
    s = SpecConfig.make("lantern", top_k=3, depth=2, lantern_delta=0.3, gasv_kappa=None)
    assert s.tree == TreeConfig(top_k=3, depth=2, total_tokens=60)
    assert s.lantern == LanternConfig(delta=0.3) and s.gasv.kappa is None
    assert s.replace(gasv_lambda=0.2).gasv.lam == 0.2 and s.flat()["lantern_delta"] == 0.3
    with pytest.raises(InputError, match="unknown speculation setting 'depthh'"):
        s.replace(depthh=3)
    with pytest.raises(InputError, match="unknown verification method 'bogus'"):
        SpecConfig(method="bogus")


def test_one_registry_feeds_bench_and_declares_needs():
    assert method_names() == ["vanilla", "greedy", "exact", "lantern", "gasv", "sjd", "oracle", "mcsjd", "sjd-pac",
                              "gsd", "zipar", "coupled", "sjd-gasv", "pjd", "gasv-2d", "exact-2d",
                              "pjd-gasv-2d", "pjd-ssd2d"]
    assert method_names("sjd") == ["sjd", "mcsjd", "sjd-pac", "gsd", "zipar", "sjd-gasv", "pjd", "gasv-2d", "exact-2d",
                                   "pjd-gasv-2d", "pjd-ssd2d"]
    assert method_names("tree") == ["greedy", "exact", "lantern", "gasv", "oracle", "coupled"]
    assert not get_method("oracle").needs_drafter and get_method("oracle").drafter_factory is not None
    assert parse_methods("vanilla, gasv") == [get_method("vanilla"), get_method("gasv")]  # resolved once, here
    with pytest.raises(InputError, match="valid: vanilla, greedy"):
        parse_methods("vanilla,nope")
    assert get_method("gasv").needs_tables and not get_method("exact").needs_tables
    assert get_method("greedy").greedy_sampling and get_method("greedy").rule is get_method("exact").rule
    with pytest.raises(InputError, match="needs a drafter"):
        check_artifacts(get_method("exact"), None, None)
    with pytest.raises(InputError, match="needs calibration tables"):
        check_artifacts(get_method("lantern"), object(), None)


def test_greedy_is_exact_with_argmax_sampling_everywhere(models):
    """The one definition: the decoder, run_method and bench all give the same tokens."""
    t, d = models
    cond = torch.tensor([1, 2])
    s = SamplingConfig(cfg_scale=2.0)
    spec = SpecConfig.make("greedy", top_k=3, depth=2, total_tokens=8)
    a, _ = SpeculativeDecoder(t, d).generate(cond, sampling=s, method=get_method(spec.method), spec=spec, seed=0)
    b, _ = run_method(get_method("greedy"), t, d, None, cond, sampling=s, spec=spec, seed=1)
    c, _ = SpeculativeDecoder(t, d).generate(cond, sampling=dataclasses.replace(s, greedy=True),
                                             method=get_method("exact"), spec=dataclasses.replace(spec, method="exact"), seed=2)
    assert torch.equal(a, b) and torch.equal(a, c)


def test_non_tree_methods_are_refused_by_the_tree_decoder(models):
    t, d = models
    with pytest.raises(InputError, match="run_method"):
        SpeculativeDecoder(t, d).generate(torch.tensor([1]), method=get_method("sjd"), spec=SpecConfig(method="sjd"))


def test_a_toy_rule_registered_here_runs_through_decode_and_run_method(models):
    """Adding a verification rule touches one file: this one."""
    seen = []

    def reject_all(logits, tree, ctx):
        seen.append((tuple(logits.shape), ctx.spec.method))
        # accept nothing: every step commits the target's own (greedy) bonus token only
        return V.verify_greedy(logits, tree) if ctx.greedy else V.verify_exact(torch.softmax(logits, -1),
                                                                                   tree, ctx.generator)

    register_method(Method("toy", "tree", "a toy rule", needs_drafter=True, rule=reject_all, decoder=tree_decoder))
    try:
        assert "toy" in method_names("tree") and "toy" in [m.name for m in parse_methods("toy")]
        t, d = models
        s = SamplingConfig(cfg_scale=2.0, greedy=True)
        spec = SpecConfig.make("exact", top_k=3, depth=2, total_tokens=8)
        toks, st = run_method(get_method("toy"), t, d, None, torch.tensor([3]), sampling=s, spec=spec, seed=0)
        ref, _ = run_method(get_method("exact"), t, d, None, torch.tensor([3]), sampling=s, spec=spec, seed=0)
        assert torch.equal(toks, ref) and seen and all(m == "toy" for _, m in seen)
        assert st.target_forwards == len(seen) + 1
    finally:
        METHODS.pop("toy")


@dataclasses.dataclass(frozen=True)
class ToyKnobs:
    keep: int = 0  # accept at most this many drafts per step (through the exact rule)
    label: str = "toy"


def test_a_rule_with_knobs_is_one_file_too(models):
    """A rule's settings are registered with it: SpecConfig / FLAT_FIELDS are not edited, and the
    flat names reach SpecConfig.make, replace, flat, the CLI option list and the rule."""
    seen = []

    def capped(logits, tree, ctx):
        k = ctx.spec.settings("toy-knobs")
        seen.append(k)
        return V.verify_greedy(logits, tree)

    assert "toy_knobs_keep" not in FLAT_FIELDS
    register_method(Method("toy-knobs", "tree", "a toy rule with knobs", needs_drafter=True, rule=capped,
                           settings=ToyKnobs, decoder=tree_decoder,
                           options=(MethodOption("--toy-keep", "toy_knobs_keep", int, "toy cap"),)))
    try:
        s = SpecConfig.make("toy-knobs", depth=2, toy_knobs_keep=3)
        assert s.settings("toy-knobs") == ToyKnobs(keep=3) and s.tree.depth == 2
        assert s.replace(toy_knobs_label="x").settings("toy-knobs") == ToyKnobs(keep=3, label="x")
        assert SpecConfig().settings("toy-knobs") == ToyKnobs()  # defaults when not set
        assert s.flat()["toy_knobs_keep"] == 3 and SpecConfig().flat()["toy_knobs_keep"] == 0
        assert s == SpecConfig.make("toy-knobs", depth=2, toy_knobs_keep=3)  # value semantics
        assert "--toy-keep" in [o.flag for o in cli_options()]
        t, d = models
        spec = s.replace(top_k=3, total_tokens=8)
        run_method(get_method("toy-knobs"), t, d, None, torch.tensor([3]), sampling=SamplingConfig(greedy=True), spec=spec,
                   seed=0)
        assert seen and all(k.keep == 3 for k in seen)
    finally:
        unregister_method("toy-knobs")
    assert "toy_knobs_keep" not in FLAT_FIELDS and "toy-knobs" not in METHODS
    with pytest.raises(InputError, match="unknown speculation setting"):
        SpecConfig().replace(toy_knobs_keep=1)


def test_bad_settings_and_options_are_refused_at_registration():
    from lisa_trt.errors import SpecError

    with pytest.raises(SpecError, match="frozen dataclass"):
        Method("bad", "sjd", "x", settings=dict)
    with pytest.raises(SpecError, match="unknown setting 'nope_x'"):
        register_method(Method("bad", "sjd", "x", decoder=get_method("sjd").decoder,
                               options=(MethodOption("--nope", "nope_x", int),)))
    with pytest.raises(SpecError, match="give its decode loop"):  # every method brings its decoder
        Method("bad", "sjd", "x")
    assert "bad" not in METHODS
