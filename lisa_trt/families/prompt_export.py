"""The export side shared by whole-vocabulary prompt-id families (Chameleon / Lumina-mGPT, Emu3):
one embedding table for prompts and image tokens (the verify graph runs the prefill), and the
checkpoint's vocabulary map left to the config.json the bundle carries."""

from __future__ import annotations

from ..export.prompt_graphs import PromptExportFamily


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
