"""Before / after measurements of two source trees in one run (bench/step_budget.py,
bench/host_overhead.py): unpack a git ref's lisa_trt/ to a directory, and run a bench script's
worker mode under one tree or the other as a child process.

    with tempfile.TemporaryDirectory() as tmp:
        commit = export_ref("13a5dfe", Path(tmp))
        before = run_worker(__file__, Path(tmp), ["--engine-dir", d, "--images", "1"])
        after = run_worker(__file__, ROOT, ["--engine-dir", d, "--images", "1"])
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def export_ref(ref: str, dest: Path) -> str:
    """Unpack lisa_trt/ of git ref `ref` of this repository into `dest`; returns the commit id.

    Raises SystemExit naming the ref when git does not know it."""
    p = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"], capture_output=True,
                       text=True)
    if p.returncode:
        raise SystemExit(f"--compare {ref!r} is not a commit of {ROOT} ({p.stderr.strip()}); pass a branch, tag or "
                         "commit id")
    commit = p.stdout.strip()
    tar = Path(dest) / "ref.tar"
    with open(tar, "wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", commit, "lisa_trt"], check=True, stdout=f)
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="data")
    tar.unlink()
    return commit


def run_worker(script, src: Path, args: list) -> dict:
    """`python script --worker *args` with `src` first on the path and one thread: the JSON
    object the worker prints on its last line. Raises SystemExit with the worker's stderr tail
    when it fails."""
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(script), "--worker", *map(str, args)], env=env, capture_output=True,
                       text=True)
    if p.returncode:
        raise SystemExit(f"measurement under {src} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])
