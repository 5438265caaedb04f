"""The family seam (issue 24, docs/families.md), proven by parsing every module:

- outside the family packages (lisa_trt/families/<name>/) and the one registration list
  (models/family.py `_BUILTIN`), no module imports a family package;
- no file outside a family package is named after a family;
- no code outside them names a family or branches on `model_type` (docstrings, comments and
  click `help=` texts aside).

`DEBT` lists the modules that still break a rule, each with the rule; the test fails when a
module not listed breaks one (new debt) and when a listed module no longer does (update the
list: it only shrinks).

    python tests/test_family_seam.py      # prints every violation
"""

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "lisa_trt"
FAMILIES = ("llamagen", "chameleon", "lumina", "janus", "emu3")
NAME = re.compile("|".join(FAMILIES), re.I)
EXEMPT = ("families/", "models/family.py")

# module (path under lisa_trt/) -> the rules it still breaks; shrinks to {} as the seam closes
DEBT = {
}


def _docstrings(tree) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _help_strings(tree) -> set:
    """Help texts: `help=` keywords and the string arguments of option factories (`*_option(...)`)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in ("help", "short_help", "epilog"):
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Constant):
                    out.add(id(sub))
        elif isinstance(node, ast.Call):
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if fn.endswith("_option") or fn.endswith("_options"):
                for a in node.args:
                    for sub in ast.walk(a):
                        if isinstance(sub, ast.Constant):
                            out.add(id(sub))
    return out


def imports_a_family(node) -> bool:
    """True when an import statement reaches a family package: a dotted component (or imported
    name) that is a family's name, or anything in the `families` package (a family not in FAMILIES).
    `export.families` is no family (the generic ExportFamily registry)."""
    if isinstance(node, ast.Import):
        paths = [a.name.split(".") for a in node.names]
    else:
        base = (node.module or "").split(".") if node.module else []
        paths = [base + [a.name] for a in node.names]
    for parts in paths:
        if any(NAME.search(p) for p in parts):
            return True
        for i, part in enumerate(parts):  # lisa_trt.families.X, or ..families.X from a subpackage
            top = parts[i - 1] == "lisa_trt" if i else getattr(node, "level", 0) >= 2
            if part == "families" and top and i + 1 < len(parts):
                return True
    return False


def test_the_import_rule_matches_family_names_not_the_word_families():
    def imp(src):
        return imports_a_family(ast.parse(src).body[0])

    assert imp("from ..families.janus.target import JanusTarget")
    assert imp("from ..families import chameleon")
    assert imp("from ..families.newfam import x")  # a family FAMILIES does not list yet
    assert imp("from lisa_trt.families import newfam")
    assert imp("import lisa_trt.families.llamagen.model")
    assert imp("from .chameleon_onnx import export_chameleon")
    assert not imp("from .families import export_family")  # the generic ExportFamily registry
    assert not imp("from ..export.families import export_family")
    assert not imp("from ..models.family import family_of")


def violations() -> dict:
    found = {}
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith(EXEMPT):
            continue
        rules = set()
        if NAME.search(p.name):
            rules.add("file name")
        tree = ast.parse(p.read_text(), str(p))
        skip = _docstrings(tree) | _help_strings(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and imports_a_family(node):
                rules.add("imports a family")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                if NAME.search(node.value):
                    rules.add("names a family")
            elif isinstance(node, (ast.Name, ast.Attribute, ast.alias)):
                ident = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else node.name
                if NAME.search(ident or ""):
                    rules.add("names a family")
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "model_type" for s in sides):
                    rules.add("branches on model_type")
        if rules:
            found[rel] = sorted(rules)
    return found


def test_no_new_family_knowledge_outside_the_packages():
    found = violations()
    new = {m: r for m, r in found.items() if not set(r) <= set(DEBT.get(m, ()))}
    assert not new, "family knowledge outside the family packages:\n" + "\n".join(f"  {m}: {r}" for m, r in new.items())


def test_the_debt_list_only_shrinks():
    found = violations()
    paid = {m: sorted(set(r) - set(found.get(m, ()))) for m, r in DEBT.items()}
    paid = {m: r for m, r in paid.items() if r}
    assert not paid, "remove from DEBT (no longer true):\n" + "\n".join(f"  {m}: {r}" for m, r in paid.items())


if __name__ == "__main__":
    for m, r in violations().items():
        print(f"{m}: {', '.join(r)}")
    sys.exit(0)


def test_every_target_has_the_one_new_cache_signature():
    """The decode loops call every target's new_cache the same way (engines/base.TargetEngine):
    the torch targets of each family and the graph targets share one signature."""
    import inspect

    from lisa_trt.engines.base import TargetEngine
    from lisa_trt.engines.prompt_graph import GraphPromptTarget
    from lisa_trt.families.chameleon.model import ChameleonTarget
    from lisa_trt.families.emu3.target import Emu3Target
    from lisa_trt.families.janus.target import JanusTarget
    from lisa_trt.families.llamagen.engines import LlamaGenGraphTarget
    from lisa_trt.families.llamagen.model import Transformer

    def params(cls):
        return [(p.name, p.kind, p.default) for p in inspect.signature(cls.new_cache).parameters.values()]

    want = params(TargetEngine)
    assert [n for n, _, _ in want] == ["self", "batch", "max_len", "dtype", "extra", "prompt_len", "n_tokens"]
    for cls in (Transformer, LlamaGenGraphTarget, ChameleonTarget, Emu3Target, JanusTarget, GraphPromptTarget):
        assert params(cls) == want, cls.__name__
