"""The embeddable API: load an engine directory once, generate many times.

    pipe = lisa_trt.Pipeline.from_dir("engines/demo", backend="auto")
    result = pipe.generate(["coffee", 3], seed=0)              # verify="auto": the bundle's recorded choice
    result = pipe.generate(["coffee", 3], seed=0, verify="gasv")  # or a method by name
    result.images[0].save("coffee.png"); result.stats[0]["mal"]

Thread safety: a Pipeline owns its engines (ORT sessions / TensorRT contexts) and decodes one
request at a time; `generate` takes an internal lock, so one Pipeline may be shared by the
threads of a service (calls are serialised). For parallel decoding create one Pipeline per
worker (ORT sessions are then independent; on one GPU, prefer batching prompts in one call).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import torch

from ..config import SamplingConfig
from ..errors import InputError
from ..models.family import family_of
from ..speculative.methods import Method, SpecConfig, resolve_method
from .bundle import Bundle, open_bundle
from .conditions import run_conditions
from .context import AUTO, TREE_NAMES, RunContext, resolve_sampling, resolve_spec
from .prompts import Prompt
from .seeding import image_seed


@dataclass
class GenerationResult:
    """images: PIL images (one per prompt); tokens (B, N); stats: one dict per prompt; codes: the
    code grids of a prompted family's tokens (family.tokens_to_codes)."""

    images: list
    tokens: torch.Tensor
    stats: list = field(default_factory=list)
    codes: Optional[torch.Tensor] = None  # prompted families: the VQ code grids (B, h, w) of `tokens`


def _default_knobs(sjd_window: Optional[int]) -> dict:
    """A Pipeline's default method knobs, checked by their settings (InputError naming the option)."""
    knobs = {} if sjd_window is None else {"sjd_window": sjd_window}
    resolve_spec(None, knobs=knobs)
    return knobs


def _tree_budget(generation: dict, backend: str) -> dict:
    """Per-backend tree defaults recorded at export (from the measured cost curve)."""
    trees = generation.get("tree", {})
    return trees.get(backend, trees.get("default", {}))


@dataclass(frozen=True)
class _Call:
    """One decode call of a request: rows start:stop under one SamplingConfig, drawn from one
    generator seeded with `seed`, or from one generator per row (`seeds`); `tags`: what each
    row's stats record of its seed and batch."""

    start: int
    stop: int
    sampling: SamplingConfig
    seed: int
    seeds: Optional[list] = None
    tags: tuple = ()


def _batch_cfg(overrides: list) -> Optional[float]:
    """The one CFG scale the prompts of a batch set (None: none set); InputError for several."""
    cfgs = {ov.get("cfg") for ov in overrides if ov.get("cfg") is not None}
    if len(cfgs) > 1:
        raise InputError(f"batch=True decodes one CFG scale, got {sorted(cfgs)}; "
                         "group prompts by cfg (or use batch=False)")
    return cfgs.pop() if cfgs else None


def _alone(method: Method, i: int, sampling: SamplingConfig, seed: int, tag: dict) -> _Call:
    """Image i decoded by itself: from one generator of its own (sampling.RowGenerators, the
    generator a batch row gets, so the image is the one it is in any batch), or, for a Jacobi loop
    without per-row generators, from one stream seeded with `seed` (that loop's rows always
    decode alone)."""
    return _Call(i, i + 1, sampling, seed, [seed] if method.takes_row_seeds else None, (tag,))


def _sampling_of(plan, cfg: Optional[float]) -> SamplingConfig:
    """A prompt's (or the batch's) CFG scale over the plan's sampling (None: the plan's)."""
    return plan.sampling if cfg is None else dataclasses.replace(plan.sampling, cfg_scale=cfg)


