"""The graph-runner protocol every backend implements, and the backend registry.

Two levels (docs/design.md principle 3):

- `GraphRunner`: ONE exported graph at the named-tensor level (Polygraphy's BaseRunner is the
  model): `run(inputs, outputs) -> dict` by the names of models/io_spec.py, `close()`, and an
  explicit lifetime (`with runner: ...`). Outputs the caller does not preallocate are allocated
  from the io spec (dynamic axes are read off the inputs). KV caches are read-only inputs
  (`past_key_values.{i}.*`); `present.{i}.*` are the call's new rows, which the caller commits
  (engines/graph.py `_run_kv`).
  A backend is one subclass implementing `_execute` plus a `Backend` that opens its graphs.
- `TargetEngine` / `DrafterEngine`: what the decode loop needs. The torch `Transformer` /
  `Drafter` satisfy them directly (eager); engines/graph.py's `GraphTarget` (every family's
  graph target builds on it), `GraphDrafter`, `GraphGASV` implement them over any backend's runners.

Adding a backend: write one file with a `GraphRunner` subclass and a `Backend` subclass, then
`register_backend("name", MyBackend)` (built-in ones are registered lazily below by module
path), and `engines.graph.load_engines(dir, "name")` opens every graph with it.
"""

from __future__ import annotations

import abc
import importlib
from typing import Callable, Optional, Protocol, runtime_checkable

import torch

from ..errors import ConfigError, InputError, LisaError
from ..models.io_spec import DYNAMIC_AXES, Graph, GraphKind, GraphSpec  # noqa: F401 (GraphKind re-exported)
from ..timing import Timer  # noqa: F401 (re-exported)

_TORCH_DTYPES = {"int64": torch.int64, "bool": torch.bool, "float32": torch.float32}


class RunnerError(LisaError, ValueError):
    """A graph call with missing / unknown tensor names, or on a closed runner."""


def torch_dtype(code: str, precision: str) -> torch.dtype:
    """io-spec dtype code -> torch dtype ("act" is the export precision)."""
    if code == "act":
        return torch.float16 if precision == "fp16" else torch.float32
    return _TORCH_DTYPES[code]


# ----------------------------------------------------------------------------- decode-loop protocols

@runtime_checkable
class TargetEngine(Protocol):
    """What the decode loop needs from a target backend.

    Same methods and shapes as `lisa_trt.families.llamagen.model.Transformer`:
    - new_cache(batch, max_len=None, dtype=None, *, extra=0, prompt_len=None, n_tokens=None) -> KVCache
      (lengths (B,), col_valid (B, Lmax), k/v buffers): max_len committed tokens (default: the
      family's, or prompt_len + n_tokens) plus `extra` scratch slots; every target, torch or graph
    - prefill(cond, cache, taps) -> TargetOutput (logits (B, 1, V) fp32, taps (B, 1, 3H))
    - forward_tokens(tokens (B,S), positions (B,S), slots (B,S), mask (B,S,Lmax), cache, taps)
      -> TargetOutput (logits (B, S, V) fp32, taps (B, S, 3H) when asked)
    - null_cond(cond), check_cond(cond) -> batch size
    """

    config: object

    def new_cache(self, batch: int, max_len: Optional[int] = None, dtype=None, *, extra: int = 0,
                  prompt_len: Optional[int] = None, n_tokens: Optional[int] = None): ...

    def prefill(self, cond, cache, taps: bool = False): ...

    def forward_tokens(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                       mask: torch.Tensor, cache, taps: bool = False): ...

    def null_cond(self, cond): ...

    def check_cond(self, cond) -> int: ...


@runtime_checkable
class DrafterEngine(Protocol):
    """What the decode loop needs from a drafter backend (`lisa_trt.models.drafter.Drafter`).

    - new_cache(batch, max_len) -> DrafterCache
    - project_taps(taps (B,S,3H)) -> (B,S,H)
    - forward(hidden_in (B,S,H), tokens (B,S), positions, slots, mask (B,S,Lmax), cache)
      -> (logits (B,S,V), hidden_out (B,S,H))
    """

    def new_cache(self, batch: int, max_len: int, dtype=None): ...

    def project_taps(self, taps: torch.Tensor) -> torch.Tensor: ...

    def forward(self, hidden_in: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                slots: torch.Tensor, mask: torch.Tensor, cache): ...


