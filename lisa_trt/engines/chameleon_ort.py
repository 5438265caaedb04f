"""ONNX Runtime runners over a Chameleon-family engine directory (export/chameleon_onnx.py).

`OrtChameleonTarget` and `OrtChameleonDrafter` are drop-in replacements for `ChameleonTarget`
and `ChameleonDrafter` in speculative/chameleon_spec.py: same methods (`new_cache`, `prefill`,
`forward_tokens`; `new_cache`, `project_taps`, `forward`), same cache objects, torch tensors
bound to ORT by address with each K/V buffer bound as past input AND present output (updated in
place; engines/ort.OrtRunner). `OrtCodeGASV` runs the GASV v2 graph over the image-code
sub-vocabulary (per-node gates, engines/graph.GraphGASV's call); `OrtChameleonVQ` decodes code
grids to pixels.

    eng = load_chameleon_engines("engines/lumina")
    images, stats = speculative_image_tokens(eng.target, eng.drafter, eng.tokenizer, captions, ...)
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Optional

import torch

from ..errors import ArtifactMismatchError, CheckpointError, InputError
from ..export.io_spec import Graph
from ..models.prompts import PromptTarget
from .graph import GraphGASV
from .ort import OrtRunner



class _FileSpec:
    """The io names of one exported Chameleon graph (read off the ONNX file; the callers bind every
    output themselves, so no shapes are needed)."""

    def __init__(self, path: Path, graph: Graph):
        import onnx

        m = onnx.load(str(path), load_external_data=False)
        self.graph = graph
        self.input_names = [i.name for i in m.graph.input]
        self.output_names = [o.name for o in m.graph.output]


def _runner(d: Path, man: dict, graph: Graph, providers, threads) -> OrtRunner:
    path = d / man["graphs"][graph.value]["file"]
    return OrtRunner(path, _FileSpec(path, graph), {}, "fp32", providers=providers, threads=threads)


def _contig(t: torch.Tensor, dtype, device) -> torch.Tensor:
    return t.to(device=device, dtype=dtype).contiguous()


def _check_cache(cache, shape: tuple, dtype, device, what: str) -> None:
    for buf in cache.k + cache.v:
        if tuple(buf.shape) != shape or buf.dtype != dtype or buf.device != device or not buf.is_contiguous():
            raise InputError(f"{what} cache buffer {tuple(buf.shape)} {buf.dtype} on {buf.device} does not fit the "
                             f"engine ({shape} {dtype} on {device}, contiguous); make it with the engine's new_cache")


def _kv(pairs) -> tuple[dict, dict]:
    """[(past name, present name, buffer)] -> (inputs, outputs): the same buffer both ways (in place)."""
    return {a: b for a, _, b in pairs}, {p: b for _, p, b in pairs}


def read_chameleon_engine(engine_dir) -> dict:
    """The manifest of a Chameleon engine directory, with its graphs' hashes checked."""
    from ..export.chameleon_onnx import ENGINE_FILE, ENGINE_KIND, SCHEMA_VERSION
    from ..export.manifest import file_sha256
    import json

    d = Path(engine_dir)
    if not (d / ENGINE_FILE).is_file():
        raise CheckpointError(f"{d} is not a Chameleon engine directory (no {ENGINE_FILE}); make one with "
                              "`lisa-trt export --model DIR ...` or lisa_trt.export.chameleon_onnx.export_chameleon")
    man = json.loads((d / ENGINE_FILE).read_text())
    if man.get("kind") != ENGINE_KIND or man.get("schema_version") != SCHEMA_VERSION:
        raise ArtifactMismatchError(f"{d / ENGINE_FILE} is kind {man.get('kind')} v{man.get('schema_version')}; "
                                    f"this lisa-trt reads {ENGINE_KIND} v{SCHEMA_VERSION}: re-export")
    for name, g in man["graphs"].items():
        if file_sha256(d / g["file"]) != g["sha256"]:
            raise ArtifactMismatchError(f"{d / g['file']} does not match the hash in the manifest: re-export")
    man["dir"] = str(d)
    return man


