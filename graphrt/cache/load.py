"""Graph caches: a directory that lets a server start in seconds with zero compilation.

    DIR/manifest.json          config (+ digest), buckets, backend per bucket, per-bucket timings,
                               graph memory, verification error, versions, GPU, creation time,
                               the sha256 of every other file in DIR
    DIR/flashinfer/.cache/...  the FlashInfer JIT workspace the modules of this config were
                               built in (.so, objects, build.ninja, generated sources)
    DIR/triton/...             the Triton kernel cache (graphrt's prepare kernel)

CUDA graphs themselves cannot be serialised (they hold device addresses of one process), so a
cache stores what makes re-capture fast: compiled kernels. Loading points FlashInfer
(FLASHINFER_WORKSPACE_BASE) and Triton (TRITON_CACHE_DIR) at the cache only while it loads (and
while a lazy bucket is captured), then captures; zero compilation is checked by the files being
unchanged afterwards. Before anything is loaded, check_cache refuses (CacheMismatchError naming
the file and what differs) any difference in GPU, library versions or config, any file whose
sha256 differs from the manifest, unlisted or missing files, symlinks, manifest paths outside
the cache, and (unless trust_unsafe_permissions) a cache another user could write: see README
"Graph cache trust model" and files.py. Pins: expect_digest (sha256 of manifest.json, which
graphrt-capture prints) and config.
"""
from __future__ import annotations

import os
import re
import time
from contextlib import contextmanager
from pathlib import Path

from graphrt.cache.files import MANIFEST, entry_problem, hash_files, sha256, stat_snapshot, walk
from graphrt.cache.manifest import (FORMAT, CacheMismatchError, Manifest, build_manifest, environment,
                             flashinfer_version, same_environment, write_cache_manifest)

__all__ = ["CacheMismatchError", "Manifest", "check_cache", "open_cache", "compilers_at", "reading_from",
           "build_manifest", "write_cache_manifest", "environment", "flashinfer_version",
           "sha256", "FORMAT"]

FLASHINFER_DIR = "flashinfer"
TRITON_DIR = "triton"
MODES = ("CUDA graphs", "eager")
COMPILER_ENV = ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR")
MAX_LISTED = 20  # problems listed in one error; the rest are counted
HEX64 = re.compile(r"[0-9a-f]{64}")
LOAD_PARITY_SETS = 1


@contextmanager
def compilers_at(cache_dir: Path):
    """Point FlashInfer's JIT workspace and Triton's cache at `cache_dir` inside the block only
    (the build: graphrt-capture compiles into the cache).

    Sets FLASHINFER_WORKSPACE_BASE and TRITON_CACHE_DIR and restores their previous values (or
    absence) on exit, also when the block raises. Triton reads TRITON_CACHE_DIR each time it looks
    a kernel up, so the block must hold every launch that may compile (capture, lazy capture).
    FlashInfer reads its variable once, when it is imported, and then keeps the cache's workspace
    for the rest of the process: enter this before FlashInfer is imported; raises
    CacheMismatchError if it already was with another workspace. FlashInfer 0.7.4 runs ninja over
    a JIT module even when it is cached (a no-op when the build folder is complete and at the same
    absolute path: its build files record absolute paths, so a cache is bound to where it was
    built); FLASHINFER_DISABLE_JIT would refuse even a complete JIT cache, so zero compilation is
    proven instead by the files being unchanged after loading (`loading_from`).
    The variables are process-wide: another thread compiling meanwhile would also use the cache.
    """
    with _compiler_env(cache_dir, (Path(cache_dir) / TRITON_DIR).resolve()):
        yield


