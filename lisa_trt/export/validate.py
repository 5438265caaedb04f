"""Check exported graphs against PyTorch (random valid inputs) and lint them with Polygraphy.

The reference is always the fp32 PyTorch model through its public API (`prefill`,
`forward_tokens`, `Drafter.forward`, `MedusaHeads.head_logits`, `gasv_gates`, `decode_code`), not the export wrappers, so a
wrapper bug is caught too. fp16 graphs are compared with the same fp32 reference under a looser
threshold. Error = max |onnx - torch| / max(1, max |torch|) per output (finite entries; the
positions of infinities must agree); integer and bool outputs must match exactly.
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

from ..errors import SpecError
from .io_spec import Graph, GraphSpec

THRESHOLDS = {"fp32": 1e-4, "fp16": 5e-2}
_TORCH = {"int64": torch.int64, "bool": torch.bool, "float32": torch.float32}
_NUMPY = {torch.int64: np.int64, torch.bool: np.bool_, torch.float32: np.float32, torch.float16: np.float16,
          torch.int32: np.int32}


def act_dtype(precision: str) -> torch.dtype:
    return torch.float16 if precision == "fp16" else torch.float32


def spec_dtype(code: str, precision: str) -> torch.dtype:
    return act_dtype(precision) if code == "act" else _TORCH[code]


# ----------------------------------------------------------------------------- inputs

def sample_inputs(graph: Graph, spec: GraphSpec, dims: dict, refs: dict, *, precision: str = "fp32",
                  seed: int = 0, batch: int = 2, seq: int = 3, nodes: int = 3) -> dict:
    """Random inputs that satisfy the graph's contract (valid ids, distinct slots, non-empty masks).

    Args:
        graph, spec: the graph and its io spec.
        dims: static axis sizes (io_spec.export_dims).
        refs: {"target", "drafter", "tables", "vq"} models (for id ranges and GASV constants).
        precision: "fp32" or "fp16" ("act" tensors get that dtype).
        batch, seq, nodes: sizes of the dynamic axes.
    Returns:
        {input name: tensor}.
    """
    g = torch.Generator().manual_seed(seed)
    d = dict(dims, batch=batch, seq=seq, nodes=nodes)
    tcfg = refs["target"].config
    out = {}
    for t in spec.inputs:
        shape, dt = t.shape(d), spec_dtype(t.dtype, precision)
        n = t.name
        if n == "class_ids":
            x = torch.randint(0, tcfg.num_classes + 1, shape, generator=g)
        elif n == "caption_mask":
            lens = torch.randint(1, shape[1] + 1, (shape[0],), generator=g)
            x = torch.arange(shape[1])[None, :] < lens[:, None]  # valid tokens first
        elif n in ("input_ids", "image_tokens"):
            hi = refs["vq"].config.codebook_size if n == "image_tokens" else tcfg.vocab_size
            x = torch.randint(0, hi, shape, generator=g)
        elif n == "position_ids":
            x = torch.randint(tcfg.cls_token_num, tcfg.seq_len, shape, generator=g)
        elif n == "cache_slots":
            x = torch.stack([torch.randperm(d["cache_len"], generator=g)[: shape[1]] for _ in range(shape[0])])
        elif n == "attention_mask":
            x = torch.rand(shape, generator=g) < 0.5
            x.scatter_(2, out["cache_slots"][:, :, None], True)  # every query sees at least itself
        elif n == "node_tokens":
            x = torch.randint(0, tcfg.vocab_size, shape, generator=g)
        elif n == "node_parents":  # a tree: node 0 is a root, every other node's parent comes before it
            x = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, shape[0])])
        elif n == "guided_logits":
            x = _filtered_logits(shape, g)
        elif n == "depth":  # Medusa heads: every head, and depths past the last one (flat logits)
            x = torch.randint(0, refs["drafter"].config.n_heads + 1, shape, generator=g)
        elif n == "gasv_params":
            from .io_spec import gasv_params

            x = gasv_params(refs["tables"].config)
        else:  # caches, taps, hidden_in, caption_features
            x = torch.randn(shape, generator=g) * (0.5 if n.startswith("past_") else 1.0)
        out[n] = x.to(dt)
    return out


def _filtered_logits(shape, g) -> torch.Tensor:
    """Random logits, each row top-k filtered with its own k (row 0 keeps the full support)."""
    N, V = shape
    x = torch.randn(N, V, generator=g) * 3.0
    for i in range(1, N):
        k = int(torch.randint(1, V + 1, (1,), generator=g))
        kth = torch.topk(x[i], k).values[-1]
        x[i] = x[i].masked_fill(x[i] < kth, float("-inf"))
    return x


# ----------------------------------------------------------------------------- references

def _f32(x):
    return x.float() if torch.is_tensor(x) and x.is_floating_point() else x


def _interleave(ks, vs, prefix="present") -> dict:
    out = {}
    for i, (k, v) in enumerate(zip(ks, vs)):
        out[f"{prefix}.{i}.key"], out[f"{prefix}.{i}.value"] = k, v
    return out


@torch.no_grad()
def reference_outputs(graph: Graph, refs: dict, inputs: dict) -> dict:
    """fp32 PyTorch outputs of the public API for the graph's named inputs."""
    from ..models.drafter import DrafterCache
    from ..models.layers import KVCache

    x = {k: _f32(v) for k, v in inputs.items()}
    if graph in (Graph.TARGET_PREFILL, Graph.TARGET_VERIFY):
        m = refs["target"]
        cfg = m.config
        past = [x[f"past_key_values.{i}.{p}"].clone() for i in range(cfg.n_layer) for p in ("key", "value")]
        B, L = past[0].shape[0], past[0].shape[2]
        cache = KVCache(cfg, B, L, torch.float32, "cpu")
        cache.k, cache.v = past[0::2], past[1::2]
        if graph is Graph.TARGET_PREFILL:
            from ..models.family import family_of

            cond = family_of(cfg).cond_from_inputs(cfg, x)
            o = m.prefill(cond, cache, taps=True)
            res = dict(prefix_valid=cache.col_valid[:, : cfg.cls_token_num].clone())
        else:
            o = m.forward_tokens(x["input_ids"], x["position_ids"], x["cache_slots"], x["attention_mask"],
                                 cache, taps=True)
            res = {}
        res.update(logits=o.logits, taps=o.taps, hidden=o.hidden, **_interleave(cache.k, cache.v))
        return res
    if graph is Graph.DRAFTER_PROJECT:
        return dict(hidden=refs["drafter"].project_taps(x["taps"]))
    if graph in (Graph.DRAFTER_STEP, Graph.DRAFTER_COMMIT):
        d = refs["drafter"]
        k, v = x["past_key_values.0.key"].clone(), x["past_key_values.0.value"].clone()
        cache = DrafterCache(d.config, k.shape[0], k.shape[2], torch.float32, "cpu")
        cache.k, cache.v = [k], [v]
        h_in = d.project_taps(x["taps"]) if graph is Graph.DRAFTER_COMMIT else x["hidden_in"]
        logits, hidden = d(h_in, x["input_ids"], x["position_ids"], x["cache_slots"], x["attention_mask"], cache)
        return {"logits": logits, "hidden": hidden, **_interleave(cache.k, cache.v)}
    if graph is Graph.GASV:
        from ..speculative.gasv import GASVConfig, gasv_gates
        from .io_spec import GASV_K, GASV_PARAMS

        cfg = GASVConfig(**dict(zip(GASV_PARAMS, x["gasv_params"].tolist())))
        o = gasv_gates(x["guided_logits"], x["node_tokens"], x["node_parents"], refs["tables"], cfg)
        N, k = o.cand.shape
        cand = torch.full((N, GASV_K), -1, dtype=torch.long)
        gate = torch.zeros(N, GASV_K)
        cand[:, :k], gate[:, :k] = o.cand, o.gate
        return dict(p=o.p, delta_eff=o.delta_eff, cand=cand, gate=gate)
    if graph is Graph.MEDUSA_HEADS:
        return dict(logits=refs["drafter"].head_logits(x["hidden"], x["depth"]))
    if graph is Graph.VQ_DECODE:
        vq, tok = refs["vq"], x["image_tokens"]
        grid = refs["target"].config.grid_size
        return dict(images=vq.decode_code(tok, (tok.shape[0], vq.config.codebook_embed_dim, grid, grid)))
    raise SpecError(f"no reference for {graph}")


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