def _calls(plan, overrides: list, *, batch: bool, row_seeds: bool) -> list:
    """A request's decode calls under `plan` (Pipeline.generate's batch / row_seeds semantics).

    Every image follows the seeding rule (runtime/seeding.py, `_alone`), so batch=False (one call per
    prompt, its own CFG scale) and batch=True (one call over every row, one generator per row)
    give the same images. row_seeds=False is the one exception: the whole batch draws from one
    stream seeded with the plan's seed (the rows then depend on the batch)."""
    method, seed = plan.method, plan.seed
    seeds = [image_seed(seed, i, ov.get("seed")) for i, ov in enumerate(overrides)]
    n = len(seeds)
    if not batch:
        return [_alone(method, i, _sampling_of(plan, ov.get("cfg")), sd, {"seed": sd})
                for i, (ov, sd) in enumerate(zip(overrides, seeds))]
    s = _sampling_of(plan, _batch_cfg(overrides))
    if row_seeds and not method.takes_row_seeds:
        return [_alone(method, i, s, sd, {"seed": sd, "batch_row": i}) for i, sd in enumerate(seeds)]
    if row_seeds:
        return [_Call(0, n, s, seeds[0], seeds, tuple({"seed": sd, "batch": n, "batch_row": b}
                                                      for b, sd in enumerate(seeds)))]
    return [_Call(0, n, s, seed, tags=tuple({"seed": seed, "batch": n, "batch_row": b} for b in range(n)))]


def _row_stats(s, timing: dict, call: _Call) -> list:
    """One stats dict per row of a decode call: the call's DecodeStats (per row when each row has
    its own generator), `timing` (seconds, verify), the row's tags and `forwards`: the target
    forwards the decoder ran while the row was decoding (its prefill and its own steps)."""
    n, per_row = len(call.tags), len(s.rows) == len(s.committed) > 0  # a loop that records each step's rows
    forwards = [s.row(b)["steps"] + 1 for b in range(n)] if n > 1 and per_row else [s.target_forwards] * n
    if call.seeds is None:
        st = {**s.as_dict(), **timing}
        return [{**st, **tag, "forwards": f} for tag, f in zip(call.tags, forwards)]
    return [{**s.row(b), **s.settings, **timing, **tag, "batch_target_forwards": s.target_forwards,
             "forwards": forwards[b]} for b, tag in enumerate(call.tags)]


class PartialDecode:
    """One decode step of rows start.. of a Pipeline.generate call (its `on_step` hook).

    tokens (B, N) and done (B,) are the loop's own (read them during the call): row b has committed
    tokens[b, :done[b]]. `codes()` fills every token past the prefix with the row's first free
    token (a forced token keeps its id), so the grid decodes like a finished one; `images()` are
    the VQ decoder's images of those codes (the rows decoded so far, the filler below them)."""

    def __init__(self, pipe, start: int, tokens, done, layout, request):
        self.pipe, self.start, self.layout, self.request = pipe, start, layout, request
        self.tokens, self.done = tokens.detach().cpu(), done.detach().cpu()

    def filled(self) -> torch.Tensor:
        """(B, N) the committed tokens, the rest the row's first free token (forced ids kept)."""
        t = self.tokens.clone()
        forced = None if self.layout is None or self.layout.forced is None else self.layout.forced.cpu()
        first = 0 if forced is None else int(torch.nonzero(forced < 0)[0, 0])
        if bool((self.done <= first).any()):
            raise InputError("a partial image needs each row's first free token decoded (the filler); "
                             "ask for it after that step, as PartialImages does")
        past = torch.arange(t.shape[1])[None] >= self.done[:, None]
        fill = t[:, first:first + 1].expand_as(t)
        if forced is not None:
            fill = torch.where(forced[None] >= 0, forced[None], fill)
        return torch.where(past, fill, t)

    def codes(self) -> torch.Tensor:
        """The filled tokens as the VQ decoder's input (a prompted family's code grids)."""
        t = self.filled()
        if self.request is None:
            return t
        return self.pipe.family.tokens_to_codes(self.pipe._e.target, t, self.request)

    def images(self) -> list:
        return self.pipe.decode(self.codes())


