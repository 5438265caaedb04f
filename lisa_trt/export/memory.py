"""Export at size: precision copies made graph by graph and freed as the export goes, and the
export's memory measured.

An fp16 export must not hold three things at once for its whole run: the fp32 models (the
validation reference), a whole fp16 copy of them and whatever the exporter and the validation
session built. So:

* `half_copy` builds the fp16 copy tensor by tensor (no intermediate fp32 copy);
* `PrecisionCopy` makes that copy only when a graph is traced from it and drops it as soon as
  that graph is written (before its validation session opens); the next graph of the same model
  converts again (seconds, against minutes of tracing);
* `state_items` gives the same converted tensors one at a time, for the torch index of the
  shared weights file (export/weights.py), so no whole copy is rebuilt at the end;
* `peak_rss_bytes` is the process's high-water mark (`getrusage`, no psutil), recorded per graph
  and for the whole export in the manifest (`export.peak_rss_bytes`);
* `release_memory` runs the garbage collector and returns freed heap pages to the system
  (glibc `malloc_trim`), so a freed copy does not stay in the resident set;
* `spill_reference` moves a reference the loader built on the heap (a Chameleon-family bf16
  checkpoint converted to fp32) into file-backed memory in the staging directory, so that
  `FilePages` can drop it too;
* `FilePages` drops the pages of a checkpoint mapped from its file (a LlamaGen .pt is loaded with
  mmap) from the resident set once a phase is done with them: the fp32 reference is read while the
  fp16 copy is made and while validation runs PyTorch, but need not stay resident while the graph
  is traced or while ONNX Runtime runs it (the kernel reads the pages again from the page cache or
  the file when they are next touched). Only clean pages of a private file mapping are dropped;
  a tensor with a page written since loading (copy-on-write, so anonymous), swapped, or on the heap
  is left alone, so no value can change.
"""

from __future__ import annotations

import copy
import ctypes
import gc
import os
import resource
import sys
from typing import Iterator, Optional

FP32_BUFFERS = ("freqs_cis", "inv_freq")  # RoPE tables: kept fp32 in fp16 exports (see onnx._half_copy)


