"""A run is resolved once: the manifest of an engine directory is parsed once per open, the model
family looked up once, on the bundled demo engines through ONNX Runtime.

Counted by wrapping the one manifest reader (export/manifest.read_manifest), the file read of
manifest.json itself (any other reader would show there) and the family look-ups
(models/family.family_of / detect_family / family_named) in every module that imported them.
"""

import functools
import pathlib
import re
import sys
from collections import Counter

import pytest
from click.testing import CliRunner

from lisa_trt.cli import main
from lisa_trt.demo.registry import assets_present
from lisa_trt.models.artifact_sets import bundled_file

pytestmark = pytest.mark.skipif(
    not (assets_present() and bundled_file("demo-lisa", "drafters").is_file() and bundled_file("demo", "tables").is_file()),
    reason="bundled demo assets not built (scripts/demo/*)")

FAMILY_LOOKUPS = ("family_of", "detect_family", "family_named")


@pytest.fixture(scope="module")
def demo_engines(tmp_path_factory):
    from lisa_trt.runtime.demo import ensure_demo_bundle

    return ensure_demo_bundle(tmp_path_factory.mktemp("resolved") / "engines", echo=lambda *a: None)


@pytest.fixture
def counts(monkeypatch):
    """A Counter of read_manifest calls, manifest.json reads and family look-ups from now on."""
    import lisa_trt.cli.run  # noqa: F401 - the modules a run imports, so their own bindings are wrapped too
    import lisa_trt.deploy.memory_plan  # noqa: F401
    import lisa_trt.engines.ort  # noqa: F401
    import lisa_trt.families.llamagen.engines  # noqa: F401
    import lisa_trt.runtime.commands.run  # noqa: F401
    import lisa_trt.runtime.pipeline  # noqa: F401
    import lisa_trt.speculative.autoregressive  # noqa: F401
    import lisa_trt.runtime.conditions  # noqa: F401
    from lisa_trt.export import manifest as M
    from lisa_trt.models import family as F

    c = Counter()

    def wrap(owner, name, key):
        orig = getattr(owner, name)

        @functools.wraps(orig)
        def counted(*a, **k):
            c[key] += 1
            return orig(*a, **k)

        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith("lisa_trt") and getattr(mod, name, None) is orig:
                monkeypatch.setattr(mod, name, counted)

    wrap(M, "read_manifest", "read_manifest")
    for name in FAMILY_LOOKUPS:
        wrap(F, name, "family")
    read_text = pathlib.Path.read_text

    def counted_read(self, *a, **k):
        if self.name == M.MANIFEST_NAME:
            c["manifest.json"] += 1
        return read_text(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "read_text", counted_read)
    return c


def test_pipeline_open_and_generate_parse_the_manifest_once(demo_engines, counts):
    from lisa_trt.runtime.pipeline import Pipeline

    with Pipeline.from_dir(demo_engines, backend="ort", threads=1) as pipe:
        assert (counts["read_manifest"], counts["manifest.json"]) == (1, 1)
        assert counts["family"] == 1  # the engines' target resolves it; the Pipeline takes theirs
        for verify in ("gasv", "vanilla", "sjd"):  # tree, AR and Jacobi loops: no look-up per decode
            pipe.generate([1, 2], seed=0, verify=verify, decode=False)
    assert dict(counts) == {"read_manifest": 1, "manifest.json": 1, "family": 1}


