"""ServeModel (no server): validation per request, batch-mates served, grouping, responses,
client errors vs server faults; the Triton repository (config parses, model.py runs with a
stand-in pb_utils and answers 400 / 500 codes); port checks; libpython."""

import json
import sys
import types

import numpy as np
import pytest

from lisa_trt.runtime.prompts import Prompt
from lisa_trt.serve.model import OUTPUTS, RequestFailure, ServeModel, ServeRequestError


def _b(*s):
    return np.array([[x.encode()] for x in s], dtype=object)


@pytest.fixture(scope="module")
def model(pipe):
    return ServeModel(pipe, max_batch=4)


def test_rows_batched_and_equal_to_pipeline(model, pipe):
    reqs = [{"prompt": _b("c1"), "seed": np.array([[7]])}, {"prompt": _b("3", "2"), "seed": np.array([[8], [9]])},
            {"prompt": _b("4"), "seed": np.array([[1]]), "cfg_scale": np.array([[1.0]], np.float32)}]
    out = model.infer_each(reqs)
    assert [e for e, _ in out] == [None, None, None]
    r0, r1, r2 = (o for _, o in out)
    assert r1["image"].shape == (2, 8, 8, 3) and r1["image"].dtype == np.uint8
    assert r0["batch"][0, 0] == 3 and r2["batch"][0, 0] == 1  # cfg 1.0 is another group
    ref = pipe.generate([Prompt(0, class_id=1, seed=7), Prompt(1, class_id=3, seed=8), Prompt(2, class_id=2, seed=9)],
                        verify="gasv", batch=True)
    got = [r0["image"][0], r1["image"][0], r1["image"][1]]
    assert all(np.array_equal(np.asarray(a), b) for a, b in zip(ref.images, got))
    assert (r0["error"] == b"").all() and r0["mal"][0, 0] >= 1.0 and r0["seconds"][0, 0] > 0
    assert set(r1) == set(OUTPUTS)
    for k, (dt, dims) in OUTPUTS.items():  # every answer as OUTPUTS (what config.pbtxt declares) has it
        assert r1[k].dtype == (object if dt is np.bytes_ else np.dtype(dt)), k
        assert r1[k].shape[0] == 2 and len(r1[k].shape) == 1 + len(dims), k
        assert all(d in (-1, n) for d, n in zip(dims, r1[k].shape[1:])), k


@pytest.mark.parametrize("bad, msg", [
    ({"prompt": _b("nope")}, "unknown class"),
    ({"prompt": _b("99")}, "unknown class id 99"),
    ({"prompt": _b("1"), "seed": np.array([[1.5]])}, "must be an integer"),
    ({"prompt": np.array([[1]])}, "must be BYTES"),
    ({"prompt": _b("1"), "seed": np.array([[1], [2]])}, "shape"),
    ({"prompt": _b("1", "2", "3", "4", "5")}, "exceeds --max-batch 4"),
    ({"prompt": _b("1"), "top_p": np.array([[2.0]], np.float32)}, "top_p=2.0 is out of range"),
    ({"prompt": _b("1"), "temperature": np.array([[0.0]], np.float32)}, "temperature"),
    ({"prompt": _b("1"), "cfg_scale": np.array([[np.nan]], np.float32)}, "cfg_scale"),
    ({"prompt": _b("1"), "verify": _b("bogus")}, "unknown verify rule"),
    ({"prompt": _b("1"), "lantern_delta": np.array([[-1]], np.float32)}, "lantern_delta"),
    ({"seed": np.array([[1]])}, "missing input 'prompt'"),
    ({"prompt": _b("1"), "colour": _b("red")}, "unknown input"),
    ({"prompt": _b("1"), "negative_prompt": _b("blurry")}, "class-conditional: classifier-free guidance runs "
                                                           "against the null class"),
])
def test_bad_request_gets_its_error_and_batch_mates_are_served(model, bad, msg):
    out = model.infer_each([bad, {"prompt": _b("2"), "seed": np.array([[3]])}])
    assert out[0][0] is not None and msg in out[0][0]
    assert isinstance(out[0][0], RequestFailure) and not out[0][0].internal  # the client's error: 400
    assert "\n" not in out[0][0] and "Traceback" not in out[0][0] and ".py" not in out[0][0]
    assert msg in out[0][1]["error"][0, 0].decode()
    assert out[1][0] is None and out[1][1]["image"].shape == (1, 8, 8, 3)
    with pytest.raises(ServeRequestError, match=msg.split("=")[0]):
        model.infer([bad])  # alone: the whole execution fails (Triton answers with the message)


