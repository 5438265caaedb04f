"""Thread policy: defaults from affinity / cgroup quota, --threads and LISA_TRT_THREADS, passive waiting."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from lisa_trt import threads as th
from lisa_trt.cli import main
from lisa_trt.errors import InputError

ROOT = Path(__file__).resolve().parents[2]


def test_cgroup_v2_and_v1_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert th.cgroup_cpu_limit(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert th.cgroup_cpu_limit(tmp_path) is None
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("200000")
    (v1 / "cpu.cfs_period_us").write_text("100000")
    assert th.cgroup_cpu_limit(tmp_path / "v1") == 2.0
    (v1 / "cpu.cfs_quota_us").write_text("-1")
    assert th.cgroup_cpu_limit(tmp_path / "v1") is None


def test_default_respects_affinity_and_quota(monkeypatch):
    monkeypatch.setattr(th, "affinity_cpus", lambda: 8)
    monkeypatch.setattr(th, "physical_cores", lambda: None)
    monkeypatch.setattr(th, "cgroup_cpu_limit", lambda root="/": 2.5)
    assert th.available_cpus() == 2
    monkeypatch.setattr(th, "cgroup_cpu_limit", lambda root="/": 0.5)
    assert th.available_cpus() == 1
    monkeypatch.setattr(th, "cgroup_cpu_limit", lambda root="/": None)
    monkeypatch.setattr(th, "physical_cores", lambda: 4)
    assert th.available_cpus() == 4


def test_explicit_then_env_then_default(monkeypatch):
    monkeypatch.setenv(th.ENV_THREADS, "3")
    assert th.resolve_threads(None) == 3
    assert th.resolve_threads(2) == 2
    monkeypatch.delenv(th.ENV_THREADS)
    monkeypatch.setattr(th, "available_cpus", lambda: 5)
    assert th.resolve_threads(None) == 5
    for bad in (0, -1, "two", 1.5, True):
        with pytest.raises(InputError, match="positive integer"):
            th.resolve_threads(bad)
    monkeypatch.setenv(th.ENV_THREADS, "lots")
    with pytest.raises(InputError, match="LISA_TRT_THREADS"):
        th.resolve_threads(None)


def test_apply_sets_torch_and_ort(monkeypatch):
    before = torch.get_num_threads()
    try:
        assert th.apply_thread_policy(2) == 2 and torch.get_num_threads() == 2
        assert th.ensure_thread_policy(None) == 2  # an applied policy is kept
        from lisa_trt.engines.ort import session_options

        so = session_options()
        assert so.intra_op_num_threads == 2
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert session_options(threads=1).intra_op_num_threads == 1
    finally:
        th.apply_thread_policy(before)
    assert os.environ.get("OMP_WAIT_POLICY", "").upper() in ("PASSIVE", "ACTIVE")  # set before torch, or by the user


def test_cli_group_option_and_env(monkeypatch):
    before = torch.get_num_threads()
    r = CliRunner()
    try:
        # a command's own options are parsed after the group's policy applied (`--help` skips it: no torch)
        res = r.invoke(main, ["--threads", "2", "random-checkpoint", "--no-such-option"])
        assert res.exit_code == 2 and torch.get_num_threads() == 2
        res = r.invoke(main, ["random-checkpoint", "--no-such-option"], env={"LISA_TRT_THREADS": "1"})
        assert res.exit_code == 2 and torch.get_num_threads() == 1
        res = r.invoke(main, ["--threads", "0", "random-checkpoint", "--help"])
        assert res.exit_code == 2 and "--threads" in res.output
    finally:
        th.apply_thread_policy(before)


def _clean_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", th.ENV_THREADS)}
    env["PYTHONPATH"] = str(ROOT)
    return env


_CHILD = r"""
import importlib.abc, json, os, sys
seen = {}
class _Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "torch" not in seen:
            seen["torch"] = os.environ.get("OMP_WAIT_POLICY")  # what OpenMP will read when torch loads it
        return None
sys.meta_path.insert(0, _Watch())
from click.testing import CliRunner
from lisa_trt import threads as th
from lisa_trt.cli import main
import torch
res = CliRunner().invoke(main, ["random-checkpoint", "--help"])
print(json.dumps({"exit": res.exit_code, "torch": torch.get_num_threads(), "want": th.available_cpus(),
                  "wait_at_torch_import": seen.get("torch"), "ort": th.ort_threads(None)}))
"""


def _one_cpu():
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


@pytest.mark.parametrize("pin", [False, True], ids=["all-cpus", "one-cpu"])
def test_a_fresh_cli_process_applies_the_default_policy(pin):
    """No thread env vars at all: the CLI sizes torch and ORT to the CPUs it may use (its affinity),
    and OMP_WAIT_POLICY=PASSIVE is set before torch loads OpenMP, so idle threads sleep.

    What a busy neighbour then costs is measured by bench/threads.py (bench/threads.json), not timed here.
    """
    p = subprocess.run([sys.executable, "-c", _CHILD], env=_clean_env(), capture_output=True, text=True,
                       timeout=300, preexec_fn=_one_cpu if pin else None)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["exit"] == 0
    assert got["wait_at_torch_import"] == "PASSIVE"
    assert got["torch"] == got["want"] == got["ort"]
    if pin:
        assert got["torch"] == 1
