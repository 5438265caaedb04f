"""One graph stack: every family's engine directories open the same way, through the module its
ExportFamily names (`engines_module`), whose target class builds on engines/graph.GraphTarget;
load_engines has no default family path."""

import importlib
import types

import pytest

from lisa_trt.engines.graph import GraphTarget, load_engines
from lisa_trt.errors import ConfigError
from lisa_trt.export.families import ExportFamily, export_families


def test_every_export_family_names_an_engines_module_with_open_engines():
    fams = export_families()
    assert len(fams) >= 4, [f.name for f in fams]  # llamagen, chameleon, janus, emu3 at least
    for xf in fams:
        assert xf.engines_module, f"{xf.name} names no engines_module"
        mod = importlib.import_module(xf.engines_module)
        assert callable(getattr(mod, "open_engines", None)), xf.engines_module


def test_every_family_target_class_builds_on_graph_target():
    from lisa_trt.engines.prompt_graph import GraphPromptTarget
    from lisa_trt.families.llamagen.engines import LlamaGenGraphTarget

    for cls in (LlamaGenGraphTarget, GraphPromptTarget):
        assert issubclass(cls, GraphTarget)
        assert cls.forward_tokens is GraphTarget.forward_tokens  # one forward through _KVEngine._run_kv


def test_load_engines_has_no_default_family_path():
    class Nameless(ExportFamily):
        name = "nameless"

    man = types.SimpleNamespace(export_family=Nameless(), target={}, drafter=None, tables=None, dir="x")
    with pytest.raises(ConfigError, match="nameless export family names no engines_module"):
        load_engines("x", "ort", manifest=man)