def test_server_fault_is_internal_with_request_id_and_traceback_only_in_log(model, monkeypatch, caplog):
    real = model._decode_group

    def decode(knobs, rows):
        if knobs[1] == 1.0:  # the cfg 1.0 group breaks; the other group must still be served
            raise RuntimeError("boom in /secret/path/engine.py")
        return real(knobs, rows)

    monkeypatch.setattr(model, "_decode_group", decode)
    with caplog.at_level("ERROR", logger="lisa_trt.serve"):
        out = model.infer_each([{"prompt": _b("1"), "cfg_scale": np.array([[1.0]], np.float32)},
                                {"prompt": _b("2"), "seed": np.array([[3]])}])
    err = out[0][0]
    assert isinstance(err, RequestFailure) and err.internal
    assert "internal error (request id " in err and "boom" not in err and "/secret" not in err
    rid = err.split("request id ")[1].split(")")[0]
    assert len(rid) == 12 and any(rid in r.getMessage() and r.exc_info for r in caplog.records)
    assert "boom in /secret/path" in caplog.text  # the traceback is in the server log
    assert out[1][0] is None and out[1][1]["image"].shape == (1, 8, 8, 3)


def test_warm_up_decodes_once_or_raises(model, monkeypatch):
    from lisa_trt import LisaError

    assert model.warm_up() > 0
    monkeypatch.setattr(model, "_decode_group", lambda *a: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(LisaError, match="warm-up request .* failed: internal error"):
        model.warm_up()


def test_triton_repo_config_parses_and_model_runs(pipe, tmp_path, monkeypatch):
    from lisa_trt.serve.repo import MODEL_PY, config_pbtxt, warmup_bytes

    text = config_pbtxt(engine_dir="engines", backend="trt", max_batch=8, max_queue_delay_ms=5, instances=2,
                        kind="gpu", threads=3)
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except Exception:  # noqa: BLE001
        pytest.skip("tritonclient[grpc] not installed (the serve extra)")
    cfg = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert cfg.backend == "python" and cfg.max_batch_size == 8 and cfg.dynamic_batching.max_queue_delay_microseconds == 5000
    assert [i.name for i in cfg.input][:2] == ["prompt", "seed"] and not cfg.input[0].optional and cfg.input[1].optional
    assert {o.name for o in cfg.output} == {"image", "mal", "tvd", "seconds", "batch", "forwards", "error"}
    assert {o.name for o in cfg.output} == set(OUTPUTS)  # the config declares what the model answers
    types_ = {np.uint8: "TYPE_UINT8", np.float32: "TYPE_FP32", np.int32: "TYPE_INT32", np.bytes_: "TYPE_STRING"}
    for o in cfg.output:  # each output's type and per-row dims as serve/model.py OUTPUTS has them
        dt, dims = OUTPUTS[o.name]
        assert model_config_pb2.DataType.Name(o.data_type) == types_[dt] and tuple(o.dims) == dims, o.name
    neg = next(i for i in cfg.input if i.name == "negative_prompt")
    assert neg.optional and model_config_pb2.DataType.Name(neg.data_type) == "TYPE_STRING"
    assert cfg.instance_group[0].count == 2 and cfg.parameters["engine_dir"].string_value == "engines"
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert cfg.parameters["threads"].string_value == "3" and "sjd_window" not in cfg.parameters
    windowed = text_format.Parse(config_pbtxt(engine_dir="e", backend="ort", max_batch=4, max_queue_delay_ms=0,
                                              instances=1, kind="cpu", sjd_window=5), model_config_pb2.ModelConfig())
    assert windowed.parameters["sjd_window"].string_value == "5"
    (w,) = cfg.model_warmup  # one warm-up request, class 0 from warmup/prompt
    assert w.batch_size == 1 and w.inputs["prompt"].input_data_file == "prompt"
    assert warmup_bytes() == b"\x01\x00\x00\x00" + b"0"
    gpu = text_format.Parse(config_pbtxt(engine_dir="e", backend="trt", max_batch=4, max_queue_delay_ms=0,
                                         instances=1, kind="cpu", gpus=[0, 2]), model_config_pb2.ModelConfig())
    assert gpu.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert list(gpu.instance_group[0].gpus) == [0, 2] and gpu.instance_group[0].count == 1
    cpu = text_format.Parse(config_pbtxt(engine_dir="e", backend="ort", max_batch=4, max_queue_delay_ms=0,
                                         instances=3, kind="cpu", warmup=False), model_config_pb2.ModelConfig())
    assert cpu.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert cpu.instance_group[0].count == 3 and not cpu.model_warmup

    # model.py under a stand-in triton_python_backend_utils, on the in-memory pipeline
    class Tensor:
        def __init__(self, name, arr):
            self.name, self.arr = name, arr

        def as_numpy(self):
            return self.arr

    class Response:  # pb_utils.InferenceResponse: output_tensors(), has_error(), error()
        def __init__(self, output_tensors, error=None):
            self._outputs, self._error = output_tensors, error

        def output_tensors(self):
            return self._outputs

        def has_error(self):
            return self._error is not None

        def error(self):
            return self._error

    class TritonError:  # triton_python_backend_utils.TritonError(message, code)
        INVALID_ARG, INTERNAL = "INVALID_ARG", "INTERNAL"

        def __init__(self, message, code="INTERNAL"):
            self._msg, self._code = message, code

        def message(self):
            return self._msg

        def code(self):
            return self._code

    pb = types.SimpleNamespace(Tensor=Tensor, InferenceResponse=Response, TritonError=TritonError,
                               get_input_tensor_by_name=lambda req, n: req.get(n))
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    import lisa_trt.runtime.pipeline as P

    opened = []
    monkeypatch.setattr(P.Pipeline, "from_dir", classmethod(lambda cls, d, **kw: opened.append(kw) or pipe))
    (tmp_path / "model.py").write_text(MODEL_PY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    mod = importlib.import_module("model")
    m = mod.TritonPythonModel()
    cfg_json = {"max_batch_size": 8, "input": [{"name": i.name} for i in cfg.input],
                "parameters": {"engine_dir": {"string_value": "engines"}, "backend": {"string_value": "ort"},
                               "sjd_window": {"string_value": "5"}}}  # serve / triton-repo --sjd-window 5
    m.initialize({"model_config": json.dumps(cfg_json), "model_repository": str(tmp_path), "model_version": "1"})
    assert opened[-1]["sjd_window"] == 5 and opened[-1]["backend"] == "ort"
    res = m.execute([{"prompt": Tensor("prompt", _b("c2")), "seed": Tensor("seed", np.array([[4]]))},
                     {"prompt": Tensor("prompt", _b("zzz"))}])
    assert not res[0].has_error() and {t.name for t in res[0].output_tensors()} >= {"image", "mal"}
    assert "unknown class" in res[1].error().message() and res[1].error().code() == "INVALID_ARG"  # HTTP 400
    monkeypatch.setattr(m.model, "_decode_group", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    (bad,) = m.execute([{"prompt": Tensor("prompt", _b("c2"))}])
    err = bad.error()
    assert err.code() == "INTERNAL" and "request id" in err.message() and "boom" not in err.message()
    sys.modules.pop("model", None)


def test_serve_and_triton_repo_take_a_default_sjd_window(tmp_path, monkeypatch):
    """`serve --sjd-window N` / `triton-repo --sjd-window N`: the window of requests that send none
    reaches the repository's parameters (Pipeline.from_dir there); 0 is refused by click."""
    from click.testing import CliRunner

    from lisa_trt.cli import main
    from lisa_trt.serve import repo as R

    got = {}
    monkeypatch.setattr(R, "write_triton_repo", lambda *a, **kw: got.update(kw) or tmp_path)
    res = CliRunner().invoke(main, ["triton-repo", str(tmp_path), str(tmp_path / "r"), "--sjd-window", "6"])
    assert res.exit_code == 0, res.output
    assert got["sjd_window"] == 6
    res = CliRunner().invoke(main, ["serve", str(tmp_path), "--sjd-window", "0"])
    assert res.exit_code != 0 and "--sjd-window" in res.output


def test_write_triton_repo_refuses_foreign_dirs(tmp_path):
    from lisa_trt import LisaError
    from lisa_trt.serve.repo import write_triton_repo

    with pytest.raises(LisaError):
        write_triton_repo(tmp_path, tmp_path / "repo")  # not an engine directory


def test_libpython_first_on_ld_library_path():
    from lisa_trt.serve.server import fix_libpython_path, libpython_dir

    env = {"LD_LIBRARY_PATH": "/x:/y"}
    d = fix_libpython_path(env)
    if libpython_dir() is None:
        assert d is None and env["LD_LIBRARY_PATH"] == "/x:/y"
    else:
        assert env["LD_LIBRARY_PATH"].split(":") == [d, "/x", "/y"]
        fix_libpython_path(env)
        assert env["LD_LIBRARY_PATH"].split(":") == [d, "/x", "/y"]  # idempotent


def test_check_ports_refuses_taken_repeated_and_invalid_ports():
    import socket

    from lisa_trt import LisaError
    from lisa_trt.serve.process import free_ports
    from lisa_trt.serve.server import check_ports

    a, b, c = free_ports(3)
    check_ports("127.0.0.1", {"--http-port": a, "--grpc-port": b, "--metrics-port": c})
    with socket.socket() as s:
        s.bind(("127.0.0.1", c))
        s.listen()
        with pytest.raises(LisaError, match=f"port {c} \\(--metrics-port\\) on 127.0.0.1 is already in use"):
            check_ports("127.0.0.1", {"--http-port": a, "--grpc-port": b, "--metrics-port": c})
    with pytest.raises(LisaError, match="--grpc-port and --http-port are both"):
        check_ports("127.0.0.1", {"--http-port": a, "--grpc-port": a, "--metrics-port": c})
    with pytest.raises(LisaError, match="--http-port 0 is not a TCP port"):
        check_ports("127.0.0.1", {"--http-port": 0})


def test_threads_split_between_instances():
    from lisa_trt.serve.server import split_threads

    assert split_threads(8, 2) == 4 and split_threads(2, 2) == 1 and split_threads(1, 2) == 1
    assert split_threads(None, 1) >= 1


def test_drafterless_engines_serve_the_jacobi_decoders_and_refuse_tree_rules(pipe):
    """The drafter check reads the method's kind: mcsjd / gsd need no drafter, exact does."""
    from lisa_trt.runtime.pipeline import Pipeline

    e = pipe._e
    bare = Pipeline.from_models(e.target, None, None, e.vq, class_names=e.class_names, generation=e.generation)
    m = ServeModel(bare, max_batch=4)
    for verify in ("mcsjd", "gsd", "sjd"):
        out = m.infer_each([{"prompt": _b("1", "2"), "seed": np.array([[1], [2]]), "verify": _b(verify, verify)}])
        assert out[0][0] is None and out[0][1]["image"].shape == (2, 8, 8, 3), (verify, out[0][0])
    out = m.infer_each([{"prompt": _b("1"), "verify": _b("exact")}])
    assert out[0][0] is not None and "needs a drafter" in out[0][0]


def test_every_registered_method_knob_is_a_served_input(pipe, monkeypatch):
    """The knob inputs come from the method registry: GSD's and ZipAR's own settings reach the
    decode (the same tokens as Pipeline.generate with them), and a bad value is that request's error."""
    from lisa_trt.serve import model as M
    from lisa_trt.speculative.methods import cli_options

    assert {o.name for o in cli_options()} <= set(M.INPUTS)
    assert M.INPUTS["gsd_group"][1] == "int" and M.INPUTS["gsd_prob_gap"][1] == "float"
    m = ServeModel(pipe, max_batch=4)
    seen = []
    real = pipe.generate
    monkeypatch.setattr(pipe, "generate", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    out = m.infer_each([{"prompt": _b("1"), "seed": np.array([[4]]), "verify": _b("gsd"),
                         "gsd_group": np.array([[3]], np.int32)},
                        {"prompt": _b("2"), "verify": _b("zipar"), "zipar_window": np.array([[2]], np.int32)},
                        {"prompt": _b("2"), "verify": _b("gsd"), "gsd_group": np.array([[0]], np.int32)},
                        {"prompt": _b("3"), "verify": _b("mcsjd"), "sjd_window": np.array([[3]], np.int32)},
                        {"prompt": _b("3"), "verify": _b("mcsjd"), "sjd_window": np.array([[0]], np.int32)}])
    assert out[0][0] is None and out[1][0] is None and out[3][0] is None
    assert "GSD group must be >= 1" in out[2][0] and "--sjd-window" in out[4][0]
    # each group's one plan carries its knob (and the rest as the pipeline's defaults)
    plans = [kw["plan"] for kw in seen]
    assert [p.method.name for p in plans] == ["gsd", "zipar", "mcsjd"]
    default = pipe.plan("gsd").spec.flat()
    assert plans[0].spec.flat() == {**default, "gsd_group": 3}
    assert plans[1].spec.flat() == {**default, "zipar_window": 2}
    assert plans[2].spec.flat() == {**default, "sjd_window": 3}
    ref = real([Prompt(0, class_id=1, seed=4)], verify="gsd", batch=True, gsd_group=3)
    assert np.array_equal(np.asarray(ref.images[0]), out[0][1]["image"][0])


def test_a_bundle_default_top_k_above_the_vocabulary_is_served_as_the_pipeline_takes_it(pipe, monkeypatch):
    """A bundle whose recorded top-k exceeds its vocabulary (a family default on a small model) is served
    as Pipeline.generate takes it (every token kept), not refused on every request; a request's own top-k
    above the vocabulary is still the client's error."""
    import dataclasses

    model = ServeModel(pipe, max_batch=4)
    monkeypatch.setattr(model, "defaults", dataclasses.replace(model.defaults, top_k=model.vocab * 16))
    out = model.infer_each([{"prompt": _b("1"), "seed": np.array([[5]])},
                            {"prompt": _b("1"), "seed": np.array([[5]]), "top_k": np.array([[0]], np.int32)},
                            {"prompt": _b("1"), "top_k": np.array([[model.vocab + 1]], np.int32)}])
    assert out[0][0] is None and out[1][0] is None
    assert np.array_equal(out[0][1]["image"], out[1][1]["image"])  # top-k >= V keeps every token, as 0 does
    assert out[2][0] is not None and "top_k" in out[2][0] and not out[2][0].internal
