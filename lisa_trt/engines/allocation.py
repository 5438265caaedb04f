"""What the runtime allocates on the device per graph it opens: the list `lisa-trt plan` adds up.

Three kinds of buffers besides the weights, each sized here from the graph's io spec (the shapes
every bound buffer is checked against) or from the engine's own numbers:

  kv_cache     the `past_key_values.*` buffers of a cache-owning graph at the engines' static
               cache length (GraphTarget / GraphDrafter `new_cache`): `kv_cache_bytes`.
  kv_shadow    with kv_binding "swap", a second buffer for every `present.*` output the engine
               does not alias to its input, one set per runner (engines/graph.py `_run_kv`
               keys them by runner): `shadowed_outputs` / `kv_shadow_bytes`.
  activations  TensorRT: one execution context per optimisation profile; with shared memory they
               share one buffer of the largest per-profile device memory (TrtRunner sizes its
               buffer with `context_memory_bytes`), else each context allocates the engine's
               largest (ICudaEngine::getDeviceMemorySizeV2, the maximum over profiles).

deploy/memory_plan.py sums these for the graphs a backend opens; tests/deploy/test_plan_is_the_
allocation_list.py compares them with what the ORT and (fake-core) TensorRT runtimes allocate.
"""

from __future__ import annotations

import math

PLAN_BACKENDS = ("trt", "ort")  # the runtimes this list sizes: TensorRT, ONNX Runtime (binds in place)
KV_BINDINGS = ("swap", "inplace")
DEFAULT_KV_BINDING = "swap"  # TensorRT: in-place binding of non-aliased outputs is opt-in (engines/trt.py)
PAST, PRESENT = "past_key_values.", "present."


def tensor_bytes(t, dims: dict, act_bytes: int) -> int:
    """Bytes of one io-spec tensor at `dims` ("act" tensors at `act_bytes` per element)."""
    size = {"act": act_bytes, "float32": 4, "int64": 8, "bool": 1}[t.dtype]
    return math.prod(t.shape(dims)) * size


def kv_cache_bytes(spec, dims: dict, act_bytes: int) -> int:
    """Bytes of a graph's KV cache buffers (its past_key_values.* inputs); 0 for a graph without."""
    return sum(tensor_bytes(t, dims, act_bytes) for t in spec.inputs if t.name.startswith(PAST))


def shadowed_outputs(spec, kv_binding: str, aliased=()) -> list:
    """The present.* outputs that get a second buffer: all but the engine's aliased ones under
    "swap", none "inplace" (engines/graph.py `_run_kv` binds by it; the plan sums it)."""
    if kv_binding not in KV_BINDINGS:
        raise ValueError(f"kv_binding must be one of {KV_BINDINGS}, got {kv_binding!r}")
    if kv_binding == "inplace":
        return []
    return [t.name for t in spec.outputs if t.name.startswith(PRESENT) and t.name not in set(aliased)]


def kv_shadow_bytes(spec, dims: dict, act_bytes: int, kv_binding: str, aliased=()) -> int:
    """Bytes of one runner's shadow buffers (shadowed_outputs at the cache's shape)."""
    names = set(shadowed_outputs(spec, kv_binding, aliased))
    return sum(tensor_bytes(t, dims, act_bytes) for t in spec.outputs if t.name in names)


def context_memory_bytes(sizes, shared: bool = True) -> int:
    """Device memory of an engine's execution contexts, one per profile, given each profile's size
    (ICudaEngine::getDeviceMemorySizeForProfileV2): one shared buffer of the largest, or (not
    shared) every context allocating the engine's maximum over profiles itself."""
    sizes = [int(s) for s in sizes]
    if not sizes:
        return 0
    return max(sizes) if shared else len(sizes) * max(sizes)


__all__ = ["DEFAULT_KV_BINDING", "KV_BINDINGS", "PLAN_BACKENDS", "context_memory_bytes", "kv_cache_bytes", "kv_shadow_bytes",
           "shadowed_outputs", "tensor_bytes"]
