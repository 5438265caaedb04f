"""The import floors of docs/architecture.md, proven by parsing every import (lazy ones included).

    python -m pytest -q tests/test_architecture.py     # or: python tests/test_architecture.py

Floors, top to bottom (a module may import its own floor and any floor below, never above):
    cli -> serve / harness -> runtime -> train / text / calibration tools -> families -> deploy -> engines
        -> export -> calibration -> speculative -> models -> core
and no two modules import each other, directly or through others (no import circles). There is no
exception: a family package (families/<name>/, its export and shapes plugins included) sits above
the engines and the exporter it plugs into; the registries below it reach it by name, through one
loader (models/family.load_plugin) that the imports-by-name checks below follow.
"""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "lisa_trt"

# first package component (or top-level module) -> floor
FLOORS = {
    "cli": 11, "launcher": 11, "__main__": 11,  # cli: the lisa_trt/cli/ package, one module per command group
    "serve": 10, "harness": 10,                 # Triton serving; the bench harness (`lisa-trt bench`)
    "runtime": 9,                               # open a bundle into a resolved run; Pipeline; the conditions adapters
    "train": 8, "artifacts": 8, "demo": 8, "quality": 8, "testing": 8,
    "text": 8,                                  # caption plumbing the runtime's caption adapter calls
    "families": 7,                              # one package per model family (export / shapes plugins too)
    "deploy": 6,                                # TensorRT build, TensorRT lint, memory plan, operator audit
    "engines": 5,                               # the graph-runner protocol and the backends
    "export": 4,                                # ONNX export, validation, manifest, quantization
    "calibration": 3,                           # GASV / LANTERN tables
    "speculative": 2,                           # sampling, trees, verification rules, decode loops
    "models": 1,                                # the family protocol, shared layers, drafter, the I/O contract
    "config": 0, "errors": 0, "io": 0, "progress": 0, "imaging": 0, "timing": 0, "_version": 0,
    "safe_load": 0, "threads": 0, "validation": 0, "clitools": 0,
}
PUBLIC_API = "lisa_trt"  # the package __init__: the facade, above everything (imports Pipeline)


