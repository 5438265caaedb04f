"""Issue 36: the io spec v2 graphs at GPT-XL size on CPU: export wall time, peak RSS, bundle size,
and whether a step's KV outputs are the new rows only.

    python bench/gptxl_export.py [--precision fp16] [--work /tmp/gptxl] [--json bench/gptxl_export.json]

A random GPT-XL c2i 384 checkpoint (775M) and a random VQ-16 (`lisa-trt random-checkpoint`, made
once in --work), `lisa-trt export` of them (validated, as by default) under /usr/bin/time -v;
then, from the bundle: its bytes, the declared shapes of every KV graph's `past_key_values.*` and
`present.*`, and one ONNX Runtime target_verify step (batch 2 = CFG, S = 4 new tokens) whose
`present.*` must be (2, kv_heads, 4, head_dim) against a (2, kv_heads, Lmax, head_dim) cache.
The checkpoint, export and measuring helpers are bench/memory.py's (one copy of each). The
machine's load is recorded: the box is shared, so the wall time is no speed claim.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import memory as M  # noqa: E402  (bench/memory.py: make_llamagen, _sh, bundle_bytes, ...)


def _dims(vi) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]


def declared_kv(d: Path) -> dict:
    """{graph: {"past": dims, "present": dims, "rows_only": bool}} from each KV graph's declared I/O:
    present.* has the past's (B, kv_heads, -, head_dim) with the call's new rows instead of Lmax: a
    dynamic step axis, or (the LlamaGen prefill) its static prefix length."""
    import onnx

    from lisa_trt.export.manifest import read_manifest
    from lisa_trt.models.io_spec import Graph

    man, out = read_manifest(d), {}
    for g in man.graphs:
        m = onnx.load(str(man.graph_path(Graph(g))), load_external_data=False)
        past = [_dims(v) for v in m.graph.input if v.name.startswith("past_key_values.")]
        present = [_dims(v) for v in m.graph.output if v.name.startswith("present.")]
        if not past:
            continue
        p0, r0 = past[0], present[0]
        out[g] = {"kv_tensors": len(present), "past": p0, "present": r0,
                  "rows_only": len(past) == len(present) and all(
                      r[:2] == p0[:2] and r[3] == p0[3] and (isinstance(r[2], str) or r[2] < p0[2]) for r in present)}
    return out


def ort_step(d: Path, seq: int = 4) -> dict:
    """One ONNX Runtime target_verify call with valid random inputs (batch 2, `seq` new tokens)."""
    import types

    import onnxruntime as ort

    from lisa_trt.export.manifest import read_manifest
    from lisa_trt.export.validate import sample_inputs, to_numpy
    from lisa_trt.models.io_spec import Graph

    man = read_manifest(d)
    g = Graph.TARGET_VERIFY
    spec = man.spec(g)
    refs = {"target": types.SimpleNamespace(config=man.target_config)}
    feeds = sample_inputs(g, spec, man.dims, refs, precision=man.precision, batch=2, seq=seq, nodes=seq,
                          family=man.export_family)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(man.graph_path(g)), opts, providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()
    feeds = {n: to_numpy(feeds[n]) for n in spec.input_names}
    names = [o.name for o in sess.get_outputs()]
    outs = dict(zip(names, sess.run(None, feeds)))
    t2 = time.perf_counter()
    past = next(v.shape for n, v in feeds.items() if n.startswith("past_key_values."))
    present = sorted({tuple(v.shape) for n, v in outs.items() if n.startswith("present.")})
    want = (2, past[1], seq, past[3])
    return {"graph": g.value, "batch": 2, "new_tokens": seq, "past_shape": list(past),
            "present_shapes": [list(s) for s in present], "rows_only": present == [want],
            "session_s": round(t1 - t0, 1), "step_s": round(t2 - t1, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", choices=["fp16", "fp32"], default="fp16")
    ap.add_argument("--work", type=Path, default=Path("/tmp/gptxl"))
    ap.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "gptxl_export.json")
    ap.add_argument("--keep", action="store_true", help="keep the exported bundle in --work")
    a = ap.parse_args(argv)
    from lisa_trt.io import atomic_write

    a.work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    ck, vq = M.make_llamagen(a.work)
    rec = {"what": "io spec v2 graphs at GPT-XL size on CPU (issue 36 item 4)", "commit": M._commit(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": "python bench/gptxl_export.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "model": "random GPT-XL c2i 384 (lisa-trt random-checkpoint --config GPT-XL --image-size 384) + VQ-16",
           "fp32_weight_bytes": ck.stat().st_size + vq.stat().st_size, "checkpoint_s": round(time.time() - t0, 1),
           "precision": a.precision, "machine": "2-core shared CPU VM; see loadavg: no speed claim"}
    d = a.work / f"gptxl_{a.precision}"
    cmd = [sys.executable, "-m", "lisa_trt", "export", "--model", str(ck), "--config", "GPT-XL", "--image-size",
           "384", "--vq", str(vq), "--out", str(d), "--overwrite"] + (["--fp16"] if a.precision == "fp16" else [])
    rec["export"] = M._sh(cmd, a.work / f"gptxl_{a.precision}_export.log")
    print("export", json.dumps(rec["export"])[:400], flush=True)
    if rec["export"]["rc"] == 0:
        rec["bundle_bytes"] = M.bundle_bytes(d)
        rec["distinct_weight_bytes"] = M.distinct_weight_bytes(d)
        rec["declared_kv"] = declared_kv(d)
        rec["ort_step"] = ort_step(d)
        rec["rows_only"] = all(v["rows_only"] for v in rec["declared_kv"].values()) and rec["ort_step"]["rows_only"]
        if not a.keep:
            M.subprocess.run(["rm", "-rf", str(d)])
    with atomic_write(a.json) as tmp:
        Path(tmp).write_text(json.dumps(rec, indent=1) + "\n")
    print(json.dumps({k: rec.get(k) for k in ("rows_only", "bundle_bytes", "ort_step")}, indent=1))
    return 0 if rec["export"]["rc"] == 0 and rec.get("rows_only") else 1


if __name__ == "__main__":
    sys.exit(main())
