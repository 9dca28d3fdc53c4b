"""Triton reads a graph cache without ever writing into it: a read-through cache manager.

    with read_through(cache_dir / "triton", private_dir) as rt:   # rt: ReadThroughCache, or None
        ...                                                       # launches compile or load kernels
    rt.loaded, rt.compiled, rt.private_hits                      # kernel names, in order

Triton asks `triton.knobs.cache.manager_class` (Triton >= 3.4; known: 3.4 to 3.9) for the cache
of every kernel it compiles (`compiler.compile`: get_group, then put of each stage and put_group),
every launcher / utility module it builds (`runtime/build.py`: get_file, put) and every autotune
result (get_file, put). Its interface is `CacheManager` in `triton/runtime/cache.py`:
`__init__(key, override=False, dump=False)`, `get_file`, `put`, `get_group`, `put_group`. This is
the only module that knows it; it sets the knob (a public setting, no method replaced) for the
duration of `read_through` only.

Lookups go to the pinned directory first (the graph cache's `triton/`, in Triton's own layout:
`<key>/<file>`), then to the private one; every write goes to the private directory, never to the
pinned one. A kernel group found in the pinned directory resolves its files by name inside that
same `<key>` folder (the absolute paths a group file records are not followed), so a cache can be
moved without its Triton kernels going stale. A kernel or module missing from the pinned
directory logs one warning line naming it (once per name) and is built into the private one.
TRITON_KERNEL_OVERRIDE / TRITON_KERNEL_DUMP managers keep Triton's own folders.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import sysconfig
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("graphrt.cache")

GROUP_PREFIX = "__grp__"              # Triton's name of a kernel's group file: __grp__<kernel>.json
KNOWN_TRITON = "3.4 to 3.9"


def _hook():
    """triton.knobs.cache (whose `manager_class` Triton asks for a cache manager), or None where
    this Triton has no such knob (before 3.4) or Triton is not installed (a CPU install: no
    kernel to compile, no cache to read)."""
    try:
        import triton
    except ImportError:
        return None
    knobs = getattr(triton, "knobs", None)
    cache = getattr(knobs, "cache", None)
    return cache if cache is not None and "manager_class" in dir(type(cache)) else None


def supported() -> bool:
    """Whether this Triton has the cache-manager knob read_through sets."""
    return _hook() is not None


def _label(filename: str) -> str:
    """What a cache file builds, for the log: `kernel NAME` or `module NAME`."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    if filename.endswith(suffix):
        return f"module {filename[:-len(suffix)]}"
    if filename.endswith(".autotune.json"):
        return f"autotune result {filename[:-len('.autotune.json')]}"
    return f"kernel {filename.removesuffix('.json')}"


class ReadThroughCache:
    """The pinned (read-only) and private (writable) Triton directories of one `read_through`
    scope, and what happened there: `loaded` (names read from the pinned directory), `compiled`
    (built into the private one), `private_hits` (missing from the pinned one, found in the
    private one from an earlier build). `manager` is the CacheManager class handed to Triton."""

    def __init__(self, pinned: Path, private: Path):
        pinned, private = Path(pinned).resolve(), Path(private).resolve()
        if private == pinned or pinned in private.parents:
            raise ValueError(f"private_dir: {private} lies inside the graph cache {pinned}; compiling "
                             f"there would change the cache")
        self.pinned, self.private = pinned, private
        self.loaded: list[str] = []
        self.compiled: list[str] = []
        self.private_hits: list[str] = []
        self._warned: set[str] = set()
        self._lock = threading.Lock()                  # Triton may compile from several threads
        self.manager = _manager_class(self)

    def counts(self) -> tuple[int, int]:
        """(loaded from the graph cache, compiled or taken from the private directory)."""
        return len(self.loaded), len(self.compiled) + len(self.private_hits)

    def summary(self) -> str:
        """One line: how many kernels came from where."""
        line = (f"Triton kernels: {len(self.loaded)} loaded from graph cache {self.pinned}, "
                f"{len(self.compiled)} compiled into {self.private}")
        if self.private_hits:
            line += f", {len(self.private_hits)} loaded from {self.private} (missing from the graph cache)"
        if self.compiled or self.private_hits:
            line += f": {', '.join((self.compiled + self.private_hits)[:5])}"
        return line

    def _note(self, where: list, filename: str) -> None:
        with self._lock:
            where.append(_label(filename))

    def _missing(self, filename: str) -> None:
        name = _label(filename)
        with self._lock:
            if name in self._warned:
                return
            self._warned.add(name)
        log.warning("graph cache %s: Triton %s is missing from it; building it into %s (rebuild the cache "
                    "with graphrt-capture --model for this model and engine config)", self.pinned, name,
                    self.private)


