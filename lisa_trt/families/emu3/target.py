"""Emu3's decoder with a static KV cache: the shared whole-vocabulary prompt target
(families/prompt_target.py) with the parameter names of Emu3 checkpoints on disk
(`text_model.model.embed_tokens`, `text_model.model.layers.N.*`, `text_model.model.norm`,
`text_model.lm_head`: the BAAI/Emu3-*-hf files, and what transformers' save_pretrained writes),
so they load strictly. Math as transformers': pre-norm Llama blocks
(RMSNorm in fp32, GQA, SwiGLU, rotate-half RoPE on absolute positions, no q/k norm)."""

from __future__ import annotations

import torch.nn as nn

from ...models.layers import DecoderStack
from ..prompt_target import VocabPromptTarget
from .config import Emu3Config


class Emu3Target(VocabPromptTarget):
    """Emu3's text decoder over the whole vocabulary (the image VQ is separate: vq.py)."""

    family = "emu3"

    def __init__(self, config: Emu3Config):
        super().__init__()
        self.config = cfg = config
        self.text_model = nn.Module()  # the file's `text_model.*`; `vqmodel.*` is the VQ's (vq.py)
        self.text_model.model = DecoderStack(cfg, cfg.vocab_size)
        self.text_model.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self._init_rope_and_weights()

    @property
    def stack(self) -> DecoderStack:
        return self.text_model.model

    @property
    def lm_head(self) -> nn.Linear:
        return self.text_model.lm_head

    def reset_buffers(self) -> None:
        super().reset_buffers()
        if self.config.tie_word_embeddings:
            self.text_model.lm_head.weight = self.stack.embed_tokens.weight
