"""Issue 52 item 9: `--help` never imports torch (the command list and option choices come from
lisa_trt/cli/_catalogue.py, kept equal to the registries here); one logging switch on the group
(-q / -v / --log-level); progress bars only on a terminal (TQDM_DISABLE honoured); -h on every
command, `serve` included; Ctrl-C exits 130."""

import io
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]

TORCH_AT_IMPORT = set()  # commands whose --help may import torch: none (calibrate reads its defaults from the catalogue)


def _help_in_fresh_process(commands) -> dict:
    """{command or '': [exit code, torch imported?]} with each help run in-process by click's runner."""
    code = f"""
import json, sys
from click.testing import CliRunner
from lisa_trt.cli import main
out = {{}}
for c in {list(commands)!r}:
    r = CliRunner().invoke(main, ([c] if c else []) + ["--help"])
    out[c] = [r.exit_code, "torch" in sys.modules]
print(json.dumps(out))
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_help_of_the_group_and_of_every_command_imports_no_torch():
    from lisa_trt.cli import COMMAND_MODULES

    names = [""] + [c for c in COMMAND_MODULES if c not in TORCH_AT_IMPORT]
    got = _help_in_fresh_process(names)
    assert {c: v for c, v in got.items() if v != [0, False]} == {}


def test_the_catalogue_equals_the_registries():
    """Regenerate with `python -m lisa_trt.cli.catalogue` when this fails."""
    from lisa_trt.cli import catalogue

    assert catalogue.snapshot() == catalogue.live()


def test_every_lazy_command_is_named_as_it_is_listed():
    from lisa_trt.cli import COMMAND_MODULES, _load

    assert {n: _load(n).name for n in COMMAND_MODULES} == {n: n for n in COMMAND_MODULES}


def test_group_help_lists_every_command():
    from lisa_trt.cli import COMMAND_MODULES, main

    out = CliRunner().invoke(main, ["--help"]).output
    listed = out.split("Commands:")[1]
    assert all(f"  {n} " in listed for n in COMMAND_MODULES)


@pytest.mark.parametrize("argv", [["serve", "-h"], ["-q", "serve", "-h"], ["--log-level", "debug", "serve", "-h"]])
def test_serve_takes_h_like_every_command(argv, capsys):
    """The launcher's port check parses `serve` first; -h must still be help afterwards."""
    from lisa_trt.launcher import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    assert "Usage: lisa-trt serve" in capsys.readouterr().out


class _Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def level():
    from lisa_trt import progress

    before = progress.log_level()
    yield progress
    progress._LEVEL["level"] = before


def test_bars_only_on_a_terminal_and_not_with_tqdm_disable(monkeypatch, level):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert level.bars_wanted(_Tty()) and not level.bars_wanted(io.StringIO())
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file
    assert isinstance(level.progress_bar(10, True), level._NoBar)
    assert list(level.iterate(range(3), True)) == [0, 1, 2]
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert not level.bars_wanted(_Tty())
    monkeypatch.setenv("TQDM_DISABLE", "0")
    assert level.bars_wanted(_Tty())
    level.set_log_level("warning")
    assert not level.bars_wanted(_Tty())


def test_a_bar_off_a_terminal_writes_nothing(monkeypatch, level):
    """What a log file got: tqdm's updates (88 for one rollout); now nothing."""
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    bar = level.progress_bar(100, True, unit="token")
    for _ in range(100):
        bar.update(1)
    bar.close()
    for _ in level.iterate(range(50), True, desc="x"):
        pass
    assert err.getvalue() == ""


def _probe_group():
    """The real group with a probe command added: what the group's options left behind."""
    from lisa_trt import progress
    from lisa_trt.cli import main

    seen = {}

    @click.command("probe-level")
    def probe():
        seen["level"] = progress.log_level()
        progress.say(lambda m: seen.setdefault("said", m))("hello")

    @click.command("probe-interrupt")
    def interrupt():
        raise KeyboardInterrupt

    main.add_command(probe)
    main.add_command(interrupt)
    return main, seen


@pytest.fixture
def group(level):
    main, seen = _probe_group()
    yield main, seen
    main.commands.pop("probe-level")
    main.commands.pop("probe-interrupt")


@pytest.mark.parametrize("argv,want,said", [([], "info", True), (["-q"], "warning", False),
                                            (["--quiet"], "warning", False), (["-v"], "debug", True),
                                            (["--log-level", "ERROR"], "error", False)])
def test_one_logging_switch_on_the_group(group, argv, want, said):
    main, seen = group
    r = CliRunner().invoke(main, [*argv, "probe-level"])
    assert r.exit_code == 0, r.output
    assert seen["level"] == want and ("said" in seen) == said


def test_log_level_from_the_environment_and_conflicts_refused(group):
    main, seen = group
    assert CliRunner().invoke(main, ["probe-level"], env={"LISA_TRT_LOG_LEVEL": "warning"}).exit_code == 0
    assert seen["level"] == "warning"
    r = CliRunner().invoke(main, ["-q", "-v", "probe-level"])
    assert r.exit_code == 2 and "one of --quiet, --verbose and --log-level" in r.output


def test_ctrl_c_exits_130(group):
    main, _ = group
    r = CliRunner().invoke(main, ["probe-interrupt"])
    assert r.exit_code == 130 and "interrupted" in r.output


def test_a_bar_with_its_own_eta_shows_one(monkeypatch, level):
    """export's bar: lisa-trt's work-weighted ETA in the postfix, tqdm's own left out."""
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    bar = level.progress_bar(4, True, unit="graph", own_eta=True, file=err, mininterval=0)
    bar.set_postfix_str("all ~2m43s left")
    bar.update(1)
    bar.close()
    last = err.getvalue().split("\r")[-1]
    assert "2m43s left" in last and "<" not in last  # tqdm's [elapsed<remaining] is gone
    plain = _Tty()
    b = level.progress_bar(4, True, file=plain, mininterval=0)
    b.update(1)
    b.close()
    assert "<" in plain.getvalue()


def test_a_bar_off_a_terminal_still_prints_its_lines(monkeypatch, level):
    """export writes one line per graph through its bar: a log keeps those, without the bar."""
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    level.progress_bar(3, True).write("target_prefill: 12s")
    level.progress_bar(3, False).write("not asked for")
    assert err.getvalue() == "target_prefill: 12s\n"
    level.set_log_level("warning")
    level.progress_bar(3, True).write("quiet")
    assert "quiet" not in err.getvalue()
