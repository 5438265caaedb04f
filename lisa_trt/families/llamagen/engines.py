"""LlamaGen's graph engines (its ExportFamily's `engines_module`): the condition-prefix target and
the VQ-16 decoder over any backend's runners.

`LlamaGenGraphTarget` is engines/graph.GraphTarget with LlamaGen's condition protocol: the class
token (c2i) or caption (t2i) prefix of `cls_token_num` slots, the null caption a t2i bundle ships
for CFG (`conditions.safetensors`), and a cache of round_up(seq_len + extra, 8) slots. `GraphVQ`
decodes the code sequence of one image through the vq_decode graph. The drafter and the GASV
graph are the generic `GraphDrafter` / `GraphGASV`, and every cache write is `_KVEngine._run_kv`.

    engines = load_engines("engines/demo", "ort")   # engines/graph.load_engines opens it here
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ...config import find_multiple
from ...engines.base import GraphRunner, check_static_len
from ...engines.graph import Engines, GraphDecoder, GraphTarget, open_family_engines
from ...errors import InputError


class LlamaGenGraphTarget(GraphTarget):
    """The LlamaGen target over a backend's prefill + verify runners (TargetEngine protocol).

    Without a prefill runner (a c2i bundle whose verify graph embeds the class ids:
    ExportFamily.bundle_prefill_ids) the prefill is one verify call (the prefill graph's
    positions, slots and mask, made here) and its last position's outputs."""

    def __init__(self, manifest, runners: dict):
        super().__init__(manifest, runners)
        self.family = manifest.model_family  # looked up once per Manifest
        self.max_positions = self.config.seq_len
        # the verify engine's seq capacity (a "prefill" profile may exceed the cache's tree slots)
        self.max_tree = min(getattr(self._verify, "seq_capacity", manifest.max_tree), manifest.max_tree)
        self._uncond = None
        if "conditions" in (manifest.files or {}):  # the null caption (t2i) shipped in the bundle
            from ...io import load_safetensors

            self._uncond = load_safetensors(Path(manifest.dir) / manifest.files["conditions"])[0]["uncond_embedding"]

    def check_cond(self, cond) -> int:
        return self.family.check_cond(self.config, cond)

    def null_cond(self, cond):
        return self.family.null_cond(self.config, cond, self._uncond)

    def prompt_len(self, cond) -> int:
        return self.config.cls_token_num

    def new_cache(self, batch: int, max_len: Optional[int] = None, dtype=None, *, extra: int = 0,
                  prompt_len: Optional[int] = None, n_tokens: Optional[int] = None):
        """A KVCache of the engines' static length (>= round_up(max_len + extra, 8), max_len the whole
        sequence by default: the targets' one new_cache signature); prompt_len / n_tokens (the
        generic loops pass them) are implied by the config."""
        from .model import committed_len

        need = find_multiple(committed_len(self.config, max_len) + extra, 8)
        check_static_len(need, self.max_cache_len, f"a cache with {extra} extra slots",
                         f"re-export with a larger --max-tree (exported with max_tree {self.manifest.max_tree}) "
                         "or use a smaller tree budget")
        return self._kv_cache(batch, dtype)

    def prefill(self, cond, cache, taps: bool = False):
        """Write the condition prefix into the cache; logits of the last prefix position."""
        from ...models.layers import TargetOutput

        B = self.check_cond(cond)
        if B != cache.batch:
            raise InputError(f"condition batch {B} does not match the cache batch {cache.batch}")
        self._cache_ok(cache)
        if self._prefill is None:
            return self._prefill_verify(cond, cache, taps)
        inputs = self.family.cond_inputs(self.config, cond, self.device, self.dtype)
        out = self._run_kv(self._prefill, cache, self.config.n_layer, inputs, {})
        T = self.config.cls_token_num
        cache.col_valid[:] = True
        cache.col_valid[:, :T] = out["prefix_valid"].to(cache.col_valid.device)
        cache.lengths.fill_(T)
        return TargetOutput(out["logits"], out["taps"] if taps else None, out["hidden"])

    def _prefill_verify(self, cond, cache, taps: bool):
        """The prefill as one verify call over the condition's ids: slots and positions 0..T-1,
        the prefill graph's mask ((causal & valid) | eye, nothing past T), the outputs of the
        last prefix position."""
        from ...models.layers import TargetOutput

        ids, valid = self._xf.prefill_tokens(self.config, cond, self._prefill_ids)
        B, T = ids.shape
        ar = torch.arange(T)
        mask = torch.zeros(B, T, self.max_cache_len, dtype=torch.bool)
        mask[:, :, :T] = ((ar[None, :] <= ar[:, None])[None] & valid[:, None, :]) | (ar[None, :] == ar[:, None])[None]
        pos = ar[None, :].expand(B, T)
        out = self._run_kv(self._verify, cache, self.config.n_layer, self._step_inputs(ids, pos, pos, mask), {})
        cache.col_valid[:] = True
        cache.col_valid[:, :T] = valid.to(cache.col_valid.device)
        cache.lengths.fill_(T)
        last = {k: out[k][:, -1:] if T > 1 else out[k] for k in ("logits", "taps", "hidden")}
        return TargetOutput(last["logits"], last["taps"] if taps else None, last["hidden"])


class GraphVQ(GraphDecoder):
    """The VQ decoder graph: token ids (B, h*w) -> images (B, 3, H, W) in about [-1, 1]."""

    def __init__(self, manifest, runner: GraphRunner):
        super().__init__(manifest, runner)
        h, w = manifest.target_config.grid_hw
        self.n_codes = h * w

    def tokens_to_pixels(self, tokens: torch.Tensor) -> torch.Tensor:
        """Codes (B, h*w) or (B, h, w) -> images (decode_code): the family hook's decoder call."""
        if torch.is_tensor(tokens) and tokens.dim() == 3:
            tokens = tokens.reshape(tokens.shape[0], -1)
        return self.decode_code(tokens)

    def decode_code(self, indices, shape=None):
        B, N = indices.shape
        if N != self.n_codes:
            raise InputError(f"expected {self.n_codes} tokens per image, got {N}")
        return self._decode(indices, self.config.codebook_size)


def open_engines(man, backend: str = "ort", **options) -> Engines:
    """The engines of a read LlamaGen Manifest (engines/graph.load_engines calls this)."""
    return open_family_engines(man, backend, LlamaGenGraphTarget, GraphVQ, **options)


__all__ = ["GraphVQ", "LlamaGenGraphTarget", "open_engines"]
