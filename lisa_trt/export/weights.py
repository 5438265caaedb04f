"""One copy of every weight per engine directory: the graphs' shared external-data file.

Every exported graph of a bundle (target prefill + verify, drafter project / step / commit, GASV,
VQ decoder) keeps its weights in ONE external-data file, `weights.onnx.data`, where each distinct
tensor (same ONNX data type, same bytes) is stored once: the prefill and verify graphs point at
the same offsets for the target's layers, the drafter's embedding table points at the target's
(EAGLE-3 shares it), the drafter_fused graph (and an older bundle's drafter_commit) at drafter_step's weights. ONNX external data
allows that (several initializers and graphs may name the same location / offset / length), and
ONNX Runtime, Polygraphy and TensorRT's parser read each graph's tensors by offset. Large tensors
start on 4 KiB boundaries (page aligned, so ONNX Runtime may map them instead of reading them).

The torch backend reads the same file: the manifest's `weights.tensors` maps every state-dict
entry of the exported target / drafter / VQ to the offset of its bytes (or of its transpose: the
exporter folds Linear weights into W^T initializers); the few tensors no graph holds (a VQ's
encoder, unused buffers) go to `weights/rest.safetensors`. So a bundle holds no second fp32 copy
of the models (`lisa-trt export --torch-weights` still writes one, `weights/*.safetensors`).

Bundles exported before this layout (one `<graph>.onnx.data` per graph, `weights/*.safetensors`)
load unchanged; re-export them with `lisa-trt export` to get the smaller layout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Optional

SHARED_DATA = "weights.onnx.data"
REST_FILE = "weights/rest.safetensors"
MIN_EXTERNAL_BYTES = 1024  # smaller tensors stay inside the graph proto (as onnx.save's size_threshold)
_PAGE = 4096
_BIG = 1 << 16  # tensors of at least this many bytes start on a page boundary

_NP_OF_ONNX = {1: "float32", 10: "float16", 16: "bfloat16", 7: "int64", 6: "int32", 3: "int8", 2: "uint8",
               9: "bool", 11: "float64"}


def _tensor_bytes(t, base: Path) -> Optional[bytes]:
    """The raw little-endian bytes of an initializer (external, raw_data or typed fields)."""
    from onnx import TensorProto, numpy_helper

    if t.data_type == TensorProto.STRING:
        return None
    if t.data_location == TensorProto.EXTERNAL:
        info = {e.key: e.value for e in t.external_data}
        with open(base / info["location"], "rb") as f:
            f.seek(int(info.get("offset", 0)))
            return f.read(int(info["length"])) if "length" in info else f.read()
    if t.HasField("raw_data"):
        return t.raw_data
    return numpy_helper.to_array(t).tobytes()


def _point_at(t, location: str, offset: int, length: int) -> None:
    from onnx import TensorProto

    for fld in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        t.ClearField(fld)
    del t.external_data[:]
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v


def _inline(t, data: bytes) -> None:
    from onnx import TensorProto

    del t.external_data[:]
    t.data_location = TensorProto.DEFAULT
    for fld in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        t.ClearField(fld)
    t.raw_data = data


def _key(data_type: int, data: bytes) -> bytes:
    return hashlib.sha256(data_type.to_bytes(4, "little") + data).digest()


class _Writer:
    """Appends distinct tensors to the shared file; remembers where each (type, bytes) went."""

    def __init__(self, path: Path):
        self.path, self.f, self.pos, self.table, self.referenced = path, open(path, "wb"), 0, {}, 0

    def put(self, data_type: int, data: bytes) -> tuple:
        self.referenced += len(data)
        key = _key(data_type, data)
        hit = self.table.get(key)
        if hit is None:
            pad = -self.pos % (_PAGE if len(data) >= _BIG else 64)
            self.f.write(b"\0" * pad)
            self.pos += pad
            self.f.write(data)
            hit = self.table[key] = (self.pos, len(data))
            self.pos += len(data)
        return hit

    def lookup(self, data_type: int, data: bytes) -> Optional[tuple]:
        return self.table.get(_key(data_type, data))

    def close(self) -> None:
        self.f.close()


def share_weights(engine_dir, graphs: dict, *, models: Optional[dict] = None, name: str = SHARED_DATA,
                  min_bytes: int = MIN_EXTERNAL_BYTES):
    """Move every graph's weights into one deduplicated external-data file (in place).

    Args:
        engine_dir: a (staging) engine directory holding the graphs.
        graphs: {graph name: manifest GraphEntry} of the graphs to rewrite.
        models: {"target" | "drafter" | "vq": the torch module the graphs were traced from}: their
            state-dict entries are indexed into the shared file for the torch backend (what no
            graph holds goes to REST_FILE). None: no index.
    Returns:
        (updated {name: GraphEntry}, the manifest's `weights` record).
    """
    import onnx

    from .manifest import file_sha256

    d = Path(engine_dir)
    out = d / name
    w = _Writer(out.with_name(out.name + ".partial"))
    old, new = set(), {}
    per_graph = {}
    try:
        for gname, entry in graphs.items():
            path = d / entry.file
            model = onnx.load(str(path), load_external_data=False)
            before = w.referenced
            for t in model.graph.initializer:
                data = _tensor_bytes(t, path.parent)
                if data is None:
                    continue
                if len(data) < min_bytes:
                    _inline(t, data)
                    continue
                _point_at(t, name, *w.put(t.data_type, data))
            per_graph[gname] = w.referenced - before
            if entry.external_data:
                old.add(entry.external_data)
            onnx.save_model(model, str(path))  # the proto only: its tensors now point at `name`
            q = dict(entry.quantization) if entry.quantization else None
            if q is not None:
                q.pop("data_sha256", None)  # the shared file's sha256 is in the weights record
                q["external_data"] = name
            new[gname] = dataclasses.replace(entry, sha256=file_sha256(path), external_data=name, quantization=q)
        index = _index_models(w, models or {}, d) if models else None
    finally:
        w.close()
    os.replace(w.path, out)
    for f in old - {name}:
        (d / f).unlink(missing_ok=True)
    rec = {"file": name, "bytes": out.stat().st_size, "sha256": file_sha256(out), "distinct_tensors": len(w.table),
           "graph_bytes": per_graph, "referenced_bytes": w.referenced}
    if index is not None:
        rec["tensors"], rest = index
        if rest:
            rec["rest"] = REST_FILE
    return new, rec


def _index_models(w: _Writer, models: dict, d: Path):
    """{model: {state-dict name: [offset, length, dtype, shape, transposed]}}, and the rest file."""

    from ..io import save_safetensors

    index, rest = {}, {}
    for what, module in models.items():
        if module is None:
            continue
        entries = {}
        # a PrecisionCopy (export/memory.py) converts one tensor at a time: no whole copy for the index
        items = module.state_items() if hasattr(module, "state_items") else module.state_dict().items()
        for name, t in items:
            t = t.detach().cpu().contiguous()
            code = _onnx_type(t.dtype)
            hit, transposed = None, False
            if code is not None and t.numel() * t.element_size() >= MIN_EXTERNAL_BYTES:
                hit = w.lookup(code, _raw(t))
                if hit is None and t.dim() == 2:
                    tt = t.t().contiguous()
                    hit, transposed = w.lookup(code, _raw(tt)), True
                    t = tt if hit is not None else t
            if hit is None:
                rest[f"{what}/{name}"] = t.clone()
                continue
            entries[name] = [hit[0], hit[1], str(t.dtype).replace("torch.", ""), list(t.shape), transposed]
        index[what] = entries
    if rest:
        (d / REST_FILE).parent.mkdir(parents=True, exist_ok=True)
        save_safetensors(rest, d / REST_FILE, metadata={"kind": "lisa-trt/bundle-rest-weights"})
    return index, rest


def _onnx_type(dtype) -> Optional[int]:
    import torch

    return {torch.float32: 1, torch.float16: 10, torch.bfloat16: 16, torch.int64: 7, torch.int32: 6,
            torch.int8: 3, torch.uint8: 2, torch.bool: 9, torch.float64: 11}.get(dtype)


def _raw(t) -> bytes:
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


# ----------------------------------------------------------------------------- reading

def no_torch_weights(man, what: str = "target") -> str:
    """Why the torch backend cannot rebuild `what` from the engine directory of `man`, and the fix.

    Quantized bundles carry the fp32 PyTorch weights only when exported with `--torch-weights`
    (their graphs hold int8 / int4 weights, which no PyTorch model reads), which only families
    whose loaders read those copies write (ExportFamily.torch_weights_copy)."""
    q = getattr(man, "quantization", "none") or "none"
    if q != "none":
        copies = man.export_family.torch_weights_copy
        how = " exported without `--torch-weights`" if copies else ""
        fix = (f"re-export it with `lisa-trt export ... --quantize {q} --torch-weights`" if copies
               else "export it without --quantize for the torch backend")
        return (f"{man.dir} is an {q} bundle{how}: its graphs hold {q} weights and it carries no fp32 PyTorch "
                f"weights for its {what}, so the torch backend cannot run it; use `--backend ort` (or trt), or {fix}")
    return (f"{man.dir} carries no PyTorch weights for its {what} (neither weights/ nor an index of its shared "
            "weights file); use another backend, or re-export it with `lisa-trt export`")


def has_index(man, what: str) -> bool:
    """True when the bundle's shared weights file carries `what`'s state dict (torch backend)."""
    return what in ((man.weights or {}).get("tensors") or {})


def state_dict_from_bundle(man, what: str) -> dict:
    """`what`'s state dict ("target" | "drafter" | "vq") read from the bundle's shared weights file
    (tensors own their memory: the file is not kept open)."""
    import numpy as np
    import torch

    rec = man.weights
    d = Path(man.dir)
    mm = np.memmap(d / rec["file"], dtype=np.uint8, mode="r")
    sd = {}
    for name, (off, n, dtype, shape, transposed) in rec["tensors"][what].items():
        tdt = getattr(torch, dtype)
        raw = torch.from_numpy(np.array(mm[off:off + n]))  # one copy out of the mapping
        t = raw.view(tdt).reshape(shape)
        sd[name] = t.t().contiguous() if transposed else t
    del mm
    if rec.get("rest"):
        from ..io import load_safetensors

        tensors, _ = load_safetensors(d / rec["rest"])
        pre = f"{what}/"
        sd.update({k[len(pre):]: v for k, v in tensors.items() if k.startswith(pre)})
    return sd


from .manifest import check_shared, verify_shared  # noqa: E402 (re-exported: the checks live with the manifest)

__all__ = ["REST_FILE", "SHARED_DATA", "check_shared", "has_index", "no_torch_weights", "share_weights",
           "state_dict_from_bundle", "verify_shared"]


def model_from_bundle(man, what: str, target=None):
    """The fp32 eval torch model `what` ("target" | "drafter" | "vq") of an engine directory:
    from its `weights/*.safetensors` when it has them (older bundles, `--torch-weights`), else from
    the shared weights file (fp16 bundles give the fp16 values).

    Raises:
        InputError: the bundle holds neither (the message says how to re-export).
        ArtifactMismatchError: the weights are not the manifest's target's.
    """
    from ..errors import ArtifactMismatchError, InputError
    from ..models.checkpoints import target_hash

    files = man.files or {}
    key = {"target": "target_weights", "drafter": "drafter_weights", "vq": "vq_weights"}[what]
    d = Path(man.dir)
    fam = man.model_family  # looked up once per Manifest
    if key in files:
        if what == "target":
            m = fam.load_target(d / files[key])
        elif what == "drafter":
            from ..models.drafter import load_drafter

            return load_drafter(d / files[key], target)
        else:
            return fam.load_decoder(d / files[key]).eval()
    elif has_index(man, what):
        sd = state_dict_from_bundle(man, what)
        if what == "drafter":
            from ..models.drafter import Drafter

            drafter = Drafter(man.drafter_config, target.token_embedding_table(), d2t=sd.get("d2t"))
            drafter.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in sd.items()},
                                    strict=True)
            return drafter.to(target.output.weight.device).eval()
        m = fam.target_from_state(man.target_config, sd) if what == "target" else \
            fam.decoder_from_state(man.vq_config, sd)
        if m is None:
            raise InputError(f"{man.dir}: the torch backend cannot rebuild this {fam.name} {what} from the bundle's "
                             "shared weights; re-export with `lisa-trt export --torch-weights`")
        if what == "vq":
            return m
    else:
        raise InputError(no_torch_weights(man, what))
    if (key in files or man.precision == "fp32") and target_hash(m) != man.target_hash:
        raise ArtifactMismatchError(f"the target weights of {man.dir} do not match the manifest's target "
                                    f"({target_hash(m)} vs {man.target_hash}); re-export the bundle")
    return m


__all__ += ["model_from_bundle"]


def share_bundle(engine_dir, models: Optional[dict] = None):
    """`share_weights` over every graph of a written engine directory (e.g. after quantization);
    the manifest gains the `weights` record. Returns the new Manifest."""
    from . import manifest as M

    from .memory import peak_rss_bytes

    man = M.read_manifest(engine_dir, check_files=False)
    graphs, rec = share_weights(engine_dir, dict(man.graphs), models=models)
    export = dict(man.export or {})
    if export:  # the export continued in this process (quantization): its peak so far
        export["peak_rss_bytes"] = max(int(export.get("peak_rss_bytes") or 0), peak_rss_bytes())
        if export.get("fp32_parameter_bytes"):
            export["peak_rss_over_fp32_parameters"] = round(export["peak_rss_bytes"] / export["fp32_parameter_bytes"], 3)
    M.write_manifest(dataclasses.replace(man, graphs=graphs, weights=rec, export=export), engine_dir)
    return M.read_manifest(engine_dir)


__all__ += ["share_bundle"]
