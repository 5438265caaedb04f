"""`lisa-trt plan` is the runtime's allocation list (issues 36, 51): a bundle of every family, built by
Polygraphy's real loaders over the fake native core of tests/contract/trt_fake.py (no libnvinfer) and
decoded with GASV tree speculation by the TensorRT runners, allocates, model by model and component by
component, what the plan of that directory counts:

  kv_cache     the caches the engines made (the target's through models/layers.kv_cache_shape);
  activations  the bundle's one shared context buffer (the AllocationLog's "activations"), in the target;
  io           every engine's output buffers (the AllocationLog's "io", per engine): the pools made at the
               engines' largest output shapes, and nothing beyond them (a call that allocated outside
               the pool would show as a difference).

LlamaGen c2i runs here by default; LlamaGen t2i (its caption prefill engine), Chameleon / Lumina-mGPT,
Emu3 and Janus-Pro are `slow` (each exports and builds its tiny bundle first). The ONNX Runtime plan
counts the same caches."""

import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
for sub in ("tests/export", "tests/engines", "tests/contract"):
    sys.path.insert(0, str(ROOT / sub))
from test_build import FakeTRT, _install  # noqa: E402
from test_trt_compat import tiny_bundle  # noqa: E402

from lisa_trt.deploy import build as B  # noqa: E402
from lisa_trt.deploy.memory_plan import make_plan  # noqa: E402
from lisa_trt.engines.graph import load_engines  # noqa: E402
from lisa_trt.export.manifest import read_manifest  # noqa: E402
from lisa_trt.speculative.methods import get_method

MODELS = {"target": ("target_prefill", "target_verify"), "drafter": ("drafter_project", "drafter_step", "drafter_fused"),
          "gasv": ("gasv",), "vq_decode": ("vq_decode",)}
BATCH = 2  # prompts per call (4 rows with CFG)


def _cache_bytes(cache) -> int:
    """Device bytes of a cache's K/V storage (its tensors of rank >= 4, each storage counted once)."""
    seen, n = set(), 0
    for v in vars(cache).values():
        for t in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(t, torch.Tensor) and t.dim() >= 4:
                s = t.untyped_storage()
                if s.data_ptr() not in seen:
                    seen.add(s.data_ptr())
                    n += s.nbytes()
    return n


@pytest.fixture
def made_caches(monkeypatch):
    """The K/V bytes of every KVCache / DrafterCache the engines make during the test, by model (as
    made: a decode may later keep only some rows of a cache)."""
    from lisa_trt.models import drafter as D
    from lisa_trt.models import layers as L

    made = {"target": [], "drafter": []}
    for mod, name, model in ((L, "KVCache", "target"), (D, "DrafterCache", "drafter")):
        cls = getattr(mod, name)
        spy = type(name, (cls,), {"__init__": lambda self, *a, _c=cls, _m=model, **k: (
            _c.__init__(self, *a, **k), made[_m].append(_cache_bytes(self)))[0]})
        monkeypatch.setattr(mod, name, spy)
    return made


def _llamagen(kind: str, root: Path, c2i: Path) -> tuple:
    """(bundle, decode inputs(engines) -> (cond, layout)) of the tiny LlamaGen c2i / t2i export."""
    if kind == "c2i":
        return c2i, lambda eng: (torch.tensor([3, 7]), None, None)
    from export_artifacts import make_artifacts

    from lisa_trt.export import export_bundle
    from lisa_trt.testing import make_cond

    a = make_artifacts("t2i")
    out = root / "t2i"
    export_bundle(a["target"], a["drafter"], a["tables"], a["vq"], out, max_tree=16, validate=False, lint=False,
                  progress=False)
    return out, lambda eng: (make_cond(a["target"], batch=BATCH), None, None)


def _family(name: str, root: Path) -> tuple:
    from family_bundles import export_family_bundle, family_artifacts, request

    art = family_artifacts(name, root / "art")
    man = export_family_bundle(art, root / "eng", max_prompt=32)  # the captions with the family's template

    def inputs(eng):
        req = request(dict(art, captions=art["captions"][:BATCH]), eng.target)  # the family's prompter
        return req.cond, req.layout, req

    return Path(man.dir), inputs


CASES = [pytest.param("c2i", id="llamagen-c2i"),
         pytest.param("t2i", id="llamagen-t2i", marks=pytest.mark.slow),
         *[pytest.param(k, id=k, marks=pytest.mark.slow) for k in ("chameleon", "emu3", "janus")]]


def _bundle(case: str, root: Path, c2i: Path) -> tuple:
    return _llamagen(case, root, c2i) if case in ("c2i", "t2i") else _family(case, root)


