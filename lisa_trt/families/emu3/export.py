"""The Emu3 family's export plugin (export/families.py finds it through `Emu3Family.export_module`):
the token-prompt bundle of export/prompt_graphs.PromptExportFamily over Emu3's whole-vocabulary
head, GASV over the visual-token sub-vocabulary ("codes"), and the VQ-VAE decoder's frame 0.

    target_prefill.onnx / target_verify.onnx   left-padded prompt ids, tokens / a draft tree
    drafter_*.onnx, gasv.onnx                  with a drafter / tables
    vq_decode.onnx                             code grid (h, w) -> pixels (2-D ops only)
    config.json                                the checkpoint's (vocabulary map, VQ settings)

The static cache serves one image size (its code grid `size / 8` per side): the prompt budget,
the span h * (w + 1) + 3 (row ends and the three end tokens) and the tree scratch."""

from __future__ import annotations

from pathlib import Path

from ...errors import InputError
from ...export.families import register_export_family
from ..prompt_export import VocabPromptGraphs

FAMILY = "emu3"
DEFAULT_MAX_TREE = 64


def latent_grid(image_size: int, downsample: int = 8) -> tuple:
    """(h, w) code grid of a square image (Emu3's VQ: 8 pixels per code)."""
    if image_size % downsample or image_size <= 0:
        raise InputError(f"image size {image_size}: a positive multiple of the VQ's {downsample} pixels per code")
    return image_size // downsample, image_size // downsample


def span_length(h: int, w: int) -> int:
    """Tokens generated for an (h, w) image: rows closed by end-of-line, then the three end tokens."""
    return h * (w + 1) + 3


class Emu3Graphs(VocabPromptGraphs):
    """Emu3's graphs: token-input prefill and verify over the whole vocabulary, GASV over the
    visual tokens, the frame-0 VQ decoder."""

    name = FAMILY
    default_max_tree = DEFAULT_MAX_TREE
    vq_doc = "Emu3 VQ-VAE decoder (frame 0)"

    def bundle_graphs(self, target, drafter, tables, vq, opts, *, source=None, image_size=None, max_prompt=None):
        from . import EMU3

        image_size = int(image_size or EMU3.default_image_size)
        max_prompt = int(max_prompt or self.default_max_prompt)
        h, w = latent_grid(image_size, vq.config.downsample if vq is not None else 8)
        layout = {"image_size": image_size, "max_prompt": max_prompt, "latent": [h, w]}
        return self.vocab_bundle(target, drafter, tables, vq, opts, image_size=image_size, max_prompt=max_prompt,
                                 span=span_length(h, w), layout=layout, source=source,
                                 files=("config.json", "tokenizer.json"))

    def target_config(self, man):
        from .config import read_emu3_config

        return read_emu3_config(Path(man.dir) / (man.files or {}).get("config", "config.json"))

    def vq_config(self, man):
        from .config import Emu3VQConfig

        return Emu3VQConfig.from_hf(man.vq["config"]) if man.vq else None


FAMILY_GRAPHS = register_export_family(Emu3Graphs())


__all__ = ["Emu3Graphs", "latent_grid", "span_length"]
