"""`--model org/name`: Hugging Face model names resolved through the local Hugging Face cache.

Lumina-mGPT and Janus-Pro weights are named the way the Hub names them
(`Alpha-VLLM/Lumina-mGPT-7B-768`, `deepseek-ai/Janus-Pro-7B`). `resolve_model` turns such a
name into the local snapshot directory, so every `--model` (and `Pipeline.from_dir`) accepts
one; anything else is handed back unchanged:

    resolve_model("demo")                       # a bundled artifact set: "demo"
    resolve_model("runs/t.safetensors")         # a local path (existing or not): unchanged
    resolve_model("org/name")                   # ~/.cache/huggingface/hub/models--org--name/snapshots/<hash>
    resolve_model("org/name@v1.0")              # a branch, tag or commit of it

A snapshot already in the cache is used as it is, without network (`hf download org/name`
updates it). A name missing from the cache is downloaded, unless HF_HUB_OFFLINE is set: then it
is refused with the fix. A download fetches only what the command reads (`need`: config.json
for `lisa-trt plan`, the weights for the rest, never a repository's duplicate weight formats),
and says first how many files and bytes (the Hub's file metadata). A Hub that cannot be reached is
a HubModelError naming the fix, never huggingface_hub's traceback. The cache is HF_HUB_CACHE, else HF_HOME/hub, else
huggingface_hub's default, read when the name is resolved (docs/cli.md).

Floors: models (imports only core modules and the artifact-set registry).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional, Union

from ..errors import InputError
from .artifact_sets import artifact_set

# org/name[@revision]: the Hub's repo-id characters (huggingface_hub.utils.validate_repo_id)
_NAME = re.compile(r"^(?P<repo>[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?/[A-Za-z0-9_](?:[\w.-]*[\w])?)"
                   r"(?:@(?P<rev>[\w./-]+))?$")
# a string ending like a file is a local path, never a Hub name (it reports itself as missing)
_FILE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".json", ".jsonl", ".npy", ".txt", ".onnx",
                  ".engine", ".plan", ".yaml")


class HubModelError(InputError):
    """A `--model org/name` that cannot be resolved: a malformed name, a repository missing from the
    local Hugging Face cache while HF_HUB_OFFLINE is set, or a failed download."""


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", "0", "false", "no", "off")


def _cache_dir() -> Optional[str]:
    """The hub cache, read from the environment now (huggingface_hub reads it once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None  # huggingface_hub's default


def hub_name(name) -> Optional[tuple]:
    """(repo_id, revision or None) when `name` is meant as a Hub name, else None.

    Raises:
        HubModelError: `name` looks like a Hub name (one '/', or an '@revision') but is malformed.
    """
    if not isinstance(name, str) or artifact_set(name) is not None or Path(name).expanduser().exists():
        return None
    if name.startswith(("/", ".", "~")) or "\\" in name or name.lower().endswith(_FILE_SUFFIXES):
        return None  # a local path: the loader says it is missing
    head = name.split("@", 1)[0]
    if head.count("/") != 1 and "@" not in name:
        return None  # a plain name (GPT-B) or a deeper relative path
    m = _NAME.match(name)
    if m is None or "--" in m["repo"] or ".." in m["repo"] or len(m["repo"]) > 96:
        raise HubModelError(
            f"the model {name!r} is neither an existing file or directory nor a Hugging Face name: use org/name "
            "or org/name@revision (letters, digits, '-', '_', '.'), e.g. my-org/my-model@main")
    return m["repo"], m["rev"]


# What a command needs of a Hub repository: `lisa-trt plan` reads the shapes (config.json); every
# other command loads the weights: the repository's files less the duplicate weight formats
# (when it ships .safetensors, its .bin / .pt / ... copies are not fetched).
NEEDS = ("config", "weights")
_CONFIG_FILES = ("config.json",)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
# the model's weights again in another format (a decoder's own .pt / .ckpt is kept)
_DUPLICATE_FORMATS = ("pytorch_model*.bin", "pytorch_model.bin.index.json", "model*.bin", "model*.pt", "model*.pth",
                      "consolidated*.pth", "tf_model*", "flax_model*", "*.msgpack", "*.h5", "*.onnx", "*.onnx_data",
                      "*.gguf", "*.ot")
_NOT_NEEDED = ("*.md", ".gitattributes", "*.png", "*.jpg", "*.jpeg", "*.gif", "*.webp", "*.mp4")


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _download_command(repo: str, rev: Optional[str], need: str) -> str:
    """The huggingface_hub CLI command (`hf download`) that fetches what `need` reads."""
    files = " " + " ".join(_CONFIG_FILES) if need == "config" else ""
    return f"hf download {repo}{files}" + (f" --revision {rev}" if rev else "")


def select_files(files: dict, need: str, repo: str) -> list:
    """The file names of a repository listing ({name: size or None}) that `need` fetches.

    Raises:
        HubModelError: the repository is not a model directory lisa-trt loads (no config.json).
    """
    import fnmatch

    if need not in NEEDS:
        raise ValueError(f"need must be one of {NEEDS}, got {need!r}")
    if not any(f in files for f in _CONFIG_FILES):
        ckpts = sorted(f for f in files if f.endswith(_WEIGHT_SUFFIXES))
        shown = ", ".join(ckpts[:4]) + (f" (+{len(ckpts) - 4} more)" if len(ckpts) > 4 else "")
        raise HubModelError(
            f"Hugging Face repo {repo!r} is not a model directory lisa-trt loads (it has no config.json)"
            + (f"; it holds checkpoint files ({shown}): download the one you need, e.g. `hf download {repo} "
               f"{ckpts[0]} --local-dir .`, and pass that file as --model" if ckpts else "")
            + ". Nothing was downloaded.")
    if need == "config":
        return [f for f in _CONFIG_FILES if f in files]

    has_safetensors = any(f.endswith(".safetensors") for f in files)
    pats = _NOT_NEEDED + (_DUPLICATE_FORMATS if has_safetensors else ())
    return sorted(f for f in files if not any(fnmatch.fnmatch(f.rsplit("/", 1)[-1], p) for p in pats))


def _has_need(snapshot: Path, need: str) -> bool:
    """True when a cached snapshot holds what `need` reads (a config; for weights, a weights file too)."""
    if not any((snapshot / f).is_file() for f in _CONFIG_FILES):
        return False
    return need == "config" or any(p.suffix in _WEIGHT_SUFFIXES for p in snapshot.rglob("*") if p.is_file())


def _listing(repo: str, rev: Optional[str], shown: str) -> dict:
    """{file name: size in bytes or None} of a Hub repository (huggingface_hub's file metadata)."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(repo, revision=rev, files_metadata=True)
    except Exception as e:  # noqa: BLE001 - no network, gated / missing repo: one message with the cause
        raise _download_error(shown, repo, rev, e) from None
    return {s.rfilename: getattr(s, "size", None) for s in (info.siblings or [])}


def _download_error(shown: str, repo: str, rev: Optional[str], e: Exception) -> "HubModelError":
    where = f"revision {rev!r} of " if rev else ""
    cause = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    return HubModelError(
        f"the model {shown!r}: {where}Hugging Face repo {repo!r} is not in the local cache "
        f"({_cache_dir() or 'the default HF cache'}) and could not be fetched ({cause}). Check the name, your "
        f"network and access (gated repos need `hf auth login`); or fetch it where there is network "
        f"(`{_download_command(repo, rev, 'weights')}`) and copy the cache, or pass a local directory. "
        "Set HF_HUB_OFFLINE=1 to fail at once without trying the network.")


def resolve_model(name_or_path, *, need: str = "weights", notify=None) -> Union[Path, str]:
    """The local source of a model: a Hub name's snapshot directory, anything else unchanged.

    Args:
        name_or_path: a local path (str or Path), a bundled artifact-set name ("demo"), or a
            Hugging Face name `org/name` / `org/name@revision`.
        need: what the command reads of a Hub repository: "config" (`lisa-trt plan`: config.json
            only) or "weights" (everything a loader reads, not the duplicate weight formats).
        notify: callable for the one line said before a download (what and how much; default stderr).
    Returns:
        `name_or_path` unchanged, or the Path of the cached snapshot of the Hub name.
    Raises:
        HubModelError: malformed name; not in the cache with HF_HUB_OFFLINE set (the message gives
            the `hf download` command, or says to unset HF_HUB_OFFLINE); huggingface_hub missing; the
            Hub unreachable or the download failed; a repository that is not a model directory.
    """
    parsed = hub_name(name_or_path)
    if parsed is None:
        return name_or_path
    repo, rev = parsed
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise HubModelError(f"the model {name_or_path!r} is a Hugging Face name, which needs huggingface_hub: "
                            "pip install huggingface_hub (or pass the local directory)") from None
    kw = dict(revision=rev, cache_dir=_cache_dir())
    try:
        local = Path(snapshot_download(repo, local_files_only=True, **kw))  # cached: no network
        if _has_need(local, need):
            return local
    except LocalEntryNotFoundError:
        pass
    where = f"revision {rev!r} of " if rev else ""
    if _offline():
        raise HubModelError(
            f"the model {name_or_path!r}: no local file or directory of that name, and {where}Hugging Face repo "
            f"{repo!r} is not in the local cache ({_cache_dir() or 'the default HF cache'}) while HF_HUB_OFFLINE "
            f"is set; run `{_download_command(repo, rev, need)}` with network, or unset HF_HUB_OFFLINE")
    files = _listing(repo, rev, name_or_path)
    allow = select_files(files, need, repo)
    sizes = [files[f] for f in allow]
    size = _human(sum(s for s in sizes if s)) + ("" if all(s is not None for s in sizes) else " or more")
    (notify or _stderr)(f"downloading {len(allow)} file(s), {size}, of {where}Hugging Face repo {repo} "
                        f"({'its config only' if need == 'config' else 'config and weights'}) into "
                        f"{_cache_dir() or 'the default HF cache'}")
    try:
        return Path(snapshot_download(repo, allow_patterns=allow, **kw))
    except Exception as e:  # noqa: BLE001 - network, gated or missing repo: one message with the cause
        raise _download_error(name_or_path, repo, rev, e) from None


def _stderr(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr, flush=True)


__all__ = ["NEEDS", "HubModelError", "hub_name", "resolve_model", "select_files"]
