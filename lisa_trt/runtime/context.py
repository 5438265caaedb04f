"""The resolve step: a run's plan (source, family, manifest, method, sampling, speculation settings,
seed, conditions adapter), as one frozen object, once.

Every `lisa-trt` command builds its `RunContext` here; `Pipeline.plan` builds one per request of
the API, serve and the OpenAI front end. The plan is handed down as is (a `Method`, a
`SamplingConfig`, a `SpecConfig`, never names and loose values) to the one runner,
runtime/runner.decode:

    rc = resolve("demo", verify="gasv", sampling={"cfg_scale": 4.0, "seed": 3},
                 tree={"tree_depth": 3}, knobs={"gasv_kappa": 2.0})
    rc.method        # Method("gasv", ...), looked up once (speculative/methods.resolve_method)
    rc.sampling      # SamplingConfig: the source's defaults with the given values (resolve_sampling)
    rc.spec          # SpecConfig: given tree and rule knobs (resolve_spec)
    rc = rc.bind(rc.load_target())   # the target: tuned tree for the backend, top-k vs its vocabulary
    rc.run(generic_entry, out_dir=..., echo=click.echo)
    plan = rc.settle(pipe)           # an engine directory: "auto" and the bundle's defaults settled once

`RunContext.run` calls the one entry the caller passes for every family; what differs between
families comes from the family's hooks and capabilities (models/family.py: `conditioning`, through
`RunContext.conditions`, and `RunContext.request`, `default_sampling`, `default_tree`, `train_data`, ...): the CLI never asks
which family it runs.

Floors: runtime (imports models, speculative, export and artifacts; never runtime/pipeline.py,
harness.py or serve, which import this module).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

from ..config import SamplingConfig
from ..errors import InputError, LisaError
from ..models.hub import resolve_model
from ..speculative.methods import AUTO, Method, SpecConfig, resolve_method

# CLI / Pipeline names of the tree budget -> SpecConfig flat names
TREE_NAMES = {"tree_top_k": "top_k", "tree_depth": "depth", "tree_tokens": "total_tokens",
              "top_k": "top_k", "depth": "depth", "total_tokens": "total_tokens"}


# ----------------------------------------------------------------------------- resolve functions

def resolve_sampling(base=None, *, vocab_size: Optional[int] = None, check: bool = True, **given) -> SamplingConfig:
    """SamplingConfig from defaults and the values given (None / False = not given).

    Args:
        base: a SamplingConfig; a dict of its fields (a bundle's recorded `generation["sampling"]`,
            other keys ignored); a model source whose artifact set records sampling defaults (the
            demo's); or None: the dataclass defaults.
        check: range-check the result (lisa_trt.validation; top-k against `vocab_size` when known).
    """
    from ..models.artifact_sets import artifact_set

    if isinstance(base, Mapping):
        names = {f.name for f in dataclasses.fields(SamplingConfig)}
        base = SamplingConfig(**{k: v for k, v in base.items() if k in names})
    elif not isinstance(base, SamplingConfig):
        aset = artifact_set(base)
        base = aset.extra("demo_sampling", SamplingConfig)() if aset is not None else SamplingConfig()
    s = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None and v is not False})
    if check:
        from ..validation import check_sampling

        check_sampling(s, vocab_size=vocab_size)
    return s


def resolve_spec(method: Optional[Method] = None, *, tree: Optional[Mapping] = None, tree_default: Optional[Mapping] = None,
                 knobs: Optional[Mapping] = None) -> SpecConfig:
    """SpecConfig for `method` (the resolved Method; None: SpecConfig's default rule).

    A non-tree method gets the first tree method's settings (its rule parameters go unused).
    Args:
        tree: the tree budget given (tree_top_k / tree_depth / tree_tokens or SpecConfig's top_k /
            depth / total_tokens; None = not given) over `tree_default` (the backend's tuned tree,
            a bundle's recorded one).
        knobs: rule knobs by SpecConfig flat name (FLAT_FIELDS: lantern_delta, gasv_kappa, ...;
            None = the tables' / dataclass value).
    """
    if method is not None and not isinstance(method, Method):
        raise TypeError(f"resolve_spec takes the resolved Method (runtime/context.resolve), got {method!r}")
    name = None if method is None else method.spec_name
    flat = {TREE_NAMES[k]: v for k, v in (tree_default or {}).items() if k in TREE_NAMES and v is not None}
    flat.update({TREE_NAMES.get(k, k): v for k, v in (tree or {}).items() if v is not None})
    flat.update({k: v for k, v in (knobs or {}).items() if v is not None})
    return SpecConfig.make(**({} if name is None else {"method": name}), **flat)


def gasv_calibration(spec: SpecConfig):
    """The GASVConfig a calibration records: the defaults with the spec's GASV knobs applied."""
    from ..speculative.gasv import GASVConfig

    return GASVConfig(**spec.gasv.overrides())


def tuned_tree(source, target, backend: str = "torch") -> dict:
    """The tree budget tuned for `backend` (measured ones when the artifact set ships them; the
    small CPU tree for torch on a CPU, the EAGLE-2 GPU tree on CUDA / TensorRT)."""
    import torch

    from ..models.artifact_sets import artifact_set
    from .autotune import default_tree_budgets, gpu_plan

    from ..models.family import family_of

    own = family_of(target.config).default_tree
    if own and backend in ("torch", "ort") and artifact_set(source) is None:
        return dict(own)
    measured = _measured_budgets() if artifact_set(source) is not None else None
    budgets = default_tree_budgets(target.config, measured, plan=gpu_plan(source, backend))
    if backend == "torch" and torch.cuda.is_available():
        return budgets["trt"]
    return budgets.get(backend, budgets["default"])


def _measured_budgets() -> dict:
    """Tree budgets bench/tune_tree.py measured for the bundled set (assets/demo/tree_budgets.json).

    The file runtime/demo._measured_budgets reads too; read here directly because runtime/demo.py
    imports the Pipeline, which imports this module (no import circles)."""
    import json

    from ..demo.registry import DEMO_DIR

    p = DEMO_DIR / "tree_budgets.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def spec_artifacts(source, target, methods, drafter, tables, sub_vocab=None) -> tuple:
    """(drafter, tables) that `methods` (resolved Methods) need, loaded for `target` (the artifact set's
    own by default); tables bound to `sub_vocab` (a request layout's) when given."""
    from ..artifacts import default_drafter, default_tables, load_drafter_by_name, load_tables_by_name

    ms = [m for m in methods if m is not None]
    needs_drafter = [m.name for m in ms if m.needs_drafter]
    needs_tables = [m.name for m in ms if m.needs_tables]
    drafter = drafter or default_drafter(source)
    tables = tables or default_tables(source)
    if needs_drafter and drafter is None:
        raise InputError(f"{needs_drafter[0]} verification needs --drafter (train one with `lisa-trt train`)")
    if needs_tables and tables is None:
        raise InputError(f"{needs_tables[0]} verification needs --tables (make them with `lisa-trt calibrate`)")
    dr = load_drafter_by_name(drafter, target) if needs_drafter else None
    tb = load_tables_by_name(tables, target, sub_vocab) if needs_tables else None
    return dr, tb


# ----------------------------------------------------------------------------- families

def _detect(source, *, manifest=None):
    """The family of a model source (models/family.detect_family) or of an engine directory's
    `manifest` (its target config's).

    An artifact set's family is its target config's (None until `RunContext.bind` when its
    provider does not say).
    """
    from ..models.artifact_sets import artifact_set
    from ..models.family import detect_family, family_of

    if manifest is not None:
        try:
            return manifest.model_family  # the Manifest's one look-up, which the engines take too
        except (LisaError, OSError, ValueError):  # a config no family reads: Pipeline.from_dir says why
            return None
    aset = artifact_set(source)
    if aset is not None:
        cfg = aset.extra("demo_target_config")
        return family_of(cfg()) if cfg is not None else None
    return detect_family(source)


def _engine_manifest(engine_dir):
    """An engine directory's Manifest, parsed once for the whole run (its graph files are checked
    when the bundle opens, runtime/bundle.open_bundle); None when it is not a readable bundle
    (Pipeline.from_dir then reads it again and says why)."""
    from ..export.manifest import read_manifest

    try:
        return read_manifest(Path(engine_dir), check_files=False)
    except (LisaError, OSError, ValueError):
        return None


# ----------------------------------------------------------------------------- the run context

@dataclass(frozen=True)
class RunContext:
    """What one run uses, resolved once (see the module docstring).

    Attributes:
        source: the model source: a local path, an artifact-set name, or a Hub name's snapshot
            directory (models/hub.py); for engine commands the engine directory.
        family: the family object (models/family.py).
        method: the decoding Method (None: "auto", or a command that decodes nothing).
        sampling: SamplingConfig (range-checked; top-k against the vocabulary after `bind`).
        spec: SpecConfig for `method` (tuned tree after `bind`).
        seed: the base seed.
        given: the values as given ({"model", "verify", "sampling", "tree", "knobs", "image_size"};
            None = not given), for family entries that take raw values.
        model_cfg: --config / --image-size / --model-type (official configs).
        backend: the backend the run decodes on ("torch" for in-memory models).
        target: the loaded target, after `bind`.
        manifest: an engine directory's Manifest, parsed once by `resolve` and handed down (the
            memory preflight, the prompts precheck and `Pipeline.from_dir` take it); None for a
            model source or an unreadable directory.
        why: how `method` was settled: "NAME (asked for)", or "auto"'s reason once a bundle
            settled it (`Pipeline.plan`, `settle`); "" before.
        conds: the conditions adapter (runtime/conditions.py), built once (`conditions`).
    """

    source: Union[str, Path]
    family: Any
    method: Optional[Method] = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)
    seed: int = 0
    given: Mapping = field(default_factory=dict)
    model_cfg: Mapping = field(default_factory=dict)
    backend: str = "torch"
    target: Any = None
    manifest: Any = None
    why: str = ""
    conds: Any = None

    @property
    def verify(self) -> str:
        """The method's name, or "auto"."""
        return AUTO if self.method is None else self.method.name

    def image_size(self, default: int) -> int:
        """--image-size when given on the command line, else `default` (the family's own)."""
        size = self.given.get("image_size")
        return default if size is None else size

    def load_target(self):
        """The target model of `source` (with --config / --image-size / --model-type when given)."""
        from ..models.target_config import target_config
        from ..models.checkpoints import load_target

        c = self.model_cfg
        cfg = None
        if c.get("config") is not None:
            cfg = target_config(c["config"], image_size=c.get("image_size", 256), model_type=c.get("model_type"))
        return load_target(self.source, cfg)

    def load(self, *, counts: Optional[Mapping] = None, counts_or_zero: Optional[Mapping] = None,
             files: Optional[Mapping] = None, dirs: Optional[Mapping] = None, captions=None,
             encoder_dir=None) -> "RunContext":
        """The prelude of a generic entry, then `bind(load_target())`.

        Before any model loads: every count of `counts` ({option: value}) is >= 1 (>= 0 in
        `counts_or_zero`), every output of `files` / `dirs` ({what: path}) is writable, and t2i
        captions with their encoder are checked. Messages name the option."""
        from ..validation import check_positive, probe_writable_dir, probe_writable_file

        for option, value in (counts or {}).items():
            check_positive(value, option)
        for option, value in (counts_or_zero or {}).items():
            check_positive(value, option, allow_zero=True)
        for what, path in (files or {}).items():
            if path:
                probe_writable_file(path, what)
        for what, path in (dirs or {}).items():
            probe_writable_dir(path, what)
        self.conditions.precheck(None, captions, encoder_dir)
        return self.bind(self.load_target())

    def bind(self, target, backend: Optional[str] = None) -> "RunContext":
        """This context for a loaded target: its family, the tree tuned for `backend` under the
        given tree, top-k checked against its vocabulary."""
        from ..models.family import family_of
        from ..validation import check_sampling

        backend = backend or self.backend
        s = self.sampling
        if self.given.get("sampling", {}).get("top_k") is None:  # a default top-k (the family's) caps nothing
            s = dataclasses.replace(s, top_k=0)
        check_sampling(s, vocab_size=target.config.vocab_size)
        spec = resolve_spec(self.method, tree=self.given.get("tree"),
                            tree_default=tuned_tree(self.source, target, backend), knobs=self.given.get("knobs"))
        family = family_of(target.config)
        return dataclasses.replace(self, target=target, family=family, spec=spec, backend=backend,
                                   conds=_conditions(family, target.config, self.conds))

    def settle(self, pipe) -> "RunContext":
        """This run's plan on the Pipeline that opened its engine directory (`lisa-trt run`), made
        once for every prompt: "auto" settled by the bundle's record (with why), the sampling given
        over the bundle's defaults, the tree and knobs given over the bundle's tree (Pipeline.plan);
        the source, manifest, family, seed and given values kept. `Pipeline.generate(plan=...)`
        decodes it as is."""
        g = self.given
        p = pipe.plan(self.method or AUTO, seed=self.seed, **g.get("sampling", {}), **g.get("tree", {}),
                      **g.get("knobs", {}))
        return dataclasses.replace(self, method=p.method, sampling=p.sampling, spec=p.spec, why=p.why,
                                   backend=p.backend, target=p.target, conds=p.conds)

    @property
    def conditions(self):
        """The run's conditions adapter (runtime/conditions.py), built by `resolve` (an engine
        directory's kind, or the family's default before the target loads: cheap prechecks only)
        and again by `bind` only when the bound target's kind differs."""
        return self.conds if self.conds is not None else _conditions(self.family, None, None)

    def run(self, entry: Callable, **options):
        """`entry(self, **options)`: a command's one (generic) entry for every family; its
        `echo` (progress lines) is silent below log level info (--quiet)."""
        from ..progress import say

        if "echo" in options:
            options["echo"] = say(options["echo"])
        return entry(self, **options)

    def request(self, prompts, *, cfg: Optional[bool] = None, image_size: Optional[int] = None):
        """Text prompts -> the family prompter's Request for the bound target (text-prompt families).

        cfg: encode the unconditional rows (default: when the run's CFG scale guides);
        image_size: default --image-size when given, else the prompter's own (the family's)."""
        from ..speculative.sampling import cfg_active

        if not prompts:
            from .conditions import missing_prompts

            raise missing_prompts(self.family)
        size = self.given.get("image_size") if image_size is None else image_size
        cfg = cfg_active(self.sampling.cfg_scale) if cfg is None else cfg
        return self.family.prompter(self.target, self.source).encode(list(prompts), image_size=size, cfg=cfg)


def _conditions(family, cfg, built):
    """The conditions adapter of `family` for `cfg` (None: the family's default kind): `built` when
    it is already that kind's (built once per run)."""
    from .conditions import run_conditions

    if family is None:
        return None
    if built is not None and built.family is family and built.kind == family.conditioning(cfg):
        return built
    return run_conditions(family, cfg)


def resolve(model=None, *, engine_dir=None, verify=None, default_verify: Union[str, Method, None] = None,
            auto: bool = False,
            sampling: Optional[Mapping] = None, tree: Optional[Mapping] = None, knobs: Optional[Mapping] = None,
            model_cfg: Optional[Mapping] = None, backend: str = "torch") -> RunContext:
    """The resolve step of a run (module docstring).

    Args:
        model: --model (a path, an artifact-set name or a Hugging Face name); or
        engine_dir: an exported engine directory (run, build): its manifest is parsed here, once
            (`RunContext.manifest`).
        verify / default_verify: the method name (None: `default_verify`); "auto" allowed with `auto`.
        sampling: the sampling options given ({cfg_scale, temperature, top_k, top_p, cfg_interval,
            greedy, seed}; None = not given).
        tree: the tree budget given ({tree_top_k, tree_depth, tree_tokens}).
        knobs: rule knobs given, by SpecConfig flat name.
        model_cfg: {config, image_size, model_type, image_size_given} (official configs).
        backend: the backend the run decodes on.
    """
    if (model is None) == (engine_dir is None):
        raise TypeError("resolve() takes a model or an engine_dir, not both")
    source = resolve_model(model if engine_dir is None else engine_dir)
    manifest = _engine_manifest(source) if engine_dir is not None else None
    family = None if engine_dir is not None and manifest is None else _detect(source, manifest=manifest)
    given_s = dict(sampling or {})
    seed = given_s.pop("seed", None)
    model_cfg = dict(model_cfg or {})
    method = resolve_method(verify, auto=auto, default=default_verify)  # the run's one look-up by name
    given = {"model": model if engine_dir is None else engine_dir, "verify": verify, "sampling": given_s,
             "tree": dict(tree or {}), "knobs": dict(knobs or {}),
             "image_size": model_cfg.get("image_size") if model_cfg.pop("image_size_given", False) else None}
    base = source
    if family is not None and family.default_sampling and engine_dir is None:
        from ..models.artifact_sets import artifact_set

        if artifact_set(source) is None:
            base = SamplingConfig(**family.default_sampling)
    return RunContext(source=source, family=family, method=method,
                      sampling=resolve_sampling(base, **given_s), spec=resolve_spec(method, tree=tree, knobs=knobs),
                      seed=0 if seed is None else seed, given=given, model_cfg=model_cfg, backend=backend,
                      manifest=manifest, why="" if method is None else f"{method.name} (asked for)",
                      conds=_conditions(family, None if manifest is None else manifest.target_config,
                                                             None))


__all__ = ["AUTO", "RunContext", "gasv_calibration", "resolve", "resolve_method", "resolve_sampling", "resolve_spec",
           "spec_artifacts", "tuned_tree"]
