"""Model families: everything that differs between autoregressive image models of one kind.

A family owns its conditioning (validate a condition, the null condition for CFG, the prefill
graph's condition inputs), checkpoint loading, and the image decoder. LlamaGen (class-to-image
`c2i` and text-to-image `t2i`, families/llamagen/) is the first family; a second one (e.g. Chameleon / Lumina-mGPT)
registers its own `ModelFamily` subclass under its `model_type` names and nothing else in the
speculative loop, the engines or the runtime changes.

    fam = family_of(cfg)                 # cfg.model_type -> the family
    B = fam.check_cond(cfg, cond)        # InputError with the fix on a bad condition
    inputs = fam.cond_inputs(cfg, cond, device, act_dtype)   # prefill graph inputs by name

Floors: models (this file imports only core modules; families/*/ call into it).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..errors import ConfigError, InputError
from .conditioning import Conditioning


@dataclass(frozen=True)
class SequenceLayout:
    """What a decode loop generates after the prompt: the family's answer for one request.

    n_tokens: tokens to generate.
    allowed: sorted LongTensor of the token ids that may be sampled or drafted (None: the whole
        head; Chameleon: the image-code tokens).
    forced: (n_tokens,) LongTensor, the token id forced at index i or -1 where it is sampled
        (Lumina-mGPT's row ends); None: nothing forced. Forced tokens are never sampled: the
        AR loop writes them, the tree loops see a one-hot law there.
    sub_vocab: optional `SubVocab` the relaxed rules (LANTERN, GASV) and calibration work over
        when the head is wider than the codebook (None: the head is the codebook).
    """

    n_tokens: int
    allowed: Optional[torch.Tensor] = None
    forced: Optional[torch.Tensor] = None
    sub_vocab: Optional["SubVocab"] = None

    def __post_init__(self):
        if int(self.n_tokens) < 1:
            raise InputError(f"the number of tokens to generate must be >= 1, got {self.n_tokens}")
        if self.forced is not None and self.forced.numel() != int(self.n_tokens):
            raise InputError(f"forced has {self.forced.numel()} entries for {self.n_tokens} tokens")

    def forced_mask(self, device) -> Optional[torch.Tensor]:
        """(n_tokens,) bool, True where the token is forced (None when nothing is)."""
        return None if self.forced is None else (self.forced >= 0).to(device)

    def law(self, logits: torch.Tensor, token_index: torch.Tensor, process) -> torch.Tensor:
        """Guided logits (B, ..., V) of token indices (B, ...) -> the law sampled / verified.

        Restricts to `allowed`, applies `process` (temperature / top-k / top-p), then makes forced
        indices one-hot on their token. A layout with nothing to do returns process(logits)."""
        if self.allowed is not None:
            keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
            keep[self.allowed.to(logits.device)] = True
            logits = logits.masked_fill(~keep, float("-inf"))
        logits = process(logits)
        if self.forced is None or token_index is None:
            return logits
        f = self.forced.to(logits.device)[token_index.clamp(max=self.forced.numel() - 1)]  # (B, ...)
        one_hot = torch.full_like(logits, float("-inf"))
        one_hot.scatter_(-1, f.clamp(min=0)[..., None], 0.0)
        return torch.where((f >= 0)[..., None], one_hot, logits)


@dataclass
class Request:
    """One batch of prompts, encoded by the family's prompter: what the decode loops and the
    image decoder need. cond: the family's condition (B rows); layout: what is generated;
    grid: (h, w) of the VQ code grid the tokens decode to; prompts: the source texts / ids."""

    cond: object
    layout: SequenceLayout
    grid: tuple
    prompts: tuple = ()

    @property
    def batch(self) -> int:
        return len(self.prompts)


@dataclass(frozen=True)
class SubVocab:
    """The codebook inside a wider head: code_ids (K,) sorted token ids, codes (K,) their VQ rows.

    Sub indices: codes 0..K-1; K the token the layout forces at that position (any id: one per
    forced position, so any number of distinct forced tokens); K + 1 anything else (never
    committed). The forced ids come per position from `SequenceLayout.forced`."""

    code_ids: torch.Tensor
    codes: torch.Tensor

    @property
    def K(self) -> int:
        return int(self.code_ids.numel())

    def lut(self, vocab_size: int, device) -> torch.Tensor:
        """(V,) token id -> sub index, codes 0..K-1 and K + 1 for any other id (no position:
        `to_sub` gives K to the token forced at a position)."""
        t = torch.full((vocab_size,), self.K + 1, dtype=torch.long, device=device)
        t[self.code_ids.to(device)] = torch.arange(self.K, device=device)
        return t

    def to_sub(self, tokens: torch.Tensor, forced: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
        """Token ids (...) at positions whose forced id is `forced` (..., -1: free) -> sub indices
        (K where the token is the one forced there)."""
        return torch.where((forced >= 0) & (tokens == forced), self.K, lut[tokens.clamp(min=0)])

    def from_sub(self, sub: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
        """Sub indices (...) at positions whose forced id is `forced` (...) -> token ids: a code's
        id, or the position's forced token for K (and K + 1, which is never committed)."""
        ids = self.code_ids.to(sub.device)
        return torch.where(sub < self.K, ids[sub.clamp(min=0, max=self.K - 1)], forced.to(sub.device))


class ModelFamily:
    """One model family; subclasses implement the conditioning and artifact hooks.

    Attributes:
        name: family name ("llamagen").
        model_types: the TargetConfig.model_type values it serves.
    """

    name = "?"
    model_types: tuple = ()
    # -- capabilities and defaults the generic commands read (the family is never named there)
    vq_beside_checkpoint = False  # its image decoder loads from the checkpoint directory and describes itself
    default_sampling: dict = {}  # SamplingConfig values replacing the dataclass defaults (no artifact set)
    default_tree: dict = {}  # tree budget {top_k, depth, total_tokens} when none is given or recorded
    train_data: tuple = ("self", "tokens", "images")  # the `lisa-trt train --data` sources it supports
    train_defaults: dict = {}  # TrainConfig / DataConfig values of its self-distillation runs
    default_captions: tuple = ()  # text-prompt families: self-distillation / calibration captions when none given

    # -- plug-ins: modules of the family's own package, found by name (`export`, `shapes`, `captions`;
    # its one registration is _BUILTIN) and imported once, on first use, by `plugin`

    @property
    def export_module(self) -> Optional[str]:
        """`<package>.export`, the module registering the family's ExportFamily; None when the
        package has none (the family cannot be exported)."""
        return self._plugin("export")

    @property
    def shapes_module(self) -> Optional[str]:
        """`<package>.shapes`, the family's memory-plan shapes; None when the package has none (its
        models cannot be planned)."""
        return self._plugin("shapes")

    @property
    def captions_module(self) -> Optional[str]:
        """`<package>.captions`, the family's caption encoder (`caption_encoder(encoder_dir, required=,
        **options)`, `ENCODER_HINT`); None when the package has none (its targets are not conditioned
        on caption features, `lisa-trt encode-captions` refuses it)."""
        return self._plugin("captions")

    def plugin(self, kind: str):
        """The family's `kind` plug-in module ("export", "shapes", "captions": its `<kind>_module`),
        imported once and held by the family; None when its package has none. The registries below
        the families reach a plug-in only through this (export/families.py, deploy/model_shapes.py,
        models/captions.py), so no module imports a family's by name."""
        held = self.__dict__.setdefault("_plugins", {})
        if kind not in held:
            module = getattr(self, f"{kind}_module")
            held[kind] = None if module is None else load_plugin(module)
        return held[kind]

    @property
    def shapes(self):
        """The family's shape plug-in (deploy/model_shapes.py: `KNOWN`, `DEFAULT_SIZE`, ...) or None."""
        return self.plugin("shapes")

    @property
    def captions(self):
        """The family's caption-encoder plug-in (models/captions.caption_encoder) or None."""
        return self.plugin("captions")

    def _plugin(self, name: str) -> Optional[str]:
        import importlib.util
        import sys

        mod = sys.modules.get(type(self).__module__)
        if mod is None:
            return None
        pkg = mod.__name__ if hasattr(mod, "__path__") else mod.__name__.rpartition(".")[0]
        if not pkg:
            return None
        try:
            return f"{pkg}.{name}" if importlib.util.find_spec(f"{pkg}.{name}") is not None else None
        except (ImportError, ValueError):
            return None

    def __deepcopy__(self, memo):
        return self  # one object per family: a deep-copied target keeps it (its plug-in modules too)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_plugins"}  # modules do not pickle

    def describe_checkpoint(self) -> str:
        """What a checkpoint of this family looks like (for errors naming the fix)."""
        return "?"

    # -- conditioning ---------------------------------------------------------------------

    def check_cond(self, cfg, cond) -> int:
        """Validate a condition for `cfg`; returns the batch size. Raises InputError with the fix."""
        raise NotImplementedError

    def null_cond(self, cfg, cond, uncond_embedding: Optional[torch.Tensor] = None):
        """The unconditional condition for CFG, same batch size as `cond`."""
        raise NotImplementedError

    def conditioning(self, cfg_or_type) -> Conditioning:
        """What `cfg`'s targets are conditioned on (models/conditioning.py): class ids, caption
        features or text prompts through `prompter`; a bare model_type string gives no sizes."""
        raise NotImplementedError

    def condition_tensors(self, target) -> dict:
        """Tensors an engine bundle must carry for null_cond at run time ({} when none)."""
        return {}

    def cond_specs(self, cfg_or_type) -> tuple:
        """The prefill graph's condition inputs: ((name, dtype code, axes, doc), ...)."""
        raise NotImplementedError

    def cond_inputs(self, cfg, cond, device, act_dtype) -> dict:
        """{prefill input name: tensor} for a validated condition."""
        raise NotImplementedError

    def cond_from_inputs(self, cfg, inputs: dict):
        """Inverse of cond_inputs (the exported prefill graph rebuilds the model's condition)."""
        raise NotImplementedError

    def example_cond(self, cfg, batch: int, generator=None):
        """A random valid condition (validation, tests)."""
        raise NotImplementedError

    def random_cond(self, cfg, batch: int, generator=None):
        """A random condition for tests and smoke checks (lisa_trt.testing.make_cond); default
        `example_cond`."""
        return self.example_cond(cfg, batch, generator)

    def random_target(self, model_type: str, seed: int = 0, std: float = 0.1, **overrides):
        """A tiny random target of `model_type` with weights large enough for peaky logits, in
        seconds on a CPU and without downloads (lisa_trt.testing.make_target)."""
        raise NotImplementedError(f"the {self.name} family builds no tiny random target; load a checkpoint "
                                  "(HF families: a tiny model saved by transformers)")

    def claims(self, path) -> bool:
        """True when `path` (a checkpoint file or directory) holds a model of this family."""
        return False

    # -- sequence layout ------------------------------------------------------------------

    def free_layout(self, target, n_tokens: Optional[int] = None, image_tokens_only: bool = False) -> SequenceLayout:
        """`n_tokens` free tokens (default: the whole image, `image_tokens(target)`)."""
        block = self.image_tokens(target)
        if n_tokens is None and block is None:
            raise InputError(f"the {self.name} family has no fixed image length: pass num_tokens (max_new_tokens)=N")
        N = block if n_tokens is None else int(n_tokens)
        if N < 1 or (block is not None and N > block):
            raise InputError(f"num_tokens must be in 1..{block if block is not None else 'N'}, got {N}")
        return SequenceLayout(N)

    def image_tokens(self, target) -> Optional[int]:
        """Tokens of one whole image when the config fixes it (`block_size`), else None."""
        n = getattr(target.config, "block_size", None)
        return None if n is None else int(n)

    # -- prompts and pixels ---------------------------------------------------------------

    default_image_size: Optional[int] = None  # pixels when a request names none (None: the config's)

    def prompter(self, target, source=None):
        """An object whose `encode(prompts, *, image_size=None, cfg=False) -> Request` turns a
        batch of prompts (texts, or what the family takes) into a Request. `source`: where the
        tokenizer / encoder lives (the checkpoint directory by default)."""
        raise NotImplementedError(f"the {self.name} family has no text prompter")

    def tokens_to_codes(self, target, tokens: torch.Tensor, request: Request) -> torch.Tensor:
        """Generated tokens (B, N) -> VQ codes (B, h, w) (default: the tokens on request.grid)."""
        h, w = request.grid
        return tokens.reshape(tokens.shape[0], h, w)

    def generation_inputs(self, target, cond, attention_mask=None, negative=None, negative_mask=None):
        """(cond, attention_mask, layout or None) the public `lisa_trt.generate` runs: a family whose
        prompt fixes the image (Emu3 writes its grid) answers the layout; None: the loop's own.
        `negative` (B, T'): transformers' negative_prompt_ids (the CFG rows), where supported."""
        if negative is not None:
            raise InputError(f"the {self.name} family takes no negative_prompt_ids (its CFG rows come from "
                             "the condition: null_cond)")
        return cond, attention_mask, None

    def teacher_forced_logits(self, target, cond, tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Raw head logits (B, N, V) of one cache-free forward: [:, j] predicts tokens[:, j] from
        `cond` (the CFG batch's rows included) and tokens[:, :j] (calibration's teacher forcing,
        the public `lisa_trt.teacher_forced_logits`). tokens None: the logits of a prompt-id
        sequence itself, where the family has them.

        Default: the target's own `teacher_forced_logits(cond, tokens)` (LlamaGen, Janus)."""
        if tokens is None:
            raise InputError(f"{self.name} teacher forcing needs the generated tokens: "
                             "teacher_forced_logits(target, cond, tokens (B, N))")
        return target.teacher_forced_logits(cond, tokens)

    # -- artifacts ------------------------------------------------------------------------

    def claims_decoder(self, path) -> bool:
        """True when `path` is a bare image-decoder folder of this family (no model beside it)."""
        return False

    def load_target(self, path, config=None, device="cpu"):
        raise NotImplementedError

    def load_decoder(self, path, config=None, device="cpu"):
        """The image decoder (tokens -> pixels) of this family."""
        raise NotImplementedError

    def init_target(self, config):
        """A randomly initialised target of `config` (the module's own init; `lisa-trt random-checkpoint`).
        A family without one: a ConfigError naming the model types that have one (random_init_types)."""
        raise ConfigError(f"the {self.name} family writes no random checkpoint (its models load from their "
                          f"checkpoint directories); random checkpoints: --model-type {' / '.join(random_init_types())}")

    def init_decoder(self, config):
        """A randomly initialised image decoder of `config` (`lisa-trt random-checkpoint`)."""
        raise ConfigError(f"the {self.name} family writes no random image-decoder checkpoint; random checkpoints: "
                          f"--model-type {' / '.join(random_init_types())}")

    def target_from_state(self, config, state_dict: dict):
        """A target of `config` with exactly `state_dict` (strict), fp32, eval: how the torch backend
        rebuilds a model from a bundle's shared weights file (export/weights.py). None: this family
        cannot (the bundle then needs its PyTorch copy, `lisa-trt export --torch-weights`)."""
        return None

    def decoder_from_state(self, config, state_dict: dict):
        """The image decoder of `config` with exactly `state_dict` (strict), fp32, eval; None: cannot."""
        return None

    def tokens_to_pixels(self, vq, tokens: torch.Tensor) -> torch.Tensor:
        """(B, N) or (B, h, w) tokens -> (B, 3, H, W) float: the raw decoder output (no clamp)."""
        return vq.tokens_to_pixels(tokens)

    def codes_to_pixels(self, vq, codes: torch.Tensor) -> torch.Tensor:
        """VQ code grids (B, h, w) (what `tokens_to_codes` returns) -> raw decoder output (B, 3, H, W)."""
        return self.tokens_to_pixels(vq, codes)

    def codebook(self, vq) -> torch.Tensor:
        """The decoder's codebook rows (n_codes, d), detached: the geometry LISA, LANTERN and GASV use."""
        cb = vq.codebook
        return (cb() if callable(cb) else cb).detach()

    def to_uint8(self, pixels: torch.Tensor):
        """Raw decoder output (B, 3, H, W) -> uint8 (B, H, W, 3) numpy, the family's own conversion."""
        from ..imaging import to_uint8

        return to_uint8(pixels)


class FamilyTarget:
    """Mixin of a torch target: `model_family`, its family looked up once from `self.config` and
    held (check_cond / null_cond ask it, not the registry, on every call)."""

    @property
    def model_family(self) -> "ModelFamily":
        fam = self.__dict__.get("_model_family")
        if fam is None:
            fam = self.__dict__["_model_family"] = family_of(self.config)
        return fam


class UnknownModelTypeError(ConfigError, ValueError):
    """A model_type no registered family serves."""


_FAMILIES: dict[str, ModelFamily] = {}


def register_family(family: ModelFamily) -> ModelFamily:
    """Serve `family.model_types` with `family` (a later registration replaces an earlier one)."""
    for t in family.model_types:
        _FAMILIES[t] = family
    return family


# THE registration list of built-in families, imported on first use (model_type -> module that
# registers it). Adding a family adds its model types here and nothing else outside its package.
_BUILTIN = {"c2i": "lisa_trt.families.llamagen", "t2i": "lisa_trt.families.llamagen",
            "chameleon": "lisa_trt.families.chameleon", "janus": "lisa_trt.families.janus",
            "emu3": "lisa_trt.families.emu3"}


def model_types() -> list:
    """Every registered model_type (built-in and registered)."""
    return sorted(set(_FAMILIES) | set(_BUILTIN))


def load_plugin(module: str):
    """Import a family package or one of its plug-ins by name: the one import by name of the
    families (tests/test_architecture.py follows it: _BUILTIN's packages, their export / shapes /
    captions plug-ins, and the engines module each ExportFamily names, export/families.ExportFamily.engines)."""
    return importlib.import_module(module)


def random_init_types() -> list:
    """The model types whose family writes a random checkpoint (overrides ModelFamily.init_target)."""
    return [t for t in model_types() if type(family_of(t)).init_target is not ModelFamily.init_target]


def family_of(cfg_or_type) -> ModelFamily:
    """The family serving a TargetConfig (or a model_type string)."""
    t = getattr(cfg_or_type, "model_type", cfg_or_type)
    if t not in _FAMILIES and t in _BUILTIN:
        load_plugin(_BUILTIN[t])  # registers itself
    fam = _FAMILIES.get(t)
    if fam is None:
        raise UnknownModelTypeError(f"unknown model_type {t!r}; registered: {', '.join(model_types())} "
                                    "(a new family registers itself with models.family.register_family)")
    return fam


def families() -> list:
    """Every family (built-in ones imported), in registration order, without duplicates."""
    for module in dict.fromkeys(_BUILTIN.values()):
        load_plugin(module)
    return list(dict.fromkeys(_FAMILIES.values()))


def family_named(name: str) -> ModelFamily:
    """The family whose `name` is `name` (an engine manifest's `family` field).

    Raises UnknownModelTypeError listing the registered families when none is."""
    for fam in families():
        if fam.name == name:
            return fam
    raise UnknownModelTypeError(f"unknown model family {name!r}; registered: "
                                f"{', '.join(f.name for f in families())} (a bundle from a newer lisa-trt? "
                                "upgrade, or re-export it with this one)")


def detect_family(path) -> ModelFamily:
    """The one family whose `claims(path)` is True (checkpoint files and HF directories).

    Raises ConfigError naming each family and what it loads when none claims `path`, and naming
    the claimants when more than one does (a family's `claims` must be specific)."""
    fams = families()
    claimants = [f for f in fams if f.claims(path)]
    if len(claimants) == 1:
        return claimants[0]
    if claimants:
        raise ConfigError(f"{path} is claimed by {len(claimants)} families ({', '.join(f.name for f in claimants)}); "
                          "a checkpoint must belong to one: make their `claims` specific (ModelFamily.claims)")
    p = Path(path)
    known = "; ".join(f"{f.name}: {f.describe_checkpoint()}" for f in fams)
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise ConfigError(f"{path} has no config.json: a checkpoint directory is an HF directory with "
                              f"config.json and model*.safetensors. lisa-trt loads {known}")
        try:
            mt = json.loads(cfg.read_text()).get("model_type")
        except (OSError, ValueError) as e:
            raise ConfigError(f"{cfg} is not valid JSON ({e})") from e
        raise ConfigError(f"{cfg} has model_type {mt!r}, which no family loads. lisa-trt loads {known}")
    if p.exists():
        raise ConfigError(f"{path} is not a checkpoint any family loads. lisa-trt loads {known}")
    from .artifact_sets import did_you_mean

    raise ConfigError(f"{path} does not exist, and is not a name any family loads{did_you_mean(path)}. lisa-trt loads {known}")


__all__ = ["FamilyTarget", "ModelFamily", "Request", "SequenceLayout", "SubVocab", "UnknownModelTypeError", "detect_family", "families",
           "family_named", "family_of", "load_plugin", "model_types", "random_init_types", "register_family"]