def peak_rss_bytes() -> int:
    """The high-water mark of this process's resident set, in bytes (ru_maxrss: KiB on Linux,
    bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def children_peak_rss_bytes() -> int:
    """The largest high-water mark of this process's finished child processes (the
    `polygraphy check lint` subprocesses of an export), in bytes: not part of peak_rss_bytes.
    Linux carries a process's high-water mark across exec, and a spawned child starts in its
    parent's memory, so this is at least this process's peak at the moment the child started: a
    value equal to peak_rss_bytes means no child used more than the exporter."""
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


_LIBC = None


def release_memory() -> None:
    """Collect garbage, then give freed heap memory back to the system (glibc only; a no-op elsewhere)."""
    global _LIBC
    gc.collect()
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 (probe)
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


MADV_DONTNEED = 4
_PM_PRESENT, _PM_SWAPPED, _PM_FILE = 1 << 63, 1 << 62, 1 << 61  # /proc/PID/pagemap flag bits (kernel docs)


class FilePages:
    """Drop the resident pages of tensors mapped from a file (see the module doc).

    Linux only: /proc/self/maps says which ranges are file mappings, and madvise(MADV_DONTNEED)
    unmaps their pages. A shared mapping (the spilled fp16 copy, `Spill`) keeps every write in the
    file, so its pages are always dropped; a private one (a checkpoint loaded with mmap) reads them
    again from the file on the next access, which is why a written page would lose its value: there
    /proc/self/pagemap must show every present page still the file's own (not copied on write, not
    swapped). Anywhere else (no /proc, no libc) `release` does nothing and returns 0."""

    def __init__(self):
        self.page = resource.getpagesize()
        self.maps = self._file_maps()
        self._libc = None
        if self.maps:
            try:
                libc = ctypes.CDLL("libc.so.6", use_errno=True)
                libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                self._libc = libc
            except (OSError, AttributeError):
                self.maps = []

    @staticmethod
    def _file_maps() -> list:
        """[(start, end, shared)] of this process's mappings of regular files."""
        out = []
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    parts = line.split(maxsplit=5)
                    if len(parts) < 6 or parts[4] == "0" or not parts[5].startswith("/"):
                        continue
                    lo, hi = parts[0].split("-")
                    out.append((int(lo, 16), int(hi, 16), parts[1][3] == "s"))
        except OSError:
            return []
        return out

    def _file_map(self, lo: int, hi: int):
        """The file mapping holding [lo, hi): (start, end, shared), or None."""
        return next((m for m in self.maps if m[0] <= lo and hi <= m[1]), None)

    def _clean(self, lo: int, hi: int) -> bool:
        """Every present page of [lo, hi) is the file's own page (none written, none swapped)."""
        import numpy as np

        first, n = lo // self.page, (hi - lo) // self.page
        try:
            with open("/proc/self/pagemap", "rb") as f:
                raw = os.pread(f.fileno(), 8 * n, 8 * first)
        except OSError:
            return False
        if len(raw) != 8 * n:
            return False
        e = np.frombuffer(raw, dtype=np.uint64)
        present = (e & np.uint64(_PM_PRESENT)) != 0
        if ((e & np.uint64(_PM_SWAPPED)) != 0).any():
            return False
        return bool(((e[present] & np.uint64(_PM_FILE)) != 0).all())

    def release(self, tensors) -> int:
        """Drop the resident file pages of `tensors` (whole pages inside each storage); the bytes advised."""
        if not self.maps:
            return 0
        done, seen = 0, set()
        for t in tensors:
            try:
                st = t.untyped_storage()
            except (AttributeError, RuntimeError):
                continue
            if st.device.type != "cpu" or st.data_ptr() in seen:
                continue
            seen.add(st.data_ptr())
            lo = -(-st.data_ptr() // self.page) * self.page
            hi = (st.data_ptr() + st.nbytes()) // self.page * self.page
            m = self._file_map(lo, hi) if hi > lo else None
            # a shared mapping keeps every write in the file (page cache): always safe to drop;
            # a private one only where no page was written (copied on write) or swapped
            if m is None or (not m[2] and not self._clean(lo, hi)):
                continue
            if self._libc.madvise(lo, hi - lo, MADV_DONTNEED) == 0:
                done += hi - lo
        return done


def module_tensors(*modules) -> list:
    """The parameters and buffers of `modules` (modules, PrecisionCopy entries, None)."""
    out = []
    for m in modules:
        if isinstance(m, PrecisionCopy):
            m = m.module
        if m is not None and hasattr(m, "parameters"):
            out += list(m.parameters()) + list(m.buffers())
    return out


def release_file_pages(*modules, min_bytes: Optional[int] = None) -> int:
    """FilePages().release over the modules' tensors when they hold at least `min_bytes`
    (default RELEASE_MIN_BYTES: a small model is not worth reading /proc for); the bytes advised."""
    if sum(module_bytes(m) for m in modules) < (RELEASE_MIN_BYTES if min_bytes is None else min_bytes):
        return 0
    return FilePages().release(module_tensors(*modules))


RELEASE_MIN_BYTES = 256 << 20  # below this, a garbage collection costs more time than it returns memory


def release_if_large(models) -> None:
    """`release_memory` when the models (modules, PrecisionCopy entries, None) hold at least
    RELEASE_MIN_BYTES: a big export gets its freed copies back from the allocator, while a small
    one (the tests' tiny models, in a long-lived process) does not pay a full collection per graph."""
    if sum(module_bytes(m) for m in models or ()) >= RELEASE_MIN_BYTES:
        release_memory()


def _keeps_fp32(name: str) -> bool:
    return name in FP32_BUFFERS  # the module's own RoPE table (a top-level attribute), as _half_copy did


class Spill:
    """File-backed memory for an fp16 copy: each tensor in its own MAP_SHARED mapping of a file
    made in `directory` and unlinked at once (nothing is left on disk, even after a crash).

    The ONNX exporter keeps references to the tensors it traced (numpy views, held from C until
    the next export), so a freed copy would stay resident through the graph's validation; a copy
    in shared file mappings is dropped from memory by `FilePages.release` whoever holds it, and
    any later read gets the same bytes back from the page cache or the file."""

    DISK_MARGIN = 1 << 30  # free space left on the disk after a spill (bytes)

    def __init__(self, directory):
        self.directory = str(directory)

    @staticmethod
    def fits(directory, nbytes: int) -> bool:
        """Whether `directory`'s file system has room for `nbytes` more (plus DISK_MARGIN): a spill
        that does not fit stays on the heap (a full disk would fail the export half way)."""
        import shutil

        try:
            return shutil.disk_usage(str(directory)).free >= nbytes + Spill.DISK_MARGIN
        except OSError:
            return False

    def take(self, t):
        """A file-backed tensor equal to `t` (same dtype and shape)."""
        import tempfile

        import torch

        n = max(1, t.numel())
        fd, name = tempfile.mkstemp(prefix=".lisa-trt-spill-", suffix=".bin", dir=self.directory)
        try:
            os.close(fd)
            buf = torch.from_file(name, shared=True, size=n * t.element_size(), dtype=torch.uint8)
        finally:
            os.unlink(name)
        out = buf.view(t.dtype)[: t.numel()].view(t.shape)
        out.copy_(t)
        return out


def spill_reference(module, directory) -> int:
    """Move a large model's floating parameters that live on the heap into file-backed memory
    (`Spill` in `directory`, the export's staging directory), so `FilePages` can drop them from the
    resident set between the phases that read them, as it does for a checkpoint loaded with mmap.

    For a reference the loader built on the heap (a Chameleon-family checkpoint: bf16 shards
    converted to an fp32 model). Parameters already mapped from a file, small models (below
    RELEASE_MIN_BYTES) and a disk without room for them are left as they are. Values are
    unchanged (`Parameter.data` is replaced by an equal tensor). -> bytes moved."""
    if module is None or module_bytes(module) < RELEASE_MIN_BYTES:
        return 0
    pages = FilePages()
    if not pages.maps:
        return 0
    todo = []
    for p in module.parameters():
        if not p.is_floating_point() or p.device.type != "cpu":
            continue
        st = p.untyped_storage()
        if pages._file_map(st.data_ptr(), st.data_ptr() + max(1, st.nbytes())) is None:
            todo.append(p)
    need = sum(p.numel() * p.element_size() for p in todo)
    if not need or not Spill.fits(directory, need):
        return 0
    spill = Spill(directory)
    for p in todo:
        p.data = spill.take(p.data)
    release_memory()  # the heap copies go back to the system
    return need


def half_in_place(module):
    """`module` converted to fp16 in place, to the tensors `half_copy` gives: floating parameters and
    buffers halved, its top-level RoPE tables (FP32_BUFFERS, buffers or plain attributes) kept fp32.
    The torch backend's fp16 models (engines/torch_runner.py): what the fp16 graphs compute with."""
    import torch

    keep = {n: getattr(module, n).float() for n in FP32_BUFFERS if torch.is_tensor(getattr(module, n, None))}
    module.half()
    for name, t in keep.items():
        setattr(module, name, t)
    return module


def half_copy(module, spill: Optional[Spill] = None):
    """An fp16 copy of `module` (floating parameters and buffers halved; its top-level RoPE tables
    FP32_BUFFERS kept fp32), made tensor by tensor: the peak is the fp16 copy, never a second fp32
    one. The same tensors as `copy.deepcopy(module).half()` with the RoPE tables restored.
    `spill`: the floating parameters are written into file-backed memory (Spill) instead of the
    heap, so the copy can leave the resident set after its graph is traced (PrecisionCopy.free)."""
    import torch

    memo = {}
    pages = FilePages() if module_bytes(module) >= RELEASE_MIN_BYTES else None
    for p in module.parameters():
        if p.is_floating_point():
            h = p.detach().half()
            if spill is not None:
                h = spill.take(h)
            memo[id(p)] = torch.nn.Parameter(h, requires_grad=p.requires_grad)
            if pages is not None:  # the fp32 source read for this tensor leaves the resident set again
                pages.release([p])
    for name, b in module.named_buffers():
        if id(b) in memo or not b.is_floating_point():
            continue
        memo[id(b)] = b.detach().float().clone() if _keeps_fp32(name) else b.detach().half()
    m = copy.deepcopy(module, memo)
    for name in FP32_BUFFERS:  # a RoPE table that is a plain attribute (not a buffer): deep-copied fp32 already
        if hasattr(module, name) and torch.is_tensor(getattr(module, name)):
            t = getattr(m, name)
            if t.is_floating_point() and t.dtype != torch.float32:
                setattr(m, name, getattr(module, name).float().clone())
    return m


class PrecisionCopy:
    """The module a graph is traced from, in the bundle's precision, made on demand.

    fp32 exports trace the caller's model itself (`get` returns it, `free` keeps it); fp16 ones
    get a `half_copy` that lives from the first `get` to the next `free`."""

    def __init__(self, module, fp16: bool, spill_dir=None):
        """spill_dir: where a large model's copy is spilled (Spill; the export's staging directory),
        None to keep it on the heap."""
        self.module, self.fp16, self._copy, self.spill_dir = module, bool(fp16), None, spill_dir

    def get(self):
        if not self.fp16:
            return self.module
        if self._copy is None:
            spill = None
            n = module_bytes(self.module)
            if (self.spill_dir is not None and n >= RELEASE_MIN_BYTES and FilePages().maps
                    and Spill.fits(self.spill_dir, n // 2)):
                spill = Spill(self.spill_dir)
            self._copy = half_copy(self.module, spill)
        return self._copy

    def _drop(self) -> bool:
        """Forget the copy; a spilled one also leaves the resident set now (FilePages), even while
        the exporter still holds its tensors. True if there was one."""
        copy_, self._copy = self._copy, None
        if copy_ is None:
            return False
        if self.spill_dir is not None:
            FilePages().release(module_tensors(copy_))
        return True

    def peek(self):
        """The module if it exists now (None for a freed fp16 copy)."""
        return self.module if not self.fp16 else self._copy

    def free(self) -> None:
        if self._drop():
            release_if_large((self.module,))

    @property
    def config(self):
        return self.module.config

    def state_items(self) -> Iterator[tuple]:
        """(name, tensor) of the copy's state dict, converted one tensor at a time (what
        `get().state_dict()` would hold, without building the copy)."""
        for name, t in self.module.state_dict().items():
            if self.fp16 and t.is_floating_point():
                t = t.float() if _keeps_fp32(name) else t.half()
            yield name, t

    def state_dict(self):
        return dict(self.state_items())


def resolve(m):
    """A PrecisionCopy's current module (building it), anything else as it is."""
    return m.get() if isinstance(m, PrecisionCopy) else m


def free_all(models) -> None:
    """Drop the fp16 copies of `models` (PrecisionCopy entries; others are left alone), then give
    freed memory back when the models are large (release_if_large)."""
    models = tuple(models or ())
    for m in models:
        if isinstance(m, PrecisionCopy):
            m._drop()
    release_if_large(models)


def module_bytes(module) -> int:
    """Bytes of a module's parameters and buffers (0 for None and for anything that is not a module,
    e.g. the GASV tables among an export's refs)."""
    if isinstance(module, PrecisionCopy):
        module = module.module
    if module is None or not hasattr(module, "parameters"):
        return 0
    seen, n = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            n += t.numel() * t.element_size()
    return n


def export_record(models: dict, started: Optional[float] = None) -> dict:
    """The manifest's `export` record: the process's peak RSS so far, the fp32-equivalent bytes of
    the exported models (the ratio's denominator), and the wall time since `started`."""
    import time

    fp32 = 0
    for m in models.values():
        if m is None or not hasattr(m, "parameters"):
            continue
        fp32 += sum(t.numel() * 4 for t in m.parameters() if t.is_floating_point())
    rec = {"peak_rss_bytes": peak_rss_bytes(), "fp32_parameter_bytes": int(fp32),
           "measured": "getrusage(RUSAGE_SELF).ru_maxrss of the exporting process (checkpoint loading included)",
           "children_peak_rss_bytes": children_peak_rss_bytes()}  # the lint subprocesses (RUSAGE_CHILDREN)
    if fp32:
        rec["peak_rss_over_fp32_parameters"] = round(rec["peak_rss_bytes"] / fp32, 3)
    if started is not None:
        rec["seconds"] = round(time.time() - started, 1)
    return rec
