"""A family is one object resolved once: detection takes exactly one claimant, the object holds
its plug-ins, a torch target holds its family, a run looks its family up a few times and never per
step, export_family takes the family object, and methods are looked up by name in few places."""

import ast
import functools
from pathlib import Path

import pytest
import torch

import lisa_trt.models.family as MF
from lisa_trt.errors import ConfigError
from lisa_trt.testing import make_target
from lisa_trt.speculative.methods import resolve_method

ROOT = Path(__file__).resolve().parents[1] / "lisa_trt"


# ----------------------------------------------------------------------------- detection

def test_a_path_no_family_claims_is_refused_naming_each_family(tmp_path):
    for path in (tmp_path / "model.onnx", tmp_path / "missing"):
        with pytest.raises(ConfigError) as e:
            MF.detect_family(path)
        for fam in MF.families():
            assert f"{fam.name}: {fam.describe_checkpoint()}" in str(e.value)
    (tmp_path / "model.onnx").write_bytes(b"x")
    with pytest.raises(ConfigError, match="is not a checkpoint any family loads"):
        MF.detect_family(tmp_path / "model.onnx")


def test_llamagen_claims_weights_files_only(tmp_path):
    fam = MF.family_of("c2i")
    assert all(fam.claims(tmp_path / f"w{s}") for s in (".pt", ".pth", ".bin", ".safetensors"))
    assert not fam.claims(tmp_path / "notes.txt") and not fam.claims(tmp_path)
    assert MF.detect_family(tmp_path / "GPT-B.pt") is fam


class _Greedy(MF.ModelFamily):
    name = "greedy"

    def claims(self, path) -> bool:
        return True


def test_two_claimants_are_an_error(monkeypatch, tmp_path):
    real = MF.families()
    monkeypatch.setattr(MF, "families", lambda: [*real, _Greedy()])
    with pytest.raises(ConfigError, match=r"claimed by 2 families \(llamagen, greedy\)"):
        MF.detect_family(tmp_path / "w.pt")


# ----------------------------------------------------------------------------- the object holds its parts

def test_the_family_holds_its_plug_ins_imported_once(monkeypatch):
    fam = MF.family_of("c2i")
    loads = []
    real = MF.load_plugin
    monkeypatch.setattr(MF, "load_plugin", lambda m: loads.append(m) or real(m))
    fam.__dict__.pop("_plugins", None)
    assert fam.shapes is fam.shapes and fam.captions is fam.captions and fam.plugin("export") is not None
    assert sorted(loads) == sorted({fam.shapes_module, fam.captions_module, fam.export_module})
    assert fam.shapes.__name__ == "lisa_trt.families.llamagen.shapes"
    assert MF.family_of("chameleon").captions is None  # no plug-in: None, nothing imported


def test_a_torch_target_holds_its_family(monkeypatch):
    """check_cond / null_cond ask the target's held family, not the registry, on every call."""
    t = make_target()
    calls = []
    real = MF.family_of
    monkeypatch.setattr(MF, "family_of", lambda c: calls.append(c) or real(c))
    import lisa_trt.families.llamagen.model as LM

    if hasattr(LM, "family_of"):
        monkeypatch.setattr(LM, "family_of", MF.family_of)
    cond = torch.tensor([1, 2])
    for _ in range(3):
        assert t.check_cond(cond) == 2
        t.null_cond(cond)
    assert len(calls) <= 1, calls
    import copy

    assert copy.deepcopy(t).model_family is t.model_family  # the registry's one object


# ----------------------------------------------------------------------------- export_family takes the family

def test_export_family_takes_the_family_object(registry_lookups):
    import lisa_trt.export.families as XF

    fam = MF.family_of("c2i")
    registry_lookups.clear()
    xf = XF.export_family(fam)
    assert xf.name == fam.name and registry_lookups["family"] == 0  # no model-family look-up: it was given
    t = make_target()
    registry_lookups.clear()
    assert XF.export_family(t) is xf and XF.export_family(t.config) is xf  # compatibility: one family_of each
    assert registry_lookups["family"] == 2, dict(registry_lookups)
    assert XF.export_family_named("llamagen") is xf  # a manifest's recorded name
    for bad in ("llamagen", "c2i", object()):  # names are not guessed from strings or other objects
        with pytest.raises(ConfigError, match=r"export_family takes a model family .*export_family_named"):
            XF.export_family(bad)
    with pytest.raises(ConfigError, match="no export family 'nope'; known: .*llamagen"):
        XF.export_family_named("nope")


