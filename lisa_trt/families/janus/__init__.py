"""Janus-Pro (DeepSeek) as a lisa-trt model family, in image-generation mode.

    config.py      JanusConfig / JanusVQConfig from an HF directory's config.json
    cond.py        prompt conditions: validation, CFG's unconditional rows, examples
    target.py      JanusTarget (Llama decoder + generation embeddings / aligner / head), JanusCache
    vq.py          JanusVQ decoder: codes -> pixels
    checkpoint.py  strict loading of the target and the VQ from one directory
    generate.py    the reference KV-cached CFG loop (generate_image_tokens)
    family.py      JanusFamily, registered under model_type "janus"

Importing this package registers the family (models/family.py lists it in _BUILTIN).
"""

from .checkpoint import load_janus_target, load_janus_vq
from .config import JanusConfig, JanusVQConfig, is_janus_dir, read_janus_config
from .family import JanusFamily
from .generate import cfg_mix, generate_image_tokens
from .target import JanusCache, JanusTarget, image_logits
from .vq import JanusVQ, tokens_to_pixels

__all__ = ["JanusCache", "JanusConfig", "JanusFamily", "JanusTarget", "JanusVQ", "JanusVQConfig", "cfg_mix",
           "generate_image_tokens", "image_logits", "is_janus_dir", "load_janus_target", "load_janus_vq",
           "read_janus_config", "tokens_to_pixels"]
