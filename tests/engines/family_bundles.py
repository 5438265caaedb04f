"""Tiny token-prompt deployments of every family but LlamaGen (Chameleon, Emu3, Janus), built from the
random transformers checkpoints the family tests use, exported through the one writer.

    art = family_artifacts("emu3", root)          # {"dir", "target", "vq", "drafter", "medusa", "tables", ...}
    man = export_family_bundle(art, root / "eng", fp16=True, drafter="eagle3")   # its Manifest
    req = art["request"](target)                  # the captions as the family's prompter encodes them

The drafters are random (EAGLE-3 from `Drafter.from_target`, Medusa heads from the target's head) and
the GASV tables random over the rows of the head the family's tables cover (its image codes, or the
whole generation head): these bundles test what runs, not what is accepted."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[1]
for sub in ("models", "families", "export"):
    sys.path.insert(0, str(TESTS / sub))

FAMILIES = ("chameleon", "emu3", "janus")
CAPTIONS = {"chameleon": ["a red fox", "tok70 tok71 tok72 tok73"],  # different lengths: left padding
            "emu3": ["a red fox", "fox"],
            "janus": ["w10 w11 w12", "w20"]}
IMAGE_SIZE = {"chameleon": 64, "emu3": 8, "janus": None}  # None: the checkpoint's own size
MAX_PROMPT = {"chameleon": 16, "emu3": 64, "janus": 16}  # the captions with the family's template


def _model_dir(family: str, root: Path) -> Path:
    if family == "chameleon":
        from chameleon_fixtures import save_model_dir

        return save_model_dir(root / "model", seed=5, num_key_value_heads=2, swin_norm=True)
    if family == "emu3":
        from emu3_fixtures import save_model_dir, save_tokenizer

        _, d = save_model_dir(root / "model", seed=0)
        save_tokenizer(d)
        return d
    from test_janus import make_hf, save, save_tokenizer

    d = save(make_hf(seed=3), root / "model")
    save_tokenizer(d)
    return d


def family_artifacts(family: str, root) -> dict:
    """The checkpoint directory of `family` under `root`, its target and decoder, a random EAGLE-3
    drafter, random Medusa heads and random GASV tables over the head rows the family's tables cover."""
    import lisa_trt
    from export_artifacts import make_tables
    from lisa_trt.export.families import export_family
    from lisa_trt.models.drafter import Drafter
    from lisa_trt.models.medusa import MedusaHeads

    root = Path(root)
    d = _model_dir(family, root)
    target, vq = lisa_trt.load_target(d), lisa_trt.load_vq(d)
    torch.manual_seed(0)
    drafter = Drafter.from_target(target).eval()
    medusa = MedusaHeads.from_target(target, n_heads=2).eval()
    tables = make_tables(target, sub_vocab=export_family(target).tables_sub_vocab(target))
    return dict(family=family, dir=d, target=target, vq=vq, drafter=drafter, medusa=medusa, tables=tables,
                captions=CAPTIONS[family], image_size=IMAGE_SIZE[family])


def export_family_bundle(art: dict, out, *, fp16: bool = False, drafter: str = "eagle3", max_prompt=None):
    """The bundle of `art` (drafter "eagle3" or "medusa"; GASV and decoder graphs), unvalidated and
    unlinted (the family export tests validate every graph): its Manifest."""
    from lisa_trt.export.bundle import export_bundle

    return export_bundle(art["target"], art[drafter if drafter == "medusa" else "drafter"], art["tables"], art["vq"],
                         out, source=art["dir"], image_size=art["image_size"],
                         max_prompt=max_prompt or MAX_PROMPT[art["family"]], max_tree=8, fp16=fp16, validate=False,
                         lint=False, progress=False)


def request(art: dict, target=None, cfg: bool = True):
    """The captions as the family's prompter encodes them for `target` (default: the torch target)."""
    from lisa_trt.models.family import family_of

    target = target if target is not None else art["target"]
    fam = family_of(art["target"].config)
    return fam.prompter(target, art["dir"]).encode(art["captions"], image_size=art["image_size"], cfg=cfg)