def test_a_family_without_an_export_plug_in_is_refused_naming_the_fix():
    import lisa_trt.export.families as XF

    with pytest.raises(ConfigError, match="the greedy family has no export family .*register_export_family"):
        XF.export_family(_Greedy())


# ----------------------------------------------------------------------------- family look-ups per run

class _CountingRegistry(dict):
    """A family registry (name -> family) that counts its look-ups under `key` in `counter`."""

    def __init__(self, table, counter, key):
        super().__init__(table)
        self.counter, self.key = counter, key

    def get(self, *a):
        self.counter[self.key] += 1
        return super().get(*a)

    def __getitem__(self, k):
        self.counter[self.key] += 1
        return super().__getitem__(k)

    def values(self):
        self.counter[self.key + " (all)"] += 1
        return super().values()


@pytest.fixture
def registry_lookups(monkeypatch):
    """A Counter of look-ups in the two family registries from now on, counted in the registries
    themselves (so a look-up through any module's own binding of family_of shows): the model
    families (family_of; families(), which family_named and detect_family walk) and the export
    families (export_family)."""
    from collections import Counter

    import lisa_trt.export.families as XF

    MF.families(), XF.export_families()  # every built-in family registered before counting
    counter = Counter()
    monkeypatch.setattr(MF, "_FAMILIES", _CountingRegistry(MF._FAMILIES, counter, "family"))
    monkeypatch.setattr(XF, "_FAMILIES", _CountingRegistry(XF._FAMILIES, counter, "export family"))
    return counter


# A run looks its family up where it is resolved (the run context, the checkpoint's detection, the
# target's held family, the loop's layout), never once per decode step: one per step would add 100.
FAMILY_LOOKUPS_PER_RUN = 7


def _demo_present() -> bool:
    from lisa_trt.demo.registry import assets_present

    return assets_present()


