"""The Chameleon / Lumina-mGPT family (models/family.py seam): HF directories of model_type
"chameleon", token-id prompts, the image codes as a sub-vocabulary of the head."""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError, InputError
from ...models.family import Request, SequenceLayout, register_family
from ..prompt_family import VocabPromptFamily


class ChameleonFamily(VocabPromptFamily):
    """Chameleon-architecture decoders (Chameleon, Lumina-mGPT); see model.py. The condition,
    vocabulary and teacher-forcing hooks are the shared families/prompt_family.py."""

    name = "chameleon"
    model_types = ("chameleon",)
    checkpoint_model_types = ("chameleon", "chameleon_xllmx")
    default_image_size = 512  # Lumina-mGPT's 512 checkpoints (768 / 1024 models: pass the size)
    default_sampling = {"cfg_scale": 3.0, "temperature": 1.0, "top_k": 2000}  # Lumina-mGPT's defaults
    default_tree = {"top_k": 4, "depth": 4, "total_tokens": 16}
    train_defaults = {"steps": 100, "batch_size": 4, "lr": 1e-3, "checkpoint_every": 50, "log_every": 1,
                      "num_samples": 32, "gen_batch": 8}

    def describe_checkpoint(self) -> str:
        return "an HF directory (config.json of model_type chameleon + model*.safetensors)"

    def image_vocab(self, cfg) -> dict:
        from .model import image_vocab

        return image_vocab(cfg.vocabulary_map, cfg.vocab_size)

    def claims_decoder(self, path) -> bool:
        return any((Path(path) / n).is_file() for n in ("vqgan.ckpt", "vqgan.safetensors"))

    def load_target(self, path, config=None, device="cpu"):
        from .checkpoint import load_chameleon

        return load_chameleon(path, device=device)

    def load_decoder(self, path, config=None, device="cpu"):
        """The VQGAN beside the checkpoint (DIR/vqgan/ or DIR), or a VQGAN folder itself.

        From a model directory the VQ also maps vocabulary ids to codes (`token_codes`), so
        `tokens_to_pixels(vq, tokens)` takes what `generate` returns."""
        from .checkpoint import read_chameleon_config
        from .vq import find_vq_dir, load_chameleon_vq

        path = Path(path)
        folder = find_vq_dir(path) if path.is_dir() else path
        if folder is None:
            raise ConfigError(f"no VQGAN in {path}: put Chameleon's vqgan.yaml + vqgan.ckpt (or vqgan.json + "
                              "vqgan.safetensors) in DIR/vqgan/ (docs/chameleon.md). A transformers "
                              "save_pretrained directory holds only the VQ encoder (model.vqmodel.*), which "
                              "cannot decode; the decoder ships in the Chameleon release's tokenizer/ folder")
        vq = load_chameleon_vq(folder, device=device)
        if path.is_dir() and self.claims(path):
            vq.token_codes = self.token_codes(read_chameleon_config(path))
        return vq

    def target_from_state(self, config, state_dict: dict):
        from ...models.hf import model_from_state
        from .model import ChameleonTarget

        return model_from_state(lambda: ChameleonTarget(config), state_dict, "the bundle's Chameleon target",
                                config.describe())

    def decoder_from_state(self, config, state_dict: dict):
        from ...models.checkpoints import model_with_state
        from .vq import ChameleonVQGAN

        return model_with_state(ChameleonVQGAN(config), state_dict, "Chameleon VQGAN")

    # -- prompts and pixels ----------------------------------------------------------------

    def prompter(self, target, source=None):
        """Lumina-mGPT's text-to-image protocol over the checkpoint's tokenizer.json."""
        return _LuminaPrompter(target, source if source is not None else getattr(target, "source_dir", None))

    def codes_to_pixels(self, vq, codes):
        """Code grids (B, h, w) (row ends dropped) through the VQGAN decoder (or its graph)."""
        return vq.decode_code(codes)

    def to_uint8(self, pixels):
        """Chameleon's conversion: clamp to [-1, 1], map to [0, 255], truncate."""
        from .vq import to_uint8

        return to_uint8(pixels)

    def tokens_to_codes(self, target, tokens, request):
        from .lumina import tokens_to_codes

        return tokens_to_codes(target, tokens, *request.grid)

    def free_layout(self, target, n_tokens=None, image_tokens_only: bool = False) -> SequenceLayout:
        """`n_tokens` free tokens over the raw head (optionally image codes only): the public
        `lisa_trt.generate(target, input_ids, max_new_tokens=N)`."""
        if n_tokens is None:
            raise InputError("Chameleon-family targets need max_new_tokens=N (the raw head has no image length)")
        return super().free_layout(target, n_tokens, image_tokens_only)


class _LuminaPrompter:
    def __init__(self, target, source):
        from .lumina import LuminaTokenizer

        if source is None:
            raise InputError("text prompts need the checkpoint directory (its tokenizer.json): pass it as source")
        self.target, self.tok = target, LuminaTokenizer(source)

    def encode(self, prompts, *, image_size=None, cfg: bool = False, width=None, height=None,
               negative=None) -> Request:
        """negative: one text for every prompt or one per prompt, CFG's rows (lumina.span_request)."""
        from .lumina import span_request

        size = image_size or ChameleonFamily.default_image_size
        cond, layout, grid = span_request(self.target, self.tok, list(prompts), width or size, height or size, cfg,
                                          negative=negative)
        return Request(cond, layout, grid, tuple(prompts))


CHAMELEON = register_family(ChameleonFamily())

__all__ = ["CHAMELEON", "ChameleonFamily"]