# ----------------------------------------------------------------------------- graph runner

class GraphRunner(abc.ABC):
    """One graph, called by tensor name (the protocol every backend implements).

    Args:
        spec: the graph's io spec (models/io_spec.py).
        dims: static axis sizes (io_spec.export_dims).
        precision: "fp32" | "fp16" (dtype of the "act" tensors).
        device: where inputs must live and outputs are allocated.

    Subclasses implement `_execute(inputs, outputs)` (every name bound, outputs preallocated)
    and may override `_close()`.
    """

    def __init__(self, spec: GraphSpec, dims: dict, precision: str, device):
        self.spec, self.dims, self.precision = spec, dict(dims), precision
        self.device = torch.device(device)
        self.input_names = spec.input_names
        self.output_names = spec.output_names
        self.name = spec.graph.value
        self.closed = False

    # -- lifetime -------------------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Release the backend's resources (sessions, contexts); the runner is unusable after."""
        if not self.closed:
            self.closed = True
            self._close()

    def _close(self) -> None:
        pass

    # -- calls ----------------------------------------------------------------------------

    def output_shapes(self, inputs: dict) -> dict:
        """{output name: shape} for these inputs (dynamic axes read off the input shapes)."""
        d = dict(self.dims)
        for t in self.spec.inputs:
            x = inputs.get(t.name)
            if x is None:
                continue
            for i, a in enumerate(t.axes):
                if a in DYNAMIC_AXES and i < x.dim():
                    d.setdefault(a, int(x.shape[i]))
        return {t.name: t.shape(d) for t in self.spec.outputs}

    def allocate(self, inputs: dict, names) -> dict:
        """Empty output tensors for `names`, shaped from the spec and the inputs."""
        shapes = self.output_shapes(inputs)
        out = {}
        for n in names:
            t = self.spec.output(n)
            out[n] = torch.empty(shapes[n], dtype=torch_dtype(t.dtype, self.precision), device=self.device)
        return out

    def run(self, inputs: dict, outputs=None) -> dict:
        """Run the graph.

        Args:
            inputs: {input name: tensor}, every graph input (contiguous, on `device`).
            outputs: None (allocate every output), a list of names (return only those), or a
                dict {output name: preallocated tensor}; outputs left out are allocated.
        Returns:
            {output name: tensor} (the requested names, or every output).
        Raises:
            RunnerError: missing or unknown input names, unknown output names, closed runner.
        """
        if self.closed:
            raise RunnerError(f"{self.name}: the runner is closed")
        given = dict(outputs) if isinstance(outputs, dict) else {}
        self._check_names(inputs, given)
        if isinstance(outputs, (list, tuple)):
            bad = [n for n in outputs if n not in self.output_names]
            if bad:
                raise RunnerError(f"{self.name}: unknown outputs {bad}; it has {self.output_names}")
        todo = [n for n in self.output_names if n not in given]
        if todo:
            given.update(self.allocate(inputs, todo))
        self._execute(inputs, given)
        if isinstance(outputs, (list, tuple)):
            return {n: given[n] for n in outputs}
        return given

    def _check_names(self, inputs, outputs) -> None:
        missing = [n for n in self.input_names if n not in inputs]
        extra = sorted((set(inputs) - set(self.input_names)) | (set(outputs) - set(self.output_names)))
        if missing or extra:
            raise RunnerError(f"{self.name}: unbound {missing}, unknown {extra}")

    def run_static(self, inputs: dict, outputs: dict, static: "StaticTensors") -> dict:
        """`run` with long-lived tensors (the KV caches) passed apart in `static`.

        A backend may bind the static tensors once and then only the per-call ones while the
        SAME `static` object comes back (engines/graph.py keeps one per cache); this default
        simply merges them. Returns {output name: tensor} for (at least) the non-static outputs.
        """
        return self.run({**inputs, **static.inputs}, {**outputs, **static.outputs})

    @abc.abstractmethod
    def _execute(self, inputs: dict, outputs: dict) -> None:
        """Run with every input and output bound (outputs are written in place)."""


