"""lisa-trt: LISA speculative decoding for autoregressive image generators, deployable.

Public API (kept stable): load_target, load_vq, generate, teacher_forced_logits, Pipeline,
TargetConfig, VQConfig, LisaError.
"""

from .threads import set_passive_wait_env as _passive

_passive()  # before torch loads OpenMP: idle threads sleep instead of spinning (see threads.py)

from .config import SamplingConfig, TargetConfig, VQConfig, target_config, vq_config
from .errors import LisaError
from .models.checkpoints import load_target, load_vq
from .runtime.pipeline import GenerationResult, Pipeline
from .speculative.autoregressive import generate
from .threads import apply_thread_policy



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
