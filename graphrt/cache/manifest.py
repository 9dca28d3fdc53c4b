"""A graph cache's manifest: what it records about the build (environment, config, buckets,
per-bucket measurements, the sha256 of every file) and its own digest, the sha256 of its bytes."""
from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path

from graphrt.config import check_json_depth
from graphrt.cache.files import MANIFEST, collect_artifacts, drop_group_other_write

FORMAT = 2  # 2: sha256 of every file (1 recorded sizes of object files)


class CacheMismatchError(RuntimeError):
    """The graph cache does not fit this process, is damaged or is not trusted; the message
    names each file and what differs, and says how to rebuild."""


def environment() -> dict:
    """Versions and device facts a cache is only valid for."""
    import torch

    import graphrt
    env = {"graphrt": graphrt.__version__, "torch": torch.__version__, "triton": triton_version(),
           "cuda": torch.version.cuda, "python": platform.python_version(), "gpu": None,
           "compute_capability": None, "flashinfer": None}
    env["flashinfer"] = flashinfer_version()
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["compute_capability"] = "%d.%d" % torch.cuda.get_device_capability()
    return env


def triton_version() -> str | None:
    """Triton's version (None: not installed, as on a CPU install); read without importing it
    where it is not imported yet."""
    import sys
    mod = sys.modules.get("triton")
    if mod is not None:
        return mod.__version__
    try:
        from importlib.metadata import version
        return version("triton")
    except Exception:  # noqa: BLE001 - not installed
        return None


def flashinfer_version() -> str | None:
    """FlashInfer's version without importing it (importing fixes its JIT cache location)."""
    import importlib.util
    import re
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        return None
    meta = Path(list(spec.submodule_search_locations)[0]) / "_build_meta.py"
    found = re.search(r'__version__\s*=\s*"([^"]+)"', meta.read_text()) if meta.is_file() else None
    if found:
        return found.group(1)
    try:
        from importlib.metadata import version
        return version("flashinfer-python")
    except Exception:  # noqa: BLE001 - no metadata either
        return None


def same_environment(key: str, built: object, here: object) -> bool:
    """Python is compared by major.minor (the ABI of compiled launchers); the rest exactly."""
    if key == "python" and isinstance(built, str) and isinstance(here, str):
        return built.split(".")[:2] == here.split(".")[:2]
    return built == here


def _dumps(data: dict) -> bytes:
    return json.dumps(data, indent=1, sort_keys=True).encode()


@dataclass(frozen=True)
class Manifest:
    """A cache's manifest.json: its parsed data and `digest`, the sha256 of the file's bytes."""
    data: dict
    digest: str

    @classmethod
    def from_data(cls, data: dict) -> "Manifest":
        return cls(data, hashlib.sha256(_dumps(data)).hexdigest())

    @classmethod
    def read(cls, cache_dir: Path, *, expect_digest: str | None = None) -> "Manifest":
        """Read and parse DIR/manifest.json once (the digest is of the bytes parsed); refuse a
        digest other than `expect_digest`, invalid JSON or another format."""
        path = Path(cache_dir) / MANIFEST
        if not path.is_file():
            raise CacheMismatchError(f"{cache_dir}: no {MANIFEST}; not a graph cache "
                                     "(build one with graphrt-capture --config X --out DIR)")
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise CacheMismatchError(f"{path}: cannot be read ({e.strerror})") from None
        digest = hashlib.sha256(raw).hexdigest()
        if expect_digest is not None and digest != expect_digest:
            raise CacheMismatchError(f"{path}: sha256 {digest}, but the caller pinned "
                                     f"{expect_digest} (edited or another cache)")
        try:
            text = raw.decode("utf-8")
            check_json_depth(text, str(path))
            data = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CacheMismatchError(f"{path}: not valid JSON (truncated or edited?): {e}") from None
        except ValueError as e:                    # nested too deep: check_json_depth names the file
            raise CacheMismatchError(str(e)) from None
        if not isinstance(data, dict):
            raise CacheMismatchError(f"{path}: top level is {type(data).__name__}, not an object")
        if data.get("format") != FORMAT:
            raise CacheMismatchError(f"{path}: format {data.get('format')!r}, this graphrt reads "
                                     f"{FORMAT}; rebuild it with graphrt-capture --out")
        return cls(data, digest)

    def write(self, cache_dir: Path) -> str:
        """Write DIR/manifest.json; returns its digest."""
        (Path(cache_dir) / MANIFEST).write_bytes(_dumps(self.data))
        return self.digest


def build_manifest(config, rows: list[dict], artifacts: dict[str, str], *, mode: str,
                   path: str | None = None, built_for: dict | None = None, plans: dict | None = None) -> Manifest:
    """built_for: what a model cache (graphrt-capture --model) was built for, {"model": {...},
    "engine": {...}} (graphrt/serve/cache_pin.py: built_for); absent for a runtime cache.
    plans: the decode plans its capture measured (graphrt/model/plans.py; a warm start takes
    them instead of measuring), absent where nothing was measured."""
    data = {
        "format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mode": mode, "config": config.to_dict(), "config_digest": config.digest(),
        "buckets": list(config.buckets),
        "bucket_backends": {str(r["bucket"]): r["backend_name"] for r in rows},
        "rows": rows, "environment": environment(), "artifacts": artifacts, "path": path,
    }
    if built_for is not None:
        data["built_for"] = built_for
    if plans:
        data["plans"] = plans
    return Manifest.from_data(data)


def write_cache_manifest(cache_dir: Path, config, rows: list[dict], *, mode: str,
                         built_for: dict | None = None, plans: dict | None = None) -> str:
    """Hash every file in `cache_dir`, write the manifest, drop group/other write permission
    (graphrt-capture's last step). Returns the manifest digest to pin."""
    cache_dir = Path(cache_dir)
    drop_group_other_write(cache_dir)
    manifest = build_manifest(config, rows, collect_artifacts(cache_dir), mode=mode,
                              path=str(cache_dir.resolve()), built_for=built_for, plans=plans)
    digest = manifest.write(cache_dir)
    drop_group_other_write(cache_dir)
    return digest

