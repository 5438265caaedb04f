"""Check exported graphs against PyTorch (random valid inputs) and lint them with Polygraphy.

The reference is always the fp32 PyTorch model through its public API (`prefill`,
`forward_tokens`, `Drafter.forward`, `MedusaHeads.head_logits`, `gasv_gates`, `decode_code`), not the export wrappers, so a
wrapper bug is caught too. fp16 graphs are compared with the same fp32 reference under a looser
threshold. Error = max |onnx - torch| / max(1, max |torch|) per output (finite entries; the
positions of infinities must agree); integer and bool outputs must match exactly. The random
inputs and the references are the model family's (export/families.py, `ExportFamily`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .families import act_dtype, export_family, spec_dtype  # noqa: F401 (act_dtype / spec_dtype re-exported)
from ..models.io_spec import Graph, GraphSpec
from .memory import release_file_pages, release_if_large

THRESHOLDS = {"fp32": 1e-4, "fp16": 5e-2}
_NUMPY = {torch.int64: np.int64, torch.bool: np.bool_, torch.float32: np.float32, torch.float16: np.float16,
          torch.int32: np.int32}


# ----------------------------------------------------------------------------- inputs / references

def sample_inputs(graph: Graph, spec: GraphSpec, dims: dict, refs: dict, *, precision: str = "fp32",
                  seed: int = 0, batch: int = 2, seq: int = 3, nodes: int = 3, family=None) -> dict:
    """Random inputs that satisfy the graph's contract (valid ids, distinct slots, non-empty masks).

    Args:
        graph, spec: the graph and its io spec.
        dims: static axis sizes (the family's export_dims).
        refs: {"target", "drafter", "tables", "vq"} models (for id ranges and GASV constants).
        precision: "fp32" or "fp16" ("act" tensors get that dtype).
        batch, seq, nodes: sizes of the dynamic axes.
        family: the ExportFamily (default: the target's, export/families.py).
    Returns:
        {input name: tensor}.
    """
    fam = family or export_family(refs["target"])
    return fam.sample_inputs(graph, spec, dims, refs, precision=precision, seed=seed, batch=batch, seq=seq,
                             nodes=nodes)


def reference_outputs(graph: Graph, refs: dict, inputs: dict, family=None) -> dict:
    """fp32 PyTorch outputs of the public API for the graph's named inputs (the family's reference)."""
    return (family or export_family(refs["target"])).reference_outputs(graph, refs, inputs)


# ----------------------------------------------------------------------------- compare

def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy()


def run_onnx(path, inputs: dict, providers=None) -> dict:
    """Run a graph with plain ONNX Runtime (no IO binding): {output name: torch tensor}."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=providers or ["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    res = sess.run(names, {k: to_numpy(v) for k, v in inputs.items()})
    return {n: torch.from_numpy(np.ascontiguousarray(r)) for n, r in zip(names, res)}


def output_error(have: torch.Tensor, want: torch.Tensor) -> float:
    """Scaled max error (see module doc); inf when shapes, inf positions or exact values differ."""
    if tuple(have.shape) != tuple(want.shape):
        return float("inf")
    if not want.is_floating_point():
        return 0.0 if torch.equal(have.to(want.dtype), want) else float("inf")
    a, b = have.double(), want.double()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(fa, fb) or not torch.equal(a[~fb], b[~fb]):
        return float("inf")
    if not fb.any():
        return 0.0
    diff = (a[fb] - b[fb]).abs().max().item()
    return diff / max(1.0, b[fb].abs().max().item())


def abs_error(have: torch.Tensor, want: torch.Tensor) -> float:
    """Raw max |have - want| over the entries finite in both (0 for integer outputs and empty ones)."""
    if tuple(have.shape) != tuple(want.shape) or not want.is_floating_point() or not want.numel():
        return 0.0
    a, b = have.double(), want.double()
    ok = torch.isfinite(a) & torch.isfinite(b)
    return float((a[ok] - b[ok]).abs().max()) if ok.any() else 0.0


@dataclass
class ValidationReport:
    """Per-output scaled errors of one graph vs PyTorch."""

    graph: str
    precision: str
    threshold: float
    errors: dict = field(default_factory=dict)
    sizes: dict = field(default_factory=dict)
    max_abs: float = 0.0  # raw max |onnx - torch| over the finite float outputs (unscaled)

    @property
    def max_error(self) -> float:
        return max(self.errors.values()) if self.errors else 0.0

    @property
    def ok(self) -> bool:
        return self.max_error <= self.threshold

    def summary(self) -> str:
        worst = max(self.errors, key=self.errors.get) if self.errors else "-"
        return (f"{self.graph} [{self.precision}] max error {self.max_error:.2e} ({worst}) "
                f"{'<=' if self.ok else '>'} threshold {self.threshold:.0e}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(max_error=self.max_error, ok=self.ok)
        return d


def validate_graph(graph: Graph, path, spec: GraphSpec, dims: dict, refs: dict, *, precision: str = "fp32",
                   seed: int = 123, batch: int = 3, seq: int = 5, nodes: int = 4,
                   threshold: Optional[float] = None, family=None) -> ValidationReport:
    """Run the exported graph and the fp32 PyTorch reference on the same random inputs.

    The sizes differ from the trace sizes on purpose (proves the dynamic axes). `family`: the
    ExportFamily that draws the inputs and computes the reference (default: the target's).
    """
    fam = family or export_family(refs["target"])
    inputs = fam.sample_inputs(graph, spec, dims, refs, precision=precision, seed=seed, batch=batch, seq=seq,
                               nodes=nodes)
    models = list(refs.values())  # the torch modules among them count (export.memory.module_bytes / module_tensors)
    # one large thing resident at a time: the session (whose memory goes back once it is closed),
    # then the fp32 reference (its file-mapped pages dropped again afterwards)
    release_file_pages(*models)
    have = run_onnx(path, inputs)
    release_if_large(models)
    want = fam.reference_outputs(graph, refs, inputs)
    release_file_pages(*models)
    rep = ValidationReport(graph.value, precision, THRESHOLDS[precision] if threshold is None else threshold,
                           sizes=dict(batch=batch, seq=seq, nodes=nodes))
    for name in spec.output_names:
        rep.errors[name] = output_error(have[name], want[name])
        rep.max_abs = max(rep.max_abs, abs_error(have[name], want[name]))
    return rep


# ----------------------------------------------------------------------------- lint

_POLYGRAPHY = "import sys; from polygraphy.tools import main; sys.argv[0] = 'polygraphy'; sys.exit(main())"


# Peak memory of a `polygraphy check lint` subprocess per byte of the graph's weights, rounded up. It
# was 5.56x when the linter loaded the weights itself (the random GPT-XL fp32 target graph: 18.8 GB for
# 3.39 GB, bench/memory.json); with --ignore-external-data (ONNX Runtime reads them from the file) the
# random GPT-B target graph linted at 1.13 GB for 0.41 GB of fp32 weights and 0.86 GB for 0.21 GB of
# fp16 ones (ONNX Runtime's CPU MatMuls hold fp32 casts), about 0.27 GB of which is the process itself.
LINT_MEMORY_FACTOR = 3.0


def graph_weight_bytes(path) -> int:
    """Bytes of a graph's initializers, inline or in external data (the proto is read without them)."""
    import onnx

    total = 0
    for t in onnx.load(str(path), load_external_data=False).graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            total += int({e.key: e.value for e in t.external_data}.get("length", 0))
        else:
            total += len(t.raw_data) or t.ByteSize()
    return total


def available_memory_bytes() -> Optional[int]:
    """MemAvailable of /proc/meminfo (None where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def lint_graph(path, inputs: dict, timeout: float = 600.0) -> dict:
    """`polygraphy check lint` with valid inputs; {"status": passed|failed|skipped, ...}.

    Skipped (with the reason, before any work) when the lint subprocess would need more memory than
    the machine has available (LINT_MEMORY_FACTOR x the graph's weights): on a large model it is the
    export's largest process and could take the machine down; validation against PyTorch has already
    run the graph through ONNX Runtime.

    The subprocess loads the graph's structure only (`--ignore-external-data`) and runs in the
    graph's folder, so the ONNX checker and ONNX Runtime read the weights from the external data
    file themselves: the linter does not hold them twice more (protobuf, then its re-export)."""
    path = Path(path).resolve()
    try:
        from polygraphy.json import save_json
    except ImportError:
        return {"status": "skipped", "reason": "polygraphy is not installed"}
    need, avail = LINT_MEMORY_FACTOR * graph_weight_bytes(path), available_memory_bytes()
    if avail is not None and need > avail:
        return {"status": "skipped", "reason": f"linting needs about {need / 2**30:.1f} GiB ({LINT_MEMORY_FACTOR:g}x the "
                f"graph's weights) and {avail / 2**30:.1f} GiB is available; run `polygraphy check lint {path}` "
                "on a machine with more memory"}
    with tempfile.TemporaryDirectory() as tmp:
        feeds, report = Path(tmp) / "inputs.json", Path(tmp) / "lint.json"
        save_json([{k: to_numpy(v) for k, v in inputs.items()}], str(feeds))
        cmd = [sys.executable, "-c", _POLYGRAPHY, "check", "lint", str(path), "--ignore-external-data",
               "--load-inputs", str(feeds), "-o", str(report)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(path.parent))
        except subprocess.TimeoutExpired:
            return {"status": "skipped", "reason": f"lint timed out after {timeout:.0f} s"}
        if not report.is_file():
            return {"status": "failed", "errors": [proc.stderr.strip().splitlines()[-1:] or ["no report"]]}
        data = json.loads(report.read_text())
    entries = data.get("lint_entries", [])
    errors = [e.get("message", "")[:300] for e in entries if e.get("level") == "exception"
              or e.get("level") == "error"]
    failing = data.get("summary", {}).get("failing", [])
    return {"status": "failed" if (errors or failing) else "passed",
            "passing_nodes": len(data.get("summary", {}).get("passing", [])), "failing_nodes": len(failing),
            "warnings": len([e for e in entries if e.get("level") == "warning"]), "errors": errors[:5]}
