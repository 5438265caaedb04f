"""The Janus-Pro family (models/family.py seam): prompt-id conditions, HF directories, the VQ."""

from __future__ import annotations

import torch

from ...errors import InputError, SpecError
from ...models.conditioning import TextPrompts
from ...models.family import ModelFamily, register_family
from ...models.prompts import Prompts, with_mask
from . import cond as C
from .config import MODEL_TYPE, is_janus_dir


class JanusFamily(ModelFamily):
    """Janus-Pro: conditions are left-padded text prompt ids; images decode with the Janus VQ."""

    name = "janus"
    model_types = (MODEL_TYPE,)
    vq_beside_checkpoint = True  # the Janus VQ inside the HF checkpoint
    default_sampling = {"cfg_scale": 5.0}  # transformers' / Janus-Pro's image-generation guidance
    train_data = ("self",)  # self-distillation from prompt requests
    default_captions = ("a red fox in the snow", "a lighthouse at sunset", "a bowl of fruit on a table",
                        "a cat sleeping on a sofa", "a mountain lake with pine trees", "a city street at night")

    def conditioning(self, cfg_or_type):
        # text prompts through JanusPrompter (the CLI's --prompt / captions files); a negative text
        # in the prompt template replaces transformers' padded unconditional row
        return TextPrompts(negative=True)

    def claims(self, path) -> bool:
        """True for a directory whose config.json has model_type "janus"."""
        return is_janus_dir(path)

    # -- conditioning ---------------------------------------------------------------------
    def check_cond(self, cfg, cond) -> int:
        return C.check_cond(cfg, cond)

    def null_cond(self, cfg, cond, uncond_embedding=None):
        """CFG's unconditional rows (cond.null_cond: those the condition carries, a negative text's,
        else transformers' BOS / BOI kept, the rest PAD), the one rule the torch target, the graph
        target's condition and the reference loop ask for."""
        return C.null_cond(cfg, cond)

    def generation_inputs(self, target, cond, attention_mask=None, negative=None, negative_mask=None):
        """The public generate's condition; `negative` (B, T') (with `negative_mask`): ids of CFG's
        unconditional rows in place of transformers' padded ones (a Prompts carrying them)."""
        if negative is None:
            return super().generation_inputs(target, cond, attention_mask)
        ids, valid = C.split_cond(with_mask(cond, attention_mask))
        neg = Prompts(*C.split_cond(with_mask(negative, negative_mask)))
        if neg.batch != ids.shape[0]:
            raise InputError(f"negative_prompt_ids has {neg.batch} rows for {ids.shape[0]} prompts; pass one per prompt")
        return Prompts(ids, valid, uncond=neg), None, None

    def example_cond(self, cfg, batch: int, generator=None):
        return C.example_cond(cfg, batch, generator)

    def cond_specs(self, cfg_or_type) -> tuple:
        model_type = getattr(cfg_or_type, "model_type", cfg_or_type)
        if model_type != MODEL_TYPE:
            raise SpecError(f"the janus family serves model_type 'janus', not {model_type!r}")
        return (("prompt_ids", "int64", ("batch", "prompt"), "text prompt ids, left-padded"),
                ("prompt_mask", "bool", ("batch", "prompt"), "True on real prompt tokens (padding first)"))

    def cond_inputs(self, cfg, cond, device, act_dtype) -> dict:
        ids, valid = C.split_cond(cond)
        return dict(prompt_ids=ids.to(device=device, dtype=torch.int64).contiguous(),
                    prompt_mask=valid.to(device=device, dtype=torch.bool).contiguous())

    def cond_from_inputs(self, cfg, inputs: dict):
        return inputs["prompt_ids"], inputs["prompt_mask"]

    # -- artifacts ------------------------------------------------------------------------
    def describe_checkpoint(self) -> str:
        return "an HF directory (config.json of model_type janus, JanusForConditionalGeneration)"

    def load_target(self, path, config=None, device="cpu"):
        from .checkpoint import load_janus_target

        return load_janus_target(path, config, device=device)

    def load_decoder(self, path, config=None, device="cpu"):
        from .checkpoint import load_janus_vq

        return load_janus_vq(path, config, device=device)

    def target_from_state(self, config, state_dict: dict):
        from ...models.hf import model_from_state
        from .target import JanusTarget

        return model_from_state(lambda: JanusTarget(config), state_dict, "the bundle's Janus target", config.describe())

    def decoder_from_state(self, config, state_dict: dict):
        from ...models.checkpoints import model_with_state
        from .vq import JanusVQ

        return model_with_state(JanusVQ(config), state_dict, "Janus VQ decoder")

    default_image_size = 384

    def prompter(self, target, source=None):
        """Janus-Pro's image-generation prompt over the checkpoint's tokenizer.json (prompts.py)."""
        from .prompts import JanusPrompter

        return JanusPrompter(target, source if source is not None else getattr(target, "source_dir", None))

    def codebook(self, vq):
        """The VQ's code embeddings (n_codes, d) (the decoder L2-normalises them, as calibration does)."""
        return vq.quantize.embedding.weight.detach()

    def tokens_to_pixels(self, vq, tokens):
        """Raw VQ decoder output (B, 3, H, W) for codes (B, N) or (B, h, w)."""
        return vq.tokens_to_pixels(tokens)


FAMILY = register_family(JanusFamily())

__all__ = ["FAMILY", "JanusFamily"]
