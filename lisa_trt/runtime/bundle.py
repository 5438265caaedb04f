"""Engine directories (written by export/bundle.py): open one for a backend, with every artifact checked.

Layout: the ONNX graphs and manifest.json, their one shared weights file
`weights.onnx.data` (export/weights.py; the torch backend rebuilds the models from it), and
`tables.safetensors` (LANTERN neighbours and the GASV constants); `weights/` holds what no graph
carries (`rest.safetensors`) and, only with `--torch-weights`, the fp32 PyTorch weights (a
quantized bundle's graphs hold no fp32 weights, so the torch backend runs one only when it was
exported with `--torch-weights`). The manifest records each artifact's hash; anything made for another
target is refused (ArtifactMismatchError) before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import ArtifactMismatchError, InputError

@dataclass
class Bundle:
    """Everything a Pipeline runs on: engines of one backend plus the bundle's tables and defaults."""

    target: object
    drafter: object = None
    gasv: object = None  # GASV engine (ORT/TRT graph) or None for the torch reference
    tables: object = None  # GASVTables (torch GASV and LANTERN neighbours)
    vq: object = None  # has decode_code(indices, shape)
    class_names: Optional[list] = None
    generation: dict = field(default_factory=dict)
    backend: str = "torch"
    manifest: object = None
    family: object = None  # the model family (models/family.py), resolved once per open; None: the Pipeline's


def resolve_backend(engine_dir: Path, backend: str, manifest=None) -> str:
    """auto -> trt when engines are built and TensorRT + a GPU are usable, else ort (`manifest`: the
    directory's, when the caller has read it)."""
    if backend != "auto":
        return backend
    try:
        from ..engines.trt_plans import engines_built
        from ..engines.plugins.trt_plugin import tensorrt_available

        if engines_built(engine_dir, manifest) and tensorrt_available():
            import torch

            if torch.cuda.is_available():
                return "trt"
    except Exception:  # noqa: BLE001 - any TensorRT probing problem means: not usable here
        pass
    return "ort"


def _tables(man, engine_dir: Path):
    if "tables" not in man.files:
        return None
    from ..calibration.tables import load_tables

    tables = load_tables(engine_dir / man.files["tables"])
    if tables.target_hash != man.target_hash:
        raise ArtifactMismatchError(f"{engine_dir}/tables.safetensors was calibrated for target {tables.target_hash}, "
                                    f"the engines are for {man.target_hash}; re-export the bundle")
    return tables


def open_bundle(engine_dir: Path, backend: str = "auto", *, threads: Optional[int] = None, compile=None,
                device: Optional[str] = None, manifest=None, family=None):
    """-> Bundle for `backend` (auto | torch | any engines.base.backend_names()).

    "torch" is the eager PyTorch models of the bundle's weights/ (with the torch GASV reference);
    every other name opens the exported graphs through `engines.graph.load_engines`. With
    `compile` (torch only: "default" Inductor, "cuda-graphs", True = auto) the torch backend runs
    the graph wrappers with the per-step graphs torch.compile'd (engines/torch_runner.py);
    `device` (torch only, e.g. "cuda") also selects the graph wrappers, on that device.
    `manifest`: the directory's Manifest when the caller has parsed it (runtime/context.resolve):
    not parsed again, its graph files checked here (export/manifest.check_graph_files); `family`:
    the model family when the caller has resolved it. Both are handed down, never looked up again.
    """
    man = _manifest(engine_dir, manifest)
    backend = resolve_backend(engine_dir, backend, man)
    from .autotune import with_measured

    gen = with_measured(dict(man.generation or {}), engine_dir)  # `bench ENGINE_DIR`'s choices over the export's
    names = gen.get("class_names")
    tables = _tables(man, engine_dir)
    graph_torch = compile not in (None, False, "off", "none") or device is not None
    if graph_torch and backend != "torch":
        raise InputError(f"compile / device are options of the torch backend; got backend {backend!r}")
    if backend != "torch" or graph_torch:
        from ..engines.graph import load_engines

        opts = dict(threads=threads) if backend == "ort" and threads else {}
        if backend == "torch":
            opts = dict(compile=compile, device=device or "cpu")
        e = load_engines(engine_dir, backend, manifest=man, **opts)
        return Bundle(target=e.target, drafter=e.drafter, gasv=e.gasv, tables=tables, vq=e.vq,
                      class_names=names, generation=gen, backend=backend, manifest=man,
                      family=family if family is not None else _engines_family(e.target))
    b = _torch_engines(man, engine_dir, tables, names, gen)
    b.family = family
    return b


def _engines_family(target):
    """The ModelFamily the engines' target resolved (engines/graph.GraphTarget.family), else None."""
    from ..models.family import ModelFamily

    fam = getattr(target, "family", None)
    return fam if isinstance(fam, ModelFamily) else None


def _manifest(engine_dir: Path, manifest):
    """The checked Manifest of `engine_dir`: parsed here, or the caller's (its files checked)."""
    from ..export.manifest import check_graph_files, read_manifest

    if manifest is None:
        return read_manifest(engine_dir)
    if manifest.dir is None or Path(manifest.dir).resolve() != Path(engine_dir).resolve():
        raise InputError(f"the manifest passed to open_bundle is {manifest.dir}'s, not {engine_dir}'s; pass the "
                         "directory's own manifest (export.manifest.read_manifest) or none")
    check_graph_files(manifest)
    return manifest


def _torch_engines(man, engine_dir: Path, tables, names, gen):
    from ..export.weights import has_index, model_from_bundle

    files = man.files or {}
    target = model_from_bundle(man, "target")  # weights/ when the bundle has them, else its shared weights file
    drafter = None
    if "drafter_weights" in files:
        drafter = _load_drafter(man, engine_dir, target)
    elif man.drafter_arch == "eagle3" and has_index(man, "drafter"):
        drafter = model_from_bundle(man, "drafter", target)
    vq = model_from_bundle(man, "vq") if "vq_weights" in files or has_index(man, "vq") else None
    if tables is not None:  # bound to the head rows they cover (a family's sub-vocabulary, or the whole head)
        tables = man.export_family.bind_tables(tables, target)
    return Bundle(target=target, drafter=drafter, gasv=None, tables=tables, vq=vq, class_names=names,
                    generation=gen, backend="torch", manifest=man)


def _load_drafter(man, engine_dir: Path, target):
    """The bundle's PyTorch drafter: a Drafter, or MedusaHeads for a Medusa bundle (manifest arch)."""
    path = engine_dir / man.files["drafter_weights"]
    if man.drafter_arch == "medusa":
        from ..export.manifest import drafter_hash
        from ..models.medusa import load_medusa

        heads = load_medusa(path, target, check_target=False)  # an fp16 bundle's target: its rounded weights
        if drafter_hash(heads) != man.drafter["hash"]:  # the heads exported for the manifest's target
            raise ArtifactMismatchError(f"{path} are not the Medusa heads the bundle was exported with (hash "
                                        f"{drafter_hash(heads)} vs {man.drafter['hash']}); re-export the bundle")
        return heads
    from ..models.drafter import load_drafter

    return load_drafter(path, target)