def _check_step(tokens, positions, slots, mask, batch, max_len, vocab, max_pos) -> None:
    B, S = tokens.shape
    if positions.shape != (B, S) or slots.shape != (B, S) or tuple(mask.shape) != (B, S, max_len):
        raise InputError(f"tokens {tuple(tokens.shape)}, positions {tuple(positions.shape)}, slots "
                         f"{tuple(slots.shape)}, mask {tuple(mask.shape)} do not fit (B, S) x3, (B, S, {max_len})")
    if B != batch:
        raise InputError(f"batch {B} does not match the cache batch {batch}")
    if not tokens.numel():
        return
    t_lo, t_hi, p_lo, p_hi, s_lo, s_hi = torch.stack([tokens.min(), tokens.max(), positions.min(), positions.max(),
                                                      slots.min(), slots.max()]).tolist()
    if t_lo < 0 or t_hi >= vocab:
        raise InputError(f"token ids must be in 0..{vocab - 1}; got {t_lo}..{t_hi}")
    if p_lo < 0 or p_hi >= max_pos:
        raise InputError(f"positions must lie in [0, {max_pos}); got {p_lo}..{p_hi}")
    if s_lo < 0 or s_hi >= max_len:
        raise InputError(f"cache slots must lie in [0, {max_len}); got {s_lo}..{s_hi}")


class OrtChameleonTarget(PromptTarget):
    """The Chameleon target through ONNX Runtime (drop-in for ChameleonTarget in the decode loops:
    the same condition protocol, models/prompts.PromptTarget)."""

    family = "chameleon"

    def __init__(self, man: dict, providers=None, threads: Optional[int] = None):
        from ..models.families.chameleon.checkpoint import read_chameleon_config

        d = Path(man["dir"])
        self.config = read_chameleon_config(d)
        self.hash = man["target_hash"]
        self.max_cache_len = int(man["max_cache_len"])
        self.dtype = torch.float32
        self._prefill = _runner(d, man, Graph.TARGET_PREFILL, providers, threads)
        self._verify = _runner(d, man, Graph.TARGET_VERIFY, providers, threads)
        self.device = self._verify.device

    def new_cache(self, batch: int, max_len: Optional[int] = None, dtype=None, *, extra: int = 0,
                  prompt_len: Optional[int] = None, n_tokens: Optional[int] = None):
        """A ChameleonCache of the engines' static length (`max_len`, or prompt_len + n_tokens +
        extra as the generic loops pass them, must fit it)."""
        from ..models.families.chameleon.model import ChameleonCache

        if max_len is None:
            if prompt_len is None or n_tokens is None:
                raise InputError("new_cache needs max_len, or prompt_len and n_tokens")
            max_len = int(prompt_len) + int(n_tokens) + int(extra)
        if max_len > self.max_cache_len:
            raise InputError(f"{max_len} cache slots do not fit the engines' static length {self.max_cache_len}; "
                             "re-export with a larger --max-prompt / --max-tree or a smaller image")
        return ChameleonCache(self.config, batch, self.max_cache_len, self.dtype, self.device)

    def _run(self, runner, tokens, positions, slots, mask, cache, S_out: int):
        from ..models.layers import TargetOutput

        cfg, dev = self.config, self.device
        shape = (cache.batch, cfg.kv_heads, self.max_cache_len, cfg.head_dim)
        pairs = []
        for i, (k, v) in enumerate(zip(cache.k, cache.v)):
            pairs += [(f"past_key_values.{i}.key", f"present.{i}.key", k),
                      (f"past_key_values.{i}.value", f"present.{i}.value", v)]
        _check_cache(cache, shape, self.dtype, dev, "target")
        kv_in, kv_out = _kv(pairs)
        B = tokens.shape[0]
        out = dict(logits=torch.empty(B, S_out, cfg.vocab_size, dtype=torch.float32, device=dev),
                   taps=torch.empty(B, S_out, 3 * cfg.dim, dtype=self.dtype, device=dev),
                   hidden=torch.empty(B, S_out, cfg.dim, dtype=self.dtype, device=dev))
        runner.run(dict(input_ids=_contig(tokens, torch.int64, dev), position_ids=_contig(positions, torch.int64, dev),
                        cache_slots=_contig(slots, torch.int64, dev), attention_mask=_contig(mask, torch.bool, dev),
                        **kv_in), {**out, **kv_out})
        return TargetOutput(out["logits"], out["taps"], out["hidden"])

    def prefill(self, input_ids, cache, valid=None, taps: bool = False):
        """A left-padded prompt (B, T) into slots 0..T-1; outputs of its last position."""
        from ..models.prompts import Prompts, prefill_plan

        p = Prompts.of(input_ids, valid)
        input_ids, valid = p.ids, p.valid
        T = input_ids.shape[1]
        slots, pos, mask = prefill_plan(input_ids, cache, valid)
        _check_step(input_ids, pos, slots, mask, cache.batch, self.max_cache_len, self.config.vocab_size,
                    self.config.max_position_embeddings)
        out = self._run(self._prefill, input_ids, pos, slots, mask, cache, 1)
        cache.lengths.fill_(T)
        if not taps:
            out.taps = None
        return out

    def forward_tokens(self, tokens, positions, slots, mask, cache, taps: bool = False):
        """New tokens at RoPE `positions`, K/V written at cache `slots` (see ChameleonTarget)."""
        _check_step(tokens, positions, slots, mask, cache.batch, self.max_cache_len, self.config.vocab_size,
                    self.config.max_position_embeddings)
        return self._run(self._verify, tokens, positions, slots, mask, cache, tokens.shape[1])