@contextmanager
def reading_from(cache_dir: Path, *, private_dir: Path | None = None):
    """The serving scope (`graphrt serve --graph-cache`): Triton reads kernels from the cache and
    never writes into it; yields the ReadThroughCache (its counts: loaded / compiled), or None.

    Triton: a read-through cache manager (graphrt/cache/triton_cache.py) reads DIR/triton, and a
    kernel missing there is compiled into `private_dir` (default: the Triton cache this process
    would use without a graph cache: TRITON_CACHE_DIR, else Triton's default), with one warning
    line naming it; TRITON_CACHE_DIR points at `private_dir` meanwhile. A Triton without the
    cache-manager knob gets one warning and compiles into the cache as compilers_at does.
    FlashInfer: as compilers_at (its JIT workspace is the cache's; FlashInfer has no read-only
    mode, so a JIT module missing from the cache is built into it, which the next start refuses).
    """
    from graphrt.cache.triton_cache import read_through, supported
    pinned = (Path(cache_dir) / TRITON_DIR).resolve()
    if private_dir is None:
        private_dir = Path(os.environ.get("TRITON_CACHE_DIR") or
                           os.path.join(os.path.expanduser("~"), ".triton", "cache"))
    triton_dir = Path(private_dir).resolve() if supported() else pinned
    with _compiler_env(cache_dir, triton_dir), read_through(pinned, Path(private_dir)) as cache:
        yield cache


@contextmanager
def _compiler_env(cache_dir: Path, triton_dir: Path):
    """FLASHINFER_WORKSPACE_BASE = cache_dir/flashinfer and TRITON_CACHE_DIR = triton_dir inside
    the block, restored after (also on raise); refuses a FlashInfer imported with another
    workspace (CacheMismatchError)."""
    import sys
    fi_base = (Path(cache_dir) / FLASHINFER_DIR).resolve()
    env_mod = sys.modules.get("flashinfer.jit.env")
    if env_mod is not None and Path(env_mod.FLASHINFER_BASE_DIR).resolve() != fi_base:
        raise CacheMismatchError(
            f"FlashInfer was imported before the graph cache was opened (its JIT cache is "
            f"{env_mod.FLASHINFER_BASE_DIR}); open the cache first, in a fresh process")
    saved = {name: os.environ.get(name) for name in COMPILER_ENV}
    os.environ["FLASHINFER_WORKSPACE_BASE"] = str(fi_base)
    os.environ["TRITON_CACHE_DIR"] = str(triton_dir)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def loading_from(cache_dir: Path, built_at: str | None = None):
    """compilers_at(cache_dir), and refuse (CacheMismatchError) if the block (re)compiled anything:
    any file of the cache created, changed or removed, build-tool state files aside."""
    with compilers_at(cache_dir):
        before = stat_snapshot(cache_dir)
        yield
        after = stat_snapshot(cache_dir)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if changed:
        raise CacheMismatchError(
            f"{cache_dir}: kernels were (re)compiled while loading ({changed[:3]}...): the cache "
            f"is incomplete or was moved from {built_at}; rebuild it with graphrt-capture --out")


_SCHEMA = {"format": int, "created": str, "mode": str, "config": dict, "config_digest": str,
           "buckets": list, "bucket_backends": dict, "rows": list, "environment": dict,
           "artifacts": dict, "path": (str, type(None))}


