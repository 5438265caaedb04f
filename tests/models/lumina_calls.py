"""The Lumina-mGPT image-span calls the tests make, through the generic library path.

Before issue 24's generic runtime these were library modules (speculative/lumina.py
`generate_image_tokens`, speculative/chameleon_spec.py `LuminaSpec` / `speculative_image_tokens`);
now the library has one path for every family: the family prompter's Request (here
`span_request`, what ChameleonFamily.prompter(...).encode returns for a width x height image)
decoded by speculative/run.run_method with the request's layout. These helpers keep the tests'
call shapes (and so the recorded tokens) while exercising that path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from lisa_trt.config import SamplingConfig
from lisa_trt.families.chameleon.lumina import (LuminaImages, LuminaTokenizer, grids,  # noqa: F401
                                                row_end_mask, span_request, tokens_to_codes)
from lisa_trt.speculative.methods import GASVRuleConfig, SpecConfig
from lisa_trt.speculative.run import run_method
from lisa_trt.speculative.sampling import cfg_active
from lisa_trt.speculative.methods import get_method, resolve_method


def generate_image_tokens(target, tokenizer, captions: Sequence[str], width: int, height: int, *,
                          cfg_scale: float = 3.0, temperature: float = 1.0, top_k: int = 2000, greedy: bool = False,
                          seed: Optional[int] = None, top_p: float = 1.0, cfg_interval: int = -1,
                          seeds=None) -> LuminaImages:
    """One image span per caption with the generic AR loop (the `vanilla` method)."""
    prompts, layout, (h, w) = span_request(target, tokenizer, captions, width, height, cfg_active(cfg_scale))
    s = SamplingConfig(cfg_scale=cfg_scale, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                       cfg_interval=cfg_interval)
    out, _ = run_method(get_method("vanilla"), target, None, None, prompts, sampling=s, spec=SpecConfig(), seed=seed,
                        seeds=seeds, layout=layout)
    return LuminaImages(out, tokens_to_codes(target, out, h, w))


@dataclass(frozen=True)
class LuminaSpec:
    """Compact tree-speculation settings (the former speculative/chameleon_spec.LuminaSpec)."""

    method: str = "greedy"
    cfg_scale: float = 3.0
    temperature: float = 1.0
    top_k: int = 2000
    tree_top_k: int = 4
    depth: int = 4
    total_tokens: int = 16
    lantern_k: int = 1000
    lantern_delta: float = 0.1
    greedy: bool = False
    gasv: GASVRuleConfig = field(default_factory=GASVRuleConfig)

    def __post_init__(self):
        from lisa_trt.errors import InputError
        from lisa_trt.speculative.methods import get_method

        if get_method(self.method).kind != "tree":
            raise InputError(f"tree speculation runs a tree method, not {self.method!r}")

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(cfg_scale=self.cfg_scale, temperature=self.temperature, top_k=self.top_k,
                              greedy=self.greedy or self.method == "greedy")

    def spec(self) -> SpecConfig:
        import dataclasses

        cfg = SpecConfig.make(self.method, top_k=self.tree_top_k, depth=self.depth, total_tokens=self.total_tokens,
                              lantern_k=self.lantern_k, lantern_delta=self.lantern_delta)
        return dataclasses.replace(cfg, gasv=self.gasv)


def speculative_image_tokens(target, drafter, tokenizer, captions: Sequence[str], width: int, height: int,
                             spec=LuminaSpec(), seed: Optional[int] = None, tables=None, gasv=None, seeds=None,
                             sampling: Optional[SamplingConfig] = None):
    """Tree speculation of one image span per caption (run_method with the request's layout).

    spec: a LuminaSpec, or a SpecConfig with a SamplingConfig `sampling`. -> (LuminaImages, DecodeStats)."""
    if isinstance(spec, SpecConfig):
        cfg, sampling = spec, sampling or SamplingConfig(cfg_scale=3.0, top_k=2000)
    else:
        cfg, sampling = spec.spec(), spec.sampling()
    prompts, layout, (h, w) = span_request(target, tokenizer, captions, width, height, cfg_active(sampling.cfg_scale))
    out, stats = run_method(resolve_method(cfg.method), target, drafter, tables, prompts, sampling=sampling, spec=cfg, seed=seed,
                            seeds=seeds, gasv=gasv, layout=layout)
    return LuminaImages(out, tokens_to_codes(target, out, h, w)), stats


def load_chameleon_tables(path, target):
    """Image-code tables bound to this target's code rows (calibration.tables.load_tables_for with
    the family's sub-vocabulary; the request layout's `sub_vocab` is the same object)."""
    from lisa_trt.calibration.tables import load_tables_for
    from lisa_trt.models.family import family_of

    return load_tables_for(path, target, family_of(target.config).sub_vocab(target))


_CALIBRATE_FLAGS = {"image_size": "--image-size", "captions_file": "--captions-file", "rollouts": "--rollouts",
                    "samples_per_pos": "--samples-per-pos", "quantile": "--quantile", "clusters": "--clusters",
                    "cluster_space": "--cluster-space", "lantern_k": "--lantern-k", "kappa": "--kappa",
                    "lam": "--lambda", "delta": "--delta", "neighbours": "--neighbours", "cfg_scale": "--cfg-scale",
                    "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}


def calibrate_cli(model_dir, out_path, **kw):
    """`lisa-trt calibrate --model DIR --out OUT` (the generic entry) with these settings; the tables
    written, bound to the target's code rows (as calibration returns them)."""
    from click.testing import CliRunner

    import lisa_trt
    from lisa_trt.cli import main

    args = ["calibrate", "--model", str(model_dir), "--out", str(out_path)]
    for k, v in kw.items():
        if v is not None:
            args += [_CALIBRATE_FLAGS[k], str(v)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output + repr(r.exception)
    return load_chameleon_tables(out_path, lisa_trt.load_target(str(model_dir)))


class _Engines:
    """A token-prompt engine directory's engines (engines/graph.Engines, with its tables) plus the
    Lumina tokenizer its prompter reads from the directory (the tests' span_request calls)."""

    def __init__(self, eng, tokenizer):
        self._eng, self.tokenizer = eng, tokenizer

    def __getattr__(self, name):
        return getattr(self._eng, name)

    def close(self):
        self._eng.close()


def load_chameleon_engines(engine_dir, providers=None, threads: Optional[int] = None, *, backend: str = "ort",
                           **options):
    """engines.graph.load_engines(engine_dir, backend) (ONNX Runtime options: providers / threads)."""
    from lisa_trt.engines.graph import load_engines

    if backend == "ort":
        options = dict(options, providers=providers, threads=threads)
    return _Engines(load_engines(engine_dir, backend, **options), LuminaTokenizer(engine_dir))