class Pipeline:
    """Tree speculation + GASV over one set of engines (see module docstring)."""

    def __init__(self, engines: Bundle, text_encoder=None, *, sjd_window: Optional[int] = None, conditions=None):
        self._e = engines
        self._lock = threading.Lock()
        self._text = None
        self._knobs = _default_knobs(sjd_window)
        tc = engines.target.config
        self.family = engines.family if engines.family is not None else family_of(tc)  # resolved once per open
        # what prompts are (class ids, captions, texts): the run's adapter when it built one, else built here
        self._conds = conditions if conditions is not None else run_conditions(self.family, tc)
        self._names = self._conds.class_names(engines.class_names)  # a 1000-class bundle: ImageNet's
        self._text = self._conds.encoder(text_encoder, tc)
        self._free = None  # the family's whole-image layout, made on the first decode without a request

    # -- construction --------------------------------------------------------------------

    @classmethod
    def from_dir(cls, engine_dir, backend: str = "auto", *, threads: Optional[int] = None,
                 text_encoder=None, compile=None, device: Optional[str] = None,
                 sjd_window: Optional[int] = None, manifest=None, family=None, conditions=None) -> "Pipeline":
        """Open an exported engine directory (`lisa-trt export`); its manifest is parsed once.

        Args:
            engine_dir: the directory, or a Hugging Face name `org/name[@revision]` of one
                (resolved through the local HF cache, models/hub.py).
            backend: "trt" (built engines, TensorRT + GPU), "ort" (ONNX Runtime), "torch"
                (the bundle's PyTorch weights), or "auto": trt when engines are built and
                TensorRT is usable, else ort.
            threads: torch and ORT intra-op threads (default: `lisa_trt.threads` policy, i.e.
                $LISA_TRT_THREADS or the CPUs this process may use; idle threads sleep).
            text_encoder: t2i: a local T5 directory (or CaptionEncoder) so that prompts may be
                caption strings (default $LISA_TRT_TEXT_ENCODER; else feature files only).
            compile: torch backend only: torch.compile the per-step graphs ("default" = Inductor,
                "cuda-graphs" = Inductor + CUDA-graph capture on CUDA, True = the device's best).
            device: torch backend only: run the bundle's graph wrappers on this device ("cuda").
            sjd_window: the Jacobi window of this pipeline's SJD-family decodes (sjd, mcsjd, sjd-pac,
                gsd, sjd-gasv) when a `generate` call does not pass one (None: 16, speculative/sjd.py).
            manifest / family / conditions: the directory's Manifest, model family and conditions
                adapter when the caller has resolved them (runtime/context.resolve: `RunContext.manifest`,
                `.family`, `.conditions`); handed down, not read, looked up or built again.
        """
        from ..engines.base import backend_names
        from ..models.hub import resolve_model
        from ..threads import ensure_thread_policy

        valid = ["auto", "torch"] + [b for b in backend_names() if b != "torch"]
        if backend not in valid:
            raise InputError(f"unknown backend {backend!r}; valid: {', '.join(valid)}")
        _default_knobs(sjd_window)  # checked before any engine loads
        engine_dir = resolve_model(engine_dir)  # the resolve step's source (a Hub name: its snapshot)
        threads = ensure_thread_policy(threads)
        if text_encoder is not None:  # t2i: check the encoder against the bundle before loading engines
            if manifest is None:
                from ..export.manifest import read_manifest

                manifest = read_manifest(Path(engine_dir), check_files=False)  # open_bundle checks its files
            tcfg = manifest.target_config
            family = family if family is not None else manifest.model_family
            conditions = conditions if conditions is not None else run_conditions(family, tcfg)
            text_encoder = conditions.encoder(text_encoder, tcfg) or text_encoder
        return cls(open_bundle(Path(engine_dir), backend, threads=threads, compile=compile, device=device,
                               manifest=manifest, family=family),
                   text_encoder=text_encoder, sjd_window=sjd_window, conditions=conditions)

    @classmethod
    def from_models(cls, target, drafter=None, tables=None, vq=None, *, class_names=None,
                    generation: Optional[dict] = None, threads: Optional[int] = None,
                    text_encoder=None, sjd_window: Optional[int] = None) -> "Pipeline":
        """A torch-backend pipeline over in-memory models (no export needed).

        threads: torch intra-op threads (default: the `lisa_trt.threads` policy); sjd_window: as in
        `from_dir`."""
        from ..threads import ensure_thread_policy

        ensure_thread_policy(threads)
        return cls(Bundle(target=target, drafter=drafter, tables=tables, vq=vq, class_names=class_names,
                          generation=dict(generation or {}), backend="torch"), text_encoder=text_encoder,
                   sjd_window=sjd_window)

    # -- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """Release the engines (ORT sessions, TensorRT contexts); the Pipeline is unusable after."""
        for e in (self._e.target, self._e.drafter, self._e.gasv, self._e.vq):
            if e is not None and hasattr(e, "close"):
                e.close()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def backend(self) -> str:
        return self._e.backend

    @property
    def config(self):
        return self._e.target.config

    @property
    def conditions(self):
        """What this bundle's prompts are (runtime/conditions.py: its kind's adapter, resolved once)."""
        return self._conds

    @property
    def class_names(self):
        """The names a class prompt may use: the bundle's own, else ImageNet's for 1000 classes."""
        return self._names

    # -- generation ----------------------------------------------------------------------

    def _cond(self, prompts) -> tuple:
        """Class ids / names, captions or text prompts (or Prompt objects) -> (condition,
        per-prompt overrides, per-prompt labels for the stats), as the target's kind takes them."""
        return self._conds.parse(prompts, self.config, self.class_names, self._text)

    @property
    def precision(self) -> str:
        """The key of the bundle's recorded decode choices: its quantization (int8 / int4) if any,
        else its graphs' precision (fp32 / fp16); fp32 for in-memory models."""
        man = self._e.manifest
        if man is None:
            return "fp32"
        q = getattr(man, "quantization", None) or "none"
        return q if q != "none" else man.precision

    def resolve_verify(self, verify: str = AUTO, requested: Optional[str] = None) -> tuple[str, dict, str]:
        """`verify` -> (method, tree settings, why).

        "auto" is the bundle's recorded never-slower choice for this backend and precision
        (runtime/autotune.auto_method: vanilla, or the fastest timed decoder that kept quality with
        its recorded knobs, or `requested` with the recorded tree when a tree won); a bundle with no
        recorded choice, or one measured with another drafter than the bundle's, runs `requested`
        (default: gasv when the bundle has a drafter and tables, exact with a drafter alone, else
        vanilla). Any other name is returned as is, with the knobs the bundle measured for it
        (autotune.recorded_knobs: the demo's zipar window 4), applied under explicit ones.
        """
        if isinstance(verify, Method):
            verify = verify.name
        from .autotune import auto_method, default_auto_method, recorded_knobs

        man = self._e.manifest
        drafter_hash = (man.drafter or {}).get("hash") if man is not None else None
        if verify != AUTO:  # the bundle's measured knobs of this method are its defaults here too
            knobs = recorded_knobs(self._e.generation, self._e.backend, self.precision, verify, drafter_hash)
            return verify, knobs, f"{verify} (asked for)"
        if requested is None:
            requested = default_auto_method(self._e.drafter is not None,
                                            self._e.tables is not None or self._e.gasv is not None)
        method, tree, why = auto_method(self._e.generation, self._e.backend, self.precision, requested, drafter_hash)
        return method, dict(tree or {}), why

    def sampling(self, base: Optional[SamplingConfig] = None, **over) -> SamplingConfig:
        """The bundle's sampling defaults (or `base`), with the `over` values that are set applied.

        The bundle's: its recorded `generation["sampling"]` (or flat sampling keys of `generation`)
        over the family's own defaults (models/family.py `default_sampling`)."""
        if base is None:
            gen = self._e.generation
            base = {**self.family.default_sampling, **{k: v for k, v in gen.items() if not isinstance(v, dict)},
                    **gen.get("sampling", {})}
        return resolve_sampling(base, check=False, **over)

    def _source(self):
        """Where the family prompter finds its tokenizer: the engine directory, else the checkpoint's."""
        man = self._e.manifest
        return Path(man.dir) if man is not None and getattr(man, "dir", None) else None

    def check_prompt(self, text: str, negative: Optional[str] = None) -> None:
        """InputError naming the fix when a prompted family's text prompt (or its negative text, CFG's
        row) does not fit the engine directory's prompt budget (its ExportFamily.prefill_max_seq:
        `lisa-trt export --max-prompt`); serve checks each row with it, so one long prompt does not
        fail its batch-mates."""
        man = self._e.manifest
        xf = getattr(man, "export_family", None) if man is not None else None
        budget = xf.prefill_max_seq(getattr(man, "layout", None)) if xf is not None else None
        if budget is None:  # no prompt budget (class ids, caption features)
            return
        target = self._e.target
        n = target.prompt_len(self._request([text], SamplingConfig(cfg_scale=1.0)).cond)  # the bundle's size
        if n > budget:
            raise InputError(f"the prompt is {n} tokens; this engine directory takes at most {budget} "
                             "(shorten it, or re-export with a larger --max-prompt)")
        if negative is not None:  # the negative text's row of the CFG prefill
            req = self._request([text], SamplingConfig(cfg_scale=2.0), [negative])
            n = target.prompt_len(target.null_cond(req.cond))
            if n > budget:
                raise InputError(f"negative_prompt is {n} tokens; this engine directory takes at most {budget} "
                                 "(shorten it, or re-export with a larger --max-prompt)")

    def _request(self, texts, sampling: SamplingConfig, negative=None):
        """A prompted family's Request for `texts` (the bundle's image size, or `generation["image_size"]`
        of in-memory models, else the family's; CFG rows when guided, from `negative`'s texts where
        a row has one)."""
        from ..speculative.sampling import cfg_active

        man = self._e.manifest
        size = (getattr(man, "layout", None) or {}).get("image_size") if man is not None else None
        size = self._e.generation.get("image_size") if size is None else size  # from_models(generation=...)
        neg = {} if negative is None or all(t is None for t in negative) else {"negative": list(negative)}
        return self.family.prompter(self._e.target, self._source()).encode(
            list(texts), image_size=size, cfg=cfg_active(sampling.cfg_scale), **neg)

    def spec(self, verify, **over) -> SpecConfig:
        """The bundle's tree budget for this backend, with `over` (flat SpecConfig names) applied;
        None values in `over` keep the bundle's setting. `verify`: a Method, or a name (`method`)."""
        verify = verify if isinstance(verify, Method) else self.method(verify)[0]
        tree = {k: v for k, v in over.items() if k in TREE_NAMES}
        knobs = {k: v for k, v in over.items() if k not in TREE_NAMES}
        default = _tree_budget(self._e.generation, self._e.backend) or self.family.default_tree
        return resolve_spec(verify, tree=tree, tree_default=default, knobs=knobs)

    def generate(self, prompts: Sequence[Union[int, str, Prompt]], *, seed: int = 0, verify: Union[str, Method] = AUTO,
                 cfg_scale: Optional[float] = None, temperature: Optional[float] = None,
                 top_k: Optional[int] = None, top_p: Optional[float] = None, greedy: bool = False,
                 batch: bool = False, row_seeds: bool = True, decode: bool = True, progress: bool = False,
                 sampling: Optional[SamplingConfig] = None, on_step=None, negative_prompt=None,
                 plan: Optional[RunContext] = None, **tree) -> GenerationResult:
        """Generate one image per prompt.

        Args:
            prompts: class ids, class names, or Prompt objects (per-prompt seed / cfg); for t2i
                caption strings (needs text_encoder) or Prompt(caption=... | caption_features=FILE);
                for a prompted family (Lumina-mGPT, Janus-Pro) caption strings or Prompt(caption=...).
            seed: base seed; prompt i uses its own seed or seed + i.
            verify: a registered method (speculative/methods.py: vanilla, greedy, exact, lantern,
                gasv, sjd, ...) or its Method, or "auto" (the default): the bundle's recorded
                never-slower choice for this backend and precision (`resolve_verify`; the stats say
                what ran and why). Explicit tree settings below still win over the recorded tree.
            cfg_scale, temperature, top_k, top_p, greedy: override the bundle's defaults.
            sampling: a SamplingConfig used instead of the bundle's defaults (the values above and a
                prompt's own cfg still override it).
            batch: decode all prompts as one batch (the serving path) instead of one call per
                prompt (the CLI's `run`). Either way image i draws from its own generator seeded
                with its prompt seed (else seed + i), so an image is the same alone, in any batch,
                through `lisa-trt run` and through serve (runtime/seeding.py).
            row_seeds: with batch=True, False draws the whole batch from one generator seeded with
                `seed` (the rows then depend on the batch; one call, as `lisa-trt generate` decodes).
            decode: decode tokens to PIL images (needs the VQ decoder).
            progress: show a progress bar (one step per image) on stderr (batch=False).
            on_step: optional `on_step(PartialDecode)` after every decode step (run_method's per-step
                hook): the rows of one decode call, their committed tokens so far and `images()`,
                the images of those tokens (serving's progressive images).
            negative_prompt: a text for every prompt, or one text (None: none) per prompt: CFG's
                unconditional rows are that text encoded by the family's prompter instead of its own
                (families whose conditioning is TextPrompts(negative=True): Emu3, Chameleon /
                Lumina-mGPT, Janus-Pro), or, for T5-caption (t2i) LlamaGen, its caption features from
                the pipeline's text encoder in place of the learned null caption; it acts only under
                CFG (cfg_scale > 1). Other families: InputError naming why (class-conditional CFG runs
                against the null class).
            plan: a run plan (`plan`, or a RunContext `settle`d on this pipeline: `lisa-trt run`'s)
                decoded as is, instead of verify / seed / the sampling and tree arguments (then
                InputError when one of those is given too): nothing is looked up again per call.
            tree: top_k / depth / total_tokens overrides of the tree budget (e.g. depth=3), and
                every registered method's knob by its flat name (speculative/methods.py FLAT_FIELDS):
                gasv_kappa, gasv_lambda, gasv_delta, gasv_neighbours, gasv_scope (None: the tables'
                values), lantern_delta, lantern_gamma, sjd_window (the Jacobi window; None: the
                pipeline's, see `from_dir`), gsd_group, zipar_window, ...
        Returns:
            GenerationResult(images, tokens (B, N), stats).
        """
        if plan is None:
            plan = self.plan(verify, seed=seed, sampling=sampling, cfg_scale=cfg_scale, temperature=temperature,
                             top_k=top_k, top_p=top_p, greedy=greedy, **tree)
        elif verify != AUTO or sampling is not None or tree or greedy or seed != 0 or \
                any(v is not None for v in (cfg_scale, temperature, top_k, top_p)):
            raise InputError("Pipeline.generate takes a plan or its settings (verify, seed, sampling, tree), not both: "
                             "make the plan with them (Pipeline.plan)")
        cond, overrides, labels = self._cond(prompts)
        negative = self._conds.negatives(negative_prompt, len(overrides))  # one text or None per prompt
        cond = self._conds.guided(cond, negative, self._text)  # T5 captions: the negatives' features as null rows
        if negative is not None:
            labels = [{**lab, **({} if t is None else {"negative_prompt": t})} for lab, t in zip(labels, negative)]
        calls = _calls(plan, overrides, batch=batch, row_seeds=row_seeds)
        with self._lock:
            tokens, codes, stats = self._run_calls(plan, cond, calls, progress=progress and not batch,
                                                   on_step=on_step, negative=negative)
            images = self.decode(tokens if codes is None else codes) if decode else []
        stats = [{**st, **labels[i], "verify_reason": plan.why} for i, st in enumerate(stats)]
        return GenerationResult(images=images, tokens=tokens, stats=stats, codes=codes)

    def plan(self, verify: Union[str, Method] = AUTO, *, seed: int = 0, sampling: Optional[SamplingConfig] = None,
             cfg_scale: Optional[float] = None, temperature: Optional[float] = None, top_k: Optional[int] = None,
             top_p: Optional[float] = None, greedy: bool = False, cfg_interval: Optional[int] = None,
             noun: str = "verification", **tree) -> RunContext:
        """The run plan of a request on this bundle (`generate`'s arguments, documented there): the
        Method ("auto" settled, with why), the SamplingConfig over the bundle's defaults, the
        SpecConfig over the bundle's tree, the seed; one frozen object (runtime/context.RunContext)
        that `generate(plan=...)` decodes as is, for any number of calls."""
        from ..validation import API_NAMES, check_sampling

        method, auto_tree, why = self.method(verify, noun)
        check_sampling(cfg_scale=cfg_scale, temperature=temperature, top_k=top_k, top_p=top_p,
                       vocab_size=self.config.vocab_size, names=API_NAMES)  # named as this API takes them
        s = self.sampling(sampling, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k, top_p=top_p,
                          greedy=greedy or None, cfg_interval=cfg_interval)
        return RunContext(source=self._source(), family=self.family, method=method, sampling=s,
                          spec=self._call_spec(method, auto_tree, dict(tree)), seed=seed, backend=self.backend,
                          target=self._e.target, manifest=self._e.manifest, why=why, conds=self._conds)

    def method(self, verify, noun: str = "verification") -> tuple[Method, dict, str]:
        """`verify` (a Method, a registered name, "auto" or None: auto) -> (the Method that runs, the
        recorded tree and knobs of "auto", why). A Method is used as is; a name, or the one "auto"
        picks, is looked up once (`noun`: how an unknown name is called in the error)."""
        if isinstance(verify, Method):
            method, auto_tree, why = verify, {}, f"{verify.name} (asked for)"
        else:
            name, auto_tree, why = self.resolve_verify(AUTO if verify is None else verify)
            method = resolve_method(name, auto=True, noun=noun)  # the one lookup by name
        self._check_artifacts(method)
        return method, auto_tree, why

    def _check_artifacts(self, method: Method) -> None:
        """InputError in this API's words when `method` needs a drafter / tables the pipeline lacks
        (the decode loop's own message names the CLI's --drafter / --tables)."""
        e = self._e
        if method.needs_drafter and e.drafter is None and method.drafter_factory is None:
            raise InputError(f"verify={method.name!r} needs a drafter and this pipeline has none (an engine directory "
                             "exported with one, or Pipeline.from_models(target, drafter, ...)); or verify='vanilla'")
        if method.needs_tables and e.tables is None and e.gasv is None:
            raise InputError(f"verify={method.name!r} needs calibration tables: Pipeline.from_models(target, drafter, "
                             "tables, ...) or Pipeline.from_dir of a bundle exported with them; or verify='exact'")

    def _call_spec(self, method: Method, auto_tree: dict, tree: dict) -> SpecConfig:
        """A call's SpecConfig: its tree and knob settings over the pipeline's knobs
        (from_dir(sjd_window=...)) over "auto"'s recorded tree and knobs."""
        given = {"top_k": tree.pop("tree_top_k", None), "depth": tree.pop("tree_depth", None),
                 "total_tokens": tree.pop("tree_tokens", None), **tree}
        for defaults in (self._knobs, auto_tree):
            for k, v in defaults.items():
                if given.get(k) is None:
                    given[k] = v
        return self.spec(method, **given)

    def _run_calls(self, plan: RunContext, cond, calls: list, *, progress: bool, on_step=None,
                   negative=None) -> tuple:
        """Every decode call of a request, in row order -> (tokens (B, N), a prompted family's code
        grids (B, h, w) or None, one stats dict per row)."""
        from ..progress import progress_bar

        outs, codes, stats = [], [], []
        bar = progress_bar(calls[-1].stop, progress, unit="image")
        for call in calls:
            toks, st, code = self._run(plan, cond, call, on_step, negative)
            outs.append(toks)
            if code is not None:
                codes.append(code)
            stats.extend(st)
            bar.update(call.stop - call.start)
        bar.close()
        return torch.cat(outs), torch.cat(codes) if codes else None, stats

    def _run(self, plan: RunContext, cond, call: _Call, on_step=None, negative=None) -> tuple:
        """Rows call.start:call.stop of `cond` decoded in one call (runtime/runner.decode) -> (tokens,
        one stats dict per row, a prompted family's code grids or None); a prompted family's rows are
        encoded as a request of their own (their own left padding, their negative texts)."""
        from ..speculative.run import check_artifacts
        from .runner import decode

        e = self._e
        neg = None if negative is None else negative[call.start:call.stop]
        rows, req = self._conds.rows(cond, call.start, call.stop,
                                     lambda texts: self._request(texts, call.sampling, neg))
        layout = getattr(req, "layout", None)
        check_artifacts(plan.method, e.drafter, e.tables, e.gasv)
        hook = None
        if on_step is not None:
            def hook(tokens, done):
                on_step(PartialDecode(self, call.start, tokens, done, layout, req))
        t0 = time.perf_counter()
        toks, s = decode(plan, e, rows, sampling=call.sampling, seed=call.seed, seeds=call.seeds,
                         layout=layout if layout is not None else self._free_layout(), on_step=hook)
        stats = _row_stats(s, {"seconds": time.perf_counter() - t0, "verify": plan.method.name}, call)
        toks = toks.cpu()
        return toks, stats, self.family.tokens_to_codes(e.target, toks, req) if req is not None else None

    def _free_layout(self):
        """The whole-image SequenceLayout of the pipeline's family (what every loop makes when given
        none), made once: the loops get it instead of looking the family up per decode."""
        if self._free is None:
            self._free = self.family.free_layout(self._e.target)
        return self._free

    def decode(self, tokens: torch.Tensor) -> list:
        """Token ids (B, N) (a prompted family: its code grids (B, h, w), GenerationResult.codes) ->
        PIL images, through the family's decoder hooks (runtime/runner.images: the one tokens-to-pixels path)."""
        from PIL import Image

        from .runner import images

        vq = self._e.vq
        if vq is None:
            raise InputError("this bundle has no VQ decoder; export with the VQ (or pass decode=False)")
        hw = getattr(self._e.target.config, "grid_hw", None)
        if tokens.dim() == 2 and hw is not None:  # a class-conditioned family's tokens, on its (h, w) grid
            tokens = tokens.reshape(tokens.shape[0], *hw)
        return [Image.fromarray(a) for a in images(self.family, vq, tokens)]
