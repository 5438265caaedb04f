"""The generated Triton models import the lisa_trt that `serve` runs (their `lisa_trt_src`
parameter), not whichever copy the stub's own sys.path would find first (an installed one)."""

import json
import subprocess
import sys
import textwrap

import pytest

from lisa_trt.serve.repo import MODEL_PY, PROXY_MODEL_PY, STREAM_MODEL_PY, config_pbtxt


def _fake_lisa_trt(root):
    """A lisa_trt whose Pipeline / final_failure say where they were imported from."""
    pkg = root / "lisa_trt"
    for sub in ("", "runtime", "serve"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    where = 'raise RuntimeError("imported from " + __file__)'
    (pkg / "runtime" / "pipeline.py").write_text(
        f"class Pipeline:\n    @classmethod\n    def from_dir(cls, *a, **k):\n        {where}\n")
    (pkg / "serve" / "model.py").write_text(f"class ServeModel: pass\ndef final_failure(*a):\n    pass\n{where}\n")


RUN = textwrap.dedent("""
    import json, sys, types
    sys.modules["triton_python_backend_utils"] = types.SimpleNamespace()
    sys.path.insert(0, sys.argv[1])
    import model
    try:
        model.TritonPythonModel().initialize(json.loads(sys.argv[2]))
    except RuntimeError as e:
        print(e)
""")


@pytest.mark.parametrize("code,proxy", [(MODEL_PY, False), (STREAM_MODEL_PY, False), (PROXY_MODEL_PY, True)],
                         ids=["lisa", "lisa_stream", "proxy"])
def test_a_generated_model_imports_lisa_trt_from_its_source_parameter(tmp_path, code, proxy):
    src = tmp_path / "src"
    _fake_lisa_trt(src)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.py").write_text(code)
    text = config_pbtxt(engine_dir="engines", backend="ort", max_batch=2, max_queue_delay_ms=1.0, instances=1,
                        kind="cpu", proxy=proxy, source=str(src))
    assert f'key: "lisa_trt_src" value: {{ string_value: "{src}" }}' in text
    params = {"lisa_trt_src": {"string_value": str(src)}, "engine_dir": {"string_value": "engines"},
              "engine_model": {"string_value": "lisa_stream"}}
    args = {"model_config": json.dumps({"max_batch_size": 2, "input": [], "output": [], "parameters": params}),
            "model_repository": str(tmp_path), "model_version": "1"}
    out = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / "m"), json.dumps(args)], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert f"imported from {src}" in out.stdout, (out.stdout, out.stderr[-2000:])


def test_without_a_source_the_config_names_none():
    text = config_pbtxt(engine_dir="e", backend="ort", max_batch=2, max_queue_delay_ms=1.0, instances=1, kind="cpu")
    assert "lisa_trt_src" not in text
