"""The one registry of decoding methods, and the speculation settings they read.

Every place that lists methods (the decode loop, Pipeline, `lisa-trt bench`, the CLI's
`--verify` / `--methods` and their options) reads `METHODS` here. A method is:

- `kind`: "tree" (drafter + EAGLE-2 tree + one verification rule), "ar" (the vanilla
  autoregressive loop) or "sjd" (speculative Jacobi decoding, no drafter); only this module
  reads it: everything outside speculative/ asks the method's capabilities instead
  (`uses_tree`, `baseline`, `takes_row_seeds`, `spec_name`, `describe`; the kind's defaults, which
  a method may override), so a new kind changes nothing in runtime/, serve or bench;
- `needs_drafter` / `needs_tables`: the artifacts it requires;
- `rule`: for tree methods, `rule(logits (B, N, V), tree, ctx) -> VerifyResult` where ctx is a
  `RuleContext` (spec, greedy flag, generator, tables, GASV engine); the rule picks its greedy
  variant itself from `ctx.greedy`;
- `greedy_sampling`: the method forces greedy sampling (the "greedy" method is the exact rule
  with argmax sampling everywhere: one definition, used by decode, Pipeline and bench);
- `options`: the CLI options it reads (`MethodOption`: flag, SpecConfig flat field, type, help);
- `settings`: optional frozen dataclass of the method's own knobs. Registering the method
  registers its flat names `<method>_<field>` ('-' written '_'; e.g. `gsd_group`) in
  `FLAT_FIELDS`, so `SpecConfig.make(..., gsd_group=...)`, Pipeline keywords, bench sweeps and
  the CLI options reach them; a rule reads them with `spec.settings("gsd")`;
- `session`: for tree methods, optional per-decode state made by the tree decoder (it may
  draw the first token and transform the drafter's laws; the rule reads `ctx.session`;
  speculative/coupled.py);
- `decoder`: the method's decode loop, `decoder(target, drafter, tables, gasv, spec) -> Decoder`
  (speculative/session.py: one contract for every method; run.py `run_method` builds it, opens
  its session and decodes). Every method brings its own: the plain loop
  (speculative/autoregressive.py), the tree decoder (speculative/decode.py `tree_decoder`,
  for every method with a `rule`), each Jacobi-family loop in its own file.

Adding a decoding rule: one file that defines the rule (and its settings dataclass) and calls
`register_method(Method(name, "tree", ..., rule=rule, decoder=tree_decoder))`; a decoder
shipped with lisa-trt is imported by the package's `speculative/__init__.py` (so importing this
module registers it; no import circle).
Nothing else changes (see docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch

from ..errors import InputError, SpecError, unknown_name
from ..validation import debug_checks
from . import verify as V


# ----------------------------------------------------------------------------- settings

@dataclass(frozen=True)
class TreeConfig:
    """EAGLE-2 dynamic tree budget (defaults follow EAGLE-2 / LANTERN: K 10, depth 4-6, 60 nodes)."""

    top_k: int = 10
    depth: int = 5
    total_tokens: int = 60


@dataclass(frozen=True)
class LanternConfig:
    """LANTERN relaxation: k latent neighbours, total-variation budget delta, residual mode."""

    k: int = 1000
    delta: float = 0.1
    residual: str = "clean"
    gamma: float = 0.0  # uncertainty-modulated budget (docs/spec/lisa.md step 2; 0 = plain LANTERN)


@dataclass(frozen=True)
class GASVRuleConfig:
    """Per-run overrides of the calibrated GASV constants (None: the tables' value)."""

    kappa: Optional[float] = None
    lam: Optional[float] = None
    delta: Optional[float] = None
    neighbours: Optional[int] = None
    scope: Optional[str] = None  # neighbours | cluster | support (ablation)

    def overrides(self) -> dict:
        """GASVConfig fields set here (None fields keep the tables' values)."""
        pairs = (("kappa", self.kappa), ("lam", self.lam), ("delta", self.delta),
                 ("neighbours", self.neighbours), ("scope", self.scope))
        return {k: v for k, v in pairs if v is not None}


# flat (CLI / keyword) name -> (sub-config, field)
FLAT_FIELDS = {"top_k": ("tree", "top_k"), "depth": ("tree", "depth"), "total_tokens": ("tree", "total_tokens"),
               "lantern_k": ("lantern", "k"), "lantern_delta": ("lantern", "delta"),
               "lantern_residual": ("lantern", "residual"), "lantern_gamma": ("lantern", "gamma"),
               "gasv_kappa": ("gasv", "kappa"), "gasv_lambda": ("gasv", "lam"), "gasv_delta": ("gasv", "delta"),
               "gasv_neighbours": ("gasv", "neighbours"), "gasv_scope": ("gasv", "scope")}


@dataclass(frozen=True)
class SpecConfig:
    """Speculation settings: the method plus the parameters of the tree and of each rule.

    `lisa-trt` picks per-backend tree budgets from the measured cost curve (bench/).
    Build from flat keywords with `SpecConfig.make(method, top_k=..., lantern_delta=...)`.
    """

    method: str = "gasv"
    tree: TreeConfig = field(default_factory=TreeConfig)
    lantern: LanternConfig = field(default_factory=LanternConfig)
    gasv: GASVRuleConfig = field(default_factory=GASVRuleConfig)
    # settings of methods registered with their own `settings` dataclass: ((key, instance), ...)
    # (only the ones changed from their defaults; read them with `settings(name)`)
    rules: tuple = ()

    def __post_init__(self):
        if self.method not in METHODS:
            raise InputError(f"unknown verification method {self.method!r}; valid: {', '.join(METHODS)}")

    def settings(self, name: str):
        """The settings dataclass of registered method (or settings group) `name` (its defaults unless changed)."""
        key = _settings_key(name)
        if key not in _SETTINGS:
            raise InputError(f"method {name!r} has no registered settings; with settings: {', '.join(_SETTINGS)}")
        got = dict(self.rules).get(key)
        return _SETTINGS[key]() if got is None else got

    def _sub(self, key: str):
        return getattr(self, key) if key in _BUILTIN_SUBS else self.settings(key)

    @classmethod
    def make(cls, method: str = "gasv", **flat) -> "SpecConfig":
        """From flat names (FLAT_FIELDS: top_k, depth, lantern_delta, gasv_kappa ...); None = default."""
        return cls(method=method).replace(**flat)

    def replace(self, **flat) -> "SpecConfig":
        """A copy with flat-named fields changed (None values are ignored)."""
        subs = {}
        for name, value in flat.items():
            if name == "method":
                continue
            if name not in FLAT_FIELDS:
                raise InputError(f"unknown speculation setting {name!r}; valid: {', '.join(FLAT_FIELDS)}")
            if value is None:
                continue
            sub, f = FLAT_FIELDS[name]
            subs.setdefault(sub, {})[f] = value
        new = {k: dataclasses.replace(self._sub(k), **v) for k, v in subs.items() if k in _BUILTIN_SUBS}
        rules = dict(self.rules)
        rules.update({k: dataclasses.replace(self._sub(k), **v) for k, v in subs.items() if k not in _BUILTIN_SUBS})
        if rules:
            new["rules"] = tuple(sorted(rules.items()))
        if flat.get("method") is not None:
            new["method"] = flat["method"]
        return dataclasses.replace(self, **new)

    def flat(self) -> dict:
        """{flat name: value} (bench reports, CLI defaults)."""
        return {n: getattr(self._sub(s), f) for n, (s, f) in FLAT_FIELDS.items()}


_BUILTIN_SUBS = ("tree", "lantern", "gasv")
_SETTINGS: dict = {}  # settings key -> settings dataclass, filled by register_method


def _settings_key(name: str) -> str:
    return name.replace("-", "_")


# ----------------------------------------------------------------------------- rules

@dataclass
class RuleContext:
    """What a verification rule may read besides the logits and the tree."""

    spec: SpecConfig
    greedy: bool
    generator: Optional[torch.Generator]
    tables: object = None
    gasv: object = None
    # set by the tree decoder for methods with a `session` (e.g. coupled drafting):
    session: object = None  # the method's per-decode state (Method.session)
    rows: Optional[torch.Tensor] = None  # (B,) original batch rows of the verified rows
    token_index: Optional[torch.Tensor] = None  # (B, N) image-token index each node's law predicts

    def require_tables(self, what: str):
        if self.tables is None:
            raise InputError(f"{what} verification needs calibration tables: pass --tables "
                             "(make them with `lisa-trt calibrate`)")
        return self.tables


def exact_rule(logits, tree, ctx: RuleContext):
    """Exact speculative sampling (lossless); argmax of the logits themselves when greedy."""
    if ctx.greedy:  # the same argmax as the reference loop (softmax can tie)
        return V.verify_greedy(logits, tree)
    return V.verify_exact(torch.softmax(logits, -1), tree, ctx.generator)


def lantern_rule(logits, tree, ctx: RuleContext):
    """LANTERN: relaxed acceptance over latent neighbours (tables' lantern_neighbors)."""
    s = ctx.spec.lantern
    p = torch.softmax(logits, -1)
    nb = ctx.require_tables("LANTERN").lantern_neighbors
    k = min(s.k, nb.shape[1])
    dn = V.lantern_delta_eff(logits, s.delta, s.gamma) if s.gamma else None
    if ctx.greedy:
        return V.verify_lantern_greedy(p, tree, nb, k=k, delta=s.delta, delta_nodes=dn)
    return V.verify_lantern(p, tree, ctx.generator, nb, k=k, delta=s.delta, residual=s.residual, delta_nodes=dn)


def gasv_rule(logits, tree, ctx: RuleContext):
    """LISA's GASV v2 (draft-anchored, docs/spec/lisa.md): per parent node, gated neighbour mass
    moves onto each drafted child (the GASV engine when given, else the torch reference)."""
    from .gasv import gasv_gates

    B, N, Vv = logits.shape
    cfg = ctx.gasv.config if ctx.gasv is not None else ctx.require_tables("GASV").config
    over = ctx.spec.gasv.overrides()
    if over:
        cfg = dataclasses.replace(cfg, **over)
    offs = torch.arange(B, device=tree.parents.device)[:, None] * N
    tok = tree.tokens.clamp(min=0).reshape(-1)
    par = torch.where(tree.parents >= 0, tree.parents + offs, -1).reshape(-1)
    if ctx.gasv is not None and cfg.scope == "neighbours":
        out = ctx.gasv(logits.reshape(B * N, Vv), tok, par, cfg)
    else:
        out = gasv_gates(logits.reshape(B * N, Vv), tok, par, ctx.require_tables("GASV"), cfg,
                         check_inputs=debug_checks())  # the decode checked its logits where they entered
    K = out.cand.shape[-1]
    p, cand, gate = out.p.reshape(B, N, Vv), out.cand.reshape(B, N, K), out.gate.reshape(B, N, K)
    if ctx.greedy:
        return V.verify_gasv_greedy(p, tree, cand, gate, out.delta_eff.reshape(B, N))
    return V.verify_gasv(p, tree, ctx.generator, cand, gate, out.delta_eff.reshape(B, N))


# ----------------------------------------------------------------------------- registry

@dataclass(frozen=True)
class MethodOption:
    """A CLI option a method reads: `--flag` sets SpecConfig flat field `name`."""

    flag: str
    name: str
    type: type
    help: str = ""
    aliases: tuple = ()  # further flags for the same setting (e.g. --gasv-kappa for --kappa)


@dataclass(frozen=True)
class Method:
    """One decoding method (see the module docstring)."""

    name: str
    kind: str  # "tree" | "ar" | "sjd"
    doc: str
    needs_drafter: bool = False
    needs_tables: bool = False
    rule: Optional[Callable] = None
    greedy_sampling: bool = False
    options: tuple = ()
    # (target) -> (target proxy, drafter): a method that brings its own drafter (the oracle)
    drafter_factory: Optional[Callable] = None
    settings: Optional[type] = None  # frozen dataclass of the method's own knobs (module docstring)
    # (target, drafter, tables, gasv, spec) -> Decoder: the method's decode loop (speculative/session.py)
    decoder: Optional[Callable] = None
    # "sjd" methods: the loop takes `seeds=` (one generator per row), so served rows batch (ZipAR);
    # the others decode a batch=True request row by row, each with its own seed
    row_seeds: bool = False
    # tree methods: per-decode state `session(batch=, vocab=, generator=, device=, spec=) -> obj`
    # made once per generate call (not for greedy sampling); obj.sample(logits (B, V), token_index
    # (B,), rows) draws the target's first token, obj.draft(logprobs (B, n, V), token_index (B, n),
    # rows) transforms every drafter law the tree is built from; the rule reads it as ctx.session
    session: Optional[Callable] = None
    # capabilities the runtime reads instead of the kind (None: the kind's default, `KIND_DEFAULTS`)
    uses_tree: Optional[bool] = None  # reads SpecConfig.tree (the draft tree budget: recorded, reported)
    baseline: Optional[bool] = None  # the plain one-token-per-step loop: MAL 1, bench's speed-up baseline

    def __post_init__(self):
        if self.kind not in KIND_DEFAULTS:
            raise SpecError(f"method kind must be one of {', '.join(KIND_DEFAULTS)}, got {self.kind!r}")
        for cap, default in KIND_DEFAULTS[self.kind].items():
            if getattr(self, cap) is None:
                object.__setattr__(self, cap, default)
        if (self.kind == "tree") != (self.rule is not None):
            raise SpecError(f"method {self.name}: tree methods (only) need a rule")
        if self.row_seeds and self.kind != "sjd":
            raise SpecError(f"method {self.name}: row_seeds describes an sjd method's own loop")
        if self.session is not None and self.kind != "tree":
            raise SpecError(f"method {self.name}: only tree methods take a session")
        if self.settings is not None and not (dataclasses.is_dataclass(self.settings)
                                              and self.settings.__dataclass_params__.frozen):
            raise SpecError(f"method {self.name}: settings must be a frozen dataclass")
        if not callable(self.decoder):
            raise SpecError(f"method {self.name}: give its decode loop, decoder=(target, drafter, tables, gasv, spec) "
                            "-> Decoder (speculative/session.py; a tree rule: decode.tree_decoder)")
        bind = getattr(self.decoder, "bind", None)
        if bind is not None:  # a decoder factory shared by many methods (tree_decoder) takes this one
            object.__setattr__(self, "decoder", bind(self))

    @property
    def takes_row_seeds(self) -> bool:
        """The loop draws each row from its own generator (`seeds=`), so served rows batch and an
        image is the same alone or in a batch; False: its rows decode alone, from one stream."""
        return self.kind != "sjd" or self.row_seeds

    @property
    def spec_name(self) -> str:
        """The `SpecConfig.method` a spec for this method carries: its own name when it reads the
        tree, else the first registered tree method's (its rule parameters then go unused)."""
        if self.uses_tree:
            return self.name
        return next(m.name for m in METHODS.values() if m.uses_tree)

    def describe(self, spec: "SpecConfig") -> str:
        """The settings this method decodes with under `spec`, as a progress line shows them
        ("" for the plain loop): the Jacobi window, or the draft tree budget."""
        if self.uses_tree:
            t = spec.tree
            return f"draft tree top-k {t.top_k} / depth {t.depth} / {t.total_tokens} nodes"
        if self.kind == "sjd":
            return f"Jacobi window {spec.settings('sjd').window}"
        return ""


# each kind's capabilities (Method fields left None take them)
KIND_DEFAULTS = {"tree": {"uses_tree": True, "baseline": False},
                 "ar": {"uses_tree": False, "baseline": True},
                 "sjd": {"uses_tree": False, "baseline": False}}


METHODS: dict[str, Method] = {}
AUTO = "auto"  # verify="auto": a bundle's recorded never-slower choice (runtime/pipeline.Pipeline.resolve_verify)


def _register_settings(key: str, settings: type, what: str) -> None:
    """Register the flat names `<key>_<field>` of a settings dataclass (replacing any old ones)."""
    if key in _BUILTIN_SUBS:
        raise SpecError(f"{what}: settings key {key!r} is taken by SpecConfig")
    for name in [n for n, (s, _) in FLAT_FIELDS.items() if s == key]:
        del FLAT_FIELDS[name]  # re-registration replaces the old settings
    _SETTINGS[key] = settings
    for f in dataclasses.fields(settings):
        FLAT_FIELDS[f"{key}_{f.name}"] = (key, f.name)


def _check_options(options, what: str) -> None:
    for o in options:
        if o.name not in FLAT_FIELDS:
            raise SpecError(f"{what}: option {o.flag} names unknown setting {o.name!r}")


def register_method(method: Method) -> Method:
    """Add (or replace) a method; it is then valid for decode, Pipeline, bench and the CLI.

    A method with `settings` registers the flat names `<key>_<field>` of its settings' fields
    (key: the name with '-' written '_'); every option must name a known flat field."""
    if method.settings is not None:
        _register_settings(_settings_key(method.name), method.settings, f"method {method.name}")
    _check_options(method.options, f"method {method.name}")
    METHODS[method.name] = method
    return method


def unregister_method(name: str) -> None:
    """Remove a method and the flat names of its settings (tests, plugins that unload)."""
    m = METHODS.pop(name)
    if m.settings is not None:
        key = _settings_key(name)
        _SETTINGS.pop(key, None)
        for n in [n for n, (s, _) in FLAT_FIELDS.items() if s == key]:
            del FLAT_FIELDS[n]


def get_method(name: str) -> Method:
    m = METHODS.get(name)
    if m is None:
        raise unknown_name("method", name, METHODS)
    return m


def baseline_method() -> Method:
    """The first registered baseline (the plain autoregressive loop): bench's speed-up baseline,
    `lisa-trt generate`'s default method."""
    m = next((m for m in METHODS.values() if m.baseline), None)
    if m is None:
        raise SpecError("no baseline method is registered (speculative/autoregressive.py registers vanilla)")
    return m


def resolve_method(verify, *, auto: bool = False, default: Union[str, Method, None] = None,
                   noun: str = "verification") -> Optional[Method]:
    """A decoding method name (or a Method) -> the registered Method: the one resolver of a name that
    the entry points share (runtime/context.resolve, Pipeline.method, the bench's parse_methods).

    Args:
        verify: a registered name, a Method (returned as is), None (then `default`: a name or a
            Method), or "auto" when `auto` is True (returns None: a bundle decides,
            runtime/pipeline.Pipeline.resolve_verify).
        noun: how the error names the value ("verification", "verify rule").
    Raises:
        InputError: an unknown name, listing the valid ones.
    """
    verify = default if verify is None else verify
    if isinstance(verify, Method):
        return verify
    if verify is None or (auto and verify == AUTO):
        return None
    m = METHODS.get(verify)
    if m is None:
        raise InputError(f"unknown {noun} {verify!r}; valid: {'auto, ' if auto else ''}{', '.join(method_names())}")
    return m


def method_names(kind: Optional[str] = None) -> list:
    """Registered names (in registration order), optionally of one kind."""
    return [n for n, m in METHODS.items() if kind is None or m.kind == kind]


def cli_options() -> list:
    """Every MethodOption of the registered methods (each flag once)."""
    seen, out = set(), []
    for m in METHODS.values():
        for o in m.options:
            if o.flag not in seen:
                seen.add(o.flag)
                out.append(o)
    return out


# The methods register beside their decoders: vanilla (autoregressive.py), the tree rules above
# (decode.py), sjd, oracle and the others in their own files, imported in that order by
# speculative/__init__.py (the method list's order)

__all__ = ["AUTO", "FLAT_FIELDS", "GASVRuleConfig", "KIND_DEFAULTS", "LanternConfig", "METHODS", "Method", "MethodOption",
           "RuleContext", "SpecConfig", "TreeConfig", "baseline_method", "cli_options", "exact_rule", "gasv_rule",
           "get_method", "lantern_rule", "method_names", "register_method", "resolve_method",
           "unregister_method"]
