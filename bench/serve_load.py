"""Load test of `lisa-trt serve`: N concurrent clients on 127.0.0.1 for a bounded time.

For each batching window (Triton's max_queue_delay) a fresh server is started on the engine
directory, warmed up with one request, then N client threads send requests back to back for
--duration seconds (random class, unique seed each). Clients stop issuing at the deadline and
wait for their in-flight request (bounded by --request-timeout). Recorded per window:
throughput (images/s over the whole run including the drain), latency p50/p95/p99, the batch
sizes the server reported, failed and lost requests, and Triton's own execution counters.

    python bench/serve_load.py --clients 32 --duration 60 --windows 0,5,20 --json bench/serve.json

Add --unbatched to also measure --max-batch 1 (every request decoded alone) as a baseline.
--instances 1,2 repeats every run with that many model instances (--threads is the server's
total, split between them). --malformed 0.1 makes 10 % of the requests malformed (unknown
class, out-of-range knob, wrong dtype, too many rows, unknown verify rule): each must get a 4xx
and every valid one must succeed; both are recorded.
Without --engine-dir the demo model is exported (cached) to runs/serve_bench/engines.
--api openai sends every request through the OpenAI Images front end (`serve --openai-port`)
with the official `openai` client instead of tritonclient (malformed requests: the same kinds as
OpenAI requests; a 4xx from the client's APIStatusError):

    python bench/serve_load.py --api openai --clients 32 --duration 60 --windows 5 --threads 2 \
        --malformed 0.1 --json bench/serve_openai.json

    python bench/serve_load.py --clients 32 --duration 60 --windows 5 --instances 1,2 --threads 2 \
        --malformed 0.1 --json bench/serve_mixed.json
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np


def percentiles(xs):
    if not xs:
        return {}
    a = np.asarray(xs)
    return {f"p{q}": float(np.percentile(a, q)) for q in (50, 95, 99)} | {"mean": float(a.mean()),
                                                                          "max": float(a.max())}


def triton_counters(metrics_port: int) -> dict:
    """nv_inference_* counters of model 'lisa' from Triton's Prometheus endpoint."""
    out = {}
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    except OSError as e:
        return {"error": str(e)}
    for line in text.splitlines():
        if line.startswith("nv_inference_") and 'model="lisa"' in line:
            name, val = line.split("{")[0], line.rsplit(" ", 1)[1]
            out[name] = float(val)
    return out


WINDOW_NOTE = ("window = Triton's max_queue_delay. At window 0 Triton's dynamic batcher still batches the "
               "requests already queued when the model frees up, so under a closed loop of many clients "
               "window 0 batches too; max_batch 1 (window 0) is the no-batching baseline.")


def ratios(runs, max_batch) -> dict:
    """Throughput of every run over window 0 (same max batch) and over the unbatched run."""
    out = {}
    for name, base in (("w0", next((r for r in runs if r["window_ms"] == 0 and r["max_batch"] == max_batch), None)),
                       ("unbatched", next((r for r in runs if r["max_batch"] == 1), None))):
        if base and base["throughput_img_s"] > 0:
            out.update({f"w{r['window_ms']:g}_b{r['max_batch']}_over_{name}": r["throughput_img_s"] / base["throughput_img_s"]
                        for r in runs if r is not base})
    return out


MALFORMED = ("unknown_class", "top_p_out_of_range", "seed_dtype", "too_many_rows", "unknown_verify")


def send_malformed(url, kind, max_batch, timeout) -> tuple:
    """One malformed request of `kind` -> (HTTP status or None, message)."""
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    def inp(name, arr, dt):
        i = http.InferInput(name, list(arr.shape), dt)
        i.set_data_from_numpy(arr)
        return i

    one = np.array([[b"1"]], dtype=object)
    inputs = {"unknown_class": [inp("prompt", np.array([[b"no-such-class"]], dtype=object), "BYTES")],
              "top_p_out_of_range": [inp("prompt", one, "BYTES"), inp("top_p", np.array([[2.0]], np.float32), "FP32")],
              "seed_dtype": [inp("prompt", one, "BYTES"), inp("seed", np.array([[1.5]], np.float32), "FP32")],
              "too_many_rows": [inp("prompt", np.array([[b"1"]] * (max_batch + 1), dtype=object), "BYTES")],
              "unknown_verify": [inp("prompt", one, "BYTES"), inp("verify", np.array([[b"bogus"]], dtype=object),
                                                                  "BYTES")]}[kind]
    c = http.InferenceServerClient(url, connection_timeout=timeout, network_timeout=timeout)
    try:
        c.infer("lisa", inputs)
        return 200, "accepted"
    except InferenceServerException as e:
        st = e.status()
        return (int(st) if st and str(st).isdigit() else None), e.message()
    finally:
        c.close()


