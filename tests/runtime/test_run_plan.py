"""Issue 50 items 1-2: one run plan handed down, one runner, one tokens-to-pixels path.

Counted statically (the call sites in lisa_trt) and at run time (the plan object that reaches the
runner, the look-ups a planned decode makes) on the tiny in-memory models of tests/conftest.py.
"""

import ast
import dataclasses
from pathlib import Path

import pytest

import lisa_trt
from lisa_trt.errors import InputError
from lisa_trt.runtime import runner
from lisa_trt.runtime.context import RunContext
from lisa_trt.runtime.pipeline import Pipeline
from lisa_trt.speculative.methods import Method

ROOT = Path(lisa_trt.__file__).parent
GEN = {"sampling": {"cfg_scale": 2.0, "top_k": 0}, "class_names": [f"c{i}" for i in range(10)],
       "tree": {"default": {"top_k": 2, "depth": 1, "total_tokens": 3}}}


def call_sites(name: str, under=("",)) -> list:
    """[(module, line)] of every call of `name` (a function or a method of that name) in lisa_trt."""
    out = []
    for p in sorted(ROOT.rglob("*.py")):
        rel = str(p.relative_to(ROOT.parent))
        if not any(rel.startswith(f"lisa_trt/{u}") for u in under):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)) == name:
                    out.append((rel, node.lineno))
    return out


def test_run_method_has_one_runner():
    """run_method is called by runtime/runner.decode (run, generate, bench, serve, the API) and by
    the drafter evaluation of training alone: the target is <= 2 call sites."""
    sites = call_sites("run_method")
    assert len(sites) <= 2, sites
    assert {m for m, _ in sites} <= {"lisa_trt/runtime/runner.py", "lisa_trt/train/evaluate.py"}, sites


def test_tokens_become_pixels_in_one_place():
    """The family's decoder hook is called by runtime/runner.pixels alone on every run path
    (Pipeline.decode, the files `generate` writes, the bench's scorer)."""
    run_paths = ("runtime/", "harness.py", "serve/", "cli/")
    assert [m for m, _ in call_sites("codes_to_pixels", run_paths)] == ["lisa_trt/runtime/runner.py"]
    assert [m for m, _ in call_sites("to_uint8", run_paths)] == ["lisa_trt/runtime/runner.py"]


@pytest.fixture(scope="module")
def pipe(parts):
    t, d, tables, vq = parts
    return Pipeline.from_models(t, d, tables, vq, class_names=GEN["class_names"], generation=GEN)


@pytest.fixture
def seen(monkeypatch):
    """Every plan that reaches the runner, and every method look-up by name, from now on."""
    import lisa_trt.runtime.pipeline as P

    got = {"plans": [], "lookups": []}
    real_decode, real_lookup = runner.decode, P.resolve_method
    monkeypatch.setattr(runner, "decode", lambda plan, *a, **k: got["plans"].append(plan) or real_decode(plan, *a, **k))
    monkeypatch.setattr(P, "resolve_method", lambda v, **k: got["lookups"].append(v) or real_lookup(v, **k))
    return got


def test_a_plan_is_frozen_and_reaches_the_runner_as_is(pipe, seen):
    plan = pipe.plan("sjd", seed=3, cfg_scale=3.0, sjd_window=4)
    assert isinstance(plan.method, Method) and plan.method.name == "sjd" and plan.why == "sjd (asked for)"
    assert (plan.sampling.cfg_scale, plan.spec.settings("sjd").window, plan.seed) == (3.0, 4, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.seed = 4
    seen["lookups"].clear()
    res = pipe.generate([1, 2], plan=plan, decode=False)  # sjd: one decode call per image
    assert len(seen["plans"]) == 2 and all(p is plan for p in seen["plans"])  # the same object, not rebuilt
    assert seen["lookups"] == []  # nothing looked up again below the entry point
    assert [st["verify"] for st in res.stats] == ["sjd", "sjd"]
    assert res.stats[0]["verify_reason"] == "sjd (asked for)"


def test_generate_by_name_resolves_once_then_hands_its_plan_down(pipe, seen):
    a = pipe.generate([1, 2], seed=3, verify="sjd", cfg_scale=3.0, sjd_window=4, decode=False)
    assert seen["lookups"] == ["sjd"]  # one look-up by name per request
    assert len(seen["plans"]) == 2 and seen["plans"][0] is seen["plans"][1]
    assert isinstance(seen["plans"][0], RunContext)
    b = pipe.generate([1, 2], plan=pipe.plan("sjd", seed=3, cfg_scale=3.0, sjd_window=4), decode=False)
    assert a.tokens.equal(b.tokens)  # a plan decodes what its settings decode


def test_a_plan_and_its_settings_are_not_both_taken(pipe):
    plan = pipe.plan("vanilla")
    for kw in ({"verify": "gasv"}, {"cfg_scale": 2.0}, {"seed": 1}, {"depth": 2}):
        with pytest.raises(InputError, match="a plan or its settings"):
            pipe.generate([1], plan=plan, decode=False, **kw)


def test_auto_is_settled_in_the_plan_with_its_reason(pipe):
    plan = pipe.plan()  # "auto": in-memory models with a drafter and tables, nothing recorded
    assert plan.method.name == "gasv" and "gasv" in plan.why
    res = pipe.generate([1], plan=plan, decode=False)
    assert res.stats[0]["verify"] == "gasv" and res.stats[0]["verify_reason"] == plan.why


def test_the_images_of_the_pipeline_are_the_runners(pipe, monkeypatch):
    """Pipeline.decode goes through runtime/runner.images (the one tokens-to-pixels path)."""
    calls = []
    real = runner.images
    monkeypatch.setattr(runner, "images", lambda *a: calls.append(a) or real(*a))
    res = pipe.generate([1], verify="vanilla")
    assert len(calls) == 1 and calls[0][0] is pipe.family and len(res.images) == 1
