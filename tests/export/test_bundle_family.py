"""Engine directories say which model family they hold: the manifest's `family` field, read by
export.manifest.bundle_family (old manifests without it: by which manifest file is present;
anything else: a clear error saying what an engine directory holds and how to make one)."""

import json

import pytest

from lisa_trt.errors import InputError
from lisa_trt.export.manifest import MANIFEST_NAME, bundle_family
from lisa_trt.families.chameleon.export import ENGINE_FILE as CHAMELEON_ENGINE_FILE


def _write(d, name, rec):
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(rec if isinstance(rec, str) else json.dumps(rec))
    return d


def test_the_family_field_decides(tmp_path):
    assert bundle_family(_write(tmp_path / "a", MANIFEST_NAME, {"family": "llamagen"})) == "llamagen"
    assert bundle_family(_write(tmp_path / "b", MANIFEST_NAME, {"family": "chameleon"})) == "chameleon"
    assert bundle_family(_write(tmp_path / "c", CHAMELEON_ENGINE_FILE, {"family": "chameleon"})) == "chameleon"


def test_old_manifests_fall_back_to_the_file_they_are_in(tmp_path):
    assert bundle_family(_write(tmp_path / "a", MANIFEST_NAME, {"format": "lisa-trt/engine-bundle"})) == "llamagen"
    assert bundle_family(_write(tmp_path / "b", CHAMELEON_ENGINE_FILE, {"kind": "lisa-trt/chameleon-engine"})) \
        == "chameleon"


def test_no_engine_directory_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match=r"not an engine directory.*manifest\.json.*lisa-trt export"):
        bundle_family(tmp_path)
    with pytest.raises(InputError, match="not valid JSON"):
        bundle_family(_write(tmp_path / "bad", MANIFEST_NAME, "{"))


def test_llamagen_exports_record_their_family(bundle):
    assert bundle.family == "llamagen"
    assert json.loads((bundle.dir / MANIFEST_NAME).read_text())["family"] == "llamagen"
    assert bundle_family(bundle.dir) == "llamagen"


def test_the_planner_reads_the_family(tmp_path):
    from lisa_trt.deploy.memory_plan import run_uses_cfg

    # no recorded CFG scale: the family's default (Lumina-mGPT 3.0 = on, LlamaGen 1.0 = off)
    assert run_uses_cfg(_write(tmp_path / "c", MANIFEST_NAME, {"family": "chameleon"}))
    assert not run_uses_cfg(_write(tmp_path / "l", MANIFEST_NAME, {"family": "llamagen"}))
    assert not run_uses_cfg(tmp_path / "none")
