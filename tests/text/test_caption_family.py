"""The caption encoder is a family plug-in (ModelFamily.captions_module): the generic caption
plumbing (models/captions.py) reaches it by module name, and `lisa-trt encode-captions` picks the
family through the registry (--family, default: the one family that has an encoder)."""

import sys
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from lisa_trt.cli import main
from lisa_trt.errors import InputError
from lisa_trt.models import captions as MC
from lisa_trt.models.family import ModelFamily, family_of


def test_only_the_caption_family_has_a_captions_plugin():
    assert family_of("t2i").captions_module == "lisa_trt.families.llamagen.captions"
    for mt in ("chameleon", "janus", "emu3"):
        assert family_of(mt).captions_module is None, mt
    assert MC.caption_family() is family_of("t2i")
    assert MC.caption_family("llamagen") is family_of("t2i")


def test_a_family_without_an_encoder_is_refused_naming_the_ones_with_one():
    with pytest.raises(InputError, match=r"the chameleon family has no caption encoder.*families with one: llamagen"):
        MC.caption_family("chameleon")
    with pytest.raises(InputError, match=r"the janus family has no caption encoder"):
        MC.caption_encoder(family_of("janus"), "some/dir")
    with pytest.raises(InputError, match=r"unknown family 'nope'.*with a caption encoder: llamagen"):
        MC.caption_family("nope")


class _Toy(ModelFamily):
    name = "toy"
    captions_module = "toy_caption_plugin"


def test_the_hook_routes_to_the_named_plugin_and_several_need_a_name(monkeypatch):
    calls = []
    plugin = SimpleNamespace(caption_encoder=lambda d, required, **o: calls.append((d, required, o)) or "ENC")
    monkeypatch.setitem(sys.modules, "toy_caption_plugin", plugin)
    toy = _Toy()
    assert MC.caption_encoder(toy, "DIR", required=False, max_length=7) == "ENC"
    assert calls == [("DIR", False, {"max_length": 7})]
    monkeypatch.setattr(MC, "families", lambda: [family_of("t2i"), toy])
    with pytest.raises(InputError, match=r"2 registered families have a caption encoder \(llamagen, toy\); "
                                         r"name one with --family NAME"):
        MC.caption_family()
    assert MC.caption_family("toy") is toy
    monkeypatch.setattr(MC, "families", lambda: [family_of("chameleon")])
    with pytest.raises(InputError, match="0 registered families have a caption encoder"):
        MC.caption_family()


def test_the_llamagen_plugin_builds_its_encoder(t5_dir, monkeypatch):
    from lisa_trt.families.llamagen.captions import CaptionEncoder

    monkeypatch.delenv("LISA_TRT_TEXT_ENCODER", raising=False)
    fam = family_of("t2i")
    assert MC.caption_encoder(fam, None, required=False) is None  # no directory given or configured
    with pytest.raises(InputError, match="--encoder DIR"):
        MC.caption_encoder(fam, None)
    enc = MC.caption_encoder(fam, t5_dir, max_length=6, preprocess="none")
    assert isinstance(enc, CaptionEncoder) and (enc.max_length, enc.preprocess, enc.dim) == (6, "none", 12)
    monkeypatch.setenv("LISA_TRT_TEXT_ENCODER", str(t5_dir))
    assert MC.caption_encoder(fam, None, required=False).dir == t5_dir


def test_encode_captions_names_its_family(t5_dir, tmp_path, monkeypatch):
    from lisa_trt.io import load_safetensors

    monkeypatch.delenv("LISA_TRT_TEXT_ENCODER", raising=False)
    (tmp_path / "c.txt").write_text("a red car\na dog\n")
    r = CliRunner()
    res = r.invoke(main, ["encode-captions", str(tmp_path / "c.txt"), "--family", "chameleon", "--encoder",
                          str(t5_dir), "--out", str(tmp_path / "x.safetensors")])
    assert res.exit_code == 2 and "chameleon family has no caption encoder" in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "x.safetensors").exists()
    outs = {}
    for name, extra in (("default", []), ("named", ["--family", "llamagen"])):
        out = tmp_path / f"{name}.safetensors"
        res = r.invoke(main, ["encode-captions", str(tmp_path / "c.txt"), "--encoder", str(t5_dir), *extra,
                              "--out", str(out)])
        assert res.exit_code == 0, res.output
        outs[name] = load_safetensors(out)
    (t, meta), (t2, meta2) = outs["default"], outs["named"]
    assert t["caption_features"].shape == (2, 120, 12)  # the encoder's default length, LlamaGen's 120
    assert torch.equal(t["caption_features"], t2["caption_features"]) and meta == meta2
    assert meta["max_length"] == 120 and meta["preprocess"] == "lower" and meta["encoder_dtype"] == "float32"


def test_the_encoder_wording_comes_from_the_plugin(monkeypatch, tmp_path):
    """The generic messages name the encoder as its family's plug-in says (ENCODER_HINT): LlamaGen's
    T5 / flan-t5-xl / $LISA_TRT_TEXT_ENCODER, another plug-in's own words, a neutral one without."""
    import importlib

    from lisa_trt.runtime.conditions import run_conditions
    from lisa_trt.testing import make_target

    fam = family_of("t2i")
    assert MC.encoder_fix(fam) == "pass --encoder DIR (a local flan-t5-xl directory) or set $LISA_TRT_TEXT_ENCODER"
    plugin = importlib.import_module(fam.captions_module)
    monkeypatch.setattr(plugin, "ENCODER_HINT", {"name": "CLIP", "dir": "a local clip-vit-l directory", "env": "CLIP_DIR"})
    assert MC.encoder_fix(fam, cli=False) == ("pass text_encoder=DIR (CLI: --encoder DIR) (a local clip-vit-l "
                                              "directory) or set $CLIP_DIR")
    tc = make_target("t2i").config
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red car\n")
    monkeypatch.delenv("LISA_TRT_TEXT_ENCODER", raising=False)
    with pytest.raises(InputError, match=r"needs a CLIP encoder: pass --encoder DIR \(a local clip-vit-l directory\) "
                                         r"or set \$CLIP_DIR") as e:
        run_conditions(fam, tc).precheck_file(prompts, tc, None)
    assert "T5" not in str(e.value) and "flan" not in str(e.value)
    with pytest.raises(InputError, match="conditioned on CLIP caption features.*start it with CLIP_DIR=DIR"):
        run_conditions(fam, tc).served("a red car", None, None)
    assert MC.encoder_hint(SimpleNamespace(captions_module=None))["env"] is None  # no plug-in: neutral words


def test_no_generic_error_message_names_t5():
    """Outside lisa_trt/families, no error message's text names T5, flan-t5 or $LISA_TRT_TEXT_ENCODER
    (the plug-in's ENCODER_HINT says them); docstrings and comments may."""
    import ast
    from pathlib import Path

    root = Path(MC.__file__).resolve().parents[1]
    hits = []
    for p in root.rglob("*.py"):
        if "families" in p.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                text = " ".join(c.value for c in ast.walk(node.exc) if isinstance(c, ast.Constant)
                                and isinstance(c.value, str))
                if any(w in text for w in ("T5", "flan-t5", "LISA_TRT_TEXT_ENCODER")):
                    hits.append(f"{p.relative_to(root)}:{node.lineno}")
    assert hits == []
