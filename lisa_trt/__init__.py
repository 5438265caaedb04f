"""lisa-trt: LISA speculative decoding for autoregressive image generators, deployable.

Public API (kept stable): load_target, load_vq, generate, teacher_forced_logits, Pipeline,
TargetConfig, VQConfig, LisaError.
"""

from .threads import set_passive_wait_env as _passive

_passive()  # before torch loads OpenMP: idle threads sleep instead of spinning (see threads.py)

from .config import SamplingConfig, TargetConfig, VQConfig, target_config, vq_config
from .errors import LisaError
from .threads import apply_thread_policy

# torch-backed names load on first use (PEP 562), so that `import lisa_trt` and the CLI's start
# (`--help`, `serve` refusing a taken port) do not pay for importing torch
_LAZY = {"load_target": ".models.checkpoints", "load_vq": ".models.checkpoints",
         "GenerationResult": ".runtime.pipeline", "Pipeline": ".runtime.pipeline",
         "generate": ".speculative.autoregressive"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")



def teacher_forced_logits(target, *inputs, **kw):
    """Full-sequence fp32 logits of a target (no cache).

    Chameleon family: `teacher_forced_logits(target, input_ids (B, T))` -> (B, T, V) raw head
    logits over the whole vocabulary ([:, t] predicts token t + 1). LlamaGen:
    `teacher_forced_logits(target, cond, tokens (B, N))` -> (B, N, V).
    """
    return target.teacher_forced_logits(*inputs, **kw)


from ._version import __version__  # noqa: E402

__all__ = ["GenerationResult", "LisaError", "Pipeline", "SamplingConfig", "TargetConfig", "apply_thread_policy",
           "VQConfig", "generate", "load_target", "teacher_forced_logits",
           "load_vq", "target_config", "vq_config", "__version__"]
