"""`--model org/name`: Hugging Face model names resolved through the local Hugging Face cache.

Lumina-mGPT and Janus-Pro weights are named the way the Hub names them
(`Alpha-VLLM/Lumina-mGPT-7B-768`, `deepseek-ai/Janus-Pro-7B`). `resolve_model` turns such a
name into the local snapshot directory, so every `--model` (and `Pipeline.from_dir`) accepts
one; anything else is handed back unchanged:

    resolve_model("demo")                       # a bundled artifact set: "demo"
    resolve_model("runs/t.safetensors")         # a local path (existing or not): unchanged
    resolve_model("org/name")                   # ~/.cache/huggingface/hub/models--org--name/snapshots/<hash>
    resolve_model("org/name@v1.0")              # a branch, tag or commit of it

A snapshot already in the cache is used as it is, without network (`huggingface-cli download
org/name` updates it). A name missing from the cache is downloaded, unless HF_HUB_OFFLINE is
set: then it is refused with the fix. The cache is HF_HUB_CACHE, else HF_HOME/hub, else
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
            f"--model {name!r} is neither an existing file or directory nor a Hugging Face name: use org/name "
            "or org/name@revision (letters, digits, '-', '_', '.'), e.g. my-org/my-model@main")
    return m["repo"], m["rev"]


def resolve_model(name_or_path) -> Union[Path, str]:
    """The local source of a model: a Hub name's snapshot directory, anything else unchanged.

    Args:
        name_or_path: a local path (str or Path), a bundled artifact-set name ("demo"), or a
            Hugging Face name `org/name` / `org/name@revision`.
    Returns:
        `name_or_path` unchanged, or the Path of the cached snapshot of the Hub name.
    Raises:
        HubModelError: malformed name; not in the cache with HF_HUB_OFFLINE set (the message says
            to run `huggingface-cli download org/name` with network, or to unset HF_HUB_OFFLINE);
            huggingface_hub missing; a failed download.
    """
    parsed = hub_name(name_or_path)
    if parsed is None:
        return name_or_path
    repo, rev = parsed
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise HubModelError(f"--model {name_or_path!r} is a Hugging Face name, which needs huggingface_hub: "
                            "pip install huggingface_hub (or pass the local directory)") from None
    kw = dict(revision=rev, cache_dir=_cache_dir())
    try:
        return Path(snapshot_download(repo, local_files_only=True, **kw))  # cached: no network
    except LocalEntryNotFoundError:
        pass
    where = f"revision {rev!r} of " if rev else ""
    if _offline():
        raise HubModelError(
            f"--model {name_or_path!r}: no local file or directory of that name, and {where}Hugging Face repo "
            f"{repo!r} is not in the local cache ({_cache_dir() or 'the default HF cache'}) while HF_HUB_OFFLINE "
            f"is set; run `huggingface-cli download {repo}"
            + (f" --revision {rev}" if rev else "") + "` with network, or unset HF_HUB_OFFLINE")
    try:
        return Path(snapshot_download(repo, **kw))
    except Exception as e:  # noqa: BLE001 - network, gated or missing repo: one message with the cause
        raise HubModelError(f"--model {name_or_path!r}: could not download {where}Hugging Face repo {repo!r} "
                            f"({type(e).__name__}: {' '.join(str(e).split())[:300]}); check the name and your "
                            f"access, or pass a local directory") from None


__all__ = ["HubModelError", "hub_name", "resolve_model"]
