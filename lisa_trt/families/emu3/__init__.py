"""The Emu3 family (models/family.py seam): transformers' Emu3ForConditionalGeneration directories
(model_type "emu3"), token-id prompts that write the image grid, the visual tokens a
sub-vocabulary of the whole-vocabulary head, rows closed by forced end-of-line tokens and the
image by end-of-frame / end-of-image / end-of-sequence (docs/families_emu3.md)."""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError, InputError
from ...models.family import register_family
from ..prompt_family import VocabPromptFamily


class Emu3Family(VocabPromptFamily):
    """Emu3 (BAAI/Emu3-Gen-hf style directories)."""

    name = "emu3"
    model_types = ("emu3",)
    default_image_size = 720  # Emu3-Gen's image_area 518400 = 720 x 720 (a 90 x 90 code grid)
    default_sampling = {"cfg_scale": 3.0, "temperature": 1.0, "top_k": 2048}  # the Emu3-Gen model card's

    def describe_checkpoint(self) -> str:
        return "an HF directory (config.json of model_type emu3 with text_config, vq_config, vocabulary_map)"

    def image_vocab(self, cfg) -> dict:
        return cfg.image_vocab()

    def load_target(self, path, config=None, device="cpu"):
        from .checkpoint import load_emu3

        return load_emu3(path, device=device)

    def load_decoder(self, path, config=None, device="cpu"):
        """The VQ-VAE decoder inside the model directory (`model.vqmodel.*`), mapping vocabulary
        ids to codes, so `tokens_to_pixels(vq, tokens)` takes what `generate` returns."""
        from .checkpoint import load_emu3_vq

        if not Path(path).is_dir():
            raise ConfigError(f"{path}: an Emu3 VQ loads from the model directory (its model.safetensors)")
        return load_emu3_vq(path, device=device)

    def target_from_state(self, config, state_dict: dict):
        from ...models.hf import model_from_state
        from .target import Emu3Target

        return model_from_state(lambda: Emu3Target(config), state_dict, "the bundle's Emu3 target", config.describe())

    def decoder_from_state(self, config, state_dict: dict):
        from ...models.checkpoints import model_with_state
        from .vq import Emu3VQ

        return model_with_state(Emu3VQ(config), state_dict, "Emu3 VQ decoder")

    def prompter(self, target, source=None):
        """The Emu3-Gen model card's text-to-image prompts over the checkpoint's tokenizer.json."""
        from .prompts import Emu3Prompter

        return Emu3Prompter(target, self, source if source is not None else getattr(target, "source_dir", None))

    def null_cond(self, cfg, cond, uncond_embedding=None):
        from .cfg import null_prompts

        return null_prompts(cond)

    def generation_inputs(self, target, cond, attention_mask=None, negative=None, negative_mask=None):
        """The prompt with its CFG rows and the layout of the image its prompt writes."""
        from .layout import image_layout, prompt_grid

        cond, _, _ = super().generation_inputs(target, cond, attention_mask, negative, negative_mask)
        h, w = prompt_grid(target, cond)
        return cond, None, image_layout(target, self, h, w, cond.ids.device)

    def free_layout(self, target, n_tokens=None, image_tokens_only: bool = False):
        if n_tokens is None:
            raise InputError("an Emu3 image's length comes from its prompt (<|image start|>H*W<|image token|>): "
                             "call lisa_trt.generate(target, prompt_ids), or pass max_new_tokens=N for raw tokens")
        return super().free_layout(target, n_tokens, image_tokens_only)

    def tokens_to_codes(self, target, tokens, request):
        from .vq import span_codes

        return span_codes(tokens, self.token_codes(target.config).to(tokens.device), target.config.end_tokens()[0])

    def codes_to_pixels(self, vq, codes):
        return vq.decode_code(codes)


EMU3 = register_family(Emu3Family())

__all__ = ["EMU3", "Emu3Family"]