def _manifest_problems(data: dict, config, where: str) -> list[str]:
    """Schema, environment and config of a parsed manifest; `where` names the file."""
    from graphrt.config import BACKENDS, ConfigError, config_from_dict
    problems = [f"{where}: {key!r} missing or not {getattr(t, '__name__', 'str or null')}"
                for key, t in _SCHEMA.items() if not isinstance(data.get(key), t)]
    if "built_for" in data and not isinstance(data["built_for"], dict):
        problems.append(f"{where}: 'built_for' is not an object")
    if problems:
        return problems
    if data["mode"] not in MODES:
        problems.append(f"{where}: mode {data['mode']!r} is not one of {list(MODES)}")
    here, built = environment(), data["environment"]
    for key in sorted(set(here) | set(built)):
        if key not in built:
            problems.append(f"{where}: environment.{key} missing (this process has "
                            f"{here[key]!r}); every environment key is required")
        elif key not in here:
            problems.append(f"{where}: environment.{key} is not a key this graphrt records")
        elif not same_environment(key, built[key], here[key]):
            problems.append(f"{where}: environment.{key}: cache built with {built[key]!r}, this "
                            f"process has {here[key]!r}")
    try:
        cached = config_from_dict(data["config"], source=f"{where} config")
    except (ConfigError, TypeError) as e:
        return problems + [f"{where}: config invalid: {e}"]
    if cached.digest() != data["config_digest"]:
        problems.append(f"{where}: config does not match its config_digest "
                        f"{data['config_digest']!r} (edited by hand?)")
    if data["buckets"] != list(cached.buckets):
        problems.append(f"{where}: buckets {data['buckets']} are not the config's "
                        f"{list(cached.buckets)}")
    if sorted(data["bucket_backends"]) != sorted(str(b) for b in cached.buckets) or any(
            v not in BACKENDS or v == "auto" for v in data["bucket_backends"].values()):
        problems.append(f"{where}: bucket_backends {data['bucket_backends']} must name a backend "
                        f"for each bucket {list(cached.buckets)}")
    if config is not None:
        want, have = config.to_dict(), cached.to_dict()
        diff = {k: (have.get(k), want.get(k)) for k in sorted(set(want) | set(have))
                if have.get(k) != want.get(k)}
        if diff:
            problems.append(f"{where}: config differs from the pinned one (cache, pinned): {diff}")
    return problems


def _artifact_problems(cache_dir: Path, listed: dict, present: tuple[str, ...]) -> list[str]:
    """The manifest's artifact entries against the files the walk found (`present`): bad entries,
    listed files missing, unlisted files, and every listed file whose sha256 differs (all hashed
    before any is judged: files.hash_files)."""
    problems = []
    for rel, digest in listed.items():
        bad = entry_problem(rel)
        if bad is None and not (isinstance(digest, str) and HEX64.fullmatch(digest)):
            bad = f"artifact entry {rel!r}: {digest!r} is not a sha256 (64 hex digits)"
        if bad:
            problems.append(f"{MANIFEST}: {bad}")
    valid = {rel: d for rel, d in listed.items() if not entry_problem(rel)}  # paths we may open
    on_disk = set(present)
    for rel in sorted(set(valid) - on_disk):
        problems.append(f"{rel}: listed in the manifest but missing (or not a regular file)")
    for rel in sorted(on_disk - set(valid)):
        problems.append(f"{rel}: present but not listed in the manifest")
    to_hash = [rel for rel in sorted(set(valid) & on_disk)    # bad digests: reported above
               if isinstance(valid[rel], str) and HEX64.fullmatch(valid[rel])]
    for rel, actual in zip(to_hash, hash_files(cache_dir, to_hash)):
        if isinstance(actual, OSError):                       # e.g. replaced by a symlink since the walk
            problems.append(f"{rel}: cannot be read ({actual.strerror})")
        elif actual != valid[rel]:
            problems.append(f"{rel}: checksum mismatch: sha256 {actual[:16]}... on disk, manifest "
                            f"lists {str(valid[rel])[:16]}...")
    return problems


def check_cache(cache_dir: Path, *, config=None, expect_digest: str | None = None,
                trust_unsafe_permissions: bool = False) -> Manifest:
    """Verify a cache against this process before anything of it is loaded.

    Refuses, in one CacheMismatchError naming each file and what differs: group/other-writable
    or foreign-owned files, folders or parent folders (unless trust_unsafe_permissions), symlinks,
    a manifest other than `expect_digest` (sha256 hex of manifest.json), invalid JSON, a missing
    or different environment key, a config that does not match its digest or differs from
    `config` (a RuntimeConfig), manifest paths outside the artifact folders, listed files missing,
    unlisted files, and any file whose sha256 differs. Returns the manifest when all fit.
    """
    cache_dir = Path(cache_dir)
    if expect_digest is not None and not (isinstance(expect_digest, str)
                                          and HEX64.fullmatch(expect_digest)):
        raise ValueError(f"expect_digest: expected the manifest's sha256 as 64 lowercase hex "
                         f"digits (printed by graphrt-capture), got {expect_digest!r}")
    from graphrt.config import RuntimeConfig
    if config is not None and not isinstance(config, RuntimeConfig):
        raise TypeError(f"config: expected a RuntimeConfig, got {type(config).__name__}")
    if not isinstance(trust_unsafe_permissions, bool):
        raise TypeError(f"trust_unsafe_permissions: expected a bool, got {trust_unsafe_permissions!r}")
    if not cache_dir.is_dir():
        raise CacheMismatchError(f"{cache_dir}: no such directory; not a graph cache "
                                 "(build one with graphrt-capture --config X --out DIR)")
    found = walk(cache_dir, trust_unsafe_permissions=trust_unsafe_permissions)
    if found.problems:  # nothing in the folder is read before it is known to be trusted
        _refuse(cache_dir, list(found.problems))
    m = Manifest.read(cache_dir, expect_digest=expect_digest)
    problems = _manifest_problems(m.data, config, MANIFEST)
    if isinstance(m.data.get("artifacts"), dict):
        problems += _artifact_problems(cache_dir, m.data["artifacts"], found.files)
    if problems:
        _refuse(cache_dir, problems)
    return m