def _decode(eng, cond, layout, req):
    """What a run allocates: GASV tree speculation (prefill, drafter commits and expansions, tree
    verifications, GASV calls), then the pixels."""
    from lisa_trt.config import SamplingConfig
    from lisa_trt.models.family import family_of
    from lisa_trt.speculative.methods import SpecConfig
    from lisa_trt.speculative.run import run_method

    spec = SpecConfig.make("gasv", top_k=2, depth=2, total_tokens=6)
    with torch.no_grad():
        toks, _ = run_method(get_method("gasv"), eng.target, eng.drafter, eng.tables, cond, sampling=SamplingConfig(
            cfg_scale=2.0, top_k=16), spec=spec, seed=1, gasv=eng.gasv, layout=layout)
        if req is None:
            eng.vq.tokens_to_pixels(toks)
        else:  # a prompted family: its code grids first (what the Pipeline decodes)
            fam = family_of(eng.target.config)
            fam.codes_to_pixels(eng.vq, fam.tokens_to_codes(eng.target, toks, req))


def _allocated(eng, made: dict) -> dict:
    """{model: {part: bytes}} the TensorRT runtime holds after a decode."""
    log = eng.target._verify.log
    got = {m: {"io": sum(log.nbytes("io", g) for g in graphs)} for m, graphs in MODELS.items()}
    for m in ("target", "drafter"):
        sizes = set(made[m])
        assert len(sizes) == 1, (m, sizes)  # every cache of a model the same, static size
        got[m]["kv_cache"] = sizes.pop()
    live = [b for c, _, b in log.entries if c == "activations"]
    for m in got:  # the one context buffer (the last one SharedActivations made), counted in the target
        got[m]["activations"] = live[-1] if m == "target" else 0
    return got


@pytest.mark.parametrize("case", CASES)
def test_tensorrt_allocates_what_the_plan_counts(case, bundle, tmp_path, monkeypatch, request, made_caches):
    src, inputs = _bundle(case, tmp_path / "src", bundle)
    _install(FakeTRT(), monkeypatch, request)
    d = tmp_path / "engines"
    shutil.copytree(src, d)
    B.build_engines(d, max_batch=BATCH, progress=False)
    plan = make_plan(str(d), memory_gib=8, batch=BATCH, cfg=True)
    for made in made_caches.values():
        made.clear()  # the export's tracing made caches too: count the run's only
    assert plan.backend == "trt" and any("device memory recorded" in n for n in plan.notes)
    with load_engines(d, "trt", device="cpu") as eng:
        _decode(eng, *inputs(eng))
        got = _allocated(eng, made_caches)
    for model, parts in got.items():
        for part, n in parts.items():
            assert n == plan.engines[model].get(part, 0), (case, model, part, n, plan.engines[model])
    assert got["target"]["io"] > 0 and got["drafter"]["kv_cache"] > 0 and got["vq_decode"]["io"] > 0
    assert set(plan.engines["target"]) == {"weights", "kv_cache", "activations", "io"}  # nothing uncounted
    assert plan.temporaries > 0 and plan.host_load > plan.engines["target"]["weights"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return tiny_bundle(tmp_path_factory)


def test_ort_allocates_what_the_ort_plan_counts(bundle, made_caches):
    man = read_manifest(bundle)
    plan = make_plan(str(bundle), memory_gib=8, batch=1, cfg=True, backend="ort")
    assert plan.max_cache_len == man.max_cache_len
    with load_engines(bundle, "ort", threads=1) as eng:
        eng.target.new_cache(2, extra=16), eng.drafter.new_cache(2, 40)
    assert made_caches["target"] == [plan.engines["target"]["kv_cache"]] and plan.engines["target"]["kv_cache"] > 0
    assert made_caches["drafter"] == [plan.engines["drafter"]["kv_cache"]] and plan.engines["drafter"]["kv_cache"] > 0


def test_build_records_each_engines_device_memory(bundle, tmp_path, monkeypatch, request):
    fake = FakeTRT()
    _install(fake, monkeypatch, request)
    d = tmp_path / "engines"
    shutil.copytree(bundle, d)
    # max_batch 1 (2 CFG rows); step (S <= 4) and tree (S <= 16) profiles, so sizes differ per profile
    rec = B.build_engines(d, profiles=B.profiles_from_io_spec(read_manifest(d), seq_split=4), progress=False)
    for name, g in rec["graphs"].items():
        e = next(x for x in fake.builds if Path(x["onnx"]).name == g["onnx"])
        assert len(g["device_memory"]) == len(g["profiles"]) == len(e["profiles"])  # one size per profile
        assert all(m > 0 for m in g["device_memory"]) and g["aliased"] == {}  # the new-rows graphs: no alias
    profs = rec["graphs"]["target_verify"]["device_memory"]
    assert len(profs) == 2 and profs[0] != profs[1]  # step and tree profiles differ: the record is per profile
