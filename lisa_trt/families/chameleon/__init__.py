"""The Chameleon / Lumina-mGPT family (models/family.py seam): HF directories of model_type
"chameleon", token-id prompts, the image codes as a sub-vocabulary of the head."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...errors import ConfigError, InputError
from ...models.conditioning import TextPrompts
from ...models.family import ModelFamily, Request, SequenceLayout, SubVocab, register_family


class ChameleonFamily(ModelFamily):
    """Chameleon-architecture decoders (Chameleon, Lumina-mGPT); see models/chameleon.py."""

    name = "chameleon"
    model_types = ("chameleon",)
    default_image_size = 512  # Lumina-mGPT's 512 checkpoints (768 / 1024 models: pass the size)
    vq_beside_checkpoint = True  # DIR/vqgan/ (Lumina-mGPT's VQGAN with its vqgan.yaml)
    default_sampling = {"cfg_scale": 3.0, "temperature": 1.0, "top_k": 2000}  # Lumina-mGPT's defaults
    default_tree = {"top_k": 4, "depth": 4, "total_tokens": 16}
    train_data = ("self",)  # self-distillation from the prompter's requests (rollouts of the target)
    train_defaults = {"steps": 100, "batch_size": 4, "lr": 1e-3, "checkpoint_every": 50, "log_every": 1,
                      "num_samples": 32, "gen_batch": 8}
    # self-distillation / calibration captions when none are given (generic, varied scenes)
    default_captions = (
        "a red fox in the snow", "a bowl of ramen on a wooden table", "a lighthouse at sunset",
        "a portrait of an old man with a beard", "a city street at night in the rain", "a cat sleeping on a sofa",
        "a mountain lake with pine trees", "a bouquet of sunflowers in a vase", "an astronaut riding a horse",
        "a watercolor painting of a harbor", "a close-up of a hummingbird", "a cozy library with tall shelves",
    )

    def conditioning(self, cfg_or_type):
        return TextPrompts()  # Lumina-mGPT text prompts (the CLI's --prompt / captions files)

    def describe_checkpoint(self) -> str:
        return "an HF directory (config.json of model_type chameleon + model*.safetensors)"

    def claims(self, path) -> bool:
        from .checkpoint import SUPPORTED_MODEL_TYPES

        cfg = Path(path) / "config.json"
        if not cfg.is_file():
            return False
        try:
            return json.loads(cfg.read_text()).get("model_type") in SUPPORTED_MODEL_TYPES
        except (OSError, ValueError):
            return False

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
            from .model import image_vocab

            cfg = read_chameleon_config(path)
            lut = torch.full((cfg.vocab_size,), -1, dtype=torch.long)
            for t, c in image_vocab(cfg.vocabulary_map, cfg.vocab_size).items():
                lut[t] = c
            vq.token_codes = lut
        return vq

    # -- conditions: token-id prompts (models/chameleon.Prompts) ---------------------------

    def check_cond(self, cfg, cond) -> int:
        from .model import Prompts

        p = Prompts.of(cond)
        if p.ids.numel() and (int(p.ids.min()) < 0 or int(p.ids.max()) >= cfg.vocab_size):
            raise InputError(f"token ids must be in 0..{cfg.vocab_size - 1}")
        return p.batch

    def null_cond(self, cfg, cond, uncond_embedding=None):
        from .model import Prompts

        p = Prompts.of(cond)
        if p.uncond is None:
            raise InputError("classifier-free guidance needs the prompt's unconditional rows (Prompts.uncond)")
        return p.uncond

    def cond_specs(self, cfg_or_type) -> tuple:
        return (("input_ids", "int64", ("batch", "prompt"), "prompt token ids, left-padded"),
                ("valid", "bool", ("batch", "prompt"), "False on left padding"))

    def cond_inputs(self, cfg, cond, device, act_dtype) -> dict:
        from .model import Prompts

        p = Prompts.of(cond)
        return dict(input_ids=p.ids.to(device).contiguous(), valid=p.valid.to(device).contiguous())

    def cond_from_inputs(self, cfg, inputs: dict):
        from .model import Prompts

        return Prompts(inputs["input_ids"], inputs["valid"])

    def example_cond(self, cfg, batch: int, generator=None):
        from .model import Prompts

        return Prompts.of(torch.randint(0, cfg.vocab_size, (batch, 8), generator=generator))

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

    # -- sequence layout -------------------------------------------------------------------

    def image_ids(self, target) -> torch.Tensor:
        """Sorted token ids of the image codes (cached on the target)."""
        from .vocab import image_ids

        return image_ids(target)

    def sub_vocab(self, target) -> SubVocab:
        from .vocab import sub_vocab

        return sub_vocab(target)

    def free_layout(self, target, n_tokens=None, image_tokens_only: bool = False) -> SequenceLayout:
        """`n_tokens` free tokens over the raw head (optionally image codes only): the public
        `lisa_trt.generate(target, input_ids, max_new_tokens=N)`."""
        if n_tokens is None:
            raise InputError("Chameleon-family targets need max_new_tokens=N (the raw head has no image length)")
        return SequenceLayout(int(n_tokens), self.image_ids(target) if image_tokens_only else None)

    def teacher_forced_logits(self, target, cond, tokens: torch.Tensor) -> torch.Tensor:
        """Raw head logits (B, N, V): [:, j] predicts tokens[:, j] from row b's prompt and tokens[:, :j].

        One cache-free forward per row over its real prompt tokens (left padding stripped; the
        CFG rows are the span prefix alone, from position 0), so a row's logits never depend on
        the other rows of the batch."""
        from .model import Prompts

        p = Prompts.of(cond)
        N = tokens.shape[1]
        rows = []
        for b in range(p.batch):
            ids = torch.cat([p.ids[b][p.valid[b]], tokens[b, :-1].to(p.ids.device)])
            rows.append(target.forward_full(ids[None]).logits[0, -N:])
        return torch.stack(rows)


class _LuminaPrompter:
    def __init__(self, target, source):
        from .lumina import LuminaTokenizer

        if source is None:
            raise InputError("text prompts need the checkpoint directory (its tokenizer.json): pass it as source")
        self.target, self.tok = target, LuminaTokenizer(source)

    def encode(self, prompts, *, image_size=None, cfg: bool = False, width=None, height=None) -> Request:
        from .lumina import span_request

        size = image_size or ChameleonFamily.default_image_size
        cond, layout, grid = span_request(self.target, self.tok, list(prompts), width or size, height or size, cfg)
        return Request(cond, layout, grid, tuple(prompts))


CHAMELEON = register_family(ChameleonFamily())

__all__ = ["CHAMELEON", "ChameleonFamily"]
