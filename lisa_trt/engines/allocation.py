"""What the runtime allocates on the device per graph it opens: the list `lisa-trt plan` adds up.

Three kinds of buffers besides the weights, each sized here from the graph's io spec (the shapes
every bound buffer is checked against) or from the engine's own numbers:

  kv_cache     the `past_key_values.*` buffers of a cache-owning graph at the engines' static
               cache length (GraphTarget / GraphDrafter `new_cache`): `kv_cache_bytes`. The one
               cache: graphs return only the new rows (`present.*`, per call), which the runner
               commits into it (engines/graph.py `_run_kv`).
  activations  TensorRT: one execution context per optimisation profile; with shared memory they
               share one buffer of the largest per-profile device memory (TrtRunner sizes its
               buffer with `context_memory_bytes`), else each context allocates the engine's
               largest (ICudaEngine::getDeviceMemorySizeV2, the maximum over profiles).
  io           the engines' output buffers (TensorRT's context memory excludes its I/O): per output,
               `pool_depth` buffers (as many as the decode loop holds at once) at the largest shape of
               the engine's profiles (`io_bytes`): the
               full-vocabulary fp32 logits of a prefill and of a tree step share one pool, the
               prefill's `present.*` rows one buffer.

The runtime allocates through an `AllocationLog` (`empty(component, owner, shape, dtype, device)`),
so every buffer the TensorRT runners make is listed by component ("activations": the bundle's one
context buffer; "io": engine output buffers, `io_bytes`; "copies": aligned input copies): what tests
compare with the plan, and with which a steady-state step is shown to allocate nothing. (The KV caches are made by the
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


OUTPUT_POOL = 2  # buffers pooled per engine output: the caller may hold the previous call's outputs
PRESENT = "present."  # the new K/V rows a call returns, committed into the cache before the call returns


# Outputs the decode loop holds more of at once: the drafter step's hidden state (the commit's, kept as
# the tree's root; the previous expansion's, fed in; the new one). Measured on every tree rule and depth
# by tests/deploy/test_plan_is_the_allocation_list.py (the pool grows past this if a loop holds more,
# and the plan then differs from the log).
HELD = {("drafter_step", "hidden"): 3, ("drafter_fused", "hidden"): 3}


def pool_depth(name: str, graph: str = "") -> int:
    """Buffers TrtRunner pools for output `name` of `graph`: one for the new K/V rows (engines/graph.py
    `_run_kv` commits them and drops them before the call returns), HELD where the loop holds more,
    OUTPUT_POOL for the others (logits, taps, hidden: the previous call's are held while the next runs)."""
    if name.startswith(PRESENT):
        return 1
    return HELD.get((graph, name), OUTPUT_POOL)


def profile_dims(spec, dims: dict, shapes: dict) -> dict:
    """Axis sizes at one optimisation profile's largest shapes: `dims` (the static axes, which win)
    and each dynamic axis read off the max shape of an input that has it. `shapes`: {input name:
    (min, opt, max)} (ProfileSpec.shapes, or a build record's lists)."""
    from ..models.io_spec import DYNAMIC_AXES

    d = dict(dims)
    for t in spec.inputs:
        if t.name not in shapes:
            continue
        mx = shapes[t.name][2]
        for i, a in enumerate(t.axes):
            if a in DYNAMIC_AXES and i < len(mx):
                d.setdefault(a, int(mx[i]))
    return d


def output_capacity(spec, dims: dict, profiles) -> dict:
    """{output name: elements} of each output at the largest shape any profile allows (`profiles`: a
    list of {input name: (min, opt, max)}): the size TrtRunner allocates each pooled buffer at, once."""
    out = {}
    for shapes in profiles:
        d = profile_dims(spec, dims, shapes)
        for t in spec.outputs:
            out[t.name] = max(out.get(t.name, 0), math.prod(t.shape(d)))
    return out


def io_bytes(spec, dims: dict, profiles, act_bytes: int) -> int:
    """Device bytes of an engine's pooled output buffers: pool_depth(name) buffers of each output at
    its output_capacity; the "io" component of the AllocationLog after the engine's first call."""
    sizes = {"act": act_bytes, "float32": 4, "int64": 8, "bool": 1}
    cap = output_capacity(spec, dims, profiles)
    return sum(pool_depth(t.name, spec.graph.value) * cap[t.name] * sizes[t.dtype] for t in spec.outputs)


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

    components: "activations" (TensorRT's shared context memory), "io" (engine output buffers:
    pooled, each at its output_capacity; one beyond the pool when a caller holds more outputs than
    it), "copies" (aligned copies of misaligned inputs, per call). A runner allocates only
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


__all__ = ["AllocationLog", "HELD", "OUTPUT_POOL", "PLAN_BACKENDS", "context_memory_bytes", "io_bytes", "kv_cache_bytes",
           "output_capacity", "pool_depth", "profile_dims", "storage_free", "tensor_bytes"]
