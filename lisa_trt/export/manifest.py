"""manifest.json of an engine directory: what was exported, for which artifacts, and how.

The manifest is the last file written into an engine directory (under a temporary name, then the
whole directory is renamed), so a directory with a readable manifest is complete. Loaders refuse
a directory made for another target / drafter / tables with ArtifactMismatchError naming both
hashes, an unknown schema or io-spec version, and graph files that are missing or changed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import ArtifactMismatchError, CheckpointError
from ..models.io_spec import IO_SPEC_VERSION, Graph

FORMAT = "lisa-trt/engine-bundle"
SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"


# ----------------------------------------------------------------------------- hashes

def state_hash(tensors: dict) -> str:
    """sha256 over sorted (name, fp32 bytes) of a tensor dict, first 16 hex digits."""
    from ..io import tensor_hash

    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(f"{name}:{tensor_hash(tensors[name])};".encode())
    return h.hexdigest()[:16]


def drafter_hash(drafter) -> str:
    """Identity of a drafter: hash of its own weights (the shared target embedding excluded)."""
    return state_hash(dict(drafter.state_dict()))


def drafter_arch(drafter) -> str:
    """"medusa" for MedusaHeads, "eagle3" for every other drafter (recorded in the manifest)."""
    from ..models.medusa import MedusaHeads

    return "medusa" if isinstance(drafter, MedusaHeads) else "eagle3"


def tables_hash(tables) -> str:
    """Identity of GASV tables: hash of the calibrated tensors and the target hash.

    The GASV constants (kappa, lambda ...) are not part of it: they are a run-time input of the
    GASV graph and may be overridden without re-exporting.
    """
    t = {n: getattr(tables, n) for n in ("invstd", "w_tilde_norm2", "cluster", "centroids", "beta")}
    return hashlib.sha256(f"{state_hash(t)}:{tables.target_hash}".encode()).hexdigest()[:16]


def vq_hash(vq) -> str:
    return state_hash({k: v for k, v in vq.state_dict().items() if not k.endswith("codebook_used")})


# ----------------------------------------------------------------------------- records

@dataclass(frozen=True)
class GraphEntry:
    """One exported graph: file, precision, hash, and its validation / lint results."""

    name: str
    kind: str
    file: str
    precision: str
    sha256: str
    external_data: Optional[str] = None
    export_seconds: float = 0.0
    peak_rss_bytes: Optional[int] = None  # the exporting process's high-water mark when this graph was done
    validation: Optional[dict] = None
    lint: Optional[dict] = None
    quantization: Optional[dict] = None  # export/quantize.py: mode, ops, data_sha256, ...

    def with_validation(self, report: dict) -> "GraphEntry":
        return dataclasses.replace(self, validation=report)

    def with_lint(self, report: dict) -> "GraphEntry":
        return dataclasses.replace(self, lint=report)


@dataclass(frozen=True)
class Manifest:
    """An engine directory's manifest (read with `read_manifest`)."""

    precision: str
    opset: int
    max_tree: int
    max_cache_len: int
    target: dict  # {"hash", "config", "prefill_ids" (ExportFamily.prefill_ids; absent before it)}
    graphs: dict  # name -> GraphEntry
    drafter: Optional[dict] = None  # {"hash", "config", "arch": "eagle3" | "medusa"} (no arch: eagle3)
    tables: Optional[dict] = None  # {"hash", "target_hash", "vocab_size", "n_clusters", "gasv"}
    vq: Optional[dict] = None  # {"hash", "config"}
    generation: dict = field(default_factory=dict)
    quantization: str = "none"  # none | int8 | int4 (weights of target + drafter; export/quantize.py)
    files: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    created: str = ""
    schema_version: int = SCHEMA_VERSION
    io_spec_version: int = IO_SPEC_VERSION
    format: str = FORMAT
    family: str = ""  # the model family the graphs are of (bundle_family; "": a manifest older than the field)
    layout: dict = field(default_factory=dict)  # the family's static sequence layout (e.g. image size, prompt)
    weights: dict = field(default_factory=dict)  # the graphs' shared weights file (export/weights.py); {} before it
    export: dict = field(default_factory=dict)  # how the export went: peak_rss_bytes, ... (export/memory.py); {} before it
    engines: dict = field(default_factory=dict)  # `lisa-trt build`'s TensorRT record (engines/trt_plans.py); {} before
    dir: Optional[Path] = None  # where it was read from (not serialised)

    def __post_init__(self):
        if not self.family:  # written before the field: the family whose unnamed manifests these are
            from .legacy import unnamed_manifest_family

            object.__setattr__(self, "family", unnamed_manifest_family(MANIFEST_NAME))  # frozen dataclass

    # -- access --------------------------------------------------------------------------

    def has(self, graph: Graph) -> bool:
        return graph.value in self.graphs

    def graph_path(self, graph: Graph) -> Path:
        if not self.has(graph):
            raise CheckpointError(f"the engine directory {self.dir} has no {graph.value} graph "
                                  f"(it has {sorted(self.graphs)}); re-export with the missing artifact")
        return Path(self.dir) / self.graphs[graph.value].file

    @property
    def target_hash(self) -> str:
        return self.target["hash"]

    @functools.cached_property
    def export_family(self):
        """The family's graph hooks (export/families.py): specs, dims, inputs, references; looked up
        once per Manifest (a cached property: the manifest is immutable)."""
        from .families import export_family_named

        return export_family_named(self.family)

    @functools.cached_property
    def model_family(self):
        """The target's ModelFamily (models/family.py), looked up once per Manifest: every reader of
        an opened directory (the run's context, the engines, the Pipeline) takes this one."""
        from ..models.family import family_of

        return family_of(self.target_config)

    @functools.cached_property
    def target_config(self):
        """The target's configuration (the family reads it: from the manifest's record, or from the
        checkpoint's config.json the bundle carries); made once per Manifest."""
        return self.export_family.target_config(self)

    def spec(self, graph: Graph):
        """The io spec of one of the bundle's graphs (its family's)."""
        return self.export_family.graph_spec(graph, self.target_config)

    @property
    def dims(self) -> dict:
        """Static axis sizes of the bundle's graphs (the family's export_dims for this export)."""
        return self.export_family.export_dims(self.target_config, max_cache_len=self.max_cache_len,
                                              drafter_cfg=self.drafter_config, vq_cfg=self.vq_config,
                                              codes=(self.tables or {}).get("vocab_size"), layout=self.layout)

    @property
    def drafter_arch(self) -> Optional[str]:
        """"eagle3" (drafter_project + drafter_step graphs), "medusa" (medusa_heads), None."""
        return (self.drafter.get("arch") or "eagle3") if self.drafter else None

    @property
    def drafter_config(self):
        """The EAGLE-3 DrafterConfig (None without a drafter or for Medusa heads: medusa_config)."""
        from ..models.drafter import DrafterConfig

        return DrafterConfig.from_dict(self.drafter["config"]) if self.drafter_arch == "eagle3" else None

    @property
    def medusa_config(self):
        """The MedusaConfig of a Medusa bundle's heads, else None."""
        from ..models.medusa import MedusaConfig

        return MedusaConfig.from_dict(self.drafter["config"]) if self.drafter_arch == "medusa" else None

    @property
    def vq_config(self):
        return self.export_family.vq_config(self) if self.vq else None

    @property
    def gasv_config(self):
        from ..speculative.gasv import GASVConfig

        return GASVConfig.from_dict(self.tables["gasv"]) if self.tables else None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("dir")
        d["graphs"] = {k: dataclasses.asdict(v) for k, v in self.graphs.items()}
        if not d["engines"]:
            d.pop("engines")  # written by `lisa-trt build` only
        return d

    @classmethod
    def from_dict(cls, d: dict, dir=None) -> "Manifest":
        d = dict(d)
        known = {f.name for f in dataclasses.fields(cls)} - {"dir"}
        d = {k: v for k, v in d.items() if k in known}
        gknown = {f.name for f in dataclasses.fields(GraphEntry)}
        d["graphs"] = {k: GraphEntry(**{a: b for a, b in v.items() if a in gknown}) for k, v in d.get("graphs", {}).items()}
        return cls(**d, dir=Path(dir) if dir is not None else None)


