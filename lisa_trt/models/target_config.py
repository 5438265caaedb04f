"""What the generic code reads of a target's configuration, and the registries of named configs.

Each family defines its own configuration class in its package (LlamaGen's GPT shapes:
families/llamagen/config.py; Chameleon, Janus-Pro, Emu3: theirs, read from an HF directory).
Below the families, the layers, the drafter, the decode loops, the exporter and the engines
read what `TargetShape` names: the sizes of the KV cache and the head, and the `model_type`
that names its family (models/family.family_of); what else a family's graphs need, its own
export plug-in reads.

Named configs ("GPT-B", "tiny", "demo", "VQ-16", ...) are registered here by whoever defines
them (a family package, the demo), and looked up by name by the commands above the families:

    cfg = target_config("GPT-B", image_size=384)   # the registering family's factory
    vq = vq_config("VQ-16")
    TargetConfig, VQConfig                          # the public config classes (the facade's names)

A lookup imports the built-in families first (their packages register their names), and an
unknown name is a ConfigError listing the valid ones. `TargetConfig` / `VQConfig` are the classes
a family publishes under those names (`publish_config_type`), read through this module's
`__getattr__`, so that `lisa_trt.TargetConfig` stays the public name of the config class of the
family that defines it (LlamaGen's) while no module below the families imports that family.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

from ..errors import ConfigError, unknown_name


class TargetShape(Protocol):
    """The part of a target configuration the generic code reads (every family's config has it).

    The KV cache (models/layers.KVCache) reads n_layer, kv_heads and head_dim; graph axes read
    dim and vocab_size and the condition's axes (`cond_dims`); `model_type` selects the family. A
    target with a fixed condition prefix and image length (the graphs of engines/graph.py and
    export/onnx.py) also answers `seq_len`, `block_size` and `grid_hw`; a config that knows its
    drafter's shape answers `drafter_shape()` (models/drafter.DrafterConfig.for_target).
    """

    model_type: str
    dim: int
    n_layer: int
    n_head: int
    vocab_size: int

    @property
    def kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    def cond_dims(self) -> dict:
        """Sizes of the static axes of the condition, by io-spec axis name (models/io_spec.py).

        "prefix": the cache slots the condition takes before the first image token, when that is
        fixed by the config (LlamaGen: cls_token_num; the prefill graph returns that many K/V rows,
        and a bundle whose verify graph runs the prefill takes that many tokens there). Any other
        key sizes an axis of the family's condition inputs (`ModelFamily.cond_specs`; LlamaGen:
        "caption_dim"). {} for a target whose prompt is token ids of per-request length (the
        prefill's dynamic "seq" axis, `Target.prompt_len(cond)`: Chameleon, Janus-Pro, Emu3).

        Returns:
            {axis name: size}; the exporter adds it to the export's static axes (export_dims).
        """
        ...


# name -> (factory(**kw) -> config, sized): a sized factory takes image_size / downsample itself
_TARGETS: dict[str, tuple] = {}
_VQS: dict[str, Callable] = {}
_TYPES: dict[str, type] = {}  # public class name -> the class a family publishes under it


def register_target(name: str, factory: Callable, *, sized: bool = False) -> None:
    """Register a named target config `factory(**overrides) -> config`.

    sized: the factory takes `image_size` / `downsample` (a shape table: the grid follows the
    image); a fixed config (False) ignores them, and takes `model_type` as one more override."""
    _TARGETS[name] = (factory, sized)


def register_vq(name: str, factory: Callable) -> None:
    """Register a named image-decoder config `factory(**overrides) -> config`."""
    _VQS[name] = factory


def publish_config_type(cls: type, name: Optional[str] = None) -> None:
    """Publish a family's config class under a public name (default: the class's own), the name
    `lisa_trt.<name>` and `models.target_config.<name>` give. Two classes under one name refuse."""
    name = name or cls.__name__
    if _TYPES.get(name, cls) is not cls:
        raise ConfigError(f"two config classes are published as {name!r}: {_TYPES[name].__module__} and "
                          f"{cls.__module__}; publish one under another name")
    _TYPES[name] = cls


def _builtin() -> None:
    """Import the built-in family packages (importing one registers its names and classes)."""
    from .family import families

    families()


def target_names() -> list:
    """Every registered target config name (built-in families' and registered ones), sorted."""
    _builtin()
    return sorted(_TARGETS)


def target_config(name: str, image_size: Optional[int] = None, model_type: Optional[str] = None,
                  downsample: Optional[int] = None, **overrides):
    """Look up a named target config.

    Args:
        name: "GPT-B" ... "GPT-7B" (LlamaGen), or a registered name such as "tiny" or "demo".
        image_size: pixels, for a sized name (default: the factory's, 256 for LlamaGen's GPT shapes);
            a fixed config ignores it.
        model_type: the family's type ("c2i" / "t2i" for LlamaGen; default: the factory's).
        downsample: pixels per token of a sized name (default: the factory's); a fixed config ignores it.
        overrides: fields of the config.
    Raises:
        ConfigError: an unknown name (the error lists the valid ones), or a bad size.
    """
    if name not in _TARGETS:
        _builtin()
    if name not in _TARGETS:
        raise unknown_name("target config", name, _TARGETS)
    factory, sized = _TARGETS[name]
    if model_type is not None:
        overrides["model_type"] = model_type
    if sized:
        sizes = {"image_size": image_size, "downsample": downsample}
        overrides.update({k: v for k, v in sizes.items() if v is not None})
    return factory(**overrides)


def vq_config(name: str, **overrides):
    """Look up a named image-decoder config ("VQ-16", "VQ-8", or a registered name such as "demo")."""
    if name not in _VQS:
        _builtin()
    if name not in _VQS:
        raise unknown_name("VQ config", name, _VQS)
    return _VQS[name](**overrides)


def __getattr__(name):
    if name not in _TYPES and not name.startswith("_"):
        _builtin()
    if name in _TYPES:
        return _TYPES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r} (published config classes: "
                         f"{', '.join(sorted(_TYPES)) or 'none'})")


__all__ = ["TargetShape", "publish_config_type", "register_target", "register_vq", "target_config",
           "target_names", "vq_config"]
