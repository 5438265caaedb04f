"""Engine directories written by an older lisa-trt still open (export/legacy.py reads them): a
manifest.json from before the `family` field and the fields added after it, and a family's legacy
manifest file."""

import json
import shutil

import torch

from lisa_trt.export.legacy import legacy_manifest_path, record_family
from lisa_trt.export.manifest import MANIFEST_NAME, bundle_family, manifest_path, read_manifest
from lisa_trt.families.chameleon.export import ENGINE_FILE as CHAMELEON_ENGINE_FILE

# what a manifest.json held before the family field and the records added since
LATER_FIELDS = ("family", "layout", "export", "engines")


def _old_style(bundle, dest):
    """A copy of `bundle` whose manifest.json is written by hand the way an older export wrote it."""
    shutil.copytree(bundle.dir, dest)
    rec = json.loads((dest / MANIFEST_NAME).read_text())
    for key in LATER_FIELDS:
        rec.pop(key, None)
    rec["drafter"].pop("arch", None)  # no arch: an EAGLE-3 drafter
    rec["target"].pop("prefill_ids", None)
    (dest / MANIFEST_NAME).write_text(json.dumps(rec))
    return dest


def test_a_manifest_from_before_the_family_field_still_opens(bundle, tmp_path):
    from lisa_trt.runtime.pipeline import Pipeline

    old = _old_style(bundle, tmp_path / "old")
    assert "family" not in json.loads((old / MANIFEST_NAME).read_text())
    man = read_manifest(old)
    assert man.family == "llamagen" and bundle_family(old) == "llamagen"
    assert man.drafter_arch == "eagle3" and man.target_config == bundle.target_config
    kw = dict(seed=3, verify="exact", decode=False, tree_top_k=3, tree_depth=2, tree_tokens=8)  # max_tree 16
    with Pipeline.from_dir(old, backend="ort", threads=1) as a, Pipeline.from_dir(bundle.dir, backend="ort",
                                                                                  threads=1) as b:
        assert a.family.name == "llamagen"
        assert torch.equal(a.generate([1, 2], **kw).tokens, b.generate([1, 2], **kw).tokens)


def test_a_family_legacy_manifest_file_is_found_and_names_its_family(tmp_path):
    d = tmp_path / "cham"
    d.mkdir()
    (d / CHAMELEON_ENGINE_FILE).write_text(json.dumps({"kind": "lisa-trt/chameleon-engine"}))
    assert legacy_manifest_path(d) == d / CHAMELEON_ENGINE_FILE == manifest_path(d)
    assert bundle_family(d) == "chameleon"
    assert legacy_manifest_path(tmp_path) is None
    assert record_family({"family": "janus"}, MANIFEST_NAME) == "janus"  # the field decides when present
    assert record_family({}, MANIFEST_NAME) == "llamagen"