class TritonAPI:
    """Requests through tritonclient (model 'lisa', KServe v2)."""

    name = "triton"

    def __init__(self, srv, timeout: float, max_batch: int):
        self.srv, self.timeout, self.max_batch = srv, timeout, max_batch

    def client(self):
        from lisa_trt.serve.client import LisaClient

        return LisaClient(self.srv.url, timeout=self.timeout)

    def generate(self, c, prompt: str, seed: int) -> int:
        """One image -> the batch size the server reported."""
        return int(c.generate(prompt, seed=seed)[1]["batch"])

    def malformed(self, kind: str) -> tuple:
        return send_malformed(self.srv.url, kind, self.max_batch, self.timeout)


class OpenAIAPI(TritonAPI):
    """Requests through the OpenAI Images front end with the official `openai` client."""

    name = "openai"

    def client(self):
        import openai

        return openai.OpenAI(base_url=self.srv.openai_url, api_key="unused", max_retries=0, timeout=self.timeout)

    def generate(self, c, prompt: str, seed: int) -> int:
        return int(c.images.generate(prompt=prompt, extra_body={"seed": seed}).usage.model_extra["batch"])

    def malformed(self, kind: str) -> tuple:
        import openai

        kw = {"unknown_class": dict(prompt="no-such-class"), "top_p_out_of_range": dict(extra_body={"top_p": 2.0}),
              "seed_dtype": dict(extra_body={"seed": 1.5}), "too_many_rows": dict(n=self.max_batch + 1),
              "unknown_verify": dict(extra_body={"verify": "bogus"})}[kind]
        c = self.client()
        try:
            c.images.generate(**{"prompt": "1", **kw})
            return 200, "accepted"
        except openai.APIStatusError as e:
            return e.status_code, str(e.message)
        finally:
            c.close()


