"""quantize-trt: ModelOpt driven in its own venv -> Q/DQ graphs that pass the CPU TensorRT check.

The ModelOpt runs need the isolated venv (created by `lisa-trt quantize-trt --install`, several
minutes of pip); they are skipped when it is absent. The driver's own logic (clear errors,
valid calibration inputs, the command line) is tested everywhere.
"""

import os

import numpy as np
import pytest

from lisa_trt.models.io_spec import Graph
from lisa_trt.deploy.trt_quantize import (
    MODELOPT_REQUIREMENT,
    ModelOptError,
    calibration_inputs,
    default_venv,
    ensure_venv,
    modelopt_command,
    qdq_counts,
    quantize_trt,
    venv_python,
)


def _venv_ok() -> bool:
    try:
        ensure_venv(default_venv(), install=False)
        return True
    except ModelOptError:
        return False


needs_modelopt = pytest.mark.skipif(not _venv_ok(), reason="no ModelOpt venv (lisa-trt quantize-trt --install)")


def test_missing_venv_is_a_clear_error(tmp_path):
    with pytest.raises(ModelOptError, match="no usable ModelOpt venv .*--install"):
        ensure_venv(tmp_path / "nope", install=False)


def test_default_venv_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LISA_TRT_MODELOPT_VENV", str(tmp_path / "v"))
    assert default_venv() == tmp_path / "v"
    monkeypatch.delenv("LISA_TRT_MODELOPT_VENV")
    assert default_venv().name == "modelopt-venv"


def test_unknown_mode_is_refused(bundle, tmp_path):
    with pytest.raises(ModelOptError, match="valid: int8, fp8, int4"):
        quantize_trt(bundle.dir, tmp_path / "x", "int2", install=False)


@pytest.mark.parametrize("graph", [Graph.TARGET_VERIFY, Graph.DRAFTER_STEP])
def test_calibration_inputs_are_valid_for_the_graph(bundle, graph):
    """The calibration batch runs through the fp32 graph with ONNX Runtime (ids in range etc.)."""
    import onnxruntime as ort

    data, shapes = calibration_inputs(graph, bundle, samples=3, seq=4)
    step = {kv.split(":")[0]: tuple(int(d) for d in kv.split(":")[1].split("x")) for kv in shapes.split(",")}
    for n, arr in data.items():
        assert arr.shape[0] == 3 * step[n][0] and arr.shape[1:] == step[n][1:], n
    sess = ort.InferenceSession(str(bundle.graph_path(graph)), providers=["CPUExecutionProvider"])
    first = {n: a[: step[n][0]] for n, a in data.items()}
    outs = sess.run(None, first)
    assert all(np.isfinite(o).all() for o in outs if o.dtype.kind == "f")
    ids = data["input_ids"]
    assert ids.min() >= 0 and ids.max() < bundle.target_config.vocab_size


def test_modelopt_command_keeps_fp32_io_and_calibrates_on_cpu(tmp_path):
    cmd = modelopt_command(venv_python(tmp_path), tmp_path / "a.onnx", tmp_path / "b.onnx", "int4",
                           tmp_path / "c.npz", "x:1x2")
    assert cmd[1:3] == ["-m", "modelopt.onnx.quantization"]
    args = dict(zip(cmd[3::2], cmd[4::2]))
    assert args["--quantize_mode"] == "int4" and args["--calibration_method"] == "rtn_dq"
    assert args["--calibration_eps"] == "cpu" and args["--high_precision_dtype"] == "fp32"
    assert "nvidia-modelopt[onnx]==" in MODELOPT_REQUIREMENT


@needs_modelopt
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_modelopt_qdq_graphs_pass_the_tensorrt_check(bundle, tmp_path, mode):
    from lisa_trt.deploy.trt_lint import check_trt_compat
    from lisa_trt.export.manifest import read_manifest

    out = tmp_path / f"trt-{mode}"
    man = quantize_trt(bundle.dir, out, mode, install=False, samples=2, echo=lambda *a: None)
    assert man.quantization == f"trt-{mode}"
    for g in (Graph.TARGET_VERIFY, Graph.DRAFTER_STEP):
        c = qdq_counts(man.graph_path(g))
        assert c.get("DequantizeLinear", 0) > 0, (g, c)
        if mode == "int8":
            assert c.get("QuantizeLinear", 0) > 0  # activations quantized too
        q = man.graphs[g.value].quantization
        assert q["mode"] == f"trt-{mode}" and q["modelopt"]["modelopt"]
    assert man.graphs["gasv"].quantization is None  # untouched
    rep = check_trt_compat(out, graphs=["target_prefill", "target_verify", "drafter_project", "drafter_step"])
    assert rep.ok
    read_manifest(out)  # hashes recorded for the new files
    from lisa_trt.export import manifest as M

    for name, entry in bundle.graphs.items():  # the source bundle is untouched (ModelOpt reads a copy)
        assert M.file_sha256(bundle.dir / entry.file) == entry.sha256, name
    assert not os.path.exists(str(out) + ".partial")


def test_cli_exposes_quantize_options():
    from click.testing import CliRunner

    from lisa_trt.cli import main

    r = CliRunner()
    out = r.invoke(main, ["export", "--help"]).output
    assert "--quantize [none|int8|int4]" in out
    out = r.invoke(main, ["quantize-trt", "--help"]).output
    assert "--mode [int8|fp8|int4]" in out and "--install / --no-install" in out
    bad = r.invoke(main, ["export", "--model", "demo", "--out", "x", "--quantize", "int2"])
    assert bad.exit_code != 0 and "int2" in bad.output


def test_quantize_trt_without_venv_fails_cleanly(bundle, tmp_path, monkeypatch):
    """--no-install and no venv: a LisaError that says how to create it, and no output directory."""
    monkeypatch.setenv("LISA_TRT_MODELOPT_VENV", str(tmp_path / "none"))
    with pytest.raises(ModelOptError, match="--install"):
        quantize_trt(bundle.dir, tmp_path / "out", "int8", install=False)
    assert not (tmp_path / "out").exists()
