"""Model names: a local checkpoint directory, or a Hugging Face repo id resolved to a snapshot.

    resolve_model("/srv/ckpt/llama8b")                       # an existing directory: itself
    resolve_model("/srv/models/smollm2.Q4_1.gguf")           # an existing GGUF file: itself
    resolve_model("Qwen/Qwen2.5-0.5B-Instruct")              # huggingface_hub's cache (downloads if missing)
    resolve_model("org/name", revision="v1.0")               # a branch, tag or commit

The repo id goes through `huggingface_hub.snapshot_download`, so its cache (`HF_HOME`,
`HF_HUB_CACHE`), token and offline mode (`HF_HUB_OFFLINE=1`: the cache only, no network) apply as
they do for transformers. Only the files graphrt reads are fetched: config.json, generation
config, tokenizer files and the safetensors weights (with their index).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

# files graphrt reads from a checkpoint (graphrt/checkpoint/loader.py, tokenizer.py; AutoTokenizer without tokenizer.json)
ALLOW_PATTERNS = ("*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt",
                  "*.jinja")
# "name" or "org/name" (letters, digits, '-', '_', '.'; no '--' or '..', not starting or ending with '-' or '.')
_REPO_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO_ID = re.compile(rf"^(?:{_REPO_PART}/)?{_REPO_PART}$")


def looks_like_repo_id(name: str) -> bool:
    """True for "name" or "org/name" spelled as the Hub allows (no path syntax: no leading
    '/', '.', '~', no backslash, at most one '/', no '--' or '..')."""
    return bool(_REPO_ID.match(name)) and "--" not in name and ".." not in name


def resolve_model(model, *, revision: str | None = None) -> Path:
    """model: a local checkpoint directory or GGUF file (str or Path) or a Hugging Face repo id.
    -> the local directory to load. An existing directory always wins (then revision must be
    None). Raises ValueError naming `model` (or `revision`) and what to do when the name is
    neither an existing directory nor a repo id that can be resolved."""
    if isinstance(model, Path):
        name = str(model)
    elif isinstance(model, str):
        name = model
    else:
        raise ValueError(f"model: expected a directory or a Hugging Face repo id (str), got {type(model).__name__}")
    if revision is not None and (not isinstance(revision, str) or not revision.strip()):
        raise ValueError(f"revision: expected a non-empty branch, tag or commit, got {revision!r}")
    local = Path(name).expanduser()
    if local.is_dir() or (local.is_file() and local.suffix.lower() == ".gguf"):   # a GGUF file: gguf_file.py
        if revision is not None:
            raise ValueError(f"revision: {revision!r} given, but model {name!r} is a local "
                             f"{'directory' if local.is_dir() else 'GGUF file'} "
                             f"(a revision selects a Hugging Face repo's snapshot)")
        return local
    if isinstance(model, Path) or not looks_like_repo_id(name) or local.suffix.lower() == ".gguf":
        return local                                   # the loader says the directory is missing
    return _snapshot(name, revision)


def _snapshot(repo_id: str, revision: str | None) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise ValueError(f"model: {repo_id!r} is not a local directory; resolving it as a Hugging Face "
                         f"repo id needs huggingface_hub (pip install huggingface_hub)") from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "on", "yes")
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=list(ALLOW_PATTERNS)))
    except LocalEntryNotFoundError:
        where = "HF_HUB_OFFLINE=1: looked in the cache only" if offline else "the Hub could not be reached"
        raise ValueError(f"model: {repo_id!r} is not a local directory and no snapshot of it"
                         f"{f' at revision {revision!r}' if revision else ''} is in the Hugging Face cache "
                         f"({where}; cache: {_cache_dir()})") from None
    except HfHubHTTPError as e:                        # unknown repo, gated, unknown revision
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"model: {repo_id!r} is not a local directory, and the Hugging Face Hub "
                         f"refused it{f' at revision {revision!r}' if revision else ''}: {first}") from None


def _cache_dir() -> str:
    try:
        from huggingface_hub import constants
        return str(constants.HF_HUB_CACHE)
    except ImportError:                                # pragma: no cover - checked by the caller
        return "?"


__all__ = ["resolve_model", "looks_like_repo_id", "ALLOW_PATTERNS"]
