"""The import floors of docs/architecture.md, proven by parsing every import (lazy ones included).

    python -m pytest -q tests/test_architecture.py     # or: python tests/test_architecture.py

Floors, top to bottom (a module may import its own floor and any floor below, never above):
    cli -> runtime -> engines -> export / speculative / calibration / train -> models -> core
and no two modules import each other, directly or through others (no import circles).

One explicit exception to "a package is one floor": a family package's plugins (FAMILY_PLUGINS).
models/families/<name>/export.py (and anything under models/families/<name>/export/) sits at
the export floor: it holds the family's ExportFamily (graph wrappers, io specs, manifest config
readers) and may import export/. models/families/<name>/shapes.py sits at the engines floor: the
family's memory-plan shapes over engines/model_shapes.py. Nothing below a plugin's floor imports
it (the family package itself never does); the generic registries reach them through
ModelFamily.export_module / shapes_module (importlib), never through a static import.
"""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "lisa_trt"

# first package component (or top-level module) -> floor
FLOORS = {
    "cli": 6, "launcher": 6, "__main__": 6,  # cli: the lisa_trt/cli/ package, one module per command group
    "runtime": 5, "bench": 5, "serve": 5, "server": 5, "text": 5,
    "text.encoder": 2,  # the caption encoder is a model (train/ uses it); text's prompt plumbing is runtime
    "engines": 4,
    "export": 3, "speculative": 3, "calibration": 3, "train": 3, "artifacts": 3, "demo": 3, "testing": 3,
    "quantization": 3, "quality": 3,
    "models": 2,
    "config": 1, "errors": 1, "io": 1, "progress": 1, "imaging": 1, "timing": 1, "_version": 1,
    "safe_load": 1, "threads": 1, "validation": 1, "clitools": 1,
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


FAMILY_PLUGINS = {"export": "export", "shapes": "engines"}  # models/families/<name>/<plugin> -> its floor


def floor(module: str):
    parts = module.split(".")
    if len(parts) == 1:
        return 7  # the public facade
    if len(parts) > 4 and parts[1:3] == ["models", "families"] and parts[4] in FAMILY_PLUGINS:
        return FLOORS[FAMILY_PLUGINS[parts[4]]]  # a family's export plugin (module docstring)
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
    assert upward_imports(edges) == ["lisa_trt.models.x (floor 2) imports lisa_trt.engines.y (floor 4)"]
    assert cycles(edges) == [["lisa_trt.engines.y", "lisa_trt.models.x"]]


def test_a_family_export_plugin_sits_at_the_export_floor():
    """models/families/<name>/export.py may import export/; its family package may not import it."""
    plugin, model = "lisa_trt.models.families.fam.export", "lisa_trt.models.families.fam.model"
    assert floor(plugin) == FLOORS["export"] and floor(model) == FLOORS["models"]
    assert floor("lisa_trt.models.families.fam.export.graphs") == FLOORS["export"]
    edges = {plugin: {"lisa_trt.export.onnx", model}, model: {plugin}, "lisa_trt.export.onnx": set()}
    assert upward_imports(edges) == [f"{model} (floor 2) imports {plugin} (floor 3)"]
    assert "lisa_trt.models.families.fam.export" in modules_named_export_plugins(edges)


def modules_named_export_plugins(edges) -> list:
    return sorted(m for m in edges if floor(m) == FLOORS["export"] and m.startswith("lisa_trt.models."))


def test_the_family_export_plugins_are_found_without_a_static_import():
    """No module imports a family's export plugin statically: export/families.py loads it by name."""
    e = import_edges(modules())
    plugins = set(modules_named_export_plugins(e))
    assert plugins, "expected the built-in families' export plugins (models/families/*/export.py)"
    importers = sorted(f"{m} imports {t}" for m, ts in e.items() for t in ts & plugins
                       if not m.startswith("lisa_trt.models.families.") and not m.startswith("lisa_trt.tests"))
    assert not importers, importers


if __name__ == "__main__":
    e = import_edges(modules())
    problems = upward_imports(e) + [" <-> ".join(c) for c in cycles(e)]
    print("\n".join(problems) or "import floors OK, no circles")
    sys.exit(1 if problems else 0)
