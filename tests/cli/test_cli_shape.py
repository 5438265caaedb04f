"""The CLI stays thin, proven by parsing lisa_trt/cli/ (docs/cli.md):

- no click command body is longer than 80 lines, and the group's __init__.py is under 150;
- every option flag ("--vq", "--out", ...) is declared in exactly one place;
- no model family is named in code (help strings and docstrings may), no `model_type` is
  compared, and no family module is imported: the resolve step (runtime/context.py) decides.
"""

import ast
from pathlib import Path

import pytest

CLI = Path(__file__).resolve().parents[2] / "lisa_trt" / "cli"
FAMILY_WORDS = ("chameleon", "lumina", "janus", "llamagen")
# family modules the CLI must not import (their ops are reached through runtime/context.py);
# models/llamagen.py is the official checkpoint layout that `random-checkpoint` writes by definition
OPS_WORDS = ("chameleon", "lumina", "janus")
HELP_KEYWORDS = ("help", "config_help", "what")
MAX_BODY, MAX_INIT = 80, 150


def modules() -> dict:
    return {p.name: ast.parse(p.read_text(), str(p)) for p in sorted(CLI.glob("*.py"))}


def _is_command_decorator(d) -> bool:
    f = d.func if isinstance(d, ast.Call) else d
    return isinstance(f, ast.Attribute) and f.attr in ("command", "group")


# click commands declared outside lisa_trt/cli/ (registered by cli/__init__.py): their bodies count too
ELSEWHERE = ("serve/cli.py", "text/cli.py")


def command_functions(trees=None):
    for name, tree in (trees or modules()).items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(_is_command_decorator(d) for d in node.decorator_list):
                yield name, node


def every_command():
    trees = dict(modules())
    trees.update({n: ast.parse((CLI.parent / n).read_text(), n) for n in ELSEWHERE})
    return list(command_functions(trees))


def test_the_package_has_commands():
    found = {f"{m}:{n.name}" for m, n in command_functions()}
    assert {"generate.py:generate", "run.py:run", "bench.py:bench", "__init__.py:main"} <= found


@pytest.mark.parametrize("module,fn", [pytest.param(m, n, id=f"{m}:{n.name}") for m, n in every_command()])
def test_command_bodies_are_short(module, fn):
    lines = fn.end_lineno - fn.lineno + 1  # from `def` to the last line (decorators not counted)
    assert lines <= MAX_BODY, f"{module}: {fn.name} is {lines} lines (at most {MAX_BODY})"


def test_every_command_is_measured_and_so_is_what_it_runs():
    """Every registered command (serve, triton-repo and encode-captions included) is one of the
    measured functions, and no function of lisa_trt/cli/ (the bodies a command hands to
    `rc.run`, e.g. train.py's _train) is longer than a command body may be."""
    from lisa_trt.cli import main

    measured = {fn.name.removesuffix("_cmd").replace("_", "-") for _, fn in every_command()}
    listed = set(main.list_commands(None))  # the group loads commands lazily (lisa_trt/cli/__init__.py)
    assert listed and listed <= measured, sorted(listed - measured)
    long = [f"{m}:{n.name} ({n.end_lineno - n.lineno + 1} lines)" for m, tree in modules().items()
            for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.end_lineno - n.lineno + 1 > MAX_BODY]
    assert not long, long


def test_group_module_is_small():
    n = len((CLI / "__init__.py").read_text().splitlines())
    assert n < MAX_INIT, f"lisa_trt/cli/__init__.py has {n} lines (under {MAX_INIT})"


def _option_calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr == "option") or (isinstance(f, ast.Name) and f.id == "option"):
                yield node


def test_every_flag_is_declared_once():
    where: dict = {}
    for name, tree in modules().items():
        for call in _option_calls(tree):
            for a in call.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-"):
                    for flag in a.value.split("/"):
                        where.setdefault(flag.strip(), []).append(f"{name}:{call.lineno}")
    for flag in ("--vq", "--out", "--captions", "--encoder", "--seed", "--cfg-scale", "--model", "--threads"):
        assert flag in where, f"{flag} is not declared in lisa_trt/cli/"
    twice = {f: w for f, w in where.items() if len(w) > 1}
    assert not twice, f"flags declared more than once (declare them once in options.py): {twice}"


def _allowed_strings(tree) -> set:
    """ids of string constants that are docstrings, help texts, or inside decorators (declarations)."""
    ok = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ok.add(id(body[0].value))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                ok.update(id(c) for c in ast.walk(d) if isinstance(c, ast.Constant))
        if isinstance(node, ast.keyword) and node.arg in HELP_KEYWORDS:
            ok.update(id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant))
    return ok


def test_no_family_is_named_in_code():
    bad = []
    for name, tree in modules().items():
        ok = _allowed_strings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in ok:
                if any(w in node.value.lower() for w in FAMILY_WORDS):
                    bad.append(f"{name}:{node.lineno} string {node.value[:40]!r}")
            elif isinstance(node, (ast.Name, ast.Attribute)):
                ident = node.id if isinstance(node, ast.Name) else node.attr
                if any(w in ident.lower() for w in FAMILY_WORDS):
                    bad.append(f"{name}:{node.lineno} name {ident}")
            elif isinstance(node, ast.ImportFrom) and any(w in (node.module or "").lower() for w in OPS_WORDS):
                bad.append(f"{name}:{node.lineno} imports {node.module}")
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                names = {getattr(x, "attr", None) or getattr(x, "id", None) or getattr(x, "value", None)
                         for s in sides for x in ast.walk(s)}
                if "model_type" in names:
                    bad.append(f"{name}:{node.lineno} compares model_type")
    assert not bad, "family branches belong in runtime/context.py (the resolve step):\n" + "\n".join(bad)


def test_the_checks_can_fail():
    """The family check sees a branch and the flag check sees a second declaration."""
    tree = ast.parse('def f(model):\n    if is_chameleon(model) or cfg.model_type == "c2i":\n        pass\n')
    ok = _allowed_strings(tree)
    hits = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and "chameleon" in n.id]
    assert hits and not ok.intersection(map(id, hits))
    tree = ast.parse('a = click.option("--out")\nb = click.option("--out", "x")\n')
    assert sum(1 for _ in _option_calls(tree)) == 2
