"""docs/serving.md: the Kubernetes example parses and agrees with the code (no cluster needed)."""

import re
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")  # pyyaml: in the dev extra

DOC = Path(__file__).parents[2] / "docs" / "serving.md"


def _manifests():
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    docs = [d for b in blocks for d in yaml.safe_load_all(b) if d]
    return {d["kind"]: d for d in docs}


def test_kubernetes_example_deployment_and_service():
    from lisa_trt.serve.server import MODEL_NAME, triton_command

    m = _manifests()
    assert set(m) >= {"Deployment", "Service"}
    dep, svc = m["Deployment"], m["Service"]
    pod = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert set(containers) == {"triton", "openai"}
    c = containers["triton"]
    assert c["image"].startswith("nvcr.io/nvidia/tritonserver:") and c["image"].endswith("-py3")
    assert c["resources"]["limits"]["nvidia.com/gpu"] >= 1
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    side = {p["name"]: p["containerPort"] for p in containers["openai"]["ports"]}
    assert side == {"openai": 8080}
    every = {**ports, **side}
    assert {sp["targetPort"] for sp in svc["spec"]["ports"]} == set(every)
    for sp in svc["spec"]["ports"]:
        assert every[sp["targetPort"]] == sp["port"]

    # the probes: startup and readiness on ready (= loaded + warmed up), liveness on live
    def probe(name):
        g = c[name]["httpGet"]
        port = ports[g["port"]] if isinstance(g["port"], str) else g["port"]
        return g["path"], port

    assert probe("startupProbe") == ("/v2/health/ready", 8000)
    assert probe("readinessProbe") == ("/v2/health/ready", 8000)
    assert probe("livenessProbe") == ("/v2/health/live", 8000)
    st = c["startupProbe"]
    assert st["periodSeconds"] * st["failureThreshold"] >= 300  # room to load engines + warm up

    # tritonserver flags: the ones `lisa-trt serve` relies on for readiness, with the doc's values
    script = " ".join(c["args"])
    argv = shlex.split(script.split("exec ", 1)[1])
    assert argv[0] == "tritonserver"
    flags = dict(a.split("=", 1) for a in argv[1:])
    ours = dict(a.split("=", 1) for a in triton_command(Path("/m"), Path("/b"), host="h", http_port=1, grpc_port=2,
                                                           metrics_port=3, drain_timeout=60)[1:])
    for key in ("--model-control-mode", "--strict-readiness"):
        assert flags[key] == ours[key], key
    assert {flags["--http-port"], flags["--grpc-port"], flags["--metrics-port"]} == {"8000", "8001", "8002"}
    assert flags["--http-port"] == "8000" and flags["--grpc-port"] == "8001"
    (mount,) = c["volumeMounts"]
    assert flags["--model-repository"] == mount["mountPath"]
    assert pod["spec"]["terminationGracePeriodSeconds"] > int(flags["--exit-timeout-secs"])
    vol = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert mount["name"] in vol
    assert MODEL_NAME == "lisa"


def test_kubernetes_openai_sidecar_runs_the_front_end_against_the_pods_triton():
    """The sidecar's command is a real `lisa-trt openai-api` line: options that exist, its --port
    the container port, Triton at the pod's own HTTP port, the bundle on the shared volume, and
    readiness on the front end's /health (503 until Triton's model is ready)."""
    from lisa_trt.serve.cli import openai_api_cmd

    dep = _manifests()["Deployment"]
    c = {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}["openai"]
    script = " ".join(c["args"])
    argv = shlex.split(script[script.index("lisa-trt openai-api"):])
    known = {o for prm in openai_api_cmd.params for o in prm.opts}
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert set(flags) <= known and argv[2].startswith("/models/")
    assert flags["--triton-url"] == "127.0.0.1:8000" and int(flags["--port"]) == c["ports"][0]["containerPort"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "openai"}
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]


def test_serve_and_triton_repo_lines_in_the_doc_use_existing_options():
    """Every `lisa-trt serve` / `lisa-trt triton-repo` line of the doc uses options that exist."""
    from lisa_trt.serve.cli import serve_cmd, triton_repo_cmd

    cmds = {"triton-repo": triton_repo_cmd, "serve": serve_cmd}
    checked = 0
    for ln in DOC.read_text().splitlines():
        ln = ln.strip().strip("`")
        if not ln.startswith("lisa-trt "):
            continue
        argv = shlex.split(ln.split(" #")[0])
        if len(argv) < 2 or argv[1] not in cmds:
            continue
        known = {o for prm in cmds[argv[1]].params for o in prm.opts + prm.secondary_opts}
        used = {a.split("=")[0] for a in argv[2:] if a.startswith("--")}
        assert used <= known, (ln, used - known)
        checked += 1
    assert checked >= 2
