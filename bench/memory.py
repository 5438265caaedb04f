"""Issue 26: bundle bytes vs distinct weight bytes, export and ONNX Runtime `run` peak RSS.

Measures engine directories that are already exported (by `lisa-trt export`, under
`/usr/bin/time -v` when export peak RSS is wanted) and runs `lisa-trt run --backend ort`
(vanilla decoding, one image, CFG as recorded in the bundle) under `/usr/bin/time -v` on each:

    python bench/memory.py --label gptl --fp32-weights 1371000000 \\
        before-fp32=DIR:EXPORT_TIME_LOG after-fp32=DIR:EXPORT_TIME_LOG ... --json bench/memory.json

`--run LABEL,...` chooses which bundles get an ORT `lisa-trt run` (needs a VQ decoder in the
bundle); `--decode LABEL,LABEL+one-copy` runs the target-only probe instead (load, CFG prefill,
`--steps` sampled tokens through GraphTarget, batch 2), default or one-copy ORT mode; `--src LABEL=PYTHONPATH`
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


DECODE = r"""
import resource, sys, time, torch
from lisa_trt.engines.graph import load_engines
d, steps, one = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
opts = dict(one_copy=True) if one else {}
t0 = time.perf_counter()
e = load_engines(d, "ort", threads=2, **opts)
t = e.target
g = torch.Generator().manual_seed(0)
cache = t.new_cache(2, extra=8)
out = t.prefill(torch.tensor([3, t.config.num_classes]), cache)  # CFG: cond + uncond rows
T, toks = t.config.cls_token_num, []
t1 = time.perf_counter()
for i in range(steps):
    lg = out.logits[:, -1].float()
    tok = torch.multinomial(torch.softmax(lg[1] + 4.0 * (lg[0] - lg[1]), -1), 1, generator=g)
    toks.append(int(tok))
    pos = torch.full((2, 1), T + i)
    mask = torch.zeros(2, 1, t.max_cache_len, dtype=torch.bool)
    mask[:, :, :T + i + 1] = True
    out = t.forward_tokens(tok.expand(2, 1).contiguous(), pos, pos.clone(), mask, cache)
dt = (time.perf_counter() - t1) / steps
print("RESULT", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, round(dt, 4), toks[:16])
"""


def ort_decode(d: Path, pythonpath: str, steps: int, one_copy: bool) -> dict:
    """The target through ORT: load, CFG prefill, `steps` sampled tokens (batch 2); peak RSS of
    that process, s/token, the first tokens (equal across modes for the same seed)."""
    env = dict(os.environ, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1")
    load0 = os.getloadavg()
    p = subprocess.run([sys.executable, "-c", DECODE, str(d), str(steps), "1" if one_copy else "0"],
                       capture_output=True, text=True, env=env)
    rec = dict(rc=p.returncode, loadavg_before=load0, loadavg_after=os.getloadavg(), steps=steps, one_copy=one_copy,
               pythonpath=pythonpath)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT"):
            _, rss, dt, toks = line.split(" ", 3)
            rec.update(peak_rss_bytes=int(rss), s_per_token=float(dt), first_tokens=json.loads(toks))
    if p.returncode:
        rec["error"] = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", nargs="+", help="LABEL=ENGINE_DIR[:EXPORT_TIME_V_LOG]")
    ap.add_argument("--label", required=True, help="the model shape measured (e.g. random GPT-L c2i 256)")
    ap.add_argument("--fp32-weights", type=int, required=True, help="fp32 bytes of the target (+ drafter, VQ)")
    ap.add_argument("--run", default="", help="comma-separated labels to run through ORT")
    ap.add_argument("--src", action="append", default=[], help="LABEL=PYTHONPATH for that bundle's ORT run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode", default="", help="comma-separated LABEL[+one-copy] to run the target decode probe on")
    ap.add_argument("--steps", type=int, default=16, help="decode probe: sampled tokens")
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
        for want in a.decode.split(","):
            lab, _, mode = want.partition("+")
            if lab == label:
                # one-copy is this checkout's mode (engines/ort.ExclusiveSessions): always run it with REPO
                r = ort_decode(d, str(REPO) if mode == "one-copy" else src.get(label, str(REPO)), a.steps,
                               mode == "one-copy")
                if "peak_rss_bytes" in r:
                    r["peak_rss_over_fp32_weights"] = round(r["peak_rss_bytes"] / a.fp32_weights, 3)
                    r["meets_1p5x_plus_1GB"] = r["peak_rss_bytes"] <= 1.5 * a.fp32_weights + 1e9
                row.setdefault("ort_decode", {})["one-copy" if mode == "one-copy" else "default"] = r
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
