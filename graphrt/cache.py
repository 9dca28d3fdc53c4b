"""Graph caches: a directory that lets a server start in seconds with zero compilation.

    DIR/manifest.json          config (+ digest), buckets, backend per bucket, per-bucket timings,
                               graph memory, verification error, versions, GPU, creation time,
                               every artifact with its sha256
    DIR/flashinfer/.cache/...  the FlashInfer JIT workspace the modules of this config were
                               built in (.so, objects, build.ninja, generated sources)
    DIR/triton/...             the Triton kernel cache (graphrt's prepare kernel)

CUDA graphs themselves cannot be serialised (they hold device addresses of one process), so a
cache stores what makes re-capture fast: compiled kernels. Loading points FlashInfer
(FLASHINFER_WORKSPACE_BASE) and Triton (TRITON_CACHE_DIR) at the cache
before either compiles anything, then captures; zero compilation is checked by the artifacts'
checksums being unchanged afterwards. Any difference in GPU, library versions, config
or artifact bytes raises CacheMismatchError naming it, before anything is loaded.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"
FORMAT = 1
FLASHINFER_DIR = "flashinfer"
TRITON_DIR = "triton"


class CacheMismatchError(RuntimeError):
    """The graph cache does not fit this process (or is damaged); the message says how to rebuild."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def environment() -> dict:
    """Versions and device facts a cache is only valid for."""
    import torch
    import triton

    import graphrt
    env = {"graphrt": graphrt.__version__, "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "python": platform.python_version(), "gpu": None,
           "compute_capability": None, "flashinfer": None}
    env["flashinfer"] = flashinfer_version()
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["compute_capability"] = "%d.%d" % torch.cuda.get_device_capability()
    return env


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


def point_compilers_at(cache_dir: Path) -> None:
    """Direct FlashInfer's JIT workspace and Triton's cache into `cache_dir` (this process).

    Used by graphrt-capture --out (the modules are built inside the cache) and by open_cache.
    Must run before FlashInfer is imported; raises CacheMismatchError if it already was with
    another workspace (its cache location is fixed at import). FlashInfer 0.7.4 runs ninja over
    a JIT module even when it is cached (a no-op when the build folder is complete and at the
    same absolute path: its build files record absolute paths, so a cache is bound to where it
    was built); FLASHINFER_DISABLE_JIT would refuse even a complete JIT cache, so zero
    compilation is proven instead by the artifacts' checksums being unchanged after loading.
    """
    fi_base = (cache_dir / FLASHINFER_DIR).resolve()
    env_mod = sys.modules.get("flashinfer.jit.env")
    if env_mod is not None and Path(env_mod.FLASHINFER_BASE_DIR).resolve() != fi_base:
        raise CacheMismatchError(
            f"FlashInfer was imported before the graph cache was opened (its JIT cache is "
            f"{env_mod.FLASHINFER_BASE_DIR}); open the cache first, in a fresh process")
    os.environ["FLASHINFER_WORKSPACE_BASE"] = str(fi_base)
    os.environ["TRITON_CACHE_DIR"] = str((cache_dir / TRITON_DIR).resolve())


@dataclass(frozen=True)
class Manifest:
    data: dict

    @classmethod
    def read(cls, cache_dir: Path) -> "Manifest":
        path = Path(cache_dir) / MANIFEST
        if not path.is_file():
            raise CacheMismatchError(f"{cache_dir}: no {MANIFEST}; not a graph cache "
                                     "(build one with graphrt-capture --config X --out DIR)")
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise CacheMismatchError(f"{path}: format {data.get('format')}, this graphrt reads {FORMAT}")
        return cls(data)

    def write(self, cache_dir: Path) -> None:
        (Path(cache_dir) / MANIFEST).write_text(json.dumps(self.data, indent=1, sort_keys=True))


LOAD_PARITY_SETS = 1
STATE_FILES = (".lock", ".ninja_log", ".ninja_deps")  # build-tool state: carried, not hashed


INTERMEDIATE = (".o",)  # object files: ninja needs them present, nothing loads them


def fingerprint(path: Path) -> str:
    """sha256 of a file that gets loaded or read; size only for build intermediates."""
    if path.name.endswith(INTERMEDIATE):
        return f"size:{path.stat().st_size}"
    return sha256(path)


def _artifact_files(cache_dir: Path):
    for sub in (FLASHINFER_DIR, TRITON_DIR):
        root = Path(cache_dir) / sub
        for p in sorted(root.rglob("*")) if root.exists() else []:
            if p.is_file() and not p.name.endswith(STATE_FILES):
                yield p