@pytest.mark.skipif(not _demo_present(), reason="bundled demo assets not built (scripts/demo/*)")
def test_a_demo_run_looks_its_family_up_a_few_times_not_per_step(registry_lookups, tmp_path):
    """`lisa-trt generate --model demo` (one image, 256 tokens, SJD: 100 target forwards)."""
    from click.testing import CliRunner

    from lisa_trt.cli import main

    res = CliRunner().invoke(main, ["generate", "--model", "demo", "--classes", "1", "--verify", "sjd",
                                    "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    n = sum(registry_lookups.values())
    assert 0 < n <= FAMILY_LOOKUPS_PER_RUN, dict(registry_lookups)


@pytest.mark.parametrize("method", ["vanilla", "sjd"])
def test_family_look_ups_do_not_grow_with_the_steps(registry_lookups, method):
    """The same run with 2 and 16 tokens looks its family up as often (AR and Jacobi loops)."""
    from lisa_trt.config import SamplingConfig
    from lisa_trt.speculative.methods import SpecConfig
    from lisa_trt.speculative.run import run_method

    found = []
    for n in (2, 16):
        t = make_target()  # a fresh target: its held family is looked up in the run, once
        layout = MF.family_of("c2i").free_layout(t, n)
        registry_lookups.clear()
        tokens, _ = run_method(resolve_method(method), t, None, None, torch.tensor([1, 2]), sampling=SamplingConfig(), spec=SpecConfig(),
                               seed=0, layout=layout)
        assert tokens.shape == (2, n)
        found.append(dict(registry_lookups))
    assert found[0] == found[1] and 0 < sum(found[0].values()) <= 2, found


# ----------------------------------------------------------------------------- methods by name

NAME_LOOKUPS = ("get_method", "resolve_method")
# Sites that look a method up by name, outside the registry (speculative/methods.py), per module: a use
# of get_method / resolve_method, or the registry read by a key (METHODS[name], METHODS.get(name)).
# The target is 2 in all (only where a run is resolved); a module may only go down. Where each one is:
# - runtime/context.py 1: resolve's call of resolve_method (the registry's one resolver; the commands'
#   resolve step);
# - runtime/pipeline.py 1: Pipeline.method (the API's, serve's, the OpenAI front end's resolve step; a
#   name, or the one "auto" settles on from the bundle: a step the commands' resolve cannot take);
# - harness.py 1: parse_methods (the bench's points: --methods, and each --sweep rule through it).
# train/evaluate.decode_eval runs the registered Method object itself (speculative/decode.EXACT), no name.
# The library entries below them (speculative/run.run_method, SpeculativeDecoder.generate) take a Method
# only (a name is a TypeError: tests/runtime/test_run_plan.py); bench rows record `uses_tree`, which
# speculative/oracle.drafter_efficiency reads. Every entry point hands the Method down: nothing below
# resolve / Pipeline.plan / the bench's points looks a method up again (test_run_plan counts that at run time).
LOOKUP_BUDGET = {"lisa_trt/runtime/context.py": 1, "lisa_trt/runtime/pipeline.py": 1, "lisa_trt/harness.py": 1}


def _registry(node) -> bool:
    return (isinstance(node, ast.Name) and node.id == "METHODS") or (isinstance(node, ast.Attribute)
                                                                     and node.attr == "METHODS")


def lookup_lines(source: str) -> list:
    """Lines of `source` that look a method up by name: get_method / resolve_method (a call, or the
    function passed on: map(resolve_method, ...)), METHODS[key], METHODS.get(key)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name in NAME_LOOKUPS and isinstance(node.ctx, ast.Load):
            out.append(node.lineno)
        elif isinstance(node, ast.Subscript) and _registry(node.value) and isinstance(node.ctx, ast.Load):
            out.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and _registry(node.func.value)):
            out.append(node.lineno)
    return sorted(out)


def name_lookup_sites(root: Path = ROOT, planted: dict = None) -> dict:
    """{file: [line, ...]} of every look-up by name (`lookup_lines`) outside speculative/methods.py;
    `planted`: {file: extra source appended} (the self-check)."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        rel = str(p.relative_to(root.parent))
        if rel.endswith("speculative/methods.py"):
            continue
        extra = (planted or {}).get(rel)
        lines = _file_lookups(p) if extra is None else lookup_lines(p.read_text() + extra)
        if lines:
            out[rel] = lines
    return out


@functools.lru_cache(maxsize=None)
def _file_lookups(path: Path) -> list:
    return lookup_lines(path.read_text())


def _over_budget(sites: dict) -> dict:
    return {f: lines for f, lines in sites.items() if len(lines) > LOOKUP_BUDGET.get(f, 0)}


def test_methods_are_looked_up_by_name_in_few_places():
    sites = name_lookup_sites()
    assert not _over_budget(sites), f"look-ups by name over budget (pass the Method object down instead): {sites}"
    assert sum(len(v) for v in sites.values()) == sum(LOOKUP_BUDGET.values()), (sites, "lower LOOKUP_BUDGET")


@pytest.mark.parametrize("planted", ["\nm = get_method(plan.verify)\n", "\nm = METHODS[plan.method.name]\n",
                                     "\nm = METHODS.get(name)\n", "\nms = list(map(resolve_method, names))\n"])
def test_a_planted_re_lookup_is_over_budget(planted):
    """A look-up by name added below an entry point (the runner, here) is counted, in any of its forms."""
    for rel in ("lisa_trt/runtime/runner.py", "lisa_trt/runtime/pipeline.py", "lisa_trt/serve/model.py"):
        assert rel in _over_budget(name_lookup_sites(planted={rel: planted})), (rel, planted)


def test_the_pipeline_resolves_a_request_s_method_once(monkeypatch):
    """Pipeline.method: a Method passes as is; a name is looked up once (not resolved, turned back
    into a name and resolved again)."""
    import lisa_trt.runtime.pipeline as P
    from lisa_trt.speculative.methods import get_method

    calls = []
    real = P.resolve_method
    monkeypatch.setattr(P, "resolve_method", lambda *a, **k: calls.append(a) or real(*a, **k))
    from types import SimpleNamespace

    pipe = P.Pipeline.__new__(P.Pipeline)  # an in-memory pipeline's run state: no bundle, no drafter
    pipe._e = SimpleNamespace(manifest=None, generation={}, backend="torch", drafter=None, tables=None, gasv=None)
    vanilla = get_method("vanilla")
    assert pipe.method(vanilla) == (vanilla, {}, "vanilla (asked for)") and calls == []
    assert pipe.method("vanilla")[0] is vanilla and len(calls) == 1