def _manager_class(source: ReadThroughCache):
    from triton.runtime.cache import CacheManager, FileCacheManager

    class GraphCacheManager(CacheManager):
        """Triton's cache for one key: reads <pinned>/<key>, then <private>/<key>; writes only the
        latter."""
        graph_cache = source

        def __init__(self, key, override=False, dump=False):
            self.key = key
            self._own = FileCacheManager(key, override=override, dump=dump) if override or dump else None
            self._pinned = source.pinned / key
            self._private = source.private / key
            self._built: set[str] = set()              # products missing from both: built next

        def get_file(self, filename):
            if self._own is not None:
                return self._own.get_file(filename)
            product = _is_product(filename)            # else a kernel's stage, read during its build
            if (self._pinned / filename).is_file():
                if product:
                    source._note(source.loaded, filename)
                return str(self._pinned / filename)
            if product:
                source._missing(filename)
            if (self._private / filename).is_file():
                if product:
                    source._note(source.private_hits, filename)
                return str(self._private / filename)
            if product:
                self._built.add(filename)              # Triton builds it and puts it next
            return None

        def get_group(self, filename):
            if self._own is not None:
                return self._own.get_group(filename)
            group = _read_group(self._pinned, filename)
            if group is not None:
                source._note(source.loaded, filename)
                return group
            group = _read_group(self._private, filename)
            source._missing(filename)
            if group is not None:
                source._note(source.private_hits, filename)
            return group

        def put(self, data, filename, binary=True):
            if self._own is not None:
                return self._own.put(data, filename, binary=binary)
            path = _write(self._private, filename, data)
            if filename in self._built:
                self._built.discard(filename)
                source._note(source.compiled, filename)
            return path

        def put_group(self, filename, group):
            if self._own is not None:
                return self._own.put_group(filename, group)
            path = _write(self._private, GROUP_PREFIX + filename, json.dumps({"child_paths": group}))
            source._note(source.compiled, filename)
            return path

    return GraphCacheManager


def _is_product(filename: str) -> bool:
    """A file Triton looks up by itself (a built module, an autotune result), not a stage of a
    kernel (those are reached through its group)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return filename.endswith((suffix, ".autotune.json"))


def _read_group(base: Path, filename: str) -> dict[str, str] | None:
    """A kernel's group under `base` ({file name: path inside base}), or None if absent, invalid
    or incomplete."""
    path = base / (GROUP_PREFIX + filename)
    if not path.is_file():
        return None
    try:
        children = json.loads(path.read_text()).get("child_paths")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(children, dict):
        return None
    found = {}
    for name in children:
        child = base / name
        if not isinstance(name, str) or "/" in name or name in ("", ".", "..") or not child.is_file():
            return None
        found[name] = str(child)
    return found


def _write(base: Path, filename: str, data) -> str:
    """Write atomically (a temporary name, then os.replace) into base; returns the path."""
    base.mkdir(parents=True, exist_ok=True)
    path = base / filename
    tmp = base / f".{filename}.tmp.{os.getpid()}.{uuid.uuid4().hex}"
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(str(data))
    os.replace(tmp, path)
    return str(path)


def active() -> ReadThroughCache | None:
    """The ReadThroughCache Triton uses now, or None (no read_through scope is open; none can be
    where Triton is not imported yet: this imports nothing)."""
    if sys.modules.get("triton") is None:
        return None
    hook = _hook()
    return getattr(hook.manager_class, "graph_cache", None) if hook is not None else None


@contextmanager
def read_through(pinned_dir: Path, private_dir: Path):
    """Point Triton's cache manager at a ReadThroughCache(pinned_dir, private_dir) inside the
    block; yields it, or None after one warning where this Triton has no cache-manager knob (the
    caller then lets Triton write into the cache, as before). Refuses nesting (RuntimeError).
    The knob is process-wide: every thread's compilations in the block go through it."""
    hook = _hook()
    if hook is None:
        if sys.modules.get("triton") is not None:     # (no Triton installed: nothing compiles)
            log.warning("Triton %s has no cache-manager knob (triton.knobs.cache.manager_class, Triton >= 3.4; "
                        "graphrt knows %s): kernels missing from the graph cache %s are compiled into it",
                        sys.modules["triton"].__version__, KNOWN_TRITON, pinned_dir)
        yield None
        return
    if active() is not None:
        raise RuntimeError(f"read_through: Triton already reads the graph cache {active().pinned}; "
                           f"one graph cache per process")
    cache = ReadThroughCache(pinned_dir, private_dir)
    saved = hook.manager_class                          # None, or TRITON_CACHE_MANAGER's class
    hook.manager_class = cache.manager
    try:
        yield cache
    finally:
        if saved is None:
            del hook.manager_class                      # back to TRITON_CACHE_MANAGER / the default
        else:
            hook.manager_class = saved


__all__ = ["ReadThroughCache", "read_through", "active", "supported", "KNOWN_TRITON"]
