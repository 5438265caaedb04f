"""Issue 26: bundle bytes vs distinct weight bytes, export and ONNX Runtime `run` peak RSS.

Measures engine directories that are already exported (by `lisa-trt export`, under
`/usr/bin/time -v` when export peak RSS is wanted) and runs `lisa-trt run --backend ort`
(vanilla decoding, one image, CFG as recorded in the bundle) under `/usr/bin/time -v` on each:

    python bench/memory.py --label gptl --fp32-weights 1371000000 \\
        before-fp32=DIR:EXPORT_TIME_LOG after-fp32=DIR:EXPORT_TIME_LOG ... --json bench/memory.json

`--run LABEL,...` chooses which bundles get an ORT run (the slow part); `--src LABEL=PYTHONPATH`
runs the `run` of that bundle with another checkout (e.g. the code before the change, for a
bundle in the old layout). Every row records machine, load and date.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def bundle_bytes(d: Path) -> dict:
    """Bytes of every file of an engine directory, by kind."""
    out = {"total": 0, "onnx_data": 0, "onnx": 0, "torch_weights": 0, "other": 0}
    for f in d.rglob("*"):
        if not f.is_file():
            continue
        n = f.stat().st_size
        out["total"] += n
        kind = ("onnx_data" if f.name.endswith(".onnx.data") else "onnx" if f.suffix == ".onnx"
                else "torch_weights" if f.parent.name == "weights" else "other")
        out[kind] += n
    return out


def distinct_weight_bytes(d: Path) -> int:
    """Bytes of the distinct tensors the graphs hold (each (dtype, bytes) counted once), read
    from the graph files themselves, so old and new layouts are measured the same way."""
    import hashlib

    import onnx

    from lisa_trt.export.weights import _tensor_bytes

    seen, total = set(), 0
    for g in sorted(d.glob("*.onnx")):
        m = onnx.load(str(g), load_external_data=False)
        for t in m.graph.initializer:
            b = _tensor_bytes(t, d)
            if b is None:
                continue
            k = hashlib.sha256(t.data_type.to_bytes(4, "little") + b).digest()
            if k not in seen:
                seen.add(k)
                total += len(b)
    return total


def time_v(log: str) -> dict:
    """Peak RSS (bytes) and wall seconds from a `/usr/bin/time -v` log."""
    out = {}
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", log)
    if m:
        out["peak_rss_bytes"] = int(m.group(1)) * 1024
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", log)
    if m:
        parts = [float(x) for x in m.group(1).split(":")]
        out["wall_s"] = round(sum(p * 60 ** i for i, p in enumerate(reversed(parts))), 1)
    return out


def ort_run(d: Path, pythonpath: str, threads: int) -> dict:
    """`lisa-trt run --backend ort --verify vanilla` of one image under /usr/bin/time -v."""
    with tempfile.TemporaryDirectory(prefix="mem-run-") as tmp:
        prompts = Path(tmp) / "p.txt"
        prompts.write_text("1\n")
        cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "lisa_trt", "run", str(d), str(prompts), "--backend", "ort",
               "--verify", "vanilla", "--threads", str(threads), "--out", str(Path(tmp) / "out"), "--seed", "0"]
        env = dict(os.environ, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1")
        load0 = os.getloadavg()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        rec = dict(time_v(p.stderr), rc=p.returncode, loadavg_before=load0, loadavg_after=os.getloadavg(),
                   command=" ".join(cmd[2:]))
        if p.returncode:
            rec["error"] = (p.stderr or p.stdout).strip().splitlines()[-3:]
        tok = Path(tmp) / "out" / "stats.json"
        if tok.is_file():
            rec["stats"] = json.loads(tok.read_text())
        return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", nargs="+", help="LABEL=ENGINE_DIR[:EXPORT_TIME_V_LOG]")
    ap.add_argument("--label", required=True, help="the model shape measured (e.g. random GPT-L c2i 256)")
    ap.add_argument("--fp32-weights", type=int, required=True, help="fp32 bytes of the target (+ drafter, VQ)")
    ap.add_argument("--run", default="", help="comma-separated labels to run through ORT")
    ap.add_argument("--src", action="append", default=[], help="LABEL=PYTHONPATH for that bundle's ORT run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, required=True, help="results file (a list of labelled blocks is extended)")
    a = ap.parse_args(argv)
    src = dict(s.split("=", 1) for s in a.src)
    rows = {}
    for spec in a.bundles:
        label, rest = spec.split("=", 1)
        d, _, log = rest.partition(":")
        d = Path(d)
        row = {"dir": str(d), "bytes": bundle_bytes(d), "distinct_weight_bytes": distinct_weight_bytes(d)}
        row["bundle_over_distinct"] = round(row["bytes"]["total"] / row["distinct_weight_bytes"], 3)
        if log and Path(log).is_file():
            row["export"] = time_v(Path(log).read_text())
            if "peak_rss_bytes" in row["export"]:
                row["export"]["peak_rss_over_fp32_weights"] = round(row["export"]["peak_rss_bytes"] / a.fp32_weights, 3)
        if label in a.run.split(","):
            r = ort_run(d, src.get(label, str(REPO)), a.threads)
            if "peak_rss_bytes" in r:
                r["peak_rss_over_fp32_weights"] = round(r["peak_rss_bytes"] / a.fp32_weights, 3)
                r["target_1p5x_plus_1GB"] = 1.5 * a.fp32_weights + 1e9
                r["meets_target"] = r["peak_rss_bytes"] <= r["target_1p5x_plus_1GB"]
            row["ort_run"] = r
        rows[label] = row
        print(label, json.dumps(row)[:400], flush=True)
    block = {"label": a.label, "fp32_weight_bytes": a.fp32_weights, "rows": rows,
             "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                         "loadavg_end": os.getloadavg()},
             "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "command": "python bench/memory.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    old = json.loads(a.json.read_text()) if a.json.is_file() else {}
    blocks = [b for b in old.get("blocks", []) if b.get("label") != a.label]
    a.json.write_text(json.dumps({"issue": 26, "what": "bundle bytes / distinct weight bytes, export and ORT run peak "
                                  "RSS, before (81e7d15) and after the shared weights file", "blocks": blocks + [block]},
                                 indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
