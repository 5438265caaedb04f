"""No dead code: every top-level function and class of the package is named somewhere else.

A top-level `def` or `class` in lisa_trt/ whose name appears nowhere but its own definition, in
the package, the tests, bench/, scripts/, the docs, README.md or pyproject.toml, is code nobody
calls, tests or documents: delete it (git keeps it). A definition reached by a string (a plug-in's
`open_engines`, `caption_encoder`) is named by the code that reaches it, so it counts as used.
There is no allow-list: a public entry point nothing in the repository calls is kept by the docs
page that documents it (docs/ is searched).

    python tests/test_dead_code.py      # lists the dead definitions, exit 1 if any
"""

import ast
import re
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEARCHED = ("lisa_trt", "tests", "bench", "scripts", "docs", "README.md", "pyproject.toml")
TEXT = {".py", ".md", ".toml", ".txt", ".sh", ".yaml", ".yml", ".json", ".cfg", ".ini", ".pbtxt"}


def _files(repo: Path):
    for name in SEARCHED:
        p = repo / name
        if p.is_file():
            yield p
        elif p.is_dir():
            yield from (q for q in p.rglob("*") if q.is_file() and q.suffix in TEXT and "__pycache__" not in q.parts)


def dead_definitions(repo: Path = REPO, package: str = "lisa_trt") -> list:
    """'path:line name' of every top-level def / class of `package` named only once in the searched files."""
    words = Counter()
    for p in _files(repo):
        try:
            words.update(re.findall(r"\w+", p.read_text(errors="ignore")))
        except OSError:
            continue
    out = []
    for p in sorted((repo / package).rglob("*.py")):
        rel = str(p.relative_to(repo))
        for node in ast.parse(p.read_text(), rel).body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if words[node.name] <= 1:
                out.append(f"{rel}:{node.lineno} {node.name}")
    return out


def test_no_top_level_definition_is_dead():
    dead = dead_definitions()
    assert not dead, "named nowhere else (delete, or call / test / document them):\n" + "\n".join(dead)


def test_the_check_sees_a_dead_definition(tmp_path):
    pkg = tmp_path / "lisa_trt"
    pkg.mkdir()
    (pkg / "m.py").write_text("def used():\n    return 1\n\n\ndef unused_helper():\n    return used()\n\n\n"
                              "class Dead:\n    pass\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("Call `used()`.\n")
    assert dead_definitions(tmp_path) == ["lisa_trt/m.py:5 unused_helper", "lisa_trt/m.py:9 Dead"]


if __name__ == "__main__":
    found = dead_definitions()
    print("\n".join(found) or "no dead top-level definitions")
    sys.exit(1 if found else 0)