def _refuse(cache_dir: Path, problems: list[str]):
    shown = problems[:MAX_LISTED]
    more = [f"... and {len(problems) - MAX_LISTED} more"] if len(problems) > MAX_LISTED else []
    hint = ""
    if any("owned by uid" in p or "writable by group/others" in p for p in problems):
        hint = ("\nif every user who can write it is trusted, pass trust_unsafe_permissions=True "
                "(graphrt-capture --trust-unsafe-permissions)")
    raise CacheMismatchError(
        f"graph cache {cache_dir} refused ({len(problems)} problem(s)):\n  - " +
        "\n  - ".join(shown + more) + hint +
        f"\nrebuild it: graphrt-capture --config <your config.yaml> --out {cache_dir}")


def open_cache(runtime_cls, cache_dir, *, kv_cache, device, lazy: bool, progress: bool,
               config=None, expect_digest: str | None = None,
               trust_unsafe_permissions: bool = False):
    """Check a cache (check_cache, with the pins given), then build and capture the runtime with
    the compilers pointed at the cache for the duration only.

    Raises CacheMismatchError before loading anything if the cache does not fit, and after
    capture if any kernel had to be (re)compiled (the runtime is then dropped). The device
    planner's parity with FlashInfer's plan() was checked at build time on 4 length sets per
    bucket; loading re-checks LOAD_PARITY_SETS per bucket. With lazy=True the runtime's
    compile_scope re-enters the cache (and the recompilation check) for each lazy capture.
    FLASHINFER_WORKSPACE_BASE and TRITON_CACHE_DIR hold their previous values when this returns
    or raises.
    """
    from functools import partial

    from graphrt.config import config_from_dict
    t0 = time.perf_counter()
    cache_dir = Path(cache_dir)
    manifest = check_cache(cache_dir, config=config, expect_digest=expect_digest,
                           trust_unsafe_permissions=trust_unsafe_permissions)
    if manifest.data["mode"] != "CUDA graphs" and str(device) != "cpu":
        raise CacheMismatchError(f"{cache_dir}: built in {manifest.data['mode']!r} mode on a machine "
                                 f"without CUDA; rebuild it on the GPU that will serve")
    t_checked = time.perf_counter()
    scope = partial(loading_from, cache_dir, manifest.data.get("path"))
    with scope():
        cfg = config_from_dict(manifest.data["config"], source=str(cache_dir / MANIFEST))
        backends = {int(k): v for k, v in manifest.data["bucket_backends"].items()}
        rt = runtime_cls(cfg, kv_cache, device, bucket_backends=backends, lazy=lazy,
                         parity_sets=LOAD_PARITY_SETS)
        t_built = time.perf_counter()
        rt.capture(progress=progress)
        t_captured = time.perf_counter()
    rt.compile_scope = scope
    rt.startup_s = {"check": t_checked - t0, "construct": t_built - t_checked,
                    "setup_and_capture": t_captured - t_built}
    return rt