def run_window(engine_dir, window_ms, *, clients, duration, max_batch, threads, request_timeout, log_dir,
               num_classes, seed0, instances=1, malformed=0.0, api=TritonAPI):
    from lisa_trt.serve.process import ServerProcess

    log = Path(log_dir) / f"server_{api.name}_w{window_ms:g}_b{max_batch}_i{instances}.log"
    with ServerProcess(engine_dir, log, threads=threads, window_ms=window_ms, max_batch=max_batch,
                       instances=instances, stop_timeout=request_timeout, openai=api is OpenAIAPI) as srv:
        proto = api(srv, request_timeout, max_batch)
        warm = proto.client()
        proto.generate(warm, "0", 0)
        warm.close()
        before = triton_counters(srv.metrics)
        lock = threading.Lock()
        rec = {"latency": [], "batch": [], "failed": [], "issued": 0, "bad_sent": Counter(), "bad_4xx": Counter(),
               "bad_wrong": []}
        counter = iter(range(seed0, 10**9))
        t0 = time.monotonic()
        deadline = t0 + duration
        last_done = [t0]

        def client(k):
            rng = random.Random(k)
            c = proto.client()
            try:
                while time.monotonic() < deadline:
                    if malformed and rng.random() < malformed:
                        kind = rng.choice(MALFORMED)
                        status, msg = proto.malformed(kind)
                        with lock:
                            rec["bad_sent"][kind] += 1
                            if status is not None and 400 <= status < 500 and "Traceback" not in msg:
                                rec["bad_4xx"][kind] += 1
                            else:
                                rec["bad_wrong"].append(f"{kind}: {status} {msg[:200]}")
                        continue
                    with lock:
                        seed = next(counter)
                        rec["issued"] += 1
                    s = time.monotonic()
                    try:
                        batch = proto.generate(c, str(rng.randrange(num_classes)), seed)
                        with lock:
                            rec["latency"].append(time.monotonic() - s)
                            rec["batch"].append(batch)
                            last_done[0] = max(last_done[0], time.monotonic())
                    except Exception as e:  # noqa: BLE001 - every failure is counted
                        with lock:
                            rec["failed"].append(f"{type(e).__name__}: {str(e)[:200]}")
            finally:
                c.close()

        ths = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
        [t.start() for t in ths]
        [t.join(duration + request_timeout + 30) for t in ths]
        hung = sum(t.is_alive() for t in ths)
        after = triton_counters(srv.metrics)
    done = len(rec["latency"])
    elapsed = last_done[0] - t0
    execs = after.get("nv_inference_exec_count", 0) - before.get("nv_inference_exec_count", 0)
    reqs = after.get("nv_inference_count", 0) - before.get("nv_inference_count", 0)
    bad = {"sent": sum(rec["bad_sent"].values()), "got_4xx": sum(rec["bad_4xx"].values()),
           "by_kind": {k: [rec["bad_sent"][k], rec["bad_4xx"][k]] for k in MALFORMED if rec["bad_sent"][k]},
           "wrong": rec["bad_wrong"][:10]}
    return {"api": api.name, "window_ms": window_ms, "max_batch": max_batch, "instances": instances, "server_threads": threads,
            "clients": clients, "duration_s": duration, "malformed_fraction": malformed, "malformed": bad,
            "issued": rec["issued"], "completed": done, "failed": len(rec["failed"]),
            "lost": rec["issued"] - done - len(rec["failed"]), "hung_clients": hung,
            "failures": rec["failed"][:10], "elapsed_s": elapsed,
            "throughput_img_s": done / elapsed if elapsed > 0 else 0.0,
            "latency_s": percentiles(rec["latency"]),
            "batch_sizes": dict(sorted(Counter(rec["batch"]).items())),
            "mean_batch": float(np.mean(rec["batch"])) if rec["batch"] else 0.0,
            "triton": {"executions": execs, "inferences": reqs,
                       "mean_batch_per_execution": reqs / execs if execs else 0.0}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine-dir", default=None)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--windows", default="0,5,20", help="Batching windows in ms (comma-separated).")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--unbatched", action="store_true", help="Also run --max-batch 1 (window 0) as a baseline.")
    ap.add_argument("--threads", type=int, default=1, help="ORT threads of the server (split between instances).")
    ap.add_argument("--instances", default="1", help="Model instances per server (comma-separated: one run each).")
    ap.add_argument("--malformed", type=float, default=0.0, help="Fraction of malformed requests (e.g. 0.1).")
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--api", choices=("triton", "openai"), default="triton",
                    help="triton: tritonclient (KServe v2); openai: the OpenAI Images front end, openai client.")
    ap.add_argument("--json", default="bench/serve.json")
    ap.add_argument("--log-dir", default="runs/serve_bench")
    args = ap.parse_args(argv)

    from lisa_trt.io import write_json
    from lisa_trt.runtime.pipeline import Pipeline

    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    eng = args.engine_dir
    if eng is None:
        from lisa_trt.runtime.demo import ensure_demo_bundle

        eng = ensure_demo_bundle(Path(args.log_dir) / "engines")
    ncls = Pipeline.from_dir(eng, backend="ort", threads=1).config.num_classes
    load0 = os.getloadavg()
    runs = []
    plan = [(float(w), args.max_batch) for w in args.windows.split(",") if w.strip()]
    if args.unbatched:
        plan.append((0.0, 1))
    plan = [(w, mb, int(n)) for n in args.instances.split(",") if n.strip() for w, mb in plan]
    for i, (w, mb, n) in enumerate(plan):
        print(f"window {w:g} ms, max batch {mb}, {n} instance(s): {args.clients} clients for {args.duration:g} s ...",
              flush=True)
        r = run_window(eng, w, clients=args.clients, duration=args.duration, max_batch=mb, threads=args.threads,
                       request_timeout=args.request_timeout, log_dir=args.log_dir, num_classes=ncls,
                       seed0=1_000_000 * (i + 1), instances=n, malformed=args.malformed,
                       api=OpenAIAPI if args.api == "openai" else TritonAPI)
        r["loadavg_after"] = os.getloadavg()
        runs.append(r)
        print(f"  {r['throughput_img_s']:.3f} img/s, p50 {r['latency_s'].get('p50', 0):.1f} s, "
              f"p99 {r['latency_s'].get('p99', 0):.1f} s, batches {r['batch_sizes']}, failed {r['failed']}, "
              f"lost {r['lost']}, malformed {r['malformed']['got_4xx']}/{r['malformed']['sent']} got 4xx", flush=True)
    summary = ratios([r for r in runs if r["instances"] == runs[0]["instances"]], args.max_batch)
    for r in runs:
        base = next((b for b in runs if b["instances"] == 1 and b["window_ms"] == r["window_ms"]
                     and b["max_batch"] == r["max_batch"]), None)
        if r["instances"] != 1 and base and base["throughput_img_s"] > 0:
            summary[f"w{r['window_ms']:g}_b{r['max_batch']}_i{r['instances']}_over_i1"] = \
                r["throughput_img_s"] / base["throughput_img_s"]
    report = {"settings": {"engine_dir": str(eng), "api": args.api, "backend": "ort", "ort_threads": args.threads,
                           "clients": args.clients, "duration_s": args.duration, "max_batch": args.max_batch,
                           "instances": args.instances, "malformed_fraction": args.malformed,
                           "command": " ".join([Path(sys.argv[0]).as_posix()] + (argv or sys.argv[1:]))},
              "machine": {"cpus": os.cpu_count(), "loadavg_before": load0,
                          "note": ("quiet 2-core CPU machine, ONNX Runtime (no other job; see loadavg_before)" if load0[0] < 1.5 else
                                   "shared 2-core CPU machine, ONNX Runtime, with other jobs running (see loadavg_before/"
                                        "_after): absolute numbers are noisy and lower than on a quiet machine, "
                                        "compare runs within this file only")},
              "runs": runs, "ratios": summary,
              "window_semantics": WINDOW_NOTE,
              "zero_failed": all(r["failed"] == 0 and r["lost"] == 0 and r["hung_clients"] == 0 for r in runs),
              "every_malformed_got_4xx": all(r["malformed"]["got_4xx"] == r["malformed"]["sent"] for r in runs)}
    write_json(args.json, report)
    print(f"wrote {args.json}: ratios {summary}")


if __name__ == "__main__":
    main()
