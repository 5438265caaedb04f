"""`lisa-trt triton-repo ENGINE_DIR REPO_DIR`: a Triton model repository for GPU servers.

Layout (model 'lisa', Python backend):

    REPO_DIR/lisa/config.pbtxt     inputs/outputs of serve/model.py, dynamic batcher, instances
    REPO_DIR/lisa/1/model.py       TritonPythonModel: Pipeline.from_dir(engine_dir) + ServeModel
    REPO_DIR/lisa/1/engines/       (with --copy-engines) a copy of ENGINE_DIR

Run it in the Triton container (with TensorRT and lisa-trt installed):
`tritonserver --model-repository REPO_DIR`. The repository is written atomically (staged next
to REPO_DIR, then renamed); an existing REPO_DIR that is not a lisa-trt repository is refused.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from ..errors import InputError
from .model import INPUTS, REQUIRED
from .server import MODEL_NAME

_TRITON_TYPES = {"str": "TYPE_STRING", "int64": "TYPE_INT64", "int32": "TYPE_INT32", "float32": "TYPE_FP32",
                 "uint8": "TYPE_UINT8"}
_OUTPUTS = (("image", "TYPE_UINT8", "-1, -1, 3"), ("mal", "TYPE_FP32", "1"), ("tvd", "TYPE_FP32", "1"),
            ("seconds", "TYPE_FP32", "1"), ("batch", "TYPE_INT32", "1"), ("error", "TYPE_STRING", "1"))

MODEL_PY = '''"""Triton Python-backend model written by `lisa-trt triton-repo`: lisa-trt Pipeline + ServeModel."""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        from lisa_trt.runtime.pipeline import Pipeline
        from lisa_trt.serve.model import ServeModel

        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        engine_dir = params["engine_dir"]
        if not os.path.isabs(engine_dir):
            engine_dir = os.path.join(args["model_repository"], args["model_version"], engine_dir)
        self.names = [i["name"] for i in cfg["input"]]
        pipe = Pipeline.from_dir(engine_dir, backend=params.get("backend", "auto"))
        self.model = ServeModel(pipe, max_batch=int(cfg.get("max_batch_size", 16)) or 1)

    def execute(self, requests):
        batch = []
        for req in requests:
            data = {}
            for name in self.names:
                t = pb_utils.get_input_tensor_by_name(req, name)
                if t is not None:
                    data[name] = t.as_numpy()
            batch.append(data)
        responses = []
        for err, out in self.model.infer_each(batch):
            if err is not None:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(err)))
            else:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(k, v) for k, v in out.items()]))
        return responses

    def finalize(self):
        self.model = None
'''


def config_pbtxt(*, engine_dir: str, backend: str, max_batch: int, max_queue_delay_ms: float, instances: int,
                 kind: str) -> str:
    """The model's config.pbtxt (protobuf text format of Triton's ModelConfig)."""
    def typ(dt, k):
        import numpy as np

        return _TRITON_TYPES["str" if k == "str" else np.dtype(dt).name]

    ins = ",\n".join(
        f'  {{ name: "{n}" data_type: {typ(dt, k)} dims: [ 1 ]{"" if n in REQUIRED else " optional: true"} }}'
        for n, (dt, k) in INPUTS.items())
    outs = ",\n".join(f'  {{ name: "{n}" data_type: {t} dims: [ {d} ] }}' for n, t, d in _OUTPUTS)
    return (f'name: "{MODEL_NAME}"\nbackend: "python"\nmax_batch_size: {max_batch}\n'
            f"input [\n{ins}\n]\noutput [\n{outs}\n]\n"
            f"dynamic_batching {{ max_queue_delay_microseconds: {int(round(max_queue_delay_ms * 1000))} }}\n"
            f"instance_group [ {{ count: {instances} kind: KIND_{kind.upper()} }} ]\n"
            f'parameters {{ key: "engine_dir" value: {{ string_value: "{engine_dir}" }} }}\n'
            f'parameters {{ key: "backend" value: {{ string_value: "{backend}" }} }}\n')


def write_triton_repo(engine_dir, repo_dir, *, backend: str = "trt", max_batch: int = 16,
                      max_queue_delay_ms: float = 5.0, instances: int = 1, kind: str = "gpu",
                      copy_engines: bool = False) -> Path:
    """Write the repository (see module docstring); returns REPO_DIR."""
    from ..export.manifest import read_manifest

    engine_dir, repo_dir = Path(engine_dir).resolve(), Path(repo_dir)
    read_manifest(engine_dir)  # refuse anything that is not an engine directory
    if max_batch < 1 or instances < 1 or max_queue_delay_ms < 0:
        raise InputError(f"need --max-batch >= 1, --instances >= 1, --max-queue-delay-ms >= 0 "
                         f"(got {max_batch}, {instances}, {max_queue_delay_ms})")
    if repo_dir.exists() and any(repo_dir.iterdir()) and not (repo_dir / MODEL_NAME / "config.pbtxt").is_file():
        raise InputError(f"{repo_dir} exists and is not a lisa-trt Triton repository; choose another directory")
    stage = repo_dir.parent / f".{repo_dir.name}.staging-{uuid.uuid4().hex[:8]}"
    try:
        ver = stage / MODEL_NAME / "1"
        ver.mkdir(parents=True)
        where = str(engine_dir)
        if copy_engines:
            shutil.copytree(engine_dir, ver / "engines")
            where = "engines"
        (ver / "model.py").write_text(MODEL_PY)
        (stage / MODEL_NAME / "config.pbtxt").write_text(config_pbtxt(
            engine_dir=where, backend=backend, max_batch=max_batch, max_queue_delay_ms=max_queue_delay_ms,
            instances=instances, kind=kind))
        old = None
        if repo_dir.exists():
            old = repo_dir.parent / f".{repo_dir.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(repo_dir, old)
        os.replace(stage, repo_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
    return repo_dir