def build_manifest(*, target, drafter, tables, vq, graphs: dict, precision: str, opset: int, max_tree: int,
                   max_cache_len: int, generation: Optional[dict] = None, files: Optional[dict] = None,
                   layout: Optional[dict] = None, weights: Optional[dict] = None,
                   started: Optional[float] = None) -> Manifest:
    """The manifest of a fresh export (hashes computed from the artifacts themselves; the target's
    family says how its configurations are recorded, export/families.py)."""
    import onnx
    import torch

    from .._version import __version__
    from ..models.checkpoints import target_hash
    from .families import export_family
    from .memory import export_record

    fam = export_family(target)

    versions = {"lisa_trt": __version__, "torch": torch.__version__, "onnx": onnx.__version__,
                "python": platform.python_version()}
    try:
        import onnxruntime

        versions["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    dr = None
    if drafter is not None:  # (a 1-D RoPE drafter's max_positions is in its config)
        dr = {"hash": drafter_hash(drafter), "config": drafter.config.to_dict(), "arch": drafter_arch(drafter)}
    return Manifest(
        precision=precision, opset=opset, max_tree=max_tree, max_cache_len=max_cache_len,
        target={"hash": target_hash(target), "config": fam.config_record(target.config),
                **({"prefill_ids": fam.prefill_ids(target.config)} if fam.prefill_ids(target.config) else {})},
        drafter=dr,
        tables=None if tables is None else {
            "hash": tables_hash(tables), "target_hash": tables.target_hash, "vocab_size": tables.vocab_size,
            "n_clusters": tables.n_clusters, "gasv": tables.config.to_dict()},
        vq=None if vq is None else {"hash": vq_hash(vq), "config": fam.config_record(vq.config)},
        graphs=dict(graphs), generation=dict(generation or fam.default_generation()),
        files=dict(files or {}), versions=versions, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        family=fam.name, layout=dict(layout or {}), weights=dict(weights or {}),
        export=export_record(dict(target=target, drafter=drafter, vq=vq), started))


def write_manifest(manifest: Manifest, engine_dir) -> Path:
    """Write manifest.json atomically into `engine_dir`."""
    from ..io import write_json

    path = Path(engine_dir) / MANIFEST_NAME
    write_json(path, manifest.to_dict())
    return path


def manifest_path(engine_dir) -> Optional[Path]:
    """The manifest file of an engine directory: manifest.json, else a manifest a family wrote
    before it (export/legacy.legacy_manifest_path); None when it holds none."""
    d = Path(engine_dir)
    if (d / MANIFEST_NAME).is_file():
        return d / MANIFEST_NAME
    if not d.is_dir():
        return None
    from .legacy import legacy_manifest_path

    return legacy_manifest_path(d)


def raw_manifest(engine_dir) -> dict:
    """The manifest of an engine directory as a plain dict (no file or hash checks).

    Raises:
        InputError: the directory holds no manifest (says what an engine directory holds and how
            to make one), or it is not readable JSON.
    """
    from ..errors import InputError

    path = manifest_path(engine_dir)
    if path is None:
        raise InputError(f"{engine_dir} is not an engine directory: one holds the exported ONNX graphs and their "
                         f"manifest ({MANIFEST_NAME}). Make one with `lisa-trt export --model NAME_OR_CHECKPOINT "
                         "--out DIR` (a text-prompt model directory: `--model CHECKPOINT_DIR --image-size N`)")
    try:
        rec = json.loads(path.read_text())
    except ValueError as e:
        raise InputError(f"{path} is not valid JSON ({e}); re-export the engine directory") from e
    if not isinstance(rec, dict):
        raise InputError(f"{path} is not a lisa-trt manifest (a JSON object); re-export the engine directory")
    return rec


def bundle_family(engine_dir) -> str:
    """The model family of an engine directory (its ExportFamily's name), from its manifest's
    `family` field.

    Manifests written before the field fall back to which manifest the directory holds: a family's
    legacy manifest file -> that family, a manifest.json -> the family whose unnamed manifests
    these are (export/legacy.record_family).
    Raises:
        InputError: no engine directory (what one holds and how to make one), unreadable manifest.
    """
    from .legacy import record_family

    return record_family(raw_manifest(engine_dir), manifest_path(engine_dir).name)


def file_sha256(path: Path) -> str:
    """sha256 hex digest of a file (streamed)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(engine_dir, *, target_hash: Optional[str] = None, drafter_hash: Optional[str] = None,
                  tables_hash: Optional[str] = None, check_files: bool = True) -> Manifest:
    """Read and check an engine directory's manifest.

    Args:
        engine_dir: directory written by `export_bundle`.
        target_hash / drafter_hash / tables_hash: when given, the hashes the caller is about to
            use the engines with; a different recorded hash is refused.
        check_files: check that every graph file (and its external data) exists and that the
            .onnx files are the exported ones (sha256; the .onnx files are small, weights of
            large graphs live in external data).
    Raises:
        CheckpointError: no manifest / unreadable / missing files.
        ArtifactMismatchError: other schema or io-spec version, changed graph files, or a hash
            that differs from the one expected.
    """
    engine_dir = Path(engine_dir)
    path = engine_dir / MANIFEST_NAME
    if not path.is_file():
        raise CheckpointError(f"{engine_dir} is not a complete lisa-trt engine directory (no {MANIFEST_NAME}); "
                              "export one with `lisa-trt export --model ... --out DIR`")
    try:
        d = json.loads(path.read_text())
    except ValueError as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); re-export the engine directory") from e
    if d.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a lisa-trt engine manifest (format {d.get('format')!r})")
    for key, want in (("schema_version", SCHEMA_VERSION), ("io_spec_version", IO_SPEC_VERSION)):
        if d.get(key) != want:
            raise ArtifactMismatchError(f"{engine_dir} was exported with {key} {d.get(key)}; this lisa-trt reads "
                                        f"{key} {want}. Re-export it with `lisa-trt export`.")
    man = Manifest.from_dict(d, dir=engine_dir)
    if check_files:
        check_graph_files(man)
    check_manifest(man, target_hash=target_hash, drafter_hash=drafter_hash, tables_hash=tables_hash)
    return man


def check_graph_files(man: Manifest) -> None:
    """The file checks of `read_manifest(check_files=True)` on a Manifest already read: every graph
    file (and its external data) exists and is the exported one, the shared weights file too.

    Raises:
        CheckpointError: a listed file is missing.
        ArtifactMismatchError: a file differs from the exported one.
    """
    # the shared weights file: its size always; its sha256 for quantized bundles (their graphs carry no hash of it)
    (verify_shared if man.quantization != "none" else check_shared)(man)
    for name, g in man.graphs.items():
        p = Path(man.dir) / g.file
        if not p.is_file():
            raise CheckpointError(f"{man.dir} lacks {g.file} listed in its manifest; re-export the directory")
        if g.external_data and not (Path(man.dir) / g.external_data).is_file():
            raise CheckpointError(f"{man.dir} lacks {g.external_data} (weights of {g.file}); re-export the directory")
        have = file_sha256(p)
        if have != g.sha256:
            raise ArtifactMismatchError(f"{p} has sha256 {have[:16]}, but the manifest records {g.sha256[:16]}: "
                                        "the graph was changed after export. Re-export the directory.")
        want = (g.quantization or {}).get("data_sha256")
        if want and g.external_data and file_sha256(Path(man.dir) / g.external_data) != want:
            raise ArtifactMismatchError(f"{Path(man.dir) / g.external_data} (quantized weights of {g.file}) differs "
                                        "from the exported one (sha256 mismatch). Re-export the directory.")


def check_shared(man) -> None:
    """The shared weights file exists and has the recorded size (its sha256 is checked by
    `verify_shared`, which reads the whole file)."""
    from ..errors import CheckpointError

    rec = man.weights or {}
    if not rec.get("file"):
        return
    p = Path(man.dir) / rec["file"]
    if not p.is_file():
        raise CheckpointError(f"{man.dir} lacks {rec['file']} (the weights of its graphs); re-export the directory")
    if p.stat().st_size != rec["bytes"]:
        from ..errors import ArtifactMismatchError

        raise ArtifactMismatchError(f"{p} has {p.stat().st_size} bytes, the manifest records {rec['bytes']}: the "
                                    "weights were changed after export. Re-export the directory.")


def verify_shared(man) -> None:
    """check_shared plus the recorded sha256 of the shared weights file."""
    from ..errors import ArtifactMismatchError
    check_shared(man)
    rec = man.weights or {}
    if rec.get("file") and file_sha256(Path(man.dir) / rec["file"]) != rec["sha256"]:
        raise ArtifactMismatchError(f"{Path(man.dir) / rec['file']} differs from the exported weights (sha256 "
                                    "mismatch). Re-export the directory.")


def check_manifest(man: Manifest, *, target_hash: Optional[str] = None, drafter_hash: Optional[str] = None,
                   tables_hash: Optional[str] = None) -> None:
    """Refuse engines made for another target / drafter / tables (ArtifactMismatchError names both)."""
    rec = {"target": man.target.get("hash"), "drafter": (man.drafter or {}).get("hash"),
           "tables": (man.tables or {}).get("hash")}
    for what, want in (("target", target_hash), ("drafter", drafter_hash), ("tables", tables_hash)):
        if want is None:
            continue
        have = rec[what]
        if have is None:
            raise ArtifactMismatchError(f"the engines in {man.dir} were exported without a {what}, but a {what} "
                                        f"with hash {want} was requested; re-export with the {what}")
        if have != want:
            raise ArtifactMismatchError(
                f"the engines in {man.dir} were exported for {what} hash {have}, but the {what} in use has "
                f"hash {want}. Engines only work with the exact artifacts they were exported from: re-run "
                f"`lisa-trt export` with this {what}, or use the {what} the engines were made for.")