class OrtChameleonDrafter:
    """The Chameleon drafter through ONNX Runtime (drop-in for ChameleonDrafter in the spec loop)."""

    def __init__(self, man: dict, providers=None, threads: Optional[int] = None):
        from ..models.drafter import DrafterConfig

        d = Path(man["dir"])
        self.config = DrafterConfig.from_dict(man["drafter"]["config"])
        self.max_positions = int(man["drafter"]["max_positions"])
        self.max_cache_len = int(man["max_cache_len"])
        self.dtype = torch.float32
        self._project = _runner(d, man, Graph.DRAFTER_PROJECT, providers, threads)
        self._step = _runner(d, man, Graph.DRAFTER_STEP, providers, threads)
        self.device = self._step.device

    def new_cache(self, batch: int, max_len: int, dtype=None):
        from ..models.drafter import DrafterCache

        if max_len > self.max_cache_len:
            raise InputError(f"a drafter cache of {max_len} slots does not fit the engines' static length "
                             f"{self.max_cache_len}; re-export with a larger --max-tree")
        return DrafterCache(self.config, batch, self.max_cache_len, self.dtype, self.device)

    def project_taps(self, taps: torch.Tensor) -> torch.Tensor:
        B, S, _ = taps.shape
        out = torch.empty(B, S, self.config.hidden, dtype=self.dtype, device=self.device)
        self._project.run(dict(taps=_contig(taps, self.dtype, self.device)), dict(hidden=out))
        return out

    def forward(self, hidden_in, tokens, positions, slots, mask, cache):
        """One drafter step; (logits (B, S, V) fp32, hidden_out (B, S, hidden))."""
        cfg, dev = self.config, self.device
        _check_step(tokens, positions, slots, mask, cache.batch, self.max_cache_len, cfg.vocab_size,
                    self.max_positions)
        B, S = tokens.shape
        shape = (cache.batch, cfg.n_head, self.max_cache_len, cfg.head_dim)
        _check_cache(cache, shape, self.dtype, dev, "drafter")
        kv_in, kv_out = _kv([("past_key_values.0.key", "present.0.key", cache.k[0]),
                             ("past_key_values.0.value", "present.0.value", cache.v[0])])
        out = dict(logits=torch.empty(B, S, cfg.vocab_size, dtype=torch.float32, device=dev),
                   hidden=torch.empty(B, S, cfg.hidden, dtype=self.dtype, device=dev))
        self._step.run(dict(hidden_in=_contig(hidden_in, self.dtype, dev), input_ids=_contig(tokens, torch.int64, dev),
                            position_ids=_contig(positions, torch.int64, dev),
                            cache_slots=_contig(slots, torch.int64, dev),
                            attention_mask=_contig(mask, torch.bool, dev), **kv_in), {**out, **kv_out})
        return out["logits"], out["hidden"]

    __call__ = forward


