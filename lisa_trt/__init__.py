"""lisa-trt: LISA speculative decoding for autoregressive image generators, deployable.

Public API (kept stable): load_target, load_vq, generate, teacher_forced_logits, image_logits,
tokens_to_pixels, Pipeline, TargetConfig, VQConfig, LisaError. Every call works for every model
family (LlamaGen, Chameleon / Lumina-mGPT, Janus-Pro, Emu3; docs/families.md).
"""

from .threads import set_passive_wait_env as _passive

_passive()  # before torch loads OpenMP: idle threads sleep instead of spinning (see threads.py)

from .config import SamplingConfig
from .errors import LisaError
from .threads import apply_thread_policy

# torch-backed names load on first use (PEP 562), so that `import lisa_trt` and the CLI's start
# (`--help`, `serve` refusing a taken port) do not pay for importing torch
# (the config names resolve through models/target_config.py: the registries of named configs and the
# config classes the defining family publishes, LlamaGen's TargetConfig / VQConfig). Each module is
# imported by an import statement, so the import floors test (tests/test_architecture.py) sees it.


def __getattr__(name):
    if name in ("load_target", "load_vq"):
        from .models import checkpoints as module
    elif name in ("GenerationResult", "Pipeline"):
        from .runtime import pipeline as module
    elif name in ("TargetConfig", "VQConfig", "target_config", "vq_config"):
        from .models import target_config as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(module, name)
    return value


def image_logits(target, prompt_ids, image_tokens):
    """Raw per-row logits of the image head (no CFG), (B, N, codebook) fp32: position k predicts
    image token k from the prompt and image_tokens[:, :k] (families with an image head: Janus-Pro;
    LlamaGen: the condition as prompt, the same as teacher_forced_logits)."""
    fn = getattr(target, "image_logits", None)
    if fn is None:
        from .errors import InputError

        raise InputError(f"{type(target).__name__} has no separate image head; use teacher_forced_logits")
    return fn(prompt_ids, image_tokens)


def tokens_to_pixels(vq, tokens):
    """Image tokens -> (B, 3, H, W) float, the raw decoder output (no clamp, no rescale), for the
    decoder of any family (`load_vq`): codes (B, N) / (B, h, w), or what that family's
    `generate` returns."""
    return vq.tokens_to_pixels(tokens)


def generate(target, cond=None, *, negative_prompt_ids=None, negative_prompt_attention_mask=None,
             attention_mask=None, layout=None, **kw):
    """Tokens (B, N) of the plain autoregressive loop (speculative/autoregressive.generate: its
    arguments, cfg_scale, greedy, seed, max_new_tokens, ...), for any family.

    A family whose prompt fixes the image (Emu3: `<|image start|>H*W<|image token|>`) generates
    that image's layout; `negative_prompt_ids` (B, T') (with its attention mask) are the
    unconditional rows of CFG as in transformers' generate (prompt-id families)."""
    from .models.family import family_of
    from .speculative.autoregressive import generate as ar_generate

    cond = cond if cond is not None else kw.pop("input_ids", None)
    if layout is None:
        cond, attention_mask, layout = family_of(target.config).generation_inputs(
            target, cond, attention_mask, negative_prompt_ids, negative_prompt_attention_mask)
    return ar_generate(target, cond, attention_mask=attention_mask, layout=layout, **kw)


def teacher_forced_logits(target, cond=None, tokens=None, *, input_ids=None):
    """Cache-free fp32 logits of any family's target, one contract:

    - `teacher_forced_logits(target, cond, tokens (B, N))` -> (B, N, V): [:, j] predicts
      tokens[:, j] from the condition and tokens[:, :j] (every family; prompt-id families: each
      row's real prompt tokens);
    - `teacher_forced_logits(target, input_ids (B, T))` (prompt-id families: Chameleon, Emu3) ->
      (B, T, V) raw whole-vocabulary logits, as transformers' `model(input_ids).logits`.
    """
    from .errors import InputError
    from .models.family import family_of

    if not callable(getattr(target, "teacher_forced_logits", None)):
        raise InputError(f"teacher_forced_logits needs an eager target (lisa_trt.load_target(DIR)); "
                         f"{type(target).__name__} is an engine target (ONNX Runtime / TensorRT graphs run "
                         "cached steps only, no cache-free forward)")
    cond = cond if cond is not None else input_ids
    return family_of(target.config).teacher_forced_logits(target, cond, tokens)


from ._version import __version__  # noqa: E402

__all__ = ["GenerationResult", "LisaError", "Pipeline", "SamplingConfig", "TargetConfig", "apply_thread_policy",
           "VQConfig", "generate", "image_logits", "load_target", "teacher_forced_logits", "tokens_to_pixels",
           "load_vq", "target_config", "vq_config", "__version__"]
