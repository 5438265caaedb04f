"""Issue 39: what `lisa-trt serve --progressive` costs, one configuration per call (run the
configurations one after another, never two servers at once): start-up, the Python-backend stubs'
memory per model, sequential requests through model 'lisa' (wall time against the decode time the
server reports: the difference is the serving path's overhead, the BLS hop included), and 16
concurrent requests (the rows decoded together, each model's Triton batch statistics).

    python bench/serve_progressive.py --label plain --engine-dir E --json bench/serve_progressive.json
    python bench/serve_progressive.py --label progressive --progressive --engine-dir E --json ...
    # the code before issue 39's one copy of the engines (two pipelines), from an archive of its commit:
    git archive 342445a lisa_trt | tar -x -C /tmp/old && (cd /tmp/old && PYTHONPATH=/tmp/old \\
        python $OLDPWD/bench/serve_progressive.py --label old-progressive --progressive --engine-dir E --json ...)

Run it from the root of the lisa_trt it measures (the Python-backend stubs import lisa_trt from the
working directory first). Demo engines: `lisa-trt demo` (or lisa_trt.runtime.demo.ensure_demo_bundle).
"""

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def stub_rss(pid: int) -> dict:
    """{model: [RSS MiB of each of its triton_python_backend_stub processes]} below `pid`."""
    from lisa_trt.serve.process import descendants

    out = {}
    for p in descendants(pid):
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
            rss = [ln for ln in open(f"/proc/{p}/status") if ln.startswith("VmRSS:")]
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"triton_python_backend_stub") and rss:
            model = Path(cmd[1].decode()).parent.parent.name  # .../repo/<model>/1/model.py
            out.setdefault(model, []).append(round(int(rss[0].split()[1]) / 1024, 1))
    return out


def batch_stats(url: str, models) -> dict:
    import tritonclient.http as http

    tc = http.InferenceServerClient(url)
    try:
        return {m: {int(b["batch_size"]): int(b["compute_infer"]["count"])
                    for b in tc.get_inference_statistics(m)["model_stats"][0].get("batch_stats", [])} for m in models}
    finally:
        tc.close()


def measure(engine_dir, progressive: bool, log_path, requests: int = 6, concurrent: int = 16) -> dict:
    import lisa_trt
    from lisa_trt.serve.client import LisaClient
    from lisa_trt.serve.process import ServerProcess

    out = {"code": str(Path(lisa_trt.__file__).parent), "progressive": progressive, "load_before": os.getloadavg()}
    t0 = time.time()
    with ServerProcess(engine_dir, log_path, backend="ort", threads=1, window_ms=20, max_batch=16,
                       openai=progressive, progressive=progressive, start_timeout=600) as s:
        out["ready_s"] = round(time.time() - t0, 1)
        out["stub_rss_mib_at_start"] = stub_rss(s.proc.pid)
        c = LisaClient(s.url, timeout=600)
        wall, dec = [], []
        for i in range(requests):
            t = time.perf_counter()
            _, st = c.generate("coffee", seed=100 + i)
            wall.append(time.perf_counter() - t)
            dec.append(st["seconds"])
        c.close()
        out.update(sequential_wall_s=[round(x, 3) for x in wall], sequential_decode_s=[round(x, 3) for x in dec],
                   median_overhead_s=round(statistics.median(a - b for a, b in zip(wall, dec)), 3))

        def one(i):
            cc = LisaClient(s.url, timeout=600)
            try:
                return cc.generate(str(i % 8), seed=200 + i)[1]["batch"]
            finally:
                cc.close()

        t = time.perf_counter()
        with ThreadPoolExecutor(concurrent) as ex:
            out["concurrent_row_batches"] = sorted(ex.map(one, range(concurrent)))
        out["concurrent_wall_s"] = round(time.perf_counter() - t, 2)
        time.sleep(3)  # a decoupled model's statistics are recorded when Triton releases the request
        out["triton_batch_stats"] = batch_stats(s.url, ["lisa", "lisa_stream"] if progressive else ["lisa"])
        out["stub_rss_mib_after"] = stub_rss(s.proc.pid)
        out["warm_up_decodes_in_log"] = s.text().count("loaded and warmed up (")
    out["load_after"] = os.getloadavg()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine-dir", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--progressive", action="store_true")
    ap.add_argument("--json", default=None, help="append the run to this file's `runs`")
    a = ap.parse_args()
    run = {"label": a.label, **measure(a.engine_dir, a.progressive, Path(f"/tmp/serve_progressive_{a.label}.log"))}
    print(json.dumps(run))
    if a.json:
        p = Path(a.json)
        doc = json.loads(p.read_text()) if p.is_file() else {"what": __doc__.split("\n\n")[0], "runs": []}
        doc["runs"].append(run)
        p.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
