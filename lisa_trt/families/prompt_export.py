"""The export side shared by whole-vocabulary prompt-id families (Chameleon / Lumina-mGPT, Emu3):
one embedding table for prompts and image tokens (the verify graph runs the prefill), the
checkpoint's vocabulary map left to the config.json the bundle carries, and the bundle itself
(`vocab_bundle`): the two target graphs over the decoder stack, the VQ graph over the decoder's
`decode_grid` (both from `graph_module`, which the torch backend runs too), the static cache of one
image span, GASV tables over the image codes."""

from __future__ import annotations

from ..errors import InputError
from ..export.onnx import _NamedGraph
from ..export.prompt_graphs import PromptExportFamily, check_bundle_artifacts, prompt_cache_len
from ..models.io_spec import Graph


class VocabVQGraph(_NamedGraph):
    """The family VQ's `decode_grid` (its decode_code without the host-side code check)."""

    def __init__(self, vq, spec):
        super().__init__(spec)
        self.vq = vq

    def compute(self, x):
        return dict(images=self.vq.decode_grid(x["image_tokens"]).float())


class VocabPromptGraphs(PromptExportFamily):
    """A PromptExportFamily over a whole-vocabulary head; GASV over the image codes."""

    gasv_axis = "codes"  # the tables cover the image codes inside the whole-vocabulary head
    verify_embeds_prompts = True

    def prefill_ids(self, cfg):
        """The verify graph embeds every id with the prompt's embedding (one table): prompts pass as
        they are, and the prefill is one verify call."""
        return {"offset": 0, "count": int(cfg.vocab_size)}

    def config_record(self, cfg) -> dict:
        d = super().config_record(cfg)
        d.pop("vocabulary_map", None)  # the whole vocabulary: the bundle carries the checkpoint's config.json
        return d

    def verify_embed(self, model, ids):
        """Prompt and image ids -> input embeddings: the one table of a whole-vocabulary target (the
        prefill's too), without the target's host-side id check."""
        return model.stack.embed_tokens(ids)

    def graph_module(self, graph, model, cfg, cache_len):
        """The prefill / verify PromptStepGraph (PromptExportFamily), the decoder's `decode_grid`."""
        if graph is Graph.VQ_DECODE:
            return VocabVQGraph(model, self.graph_spec(graph, cfg))
        return super().graph_module(graph, model, cfg, cache_len)

    def tables_sub_vocab(self, target):
        """The image codes inside the whole-vocabulary head (the family's SubVocab)."""
        from ..models.family import family_of

        return family_of(target.config).sub_vocab(target)

    def vocab_bundle(self, target, drafter, tables, vq, opts, *, image_size: int, max_prompt: int, span: int,
                     layout: dict, source, files: tuple):
        """The BundleGraphs of one image size: `span` generated tokens after a prompt of at most
        `max_prompt` (InputError when the cache would pass the checkpoint's positions), the
        family's image codes the tables' sub-vocabulary, the checkpoint `files` copied."""
        code_ids = self.tables_sub_vocab(target).code_ids if tables is not None else None
        tables = check_bundle_artifacts(target, drafter, tables, code_ids)
        L = prompt_cache_len(max_prompt, span, opts.max_tree)
        if L > target.config.max_position_embeddings + opts.max_tree:
            raise InputError(f"a {image_size}px image with a {max_prompt}-token prompt needs {L} cache slots; this "
                             f"checkpoint has max_position_embeddings {target.config.max_position_embeddings}")
        source = source if source is not None else getattr(target, "source_dir", "") or "."
        return self.prompt_bundle(target, tables, vq, opts, layout=layout, max_cache_len=L, source=source, files=files)
