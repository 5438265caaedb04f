"""Fetch NVIDIA's tensorrt-cu12-bindings wheels for the contract tests (tests/contract).

    python scripts/fetch_trt_bindings.py [--dest .cache/trt-bindings] [VERSION ...]

Each wheel (about 1 MB) is downloaded with `pip download --no-deps` and unzipped into
DEST/<version>/. Only its pure-Python `tensorrt_bindings/plugin/*.py` is used (over a stand-in for
the compiled core, tests/contract/trt_core.py); the wheel is never installed nor committed.
Default versions: the oldest TensorRT lisa-trt supports and the newest 11.x checked.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ("10.14.1.48.post1", "11.4.0.106")  # keep in sync with tests/contract/trt_core.py


def fetch(version: str, dest: Path) -> Path:
    out = dest / version
    if (out / "tensorrt_bindings" / "plugin" / "_lib.py").is_file():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        # platform fixed so the same (pure-Python) files come on any CI interpreter
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
               "--only-binary=:all:", "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64",
               "-d", tmp, f"tensorrt-cu12-bindings=={version}"]
        subprocess.run(cmd, check=True)
        (whl,) = Path(tmp).glob("*.whl")
        part = Path(tempfile.mkdtemp(dir=dest, prefix=f".{version}."))
        with zipfile.ZipFile(whl) as z:
            z.extractall(part)
        if out.exists():
            shutil.rmtree(out)
        part.rename(out)  # atomic: a half-unpacked wheel never looks complete
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("versions", nargs="*", default=list(VERSIONS))
    ap.add_argument("--dest", type=Path, default=ROOT / ".cache" / "trt-bindings")
    a = ap.parse_args(argv)
    a.dest.mkdir(parents=True, exist_ok=True)
    for v in a.versions:
        print(f"tensorrt-cu12-bindings {v}: {fetch(v, a.dest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