class OrtCodeGASV(GraphGASV):
    """The GASV v2 graph over the K image codes: (code logits (N, K), node tokens (N,) as code
    indices, node parent rows (N,), cfg) -> GASVGates, as `speculative.gasv.gasv_gates` computes
    them with the code tables (the call itself is GraphGASV's: same io_spec names and checks)."""

    def __init__(self, man: dict, config, providers=None, threads: Optional[int] = None):
        from ..export.io_spec import GASV_K, GASV_PARAMS, graph_spec

        d = Path(man["dir"])
        self.config = config
        self.vocab_size = int(man["tables"]["vocab_size"])
        path = d / man["graphs"][Graph.GASV.value]["file"]
        dims = dict(vocab=self.vocab_size, gasv_k=GASV_K, n_gasv_params=len(GASV_PARAMS))
        self._run = OrtRunner(path, graph_spec(Graph.GASV), dims, "fp32", providers=providers, threads=threads)
        self.runners = {Graph.GASV: self._run}
        self.device = self._run.device


class OrtChameleonVQ:
    """The VQGAN decoder graph: codes (B, h, w) -> images (B, 3, h*ds, w*ds) in about [-1, 1]."""

    def __init__(self, man: dict, providers=None, threads: Optional[int] = None):
        d = Path(man["dir"])
        self.n_embed, self.downsample = int(man["vq"]["n_embed"]), int(man["vq"]["downsample"])
        self._run = _runner(d, man, Graph.VQ_DECODE, providers, threads)
        self.device = self._run.device

    def decode_code(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.dim() != 3:
            raise InputError(f"codes must be (B, h, w); got shape {tuple(codes.shape)}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.n_embed):
            raise InputError(f"VQ codes must be in 0..{self.n_embed - 1}")
        B, h, w = codes.shape
        out = torch.empty(B, 3, h * self.downsample, w * self.downsample, dtype=torch.float32, device=self.device)
        self._run.run(dict(image_tokens=_contig(codes, torch.int64, self.device)), dict(images=out))
        return out


class ChameleonEngines(NamedTuple):
    target: OrtChameleonTarget
    drafter: Optional[OrtChameleonDrafter]
    gasv: Optional[OrtCodeGASV]
    tables: Optional[object]  # GASVTables (unbound: LANTERN neighbours, GASV constants)
    vq: Optional[OrtChameleonVQ]
    tokenizer: object  # LuminaTokenizer
    manifest: dict


def load_chameleon_engines(engine_dir, providers=None, threads: Optional[int] = None) -> ChameleonEngines:
    """Open every graph of a Chameleon engine directory with ONNX Runtime."""
    from ..calibration.tables import load_tables
    from ..speculative.lumina import LuminaTokenizer

    man = read_chameleon_engine(engine_dir)
    d, g = Path(man["dir"]), man["graphs"]
    target = OrtChameleonTarget(man, providers, threads)
    tables = load_tables(d / man["tables"]["file"]) if man.get("tables") else None
    if tables is not None and tables.target_hash != target.hash:
        raise ArtifactMismatchError(f"{d}/tables.safetensors was made for target {tables.target_hash}, not {target.hash}")
    return ChameleonEngines(
        target=target,
        drafter=OrtChameleonDrafter(man, providers, threads) if Graph.DRAFTER_STEP.value in g else None,
        gasv=OrtCodeGASV(man, tables.config, providers, threads) if Graph.GASV.value in g else None,
        tables=tables,
        vq=OrtChameleonVQ(man, providers, threads) if Graph.VQ_DECODE.value in g else None,
        tokenizer=LuminaTokenizer(d), manifest=man)
