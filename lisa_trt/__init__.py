"""lisa-trt: LISA speculative decoding for autoregressive image generators, deployable.

Public API (kept stable): load_target, load_vq, generate, Pipeline, TargetConfig, VQConfig, LisaError.
"""

from .config import SamplingConfig, TargetConfig, VQConfig, target_config, vq_config
from .errors import LisaError
from .models.checkpoints import load_target, load_vq
from .runtime.pipeline import GenerationResult, Pipeline
from .speculative.autoregressive import generate

from ._version import __version__  # noqa: E402

__all__ = ["GenerationResult", "LisaError", "Pipeline", "SamplingConfig", "TargetConfig", "VQConfig", "generate", "load_target",
           "load_vq", "target_config", "vq_config", "__version__"]