def test_lisa_trt_run_parses_the_manifest_once(demo_engines, counts, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("1\n2\n")
    res = CliRunner().invoke(main, ["run", str(demo_engines), str(prompts), "--out", str(tmp_path / "out"),
                                    "--backend", "ort", "--threads", "1", "--verify", "gasv"])
    assert res.exit_code == 0, res.output
    assert "2 images" in res.output
    # resolve() parses it into the RunContext; the preflight, the prompts precheck, Pipeline.from_dir
    # and the engines take that Manifest
    assert (counts["read_manifest"], counts["manifest.json"]) == (1, 1), dict(counts)
    # resolve() looks the family up (Manifest.model_family); the engines' target and the Pipeline take it
    assert counts["family"] == 1, dict(counts)


def test_a_given_manifest_still_has_its_graph_files_checked(demo_engines, tmp_path):
    """open_bundle(manifest=) parses nothing, but a changed graph file is refused as before."""
    import shutil

    from lisa_trt.errors import ArtifactMismatchError, InputError
    from lisa_trt.export.manifest import read_manifest
    from lisa_trt.runtime.bundle import open_bundle

    copy = tmp_path / "engines"
    shutil.copytree(demo_engines, copy)
    man = read_manifest(copy, check_files=False)
    g = next(iter(man.graphs.values()))
    (copy / g.file).write_bytes((copy / g.file).read_bytes() + b"\0")
    with pytest.raises(ArtifactMismatchError, match="changed after export"):
        open_bundle(copy, "ort", manifest=man)
    with pytest.raises(InputError, match=re.escape(f"not {demo_engines}'s")):
        open_bundle(demo_engines, "ort", manifest=man)  # another directory's manifest


def test_a_planned_run_reads_the_manifest_once(demo_engines, counts, tmp_path):
    """With --memory-gib (what a GPU run checks) the preflight plans on the RunContext's Manifest:
    the CFG default, the build record and the model's shape (the family's shape plug-in,
    families/<name>/shapes.py engine_shape, takes the Manifest instead of reading the directory)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("1\n")
    res = CliRunner().invoke(main, ["run", str(demo_engines), str(prompts), "--out", str(tmp_path / "out"),
                                    "--backend", "ort", "--threads", "1", "--verify", "gasv", "--memory-gib", "80"])
    assert res.exit_code == 0, res.output
    assert (counts["read_manifest"], counts["manifest.json"], counts["family"]) == (1, 1, 1), dict(counts)


@pytest.mark.parametrize("verify", ["gasv", "auto"])
def test_lisa_trt_run_hands_one_frozen_plan_to_the_runner(demo_engines, counts, tmp_path, monkeypatch, verify):
    """`lisa-trt run` resolves once (one look-up by name: the given method, or the one "auto" picks),
    settles one plan on the opened bundle and hands that object to the runner for every prompt;
    the conditions adapter is built once."""
    from lisa_trt.runtime import conditions, context, pipeline, runner

    plans, lookups, adapters = [], [], []
    real_decode, real_lookup, real_conds = runner.decode, context.resolve_method, conditions.run_conditions
    monkeypatch.setattr(runner, "decode", lambda plan, *a, **k: plans.append(plan) or real_decode(plan, *a, **k))
    for mod in (context, pipeline):
        monkeypatch.setattr(mod, "resolve_method", lambda v, **k: lookups.append(v) or real_lookup(v, **k))
    for mod in (conditions, pipeline):
        monkeypatch.setattr(mod, "run_conditions", lambda *a: adapters.append(a) or real_conds(*a))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("1\n2\n3\n")
    res = CliRunner().invoke(main, ["run", str(demo_engines), str(prompts), "--out", str(tmp_path / "out"),
                                    "--backend", "ort", "--threads", "1", "--verify", verify])
    assert res.exit_code == 0, res.output
    assert len(plans) == 3 and all(p is plans[0] for p in plans)  # one object for every prompt
    plan = plans[0]
    assert isinstance(plan, context.RunContext) and plan.manifest is not None and plan.why
    with pytest.raises(AttributeError):  # frozen
        plan.seed = 1
    assert lookups[0] == verify and len(lookups) == (1 if verify == "gasv" else 2), lookups
    assert len(adapters) == 1, adapters
    assert (counts["read_manifest"], counts["manifest.json"], counts["family"]) == (1, 1, 1), dict(counts)
