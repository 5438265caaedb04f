"""Issue 52: a Hub id fetches only what the command needs (allow_patterns), says how much first,
names `hf download` offline, and an unreachable Hub is a lisa-trt error. No network here:
huggingface_hub's functions are replaced (snapshot_download, HfApi.model_info)."""

from types import SimpleNamespace

import pytest
from click.testing import CliRunner

hfh = pytest.importorskip("huggingface_hub")

from lisa_trt.models import hub  # noqa: E402
from lisa_trt.models.hub import HubModelError, resolve_model  # noqa: E402

REPO_FILES = {"config.json": 1_000, "model-00001-of-00002.safetensors": 4_000_000_000,
              "model-00002-of-00002.safetensors": 2_500_000_000, "model.safetensors.index.json": 20_000,
              "pytorch_model.bin": 13_000_000_000, "tokenizer.json": 2_000_000, "README.md": 5_000,
              "vqgan/vqgan.ckpt": 300_000_000, "vqgan/vqgan.yaml": 1_000, "assets/sample.png": 90_000,
              "pytorch_model.bin.index.json": 30_000, "tf_model.h5": 13_000_000_000, "vq/vq_ds16.pt": 280_000_000}


class FakeHub:
    """snapshot_download / model_info stand-ins recording their calls; nothing cached."""

    def __init__(self, tmp_path, files=REPO_FILES, listing_error=None, download_error=None):
        self.calls, self.files, self.snap = [], files, tmp_path / "snap"
        self.listing_error, self.download_error = listing_error, download_error

    def snapshot_download(self, repo, **kw):
        self.calls.append(("snapshot_download", repo, kw))
        if kw.get("local_files_only"):
            raise hfh.errors.LocalEntryNotFoundError("not in the cache")
        if self.download_error:
            raise self.download_error
        self.snap.mkdir(exist_ok=True)
        return str(self.snap)

    def model_info(self, repo, **kw):
        self.calls.append(("model_info", repo, kw))
        if self.listing_error:
            raise self.listing_error
        return SimpleNamespace(siblings=[SimpleNamespace(rfilename=f, size=s) for f, s in self.files.items()])

    def downloads(self):
        return [kw for name, _, kw in self.calls if name == "snapshot_download" and not kw.get("local_files_only")]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    f = FakeHub(tmp_path)
    monkeypatch.setattr(hfh, "snapshot_download", f.snapshot_download)
    monkeypatch.setattr(hfh.HfApi, "model_info", f.model_info)
    return f


def test_plan_fetches_config_json_only_and_says_how_much(fake):
    said = []
    assert resolve_model("org/name", need="config", notify=said.append) == fake.snap
    assert [d["allow_patterns"] for d in fake.downloads()] == [["config.json"]]
    assert len(said) == 1 and "1 file(s), 1.0 KB" in said[0] and "org/name" in said[0] and "config only" in said[0]


def test_weights_skip_duplicate_formats_and_docs_and_say_the_size_first(fake):
    said = []

    def notify(msg):
        assert not fake.downloads(), "the size is said before the download starts"
        said.append(msg)

    resolve_model("org/name@v1", notify=notify)
    (dl,) = fake.downloads()
    assert dl["revision"] == "v1"
    assert dl["allow_patterns"] == ["config.json", "model-00001-of-00002.safetensors",
                                    "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                                    "tokenizer.json", "vq/vq_ds16.pt", "vqgan/vqgan.ckpt", "vqgan/vqgan.yaml"]
    want = sum(REPO_FILES[f] for f in dl["allow_patterns"])
    assert f"{len(dl['allow_patterns'])} file(s), {want / 1e9:.1f} GB" in said[0]


def test_a_repo_of_bin_files_keeps_them(fake):
    fake.files = {"config.json": 10, "pytorch_model.bin": 10, "README.md": 1}
    resolve_model("org/name", notify=lambda m: None)
    assert fake.downloads()[0]["allow_patterns"] == ["config.json", "pytorch_model.bin"]


def test_a_repo_without_config_is_refused_before_downloading(fake):
    fake.files = {"c2i_B_256.pt": 10, "c2i_L_256.pt": 10, "README.md": 1}
    with pytest.raises(HubModelError) as e:
        resolve_model("FoundationVision/LlamaGen", notify=lambda m: pytest.fail("no download"))
    assert "hf download FoundationVision/LlamaGen c2i_B_256.pt" in str(e.value) and "config.json" in str(e.value)
    assert not fake.downloads()


def test_an_unreachable_hub_is_a_lisa_trt_error(fake):
    fake.listing_error = ConnectionError("[Errno -3] Temporary failure in name resolution")
    with pytest.raises(HubModelError) as e:
        resolve_model("org/name")
    msg = str(e.value)
    assert "ConnectionError" in msg and "org/name" in msg and "HF_HUB_OFFLINE" in msg and "hf download org/name" in msg
    assert not fake.downloads()
    fake.listing_error, fake.download_error = None, OSError("connection reset")
    with pytest.raises(HubModelError, match="connection reset"):
        resolve_model("org/name", notify=lambda m: None)


def test_the_cli_prints_no_traceback_when_the_hub_is_unreachable(fake):
    from lisa_trt.cli import main

    fake.listing_error = hfh.errors.LocalEntryNotFoundError("ConnectError: cannot reach huggingface.co")
    r = CliRunner().invoke(main, ["plan", "org/name"])
    assert r.exit_code == 2 and "Traceback" not in r.output and "error: the model 'org/name'" in r.output, r.output


def test_plan_asks_for_the_config_only(fake, monkeypatch):
    """`lisa-trt plan org/name` resolves with need="config" (the download's allow_patterns)."""
    from lisa_trt.cli import main

    seen = []

    def resolve(m, **kw):
        seen.append(kw)
        raise HubModelError("stop here")

    monkeypatch.setattr(hub, "resolve_model", resolve)
    r = CliRunner().invoke(main, ["plan", "org/name"])
    assert r.exit_code == 2 and "stop here" in r.output, r.output
    assert seen == [{"need": "config"}]


def test_offline_names_hf_download(tmp_path, monkeypatch, fake):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubModelError) as e:
        resolve_model("org/name@v2", need="config")
    assert "hf download org/name config.json --revision v2" in str(e.value)
    assert "huggingface-cli" not in str(e.value) and not fake.downloads()


def test_a_config_only_cache_is_completed_for_weights(tmp_path, monkeypatch, fake):
    """A snapshot `plan` cached (config.json only) is enough for plan, not for a command loading weights."""
    snap = tmp_path / "cached"
    snap.mkdir()
    (snap / "config.json").write_text("{}")

    def snapshot_download(repo, **kw):
        fake.calls.append(("snapshot_download", repo, kw))
        return str(snap) if kw.get("local_files_only") else str(fake.snap)

    monkeypatch.setattr(hfh, "snapshot_download", snapshot_download)
    assert resolve_model("org/name", need="config") == snap and not fake.downloads()
    assert resolve_model("org/name", notify=lambda m: None) == fake.snap and len(fake.downloads()) == 1