@dataclass
class ValidationReport:
    """Per-output scaled errors of one graph vs PyTorch."""

    graph: str
    precision: str
    threshold: float
    errors: dict = field(default_factory=dict)
    sizes: dict = field(default_factory=dict)

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
                   threshold: Optional[float] = None) -> ValidationReport:
    """Run the exported graph and the fp32 PyTorch reference on the same random inputs.

    The sizes differ from the trace sizes on purpose (proves the dynamic axes).
    """
    inputs = sample_inputs(graph, spec, dims, refs, precision=precision, seed=seed, batch=batch, seq=seq, nodes=nodes)
    have = run_onnx(path, inputs)
    want = reference_outputs(graph, refs, inputs)
    rep = ValidationReport(graph.value, precision, THRESHOLDS[precision] if threshold is None else threshold,
                           sizes=dict(batch=batch, seq=seq, nodes=nodes))
    for name in spec.output_names:
        rep.errors[name] = output_error(have[name], want[name])
    return rep


# ----------------------------------------------------------------------------- lint

_POLYGRAPHY = "import sys; from polygraphy.tools import main; sys.argv[0] = 'polygraphy'; sys.exit(main())"


def lint_graph(path, inputs: dict, timeout: float = 600.0) -> dict:
    """`polygraphy check lint` with valid inputs; {"status": passed|failed|skipped, ...}."""
    try:
        from polygraphy.json import save_json
    except ImportError:
        return {"status": "skipped", "reason": "polygraphy is not installed"}
    with tempfile.TemporaryDirectory() as tmp:
        feeds, report = Path(tmp) / "inputs.json", Path(tmp) / "lint.json"
        save_json([{k: to_numpy(v) for k, v in inputs.items()}], str(feeds))
        cmd = [sys.executable, "-c", _POLYGRAPHY, "check", "lint", str(path), "--load-inputs", str(feeds),
               "-o", str(report)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
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
