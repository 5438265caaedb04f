"""Thread policy for every entry point (CLI commands, `Pipeline`, benchmarks).

Why: on a small or shared machine, torch's OpenMP pool and ONNX Runtime's intra-op pool
busy-wait ("spin") between operations. When another process occupies a core, a spinning
thread and the thread it waits for fight for the same core and every step can become 10-100x
slower (measured on the 2-core dev box: `generate` of 2 images 191 s with the defaults vs 3.3 s
with one thread; bench/threads.json has the current measurements).

The policy:

* number of threads: ``--threads N`` / ``Pipeline(..., threads=N)`` / env ``LISA_TRT_THREADS``,
  else the CPUs this process may really use: the CPU affinity mask, capped by the cgroup CPU
  quota (containers, CI runners) and by the physical core count (hyper-threads do not help the
  GEMMs);
* passive waiting: ``OMP_WAIT_POLICY=PASSIVE`` is set before torch loads its OpenMP runtime
  (importing `lisa_trt` does it, unless the user set the variable), and ONNX Runtime sessions
  are created with ``session.intra_op.allow_spinning=0``;
* `apply_thread_policy` sets torch's intra-op threads and remembers the count for ORT sessions
  opened later (`ort_threads`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

from .errors import InputError

ENV_THREADS = "LISA_TRT_THREADS"

_applied: Optional[int] = None


def set_passive_wait_env() -> None:
    """Ask OpenMP runtimes loaded after this call to sleep instead of spinning while idle.

    Only effective before `import torch` (libgomp reads the variable when it is loaded), so the
    package calls it first thing. A value the user already set is respected.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def cgroup_cpu_limit(root: str | os.PathLike = "/sys/fs/cgroup") -> Optional[float]:
    """CPUs allowed by the cgroup quota (v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``), None if unlimited."""
    root = Path(root)
    try:
        v2 = root / "cpu.max"
        if v2.is_file():
            quota, period = (v2.read_text().split() + ["100000"])[:2]
            if quota != "max" and float(period) > 0:
                return float(quota) / float(period)
            return None
        q, p = root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us"
        if not q.is_file():
            q, p = root / "cpu.cfs_quota_us", root / "cpu.cfs_period_us"
        if q.is_file() and p.is_file():
            quota, period = float(q.read_text()), float(p.read_text())
            if quota > 0 and period > 0:
                return quota / period
    except (OSError, ValueError):
        return None
    return None


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (taskset, numactl, container cpusets)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def physical_cores() -> Optional[int]:
    """Distinct (socket, core) pairs in /proc/cpuinfo, or None when it does not say."""
    try:
        cores, cur = set(), {}
        with open("/proc/cpuinfo") as f:
            for line in list(f) + [""]:
                if ":" in line:
                    k, v = (s.strip() for s in line.split(":", 1))
                    cur[k] = v
                elif cur:
                    cores.add((cur.get("physical id"), cur.get("core id")))
                    cur = {}
    except OSError:
        return None
    if not cores or any(c[1] is None for c in cores):
        return None
    return len(cores)


def available_cpus() -> int:
    """CPUs this process can really use: affinity, capped by the cgroup quota and physical cores."""
    n = affinity_cpus()
    quota = cgroup_cpu_limit()
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    phys = physical_cores()
    if phys is not None:
        n = min(n, phys)
    return max(1, n)


def parse_threads(value, source: str = "--threads") -> Optional[int]:
    """Validate a thread count from the CLI, the API or the environment (None / "" = default)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise InputError(f"{source} must be a positive integer, got {value!r}") from None
    if isinstance(value, bool) or n < 1 or (isinstance(value, float) and value != n):
        raise InputError(f"{source} must be a positive integer, got {value!r}")
    return n


def resolve_threads(threads=None) -> int:
    """Thread count to use: explicit value, else $LISA_TRT_THREADS, else `available_cpus()`."""
    n = parse_threads(threads)
    if n is None:
        n = parse_threads(os.environ.get(ENV_THREADS), source=f"${ENV_THREADS}")
    return n if n is not None else available_cpus()


def apply_thread_policy(threads=None) -> int:
    """Apply the policy to torch now and to ORT sessions opened later; returns the thread count.

    Safe to call more than once (the last call wins for torch intra-op threads; torch's
    inter-op pool can only be sized before its first use, so it is left alone after that).
    """
    global _applied
    set_passive_wait_env()
    n = resolve_threads(threads)
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    _applied = n
    return n


def ensure_thread_policy(threads=None) -> int:
    """Apply the policy unless one is already in force (an explicit `threads` always applies).

    Entry points (`Pipeline.from_dir`, `Pipeline.from_models`) call this so that the Python API
    gets the same defaults as the CLI without undoing a `--threads` given earlier.
    """
    if threads is None and _applied is not None:
        return _applied
    return apply_thread_policy(threads)


def ort_threads(threads=None) -> int:
    """Intra-op threads for a new ORT session: explicit value, else the applied policy, else default."""
    n = parse_threads(threads)
    if n is not None:
        return n
    return _applied if _applied is not None else resolve_threads(None)


def describe() -> dict:
    """What the policy sees (for benchmarks and bug reports)."""
    import torch

    return {"affinity_cpus": affinity_cpus(), "cgroup_cpu_limit": cgroup_cpu_limit(),
            "physical_cores": physical_cores(), "available_cpus": available_cpus(),
            "env_threads": os.environ.get(ENV_THREADS), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "torch_threads": torch.get_num_threads(), "applied": _applied,
            "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
