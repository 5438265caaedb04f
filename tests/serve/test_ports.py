"""`lisa-trt serve` refuses a taken port before anything starts (no Triton, no demo assets needed)."""

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lisa_trt.serve.process import free_ports


def _entry():
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()  # [project.scripts]
    return re.search(r'^lisa-trt\s*=\s*"([\w.]+):(\w+)"', text, re.M).groups()


@pytest.mark.parametrize("which", ["--http-port", "--grpc-port", "--metrics-port"])
def test_console_script_refuses_a_taken_port_at_once(tmp_path, which):
    mod, fn = _entry()
    ports = dict(zip(["--http-port", "--grpc-port", "--metrics-port"], free_ports(3)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[which]))
        s.listen()
        args = ["serve", str(tmp_path), *[x for kv in ports.items() for x in (kv[0], str(kv[1]))]]
        r = subprocess.run([sys.executable, "-c", f"import sys; from {mod} import {fn}; sys.exit({fn}())", *args],
                           capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    # "at once" is an order, not a time: the engine directory is empty, so any step before the port
    # check (reading the bundle, writing the model repository, starting Triton) would answer otherwise
    assert out.strip() == (f"error: port {ports[which]} ({which}) on 127.0.0.1 is already in use; stop what holds it "
                           f"or pass another {which}")
    assert not any(tmp_path.iterdir())  # nothing written


def test_launcher_finds_the_subcommand_after_group_options():
    from lisa_trt.launcher import _command_index

    assert _command_index(["serve", "x"]) == 0
    assert _command_index(["--threads", "2", "serve", "x"]) == 2
    assert _command_index(["--version"]) is None
