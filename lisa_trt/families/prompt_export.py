"""The export side shared by whole-vocabulary prompt-id families (Chameleon / Lumina-mGPT, Emu3):
one embedding table for prompts and image tokens (the verify graph runs the prefill), the
checkpoint's vocabulary map left to the config.json the bundle carries, and the bundle itself
(`vocab_bundle`): the two target graphs over the decoder stack, the VQ graph over the decoder's
`decode_grid`, the static cache of one image span, GASV tables over the image codes."""

from __future__ import annotations

from ..errors import InputError
from ..export.memory import resolve
from ..export.onnx import _NamedGraph
from ..export.prompt_graphs import PromptExportFamily, PromptStepGraph, check_bundle_artifacts, prompt_cache_len
from ..models.io_spec import Graph


def embed_tokens(model, ids):
    """Prompt and image ids -> input embeddings: the one table of a whole-vocabulary target."""
    return model.stack.embed_tokens(ids)


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

    def step_graph(self, model, last_only: bool) -> PromptStepGraph:
        """The prefill (last_only) or verify graph: the target's `_run` over a static cache."""
        spec = self.graph_spec(Graph.TARGET_PREFILL if last_only else Graph.TARGET_VERIFY, model.config)
        return PromptStepGraph(model, spec, embed_tokens, last_only)

    def vocab_bundle(self, family, target, drafter, tables, vq, opts, *, image_size: int, max_prompt: int,
                     span: int, layout: dict, source, files: tuple):
        """The BundleGraphs of one image size: `span` generated tokens after a prompt of at most
        `max_prompt` (InputError when the cache would pass the checkpoint's positions), the
        family's image codes the tables' sub-vocabulary, the checkpoint `files` copied."""
        code_ids = family.sub_vocab(target).code_ids if tables is not None else None
        tables = check_bundle_artifacts(target, drafter, tables, code_ids)
        L = prompt_cache_len(max_prompt, span, opts.max_tree)
        if L > target.config.max_position_embeddings + opts.max_tree:
            raise InputError(f"a {image_size}px image with a {max_prompt}-token prompt needs {L} cache slots; this "
                             f"checkpoint has max_position_embeddings {target.config.max_position_embeddings}")

        def target_graphs(t_exp, precision):
            return [(Graph.TARGET_PREFILL, lambda: self.step_graph(resolve(t_exp), True), precision),
                    (Graph.TARGET_VERIFY, lambda: self.step_graph(resolve(t_exp), False), precision)]

        vq_graph = (lambda: VocabVQGraph(vq.eval(), self.graph_spec(Graph.VQ_DECODE, target.config))) \
            if vq is not None else None
        source = source if source is not None else getattr(target, "source_dir", "") or "."
        return self.prompt_bundle(target, tables, target_graphs=target_graphs, vq_graph=vq_graph, layout=layout,
                                  max_cache_len=L, source=source, files=files)
