"""The conditioning kinds (models/conditioning.py) and the run's one adapter per kind
(runtime/conditions.py): chosen from the family's answer, never from its name."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lisa_trt.errors import InputError
from lisa_trt.models.conditioning import CaptionFeatures, ClassLabels, Conditioning, TextPrompts
from lisa_trt.models.family import family_of
from lisa_trt.runtime import conditions as C
from lisa_trt.runtime.prompts import Prompt
from lisa_trt.testing import make_target

ROOT = Path(__file__).resolve().parents[2] / "lisa_trt"


def test_each_family_kind_gets_its_adapter():
    c2i, t2i = make_target("c2i"), make_target("t2i")
    assert type(C.run_conditions(family_of(c2i.config), c2i.config)) is C.ClassConditions
    assert type(C.run_conditions(family_of(t2i.config), t2i.config)) is C.CaptionConditions
    for mt in ("chameleon", "janus"):
        assert type(C.run_conditions(family_of(mt), mt)) is C.PromptConditions


def test_a_family_answering_an_unknown_kind_is_refused_naming_the_valid_ones():
    class Odd(Conditioning):
        kind = "odd"

    fam = SimpleNamespace(name="toy", conditioning=lambda cfg: Odd())
    with pytest.raises(InputError, match="unknown conditioning Odd.*ClassLabels, CaptionFeatures, TextPrompts"):
        C.run_conditions(fam, None)


def test_random_conditions_are_class_ids_only():
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    ids = ClassLabels(7).random(500, g())
    assert torch.equal(ids, ClassLabels(7).random(500, g()))  # a pure function of the generator
    assert int(ids.min()) == 0 and int(ids.max()) == 6  # every class reachable, never the null id 7
    with pytest.raises(InputError, match="--captions CAPTIONS.txt"):
        CaptionFeatures(6, 12).random(2, g())
    with pytest.raises(InputError, match="prompter"):
        TextPrompts().random(2, g())
    with pytest.raises(InputError, match="load the target"):
        ClassLabels().random(2, g())  # a bare model_type knows no class count


def test_class_adapter_parses_ids_names_and_prompt_objects():
    tc = make_target("c2i").config
    a = C.run_conditions(family_of(tc), tc)
    cond, over, labels = a.parse([2, "b", Prompt(1, class_id=0, seed=5)], tc, ["a", "b", "c"], None)
    assert cond.tolist() == [2, 1, 0] and over == [{}, {}, {"seed": 5, "cfg": None}]
    assert labels == [{"class": 2}, {"class": 1}, {"class": 0}]
    with pytest.raises(InputError, match="unknown class"):
        a.parse(["zebra"], tc, ["a", "b", "c"], None)
    rows, req = a.rows(cond, 1, 3, encode=None)
    assert rows.tolist() == [1, 0] and req is None


def test_prompt_adapter_keeps_texts_and_encodes_each_call_rows():
    a = C.run_conditions(family_of("chameleon"), "chameleon")
    texts, over, labels = a.parse(["a fox", Prompt(1, caption="a lake", seed=2)], None, None, None)
    assert texts == ["a fox", "a lake"] and over[1]["seed"] == 2 and labels[0] == {"caption": "a fox"}
    with pytest.raises(InputError, match="caption strings"):
        a.parse([3], None, None, None)
    seen = []
    req = SimpleNamespace(cond="COND")
    rows, got = a.rows(texts, 1, 2, encode=lambda t: seen.append(list(t)) or req)
    assert seen == [["a lake"]] and rows == "COND" and got is req
    with pytest.raises(InputError, match="--prompt TEXT"):
        a.precheck((), None, None)  # given, but empty
    a.precheck(None, None, None)  # a command that takes no prompts


def test_no_capability_flags_outside_the_families():
    """The kinds are objects: nothing outside lisa_trt/families asks `.prompted`,
    `class_conditioned(...)` or the family's `caption_shape(...)`."""
    pat = re.compile(r"\.prompted\b|\bclass_conditioned\(|\.caption_shape\(")
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in ROOT.rglob("*.py") if "families" not in p.parts
            for n, line in enumerate(p.read_text().splitlines(), 1) if pat.search(line)]
    assert hits == []


KINDS = {"Conditioning", "ClassLabels", "CaptionFeatures", "TextPrompts", "RunConditions", "ClassConditions",
         "CaptionConditions", "PromptConditions"}
# the only place outside lisa_trt/families that names a kind in a check, with its reason (the one
# dispatch, models/conditioning.for_kind, checks against its table's entries, not a named kind)
KIND_CHECKS = {
    "models/captions.py": 1,  # caption_shape's guard: a target of another kind refused before its slots are read
}


def _kind_checks(tree) -> int:
    """isinstance(x, K) / type(x) is K calls on a conditioning kind or adapter class."""
    import ast

    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            names = {getattr(e, "id", getattr(e, "attr", None)) for e in ast.walk(node.args[1])}
            n += bool(names & KINDS)
        elif isinstance(node, ast.Compare) and any(isinstance(o, (ast.Is, ast.IsNot)) for o in node.ops):
            names = {getattr(e, "id", getattr(e, "attr", None)) for c in node.comparators for e in ast.walk(c)}
            n += bool(names & KINDS) and "type" in {getattr(getattr(node.left, "func", None), "id", None)}
    return n


def test_no_kind_checks_outside_the_families_but_the_dispatch_and_one_guard():
    """The generic layers call their kind's object (runtime/conditions.py's adapters, train/data.py's
    kind_data) instead of asking which kind they have: outside lisa_trt/families, one dispatch
    (models/conditioning.for_kind) and one guard remain."""
    import ast

    hits = {}
    for p in ROOT.rglob("*.py"):
        if "families" in p.relative_to(ROOT).parts:
            continue
        n = _kind_checks(ast.parse(p.read_text()))
        if n:
            hits[p.relative_to(ROOT).as_posix()] = n
    assert hits == KIND_CHECKS


def test_the_kind_check_counter_sees_checks():
    import ast

    src = ("if isinstance(kind, ClassLabels): pass\n"
           "x = isinstance(c, (CaptionFeatures, int))\n"
           "y = type(k) is C.PromptConditions\n"
           "z = isinstance(p, Prompt)\n")
    assert _kind_checks(ast.parse(src)) == 3