def modules() -> dict:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = ["lisa_trt", *p.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_edges(mods: dict) -> dict:
    """{module: {imported lisa_trt module}} over every import statement, at any depth."""
    edges = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                names = subs if len(subs) == len(node.names) else [target, *subs]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for n in names:
                if n in mods and n != m:
                    edges[m].add(n)
    return edges


def floor(module: str):
    parts = module.split(".")
    if len(parts) == 1:
        return 12  # the public facade
    if len(parts) > 2 and ".".join(parts[1:3]) in FLOORS:  # a module placed apart from its package
        return FLOORS[".".join(parts[1:3])]
    return FLOORS.get(parts[1])


def upward_imports(edges: dict) -> list:
    bad = []
    for m, targets in edges.items():
        for t in targets:
            if floor(t) > floor(m):
                bad.append(f"{m} (floor {floor(m)}) imports {t} (floor {floor(t)})")
    return sorted(bad)


def cycles(edges: dict) -> list:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_every_module_has_a_floor():
    missing = sorted(m for m in modules() if floor(m) is None)
    assert not missing, f"add these to FLOORS (docs/architecture.md): {missing}"


def test_no_import_runs_up_a_floor():
    bad = upward_imports(import_edges(modules()))
    assert not bad, "\n".join(bad)


def test_no_import_circles():
    found = cycles(import_edges(modules()))
    assert not found, found


def test_the_checker_sees_violations():
    """The two checks can fail: a made-up upward edge and a made-up circle are reported."""
    edges = {"lisa_trt.models.x": {"lisa_trt.engines.y"}, "lisa_trt.engines.y": {"lisa_trt.models.x"}}
    assert upward_imports(edges) == ["lisa_trt.models.x (floor 1) imports lisa_trt.engines.y (floor 5)"]
    assert cycles(edges) == [["lisa_trt.engines.y", "lisa_trt.models.x"]]


def test_a_family_sits_above_the_engines_and_the_exporter():
    """families/<name>/ (its export and shapes plugins too) may import export/, engines/ and deploy/;
    nothing on those floors may import a family (the registries load it by name)."""
    fam, plugin = "lisa_trt.families.fam.model", "lisa_trt.families.fam.export"
    assert floor(fam) == floor(plugin) == FLOORS["families"]
    assert FLOORS["families"] > max(FLOORS["deploy"], FLOORS["engines"], FLOORS["export"], FLOORS["models"])
    edges = {plugin: {"lisa_trt.export.onnx", fam}, "lisa_trt.engines.graph": {fam}, "lisa_trt.export.onnx": set()}
    assert upward_imports(edges) == [f"lisa_trt.engines.graph (floor 5) imports {fam} (floor 7)"]


def test_the_family_packages_are_found_without_a_static_import():
    """No module outside the family packages imports one statically: models/family.py loads them by name."""
    e = import_edges(modules())
    fams = {m for m in e if m.startswith("lisa_trt.families.")}
    assert fams, "expected the built-in family packages (families/*)"
    importers = sorted(f"{m} imports {t}" for m, ts in e.items() for t in ts & fams
                       if not m.startswith("lisa_trt.families"))
    assert not importers, importers


def test_the_docs_floor_table_is_floors():
    """docs/architecture.md's floor table lists exactly FLOORS (one source: this test keeps the page true)."""
    import re

    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", doc, re.M)
    table = {name: int(floor) for floor, names in rows for name in re.findall(r"`([\w.]+)`", names)}
    assert table == FLOORS, {k: (table.get(k), FLOORS.get(k)) for k in set(table) | set(FLOORS)
                             if table.get(k) != FLOORS.get(k)}


# ----------------------------------------------------------------------------- imports by name

# Every module that imports a module by name (importlib.import_module), and the static table the
# test follows to find what it can import. A registry below the families reaches a family's
# package and plug-ins this way (the plug-in registers itself): the one loader is
# models/family.load_plugin; the registries (export/families.py, deploy/model_shapes.py,
# models/captions.py) ask the family object (ModelFamily.plugin / .shapes / .captions), and an
# ExportFamily opens its directories through the engines module it names (ExportFamily.open_engines,
# the same loader). Every other lazy import is an import statement inside a function (the facade's
# names, cli/catalogue's commands), which the floors and circles checks above read.
DYNAMIC = {
    "lisa_trt.engines.base": "the built-in backends (_BUILTIN)",
    "lisa_trt.models.family": "the family packages (_BUILTIN), their plug-ins (export, shapes, captions) and the "
                              "engines module each ExportFamily names (engines_module)",
    "lisa_trt.models.artifact_sets": "an artifact set's provider module (ArtifactSet(name, provider))",
}
MAX_IMPORT_BY_NAME = 3  # the target (was 11, then 6)


def import_by_name_sites(root: Path = ROOT) -> list:
    """(module, line) of every importlib.import_module / __import__ call in the package."""
    mods = {p: m for m, p in modules().items()} if root == ROOT else {
        p: ".".join(["lisa_trt", *p.relative_to(root).with_suffix("").parts]) for p in root.rglob("*.py")}
    out = []
    for p, m in sorted(mods.items(), key=lambda kv: kv[1]):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if name in ("import_module", "__import__"):
                    out.append((m, node.lineno))
    return out


def _assigned(module: str, name: str):
    """The literal value assigned to `name` at the top of `module` (a dict, a string ...)."""
    p = modules()[module]
    for node in ast.parse(p.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{module} assigns no {name}")


def dynamic_targets() -> dict:
    """{loader module: {module it can import by name}}, read from the tables DYNAMIC names."""
    mods = modules()
    fams = set(_assigned("lisa_trt.models.family", "_BUILTIN").values())
    plugins = {f"{pkg}.{kind}" for pkg in fams for kind in ("export", "shapes", "captions")} & set(mods)
    engines, providers = engines_modules(), set()
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ArtifactSet"
                    and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
                providers.add(node.args[1].value)
    return {"lisa_trt.engines.base": set(_assigned("lisa_trt.engines.base", "_BUILTIN").values()),
            "lisa_trt.models.family": fams | plugins | engines, "lisa_trt.models.artifact_sets": providers}


def engines_modules() -> set:
    """The modules ExportFamily subclasses name as `engines_module` (what ExportFamily.open_engines loads)."""
    return {node.value.value for p in modules().values() for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "engines_module" for t in node.targets)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def test_imports_by_name_are_few_and_followed():
    """Each import by name is one of DYNAMIC's (a new one fails here until the test follows it), at
    most MAX_IMPORT_BY_NAME sites, and every module it can import exists; a loader may import up a
    floor only to reach a family's plug-in (its package, its export / shapes / captions module, the
    engines module its ExportFamily names) or an artifact set's provider, never the runtime or the
    command layers."""
    sites = import_by_name_sites()
    assert {m for m, _ in sites} == set(DYNAMIC), sites
    assert len(sites) <= MAX_IMPORT_BY_NAME, sites
    mods, engines = modules(), engines_modules()
    for loader, targets in dynamic_targets().items():
        assert targets, f"{loader}: found nothing it imports by name ({DYNAMIC[loader]})"
        for t in targets:
            assert t in mods, f"{loader} imports {t} by name ({DYNAMIC[loader]}): no such module"
            if floor(t) > floor(loader):  # up a floor: only to a family's plug-in or an artifact set's provider
                plugin = (t.startswith("lisa_trt.families.")
                          or (loader == "lisa_trt.models.family" and t in engines)
                          or (loader == "lisa_trt.models.artifact_sets" and floor(t) < FLOORS["runtime"]))
                assert plugin, f"{loader} imports {t} by name, up a floor ({DYNAMIC[loader]})"


def test_lazy_imports_outside_the_loaders_are_import_statements():
    """The facade's torch-backed names and the command a user names load on first use through import
    statements, so the floors and circles checks see every module they can import."""
    e = import_edges(modules())
    facade = {"lisa_trt.models.checkpoints", "lisa_trt.runtime.pipeline", "lisa_trt.models.target_config"}
    assert facade <= e["lisa_trt"], facade - e["lisa_trt"]
    commands = {"lisa_trt." + v.split(":")[0] for v in _assigned("lisa_trt.cli.catalogue", "COMMAND_MODULES").values()}
    assert commands <= e["lisa_trt.cli.catalogue"], commands - e["lisa_trt.cli.catalogue"]


def test_the_import_by_name_check_sees_a_new_site(tmp_path):
    pkg = tmp_path / "lisa_trt"
    (pkg / "models").mkdir(parents=True)
    (pkg / "models" / "x.py").write_text("import importlib\n\ndef f(n):\n    return importlib.import_module(n)\n")
    assert import_by_name_sites(pkg) == [("lisa_trt.models.x", 4)]


if __name__ == "__main__":
    e = import_edges(modules())
    problems = upward_imports(e) + [" <-> ".join(c) for c in cycles(e)]
    print("\n".join(problems) or "import floors OK, no circles")
    sys.exit(1 if problems else 0)


MAX_FUNCTION_LINES = 80  # a function a reader can hold in mind; GPU kernels (@triton.jit) excepted


def long_functions(root: Path = ROOT, limit: int = MAX_FUNCTION_LINES) -> list:
    """'path:line name (N lines)' of every function over `limit` lines that is not a Triton kernel."""
    out = []
    for p in sorted(root.rglob("*.py")):
        tree = ast.parse(p.read_text())
        jitted = {a.id for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("jit")
                  for a in n.args if isinstance(a, ast.Name)}  # kernels compiled as triton.jit(fn)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            kernel = node.name in jitted or any("jit" in ast.unparse(d) for d in node.decorator_list)
            n = node.end_lineno - node.lineno + 1
            if n > limit and not kernel:
                out.append(f"{p.relative_to(root.parent)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_is_longer_than_80_lines_outside_gpu_kernels():
    assert long_functions() == []


def test_the_length_check_sees_a_long_function(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (pkg / "m.py").write_text(f"def long():\n{body}\n\n\n@triton.jit\ndef kernel():\n{body}\n\n\n"
                              f"def k2():\n{body}\n\n\nK2 = triton.jit(k2)\n")
    assert long_functions(pkg) == [f"pkg/m.py:1 long ({MAX_FUNCTION_LINES + 1} lines)"]


def test_no_change_history_in_the_package():
    """Docstrings and comments say what the code is, not which issue changed it (git log keeps that)."""
    import re

    pat = re.compile(r"\b[Ii]ssue #?\d+")
    hits = [f"{p.relative_to(ROOT.parent)}:{n}" for p in sorted(ROOT.rglob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1) if pat.search(line)]
    assert hits == []
