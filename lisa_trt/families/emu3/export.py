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
from ...export.memory import resolve
from ...export.onnx import _NamedGraph
from ...export.prompt_graphs import PromptStepGraph, check_bundle_artifacts, prompt_cache_len
from ...models.io_spec import Graph
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
        code_ids = EMU3.sub_vocab(target).code_ids if tables is not None else None
        tables = check_bundle_artifacts(target, drafter, tables, code_ids)
        h, w = latent_grid(image_size, vq.config.downsample if vq is not None else 8)
        L = prompt_cache_len(max_prompt, span_length(h, w), opts.max_tree)
        if L > target.config.max_position_embeddings + opts.max_tree:
            raise InputError(f"a {image_size}px image with a {max_prompt}-token prompt needs {L} cache slots; this "
                             f"checkpoint has max_position_embeddings {target.config.max_position_embeddings}")
        layout = {"image_size": image_size, "max_prompt": max_prompt, "latent": [h, w]}

        def target_graphs(t_exp, precision):
            return [(Graph.TARGET_PREFILL, lambda: Emu3StepGraph(resolve(t_exp), True), precision),
                    (Graph.TARGET_VERIFY, lambda: Emu3StepGraph(resolve(t_exp), False), precision)]

        vq_graph = (lambda: Emu3VQGraph(vq.eval(), target.config)) if vq is not None else None
        source = source if source is not None else getattr(target, "source_dir", "") or "."
        return self.prompt_bundle(target, tables, target_graphs=target_graphs, vq_graph=vq_graph, layout=layout,
                                  max_cache_len=L, source=source, files=("config.json", "tokenizer.json"))

    def target_config(self, man):
        from .config import read_emu3_config

        return read_emu3_config(Path(man.dir) / (man.files or {}).get("config", "config.json"))

    def vq_config(self, man):
        from .config import Emu3VQConfig

        return Emu3VQConfig.from_hf(man.vq["config"]) if man.vq else None


FAMILY_GRAPHS = register_export_family(Emu3Graphs())


class Emu3StepGraph(PromptStepGraph):
    """Emu3Target._run over a static cache (export/prompt_graphs.PromptStepGraph)."""

    def __init__(self, model, last_only: bool):
        spec = FAMILY_GRAPHS.graph_spec(Graph.TARGET_PREFILL if last_only else Graph.TARGET_VERIFY, model.config)
        super().__init__(model, spec, lambda m, ids: m.stack.embed_tokens(ids), last_only)


class Emu3VQGraph(_NamedGraph):
    """Emu3VQ.decode_code without its host-side code check."""

    def __init__(self, vq, target_cfg):
        super().__init__(FAMILY_GRAPHS.graph_spec(Graph.VQ_DECODE, target_cfg))
        self.vq = vq

    def compute(self, x):
        quant = self.vq.quantize.embedding(x["image_tokens"]).permute(0, 3, 1, 2)  # (B, C, h, w)
        return dict(images=self.vq.decoder(self.vq.post_quant_conv(quant), quant).float())


__all__ = ["Emu3Graphs", "Emu3StepGraph", "Emu3VQGraph", "latent_grid", "span_length"]
