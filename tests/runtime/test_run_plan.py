"""Issue 50 items 1-2: one run plan handed down, one runner, one tokens-to-pixels path.

Counted statically (the call sites in lisa_trt) and at run time (the plan object that reaches the
runner, the look-ups a planned decode makes) on the tiny in-memory models of tests/conftest.py.
"""

import ast
import dataclasses
import functools
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


# ----------------------------------------------------------------------------- method kinds

def kind_test_lines(source: str) -> list:
    """Lines of `source` that test a method's kind instead of asking the Method: a comparison (==, !=,
    in, not in; `match`) of something named kind with a method kind (methods.KIND_DEFAULTS: "tree",
    "ar", "sjd"), a lookup keyed by a `.kind`, or `method_names(<kind>)`."""
    from lisa_trt.speculative.methods import KIND_DEFAULTS

    def kinds_in(node) -> bool:
        elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return any(isinstance(e, ast.Constant) and e.value in KIND_DEFAULTS for e in elts)

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            ops = [node.left, *node.comparators]
            if any(kinds_in(o) for o in ops) and any("kind" in ast.unparse(o) for o in ops):
                out.append(node.lineno)
        elif isinstance(node, ast.Match) and "kind" in ast.unparse(node.subject):
            if any(isinstance(c.pattern, ast.MatchValue) and kinds_in(c.pattern.value) for c in node.cases):
                out.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Attribute) and node.slice.attr == "kind":
            out.append(node.lineno)
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "method_names"
              and (node.args or node.keywords)):
            out.append(node.lineno)
    return out


def kind_test_sites(planted: dict = None, root: Path = ROOT) -> list:
    """[(module, line)] of every method-kind test (`kind_test_lines`) in lisa_trt outside speculative/
    (the registry and the loops own the kinds); `planted`: {module: extra source} (the self-check)."""
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = str(p.relative_to(root.parent))
        if rel.startswith("lisa_trt/speculative/"):
            continue
        extra = (planted or {}).get(rel)
        lines = _file_kind_tests(p) if extra is None else kind_test_lines(p.read_text() + extra)
        out += [(rel, n) for n in lines]
    return out


@functools.lru_cache(maxsize=None)
def _file_kind_tests(path: Path) -> list:
    return kind_test_lines(path.read_text())


def test_nothing_outside_speculative_tests_a_method_s_kind():
    """runtime/, serve, the CLI and the bench ask the Method what it does (uses_tree, baseline,
    takes_row_seeds, spec_name, describe: speculative/methods.py), so a new kind changes nothing there."""
    assert kind_test_sites() == []


@pytest.mark.parametrize("planted", ['if method.kind == "sjd":\n    pass', 'x = m.kind in ("tree", "ar")',
                                     'x = "tree" != plan.method.kind', 'x = {"tree": 1}[m.kind]',
                                     'x = method_names("ar")[0]', 'match m.kind:\n    case "ar":\n        pass'])
def test_a_planted_kind_test_is_seen(planted):
    got = kind_test_sites({"lisa_trt/runtime/pipeline.py": "\n" + planted + "\n"})
    assert [m for m, _ in got] == ["lisa_trt/runtime/pipeline.py"], got
    assert kind_test_lines('x = a.dtype.kind == "f" or loss.kind == "lisa"\nnames = method_names()\n') == []


def test_a_method_s_capabilities_default_from_its_kind_and_may_be_overridden():
    from lisa_trt.speculative.methods import METHODS, SpecConfig, baseline_method

    assert baseline_method() is METHODS["vanilla"] and METHODS["vanilla"].baseline
    assert METHODS["gasv"].uses_tree and not METHODS["sjd"].uses_tree and not METHODS["gasv"].baseline
    assert METHODS["gasv"].takes_row_seeds and METHODS["zipar"].takes_row_seeds and not METHODS["sjd"].takes_row_seeds
    assert METHODS["gasv"].spec_name == "gasv" and METHODS["sjd"].spec_name == METHODS["greedy"].name
    spec = SpecConfig.make("exact", top_k=2, depth=1, total_tokens=3, sjd_window=5)
    assert METHODS["vanilla"].describe(spec) == "" and METHODS["sjd"].describe(spec) == "Jacobi window 5"
    assert METHODS["exact"].describe(spec) == "draft tree top-k 2 / depth 1 / 3 nodes"
    own = dataclasses.replace(METHODS["sjd"], name="sjd-tree", uses_tree=True)  # a method may say otherwise
    assert own.uses_tree and own.spec_name == "sjd-tree" and "draft tree" in own.describe(spec)


@pytest.fixture(scope="module")
def pipe(parts):
    t, d, tables, vq = parts
    return Pipeline.from_models(t, d, tables, vq, class_names=GEN["class_names"], generation=GEN)


@pytest.fixture
def seen(monkeypatch):
    """Every plan that reaches the runner, and every method look-up by name, from now on: the API's
    (Pipeline.method; the library entries below the runner, run_method and SpeculativeDecoder.generate,
    refuse a name: test_the_library_entries_take_methods_not_names)."""
    import lisa_trt.runtime.pipeline as P

    got = {"plans": [], "lookups": []}
    real_decode = runner.decode
    monkeypatch.setattr(runner, "decode", lambda plan, *a, **k: got["plans"].append(plan) or real_decode(plan, *a, **k))
    for mod, name in ((P, "resolve_method"),):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda v, _real=real, **k: got["lookups"].append(v) or _real(v, **k))
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
    seen["lookups"].clear()
    pipe.generate([1], seed=3, verify="gasv", depth=1, decode=False)  # a tree method: nothing below either
    assert seen["lookups"] == ["gasv"]


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


def test_the_library_entries_take_methods_not_names():
    """run_method and SpeculativeDecoder.generate take the resolved Method: a name (or none) is a
    TypeError naming the fix (resolve it once where the run starts), before any work."""
    import torch

    from lisa_trt.config import SamplingConfig
    from lisa_trt.speculative.decode import SpeculativeDecoder
    from lisa_trt.speculative.methods import SpecConfig, get_method
    from lisa_trt.speculative.run import run_method
    from lisa_trt.testing import make_target

    t = make_target()
    for bad in ("vanilla", None):
        with pytest.raises(TypeError, match=r"get_method"):
            run_method(bad, t, None, None, torch.tensor([1]), sampling=SamplingConfig(), spec=SpecConfig(), seed=0)
        with pytest.raises(TypeError, match=r"get_method\(spec.method\)"):
            SpeculativeDecoder(t, None).generate(torch.tensor([1]), spec=SpecConfig(), method=bad)
    toks, _ = run_method(get_method("vanilla"), t, None, None, torch.tensor([1]), sampling=SamplingConfig(),
                         spec=SpecConfig(), seed=0)
    assert toks.shape[0] == 1
