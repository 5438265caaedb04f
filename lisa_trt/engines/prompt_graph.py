"""Graph engines for token-prompt targets (models/prompts.PromptTarget) over any backend.

A family whose exported target takes a prompt of tokens (left-padded rows, per-row RoPE
positions) rather than a condition prefix names this module as its ExportFamily's
`engines_module` (export/families.py, PromptExportFamily); engines/graph.load_engines then opens its
directories here, as it opens every family's through the module the family names.
`GraphPromptTarget` is engines/graph.GraphTarget with the token-prompt condition protocol (same
`new_cache`, `prefill`, `forward_tokens`, KVCache objects as the torch target) and `GraphGridVQ`
decodes code grids to pixels. The drafter and the GASV graph are the generic `GraphDrafter` and
`GraphGASV` (engines/graph.open_family_engines). Runners come from the backend registry with the
family's io specs and static axes, and the KV caches are bound as for every family
(`_KVEngine._run_kv`): the cache dtype is the bundle's precision (fp16 bundles: fp16 caches).

    Pipeline.from_dir("engines/lumina", backend="ort").generate(["a red fox"])   # opens these engines
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ..errors import ArtifactMismatchError, InputError
from ..models.prompts import PromptTarget
from .graph import Engines, GraphDecoder, GraphTarget, open_family_engines


class GraphPromptTarget(PromptTarget, GraphTarget):
    """A token-prompt target over a backend's prefill + verify runners: a drop-in for the torch
    target in the decode loops (the condition protocol of models/prompts.PromptTarget; per-row left
    padding in the KVCache `pad`, RoPE positions = slots - pad)."""

    prefill_error = ArtifactMismatchError
    prefill_fix = "re-export it with `lisa-trt export`"

    def __init__(self, manifest, runners: dict):
        super().__init__(manifest, runners)
        self.max_positions = self.config.max_position_embeddings
        self._cond = self._xf.prompt_condition(self.config)  # the family's condition protocol and prompt vocabulary
        self._prompt_vocab = self._xf.prompt_vocab_size(self.config)
        self.family = manifest.model_family  # looked up once per Manifest

    def check_cond(self, cond) -> int:
        return PromptTarget.check_cond(self, cond) if self._cond is None else self._cond.check_cond(cond)

    def null_cond(self, cond):
        """The CFG rows: the bundle's condition protocol, else the family's rule (ModelFamily.null_cond)."""
        return self.family.null_cond(self.config, cond) if self._cond is None else self._cond.null_cond(cond)

    def cfg_rows(self, cond, null):
        return PromptTarget.cfg_rows(cond, null) if self._cond is None else self._cond.cfg_rows(cond, null)

    def new_cache(self, batch: int, max_len: Optional[int] = None, dtype=None, *, extra: int = 0,
                  prompt_len: Optional[int] = None, n_tokens: Optional[int] = None):
        """A KVCache of the engines' static length (`max_len`, or prompt_len + n_tokens + extra as
        the generic loops pass them, must fit it)."""
        if max_len is None:
            if prompt_len is None or n_tokens is None:
                raise InputError("new_cache needs max_len, or prompt_len and n_tokens")
            max_len = int(prompt_len) + int(n_tokens) + int(extra)
        if max_len > self.max_cache_len:
            raise InputError(f"{max_len} cache slots do not fit the engines' static length {self.max_cache_len}; "
                             "re-export with a larger --max-prompt / --max-tree or a smaller image")
        return self._kv_cache(batch, dtype)

    def prefill(self, cond, cache, valid: Optional[torch.Tensor] = None, taps: bool = False):
        """A left-padded prompt (B, T) into slots 0..T-1; outputs of its last position.

        cond: the prompt ids (B, T), or the condition forms of `Prompts.of` ((ids, valid), Prompts)."""
        from ..models.prompts import Prompts, prefill_plan

        p = Prompts.of(cond, valid)
        ids, valid = p.ids, p.valid
        slots, pos, mask = prefill_plan(ids, cache, valid)
        if self._prefill is None:  # one target graph: the verify graph embeds prompt id t as offset + t
            rec = self._prefill_ids
            out = self._step(self._verify, ids, pos, slots, mask, cache, taps, rec["count"], rec["offset"], last=True)
        else:
            out = self._step(self._prefill, ids, pos, slots, mask, cache, taps, self._prompt_vocab)
        cache.lengths.fill_(ids.shape[1])
        return out


class GraphGridVQ(GraphDecoder):
    """A code-grid decoder graph: codes (B, h, w) (the manifest's latent grid) -> images
    (B, 3, h*ds, w*ds) in about [-1, 1]."""

    def __init__(self, manifest, runner):
        super().__init__(manifest, runner)
        from ..export.prompt_graphs import vq_settings

        self.n_codes, self.downsample, _ = vq_settings(self.config)
        self.latent = tuple(manifest.layout["latent"])

    def tokens_to_pixels(self, tokens: torch.Tensor) -> torch.Tensor:
        """Codes (B, h * w) or (B, h, w) on the exported latent grid -> images (decode_code)."""
        if torch.is_tensor(tokens) and tokens.dim() == 2 and tokens.shape[1] == self.latent[0] * self.latent[1]:
            tokens = tokens.reshape(tokens.shape[0], *self.latent)
        return self.decode_code(tokens)

    def decode_code(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.dim() != 3 or tuple(codes.shape[1:]) != self.latent:
            raise InputError(f"codes must be (B, {self.latent[0]}, {self.latent[1]}) (the exported latent grid); "
                             f"got shape {tuple(codes.shape)}")
        return self._decode(codes, self.n_codes)


def open_engines(man, backend: str = "ort", **options) -> Engines:
    """The engines of a read Manifest (engines/graph.load_engines calls this for the family), with
    the bundle's tables (checked against the target) in Engines.tables."""
    from ..calibration.tables import load_tables

    d = Path(man.dir)
    tables = load_tables(d / man.files["tables"]) if "tables" in (man.files or {}) else None
    if tables is not None and tables.target_hash != man.target_hash:
        raise ArtifactMismatchError(f"{d}/tables.safetensors was made for target {tables.target_hash}, not "
                                    f"{man.target_hash}; re-export the directory")
    return open_family_engines(man, backend, GraphPromptTarget, GraphGridVQ, tables=tables, **options)


__all__ = ["GraphGridVQ", "GraphPromptTarget", "open_engines"]
