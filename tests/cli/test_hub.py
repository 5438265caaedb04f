"""`--model org/name` through the local Hugging Face cache (models/hub.py), offline, on a fake cache.

The cache layout is huggingface_hub's: HF_HUB_CACHE/models--org--name/refs/<branch> holds a
commit hash, snapshots/<hash>/ the files. With HF_HUB_OFFLINE=1 nothing touches the network.
"""

import pytest
from click.testing import CliRunner

pytest.importorskip("huggingface_hub")

from lisa_trt.models.hub import HubModelError, hub_name, resolve_model  # noqa: E402

HASH = "0123456789abcdef0123456789abcdef01234567"


def make_cache(root, repo="org/name", refs=("main",), commit=HASH):
    d = root / ("models--" + repo.replace("/", "--"))
    (d / "refs").mkdir(parents=True)
    for ref in refs:
        (d / "refs" / ref).write_text(commit)
    snap = d / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"model_type": "chameleon"}')
    (snap / "model.safetensors").write_bytes(b"")  # a weights file: what every command but plan reads
    return snap


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return root


def test_a_cached_name_resolves_offline_to_its_snapshot(cache):
    snap = make_cache(cache, refs=("main", "v1"))
    assert resolve_model("org/name") == snap
    assert resolve_model("org/name@v1") == snap
    assert resolve_model(f"org/name@{HASH}") == snap
    assert (resolve_model("org/name") / "config.json").is_file()


def test_hf_home_is_used_without_hf_hub_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snap = make_cache(tmp_path / "home" / "hub")
    assert resolve_model("org/name") == snap


def test_a_missing_repo_fails_clearly_offline(cache):
    make_cache(cache)
    with pytest.raises(HubModelError) as e:
        resolve_model("org/missing")
    msg = str(e.value)
    assert "hf download org/missing" in msg and "HF_HUB_OFFLINE" in msg and "org/missing" in msg
    with pytest.raises(HubModelError, match="--revision v9"):
        resolve_model("org/name@v9")  # the repo is cached, that revision is not


def test_local_paths_and_set_names_are_unchanged(cache, tmp_path):
    f = tmp_path / "t.safetensors"
    f.write_bytes(b"")
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "local").mkdir()
    for name in ("demo", str(f), f, "runs/missing.safetensors", "GPT-B", "./x/y", "/abs/path", "a/b/c"):
        assert resolve_model(name) == name
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert resolve_model("org/local") == "org/local"  # an existing relative directory wins
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("bad", ["org/na me", "org/name@", "-org/name", "org/name@v1@v2", "name@main", "o--x/name"])
def test_malformed_names_are_refused(bad):
    with pytest.raises(HubModelError, match="org/name or org/name@revision"):
        hub_name(bad)


def test_the_cli_resolves_model_names(cache, monkeypatch):
    """`generate --model org/name` hands the snapshot to the generic entry; a missing one exits 2."""
    snap = make_cache(cache)
    from lisa_trt.cli import main
    from lisa_trt.runtime.commands import generate as G

    seen = {}
    monkeypatch.setattr(G, "generate", lambda rc, **kw: seen.update(source=rc.source, prompts=kw["prompts"]))
    r = CliRunner().invoke(main, ["generate", "--model", "org/name", "--prompt", "a fox"])
    assert r.exit_code == 0, r.output
    assert seen["source"] == snap and seen["prompts"] == ("a fox",)
    r = CliRunner().invoke(main, ["generate", "--model", "org/missing", "--prompt", "a fox"])
    assert r.exit_code == 2 and "hf download org/missing" in r.output and "Traceback" not in r.output
