"""The layout of tests/: every module's basename is unique where it is imported as a top-level module.

Test folders have no `__init__.py`, so pytest (rootdir-based `prepend` import mode) imports each
test file, and the helpers the tests import by bare name (`from chameleon_fixtures import ...`), as
a TOP-LEVEL module named after its file. Two `test_families.py` in two folders then collide
("import file mismatch") and collection of the whole suite stops. conftest.py files are imported by
path and may repeat.
"""

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_package(folder: Path) -> bool:
    return (folder / "__init__.py").is_file()


def duplicate_basenames(root: Path = TESTS) -> dict:
    """{basename: [paths]} of modules under `root` outside packages that share a basename."""
    seen = defaultdict(list)
    for p in sorted(root.rglob("*.py")):
        if p.name in ("conftest.py", "__init__.py") or _is_package(p.parent):
            continue
        seen[p.name].append(p.relative_to(root).as_posix())
    return {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_no_two_test_modules_share_a_basename():
    dup = duplicate_basenames()
    assert not dup, ("modules under tests/ that share a basename collide when pytest imports them (no package "
                     "__init__.py); rename one:\n" + "\n".join(f"  {n}: {', '.join(p)}" for n, p in dup.items()))


def test_the_guard_sees_a_collision(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "test_families.py").write_text("")
        (tmp_path / d / "conftest.py").write_text("")
    assert duplicate_basenames(tmp_path) == {"test_families.py": ["a/test_families.py", "b/test_families.py"]}
    (tmp_path / "b" / "__init__.py").write_text("")
    assert duplicate_basenames(tmp_path) == {}