class StaticTensors:
    """Tensors bound on every call of a runner that do not change between calls (KV caches):
    {input name: tensor} and {output name: tensor}. Identity matters: a runner may keep them
    bound for as long as it is handed the same object (make a new one when a tensor changes)."""

    __slots__ = ("inputs", "outputs", "key")

    def __init__(self, inputs: dict, outputs: dict, key=None):
        self.inputs, self.outputs, self.key = inputs, outputs, key


# ----------------------------------------------------------------------------- backends

class Backend(abc.ABC):
    """Opens the graphs of one engine directory for one backend.

    Args:
        manifest: the engine directory's Manifest.
        **options: backend options (e.g. ORT `threads`, TensorRT `share_memory`).
    """

    name = "?"
    # Optional graphs this backend can open (export.optional.OPTIONAL_GRAPHS, e.g. drafter_commit);
    # a backend that does not list one gets the engines' fallback (e.g. drafter_project + step).
    optional_graphs: tuple = ()
    # True: when the bundle's verify graph embeds the prefill's ids (ExportFamily.bundle_prefill_ids),
    # run the prefill as a verify call and never open the prefill graph: one copy of the target's
    # weights (ONNX Runtime: one session, whose pre-packed weights are the only copy). False: open
    # both graphs (e.g. TensorRT, whose verify profiles cover the tree sizes, not the prompt).
    prefill_via_verify: bool = False

    def __init__(self, manifest, **options):
        self.manifest = manifest
        self.options = options

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @abc.abstractmethod
    def open(self, graph: Graph, spec: GraphSpec, dims: dict) -> GraphRunner:
        """A runner for `graph` (its spec and static dims given)."""

    def check(self) -> None:
        """Raise (with the fix) when this backend cannot run here; called before any graph opens."""

    def target_graphs(self) -> tuple:
        """The target graphs to open: (verify,) when the prefill runs through it
        (`prefill_via_verify`, or the backend option of that name, and the bundle allows it),
        else (prefill, verify)."""
        via = self.options.get("prefill_via_verify", self.prefill_via_verify)  # an option may turn it off
        if via and self.manifest.export_family.bundle_prefill_ids(self.manifest) is not None:
            return (Graph.TARGET_VERIFY,)
        return (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY)

    def can_open(self, graph: Graph) -> bool:
        """Whether to open an optional graph (e.g. drafter_commit): this backend lists it in
        `optional_graphs` and the bundle exported it."""
        return graph in self.optional_graphs and self.manifest.has(graph)


_BACKENDS: dict[str, Callable] = {}
_BUILTIN = {"ort": "lisa_trt.engines.ort", "trt": "lisa_trt.engines.trt", "torch": "lisa_trt.engines.torch_runner"}


def register_backend(name: str, backend: Callable) -> None:
    """Make `backend` (a Backend subclass or factory(manifest, **options)) loadable by name."""
    _BACKENDS[name] = backend


def backend_names() -> list:
    """Every backend name load_engines accepts (built-in and registered)."""
    return sorted(set(_BUILTIN) | set(_BACKENDS))


def get_backend(name: str) -> Callable:
    """The Backend factory registered as `name` (built-ins are imported on first use)."""
    if name not in _BACKENDS and name in _BUILTIN:
        importlib.import_module(_BUILTIN[name])  # registers itself
    if name not in _BACKENDS:
        raise ConfigError(f"unknown backend {name!r}; valid names: {', '.join(backend_names())}")
    return _BACKENDS[name]


def check_static_len(need: int, have: int, what: str, hint: Optional[str] = None) -> None:
    """Refuse a cache that does not fit the engines' static length."""
    if need > have:
        raise InputError(f"{what} needs length {need}, but these engines were exported with a static cache of "
                         f"{have}; {hint or 're-export with a larger --max-tree'}")


__all__ = ["Backend", "DrafterEngine", "GraphKind", "GraphRunner", "RunnerError", "StaticTensors", "TargetEngine",
           "Timer", "backend_names", "check_static_len", "get_backend", "register_backend", "torch_dtype"]
