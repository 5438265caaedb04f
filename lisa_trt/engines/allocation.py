"""What the runtime allocates on the device per graph it opens: the list `lisa-trt plan` adds up.

Two kinds of buffers besides the weights, each sized here from the graph's io spec (the shapes
every bound buffer is checked against) or from the engine's own numbers:

  kv_cache     the `past_key_values.*` buffers of a cache-owning graph at the engines' static
               cache length (GraphTarget / GraphDrafter `new_cache`): `kv_cache_bytes`. The one
               cache: graphs return only the new rows (`present.*`, per call), which the runner
               commits into it (engines/graph.py `_run_kv`).
  activations  TensorRT: one execution context per optimisation profile; with shared memory they
               share one buffer of the largest per-profile device memory (TrtRunner sizes its
               buffer with `context_memory_bytes`), else each context allocates the engine's
               largest (ICudaEngine::getDeviceMemorySizeV2, the maximum over profiles).

The runtime allocates through an `AllocationLog` (`empty(component, owner, shape, dtype, device)`),
so every buffer the TensorRT runners make is listed by component ("activations": the bundle's one
context buffer; "io": engine outputs and aligned input copies): what tests compare with the plan,
and with which a steady-state step is shown to allocate nothing. (The KV caches are made by the
engines' new_cache, models/layers.KVCache, not through the log.)

deploy/memory_plan.py sums these for the graphs a backend opens; tests/deploy/test_plan_is_the_
allocation_list.py compares them with what the ORT and (fake-core) TensorRT runtimes allocate.
"""

from __future__ import annotations

import math

PLAN_BACKENDS = ("trt", "ort")  # the runtimes this list sizes: TensorRT, ONNX Runtime
PAST = "past_key_values."


def tensor_bytes(t, dims: dict, act_bytes: int) -> int:
    """Bytes of one io-spec tensor at `dims` ("act" tensors at `act_bytes` per element)."""
    size = {"act": act_bytes, "float32": 4, "int64": 8, "bool": 1}[t.dtype]
    return math.prod(t.shape(dims)) * size


def kv_cache_bytes(spec, dims: dict, act_bytes: int) -> int:
    """Bytes of a graph's KV cache buffers (its past_key_values.* inputs); 0 for a graph without."""
    return sum(tensor_bytes(t, dims, act_bytes) for t in spec.inputs if t.name.startswith(PAST))


def context_memory_bytes(sizes, shared: bool = True) -> int:
    """Device memory of an engine's execution contexts, one per profile, given each profile's size
    (ICudaEngine::getDeviceMemorySizeForProfileV2): one shared buffer of the largest, or (not
    shared) every context allocating the engine's maximum over profiles itself."""
    sizes = [int(s) for s in sizes]
    if not sizes:
        return 0
    return max(sizes) if shared else len(sizes) * max(sizes)


class AllocationLog:
    """Every device buffer a runtime allocated: (component, owner, bytes) in order.

    components: "activations" (TensorRT's shared context memory), "io" (engine outputs and
    aligned input copies). A runner allocates only
    through `empty`, so `count()` before and after a call is the number of buffers it made."""

    def __init__(self):
        self.entries: list = []

    def empty(self, component: str, owner: str, shape, dtype, device):
        import torch

        t = torch.empty(tuple(shape), dtype=dtype, device=device)
        self.entries.append((component, owner, t.numel() * t.element_size()))
        return t

    def count(self, component=None) -> int:
        return sum(1 for c, _, _ in self.entries if component is None or c == component)

    def nbytes(self, component=None, owner=None) -> int:
        return sum(b for c, o, b in self.entries if (component is None or c == component)
                   and (owner is None or o == owner))


def storage_free(t) -> bool:
    """True when no tensor but `t` itself holds `t`'s storage (no caller kept a view of an output
    handed out earlier), so the runtime may write it again. Uses the storage's reference count
    (torch._C._storage_Use_Count: 1 for `t`, 1 for the temporary storage object); without that
    API nothing is reused (always correct, never reused)."""
    import torch

    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return False
    return use_count(t.untyped_storage()._cdata) <= 2


__all__ = ["AllocationLog", "PLAN_BACKENDS", "context_memory_bytes", "kv_cache_bytes", "storage_free",
           "tensor_bytes"]
