"""Removed runner options (engines/graph.REMOVED_OPTIONS) are refused with a clear InputError that
says why they went and what to do, before any work: `kv_binding` (the v2 graphs return only a
call's new K/V rows, committed in place by the runner) on `load_engines`, `load_trt_engines` and
`lisa-trt plan --kv-binding`."""

import pytest
from click.testing import CliRunner

from lisa_trt.cli import main
from lisa_trt.engines import graph as G
from lisa_trt.errors import InputError

WHY = r"kv_binding option was removed: the v2 graphs .* new K/V rows .* Leave it out.*re-exported"


def test_load_engines_refuses_kv_binding_before_reading_the_directory(tmp_path):
    missing = tmp_path / "no-such-bundle"  # reading it would raise another error: the check comes first
    for backend in ("trt", "ort"):
        with pytest.raises(InputError, match=WHY):
            G.load_engines(missing, backend, kv_binding="swap")


def test_load_trt_engines_refuses_kv_binding_before_the_tensorrt_check(tmp_path):
    from lisa_trt.engines.trt import load_trt_engines

    with pytest.raises(InputError, match=WHY):  # not TensorRTUnavailableError: bad input is named first
        load_trt_engines(tmp_path / "no-such-bundle", kv_binding="inplace")


def test_only_removed_options_are_refused():
    G.refuse_removed_options({"threads": 1, "device": "cpu"})  # live options pass the check
    with pytest.raises(InputError, match="kv_binding"):
        G.refuse_removed_options({"threads": 1, "kv_binding": None})


def test_plan_cli_says_kv_binding_was_removed():
    r = CliRunner().invoke(main, ["plan", "GPT-B", "--kv-binding", "swap"])
    assert r.exit_code == 2, r.output
    assert "--kv-binding was removed" in r.output and "re-exported with `lisa-trt export`" in r.output, r.output
    r = CliRunner().invoke(main, ["plan", "GPT-B"])
    assert r.exit_code == 0 and "was removed" not in r.output, r.output