def collect_artifacts(cache_dir: Path) -> dict[str, str]:
    """Fingerprint of every file under the cache's artifact folders, keyed by relative path."""
    return {str(p.relative_to(cache_dir)): fingerprint(p) for p in _artifact_files(cache_dir)}


def stat_snapshot(cache_dir: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every artifact file: a rebuild while loading changes it (cheap)."""
    return {str(p.relative_to(cache_dir)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in _artifact_files(cache_dir)}


def build_manifest(config, rows: list[dict], artifacts: dict[str, str], *, mode: str) -> Manifest:
    return Manifest({
        "format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mode": mode, "config": config.to_dict(), "config_digest": config.digest(),
        "buckets": list(config.buckets),
        "bucket_backends": {str(r["bucket"]): r["backend_name"] for r in rows},
        "rows": rows, "environment": environment(), "artifacts": artifacts, "path": None,
    })


def check_cache(cache_dir: Path, *, config=None) -> Manifest:
    """Verify a cache against this process: environment, config, artifact checksums.

    Raises CacheMismatchError listing every difference; returns the manifest when it fits.
    """
    from .config import config_from_dict
    cache_dir = Path(cache_dir)
    m = Manifest.read(cache_dir)
    problems = []
    here = environment()
    for key, want in m.data["environment"].items():
        if key == "python":
            continue
        if here.get(key) != want:
            problems.append(f"{key}: cache built with {want!r}, this process has {here.get(key)!r}")
    cached_config = config_from_dict(m.data["config"], source=f"{cache_dir}/{MANIFEST}")
    if cached_config.digest() != m.data["config_digest"]:
        problems.append("config: manifest config does not match its digest (edited by hand?)")
    if config is not None and config.digest() != m.data["config_digest"]:
        problems.append(f"config: cache is for {m.data['config_digest']}, asked for {config.digest()}")
    for rel, digest in m.data["artifacts"].items():
        p = cache_dir / rel
        if not p.is_file():
            problems.append(f"artifact missing: {rel}")
        elif fingerprint(p) != digest:
            problems.append(f"artifact checksum mismatch: {rel}")
    if problems:
        raise CacheMismatchError(
            f"graph cache {cache_dir} does not fit:\n  - " + "\n  - ".join(problems) +
            f"\nrebuild it: graphrt-capture --config <your config.yaml> --out {cache_dir}")
    return m


def open_cache(runtime_cls, cache_dir, *, kv_cache, device, lazy: bool, progress: bool):
    """Check a cache, point the compilers at it, build and capture the runtime.

    Raises CacheMismatchError before loading anything if the cache does not fit, and after
    capture if any kernel had to be (re)compiled (the runtime is then dropped). The device
    planner's parity with FlashInfer's plan() was checked at build time on 4 length sets per
    bucket; loading re-checks LOAD_PARITY_SETS per bucket. With lazy=True the recompilation check
    covers only what capture() touched (setup: every FlashInfer module and the planning kernel).
    """
    from .config import config_from_dict
    t0 = time.perf_counter()
    cache_dir = Path(cache_dir)
    manifest = check_cache(cache_dir)
    if manifest.data["mode"] != "CUDA graphs" and str(device) != "cpu":
        raise CacheMismatchError(f"{cache_dir}: built in {manifest.data['mode']!r} mode on a machine "
                                 f"without CUDA; rebuild it on the GPU that will serve")
    t_checked = time.perf_counter()
    point_compilers_at(cache_dir)
    before = stat_snapshot(cache_dir)
    config = config_from_dict(manifest.data["config"], source=str(cache_dir / MANIFEST))
    backends = {int(k): v for k, v in manifest.data["bucket_backends"].items()}
    rt = runtime_cls(config, kv_cache, device, bucket_backends=backends, lazy=lazy,
                     parity_sets=LOAD_PARITY_SETS)
    t_built = time.perf_counter()
    rt.capture(progress=progress)
    t_captured = time.perf_counter()
    rt.startup_s = {"check": t_checked - t0, "construct": t_built - t_checked,
                    "setup_and_capture": t_captured - t_built}
    after = stat_snapshot(cache_dir)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if changed:
        raise CacheMismatchError(f"{cache_dir}: kernels were (re)compiled while loading "
                                 f"({changed[:3]}...): the cache is incomplete or was moved from "
                                 f"{manifest.data.get('path')}; rebuild it with graphrt-capture --out")
    return rt
