"""The files of a graph cache: one walk that refuses what graphrt does not trust, then hashes.

A graph cache holds native code that gets loaded into the server (FlashInfer JIT modules, Triton
kernels and launchers), so whoever can write the directory can run code in the server. The walk
enforces the trust model of README "Graph cache trust model":

- ownership and permissions: the cache directory, everything in it and every directory above it
  (along the path as given: a symlinked component is judged where it lives, then its target)
  must be owned by the current user (directories above it: or by root) and not writable by group
  or others (a directory above it may be, with the sticky bit, as /tmp); `trust_unsafe_permissions`
  turns this part off and nothing else;
- no symlinks anywhere inside (files or directories), nothing but regular files and directories;
- every file is either the manifest, a listed artifact (compared by sha256 of its bytes, by the
  caller) or build-tool bookkeeping (STATE_SUFFIXES: FlashInfer's lock files, ninja's logs), whose
  content decides only whether ninja rebuilds from the hashed sources, which the load refuses.

Every problem is returned as a line naming the file (relative to the cache) and what is wrong.
"""
from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MANIFEST = "manifest.json"
ARTIFACT_DIRS = ("flashinfer", "triton")
STATE_SUFFIXES = (".lock", ".ninja_log", ".ninja_deps")  # build-tool bookkeeping: not hashed
LOCK_SUFFIX = ".lock"  # never read (only flock'ed): created by loading with the user's umask
UNSAFE_MODE = stat.S_IWGRP | stat.S_IWOTH
MAX_SYMLINK_HOPS = 40  # as the kernel's path resolution (ELOOP)
READ_BLOCK = 1 << 20   # bytes read per call while hashing


def sha256(path: Path) -> str:
    """sha256 (hex) of a file's bytes; refuses (OSError) to follow a symlink to it. Reads into
    one reused buffer (no bytes object per block)."""
    h = hashlib.sha256()
    with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)), "rb", buffering=0) as f:
        buf = bytearray(min(READ_BLOCK, os.fstat(f.fileno()).st_size + 1))  # a small file: one read
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def hash_files(root: Path, rels: list[str]) -> list[str | OSError]:
    """sha256 (hex) of each file `root/rel`, in the order of `rels`, or the OSError that reading
    it raised (missing, replaced by a symlink since the walk, unreadable). One file after
    another: a model's cache (16.8 MB at the Llama-3.2-1B shape) hashes in 0.06 s on the H200."""
    def one(rel: str) -> str | OSError:
        try:
            return sha256(Path(root) / rel)
        except OSError as e:
            return e
    return [one(rel) for rel in rels]


def current_uid() -> int:
    return os.geteuid()


def is_state_file(rel: str) -> bool:
    return rel.endswith(STATE_SUFFIXES)


@dataclass(frozen=True)
class CacheFiles:
    """What one walk of a cache directory found.

    files: relative POSIX paths of every regular file except the manifest and state files;
    state: relative paths of the build-tool state files; problems: one line per refusal
    (symlinks, special files, unreadable folders, and unless trusted: owner and permissions)."""
    files: tuple[str, ...]
    state: tuple[str, ...]
    problems: tuple[str, ...]


def _ownership_problem(what: str, st: os.stat_result, uid: int, *, allow_root: bool = False,
                       allow_sticky: bool = False, check_mode: bool = True) -> str | None:
    if st.st_uid != uid and not (allow_root and st.st_uid == 0):
        return f"{what}: owned by uid {st.st_uid}, not by the current user (uid {uid})"
    sticky = allow_sticky and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if check_mode and st.st_mode & UNSAFE_MODE and not sticky:
        return (f"{what}: writable by group/others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"chmod go-w it")
    return None


def ancestor_problems(cache_dir: Path, uid: int) -> list[str]:
    """Directories above the cache (and symlinks on the way) that another user could use to
    replace it, judged along the path as given, component by component, the way the kernel
    resolves it: every directory traversed ("/" included) must be owned by the user or root and
    not writable by group/others unless sticky; a symlink is judged where it lives (its
    directory is a component already), must be owned by the user or root, and its target's
    components are judged in turn. The last component (the cache directory itself) is walk()'s."""
    given = Path(cache_dir)
    if not given.is_absolute():
        given = Path(os.getcwd()) / given
    problems: list[str] = []
    seen: set[Path] = set()

    def judge(path: Path, st: os.stat_result, what: str, **kw) -> None:
        if path not in seen:
            seen.add(path)
            p = _ownership_problem(f"{path} ({what} above the cache)", st, uid, allow_root=True, **kw)
            if p:
                problems.append(p)

    root = Path(given.anchor)
    judge(root, os.lstat(root), "a directory", allow_sticky=True)
    todo, current, hops = list(given.parts[1:-1]), root, 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent
            continue
        here = current / part
        try:
            st = os.lstat(here)
        except OSError as e:
            problems.append(f"{here} (a directory above the cache): cannot stat ({e.strerror})")
            break
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > MAX_SYMLINK_HOPS:
                problems.append(f"{here}: more than {MAX_SYMLINK_HOPS} symlinks on the path to the cache")
                break
            judge(here, st, "a symlink", check_mode=False)     # its directory: `current`, judged
            target = Path(os.readlink(here))
            if target.is_absolute():
                current = Path(target.anchor)
            todo[:0] = list(target.parts[1:] if target.is_absolute() else target.parts)
            continue
        judge(here, st, "a directory", allow_sticky=True)
        current = here
    return problems


def walk(cache_dir: Path, *, trust_unsafe_permissions: bool = False) -> CacheFiles:
    """Walk `cache_dir` without following symlinks; classify every entry, collect every problem."""
    cache_dir = Path(cache_dir)
    uid = current_uid()
    files, state, problems = [], [], []
    if not trust_unsafe_permissions:
        problems += ancestor_problems(cache_dir, uid)

    def visit(path: Path, rel: str) -> None:
        st = os.lstat(path)
        what = rel or f"{cache_dir} (the cache directory)"
        if stat.S_ISLNK(st.st_mode):
            problems.append(f"{what}: a symlink (to {os.readlink(path)}); graph caches hold no "
                            f"symlinks")
            return
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            problems.append(f"{what}: not a regular file or directory")
            return
        if not trust_unsafe_permissions:
            p = _ownership_problem(what, st, uid, check_mode=not rel.endswith(LOCK_SUFFIX))
            if p:
                problems.append(p)
        if stat.S_ISDIR(st.st_mode):
            try:
                entries = sorted(os.listdir(path))
            except OSError as e:
                problems.append(f"{what}: cannot list ({e.strerror})")
                return
            for entry in entries:
                visit(path / entry, f"{rel}/{entry}" if rel else entry)
        elif rel != MANIFEST:
            (state if is_state_file(rel) else files).append(rel)

    visit(cache_dir, "")
    return CacheFiles(tuple(files), tuple(state), tuple(problems))


def entry_problem(rel) -> str | None:
    """Why a manifest artifact entry is not a plain path inside an artifact folder (or None)."""
    if not isinstance(rel, str) or not rel:
        return f"artifact entry {rel!r}: not a relative path"
    p = PurePosixPath(rel)
    if p.is_absolute():
        return f"artifact entry {rel!r}: an absolute path"
    parts = rel.split("/")
    for bad, why in (("..", "a '..' component"), (".", "a '.' component"),
                     ("", "an empty component ('//')")):
        if bad in parts:
            return f"artifact entry {rel!r}: {why}; entries are plain paths inside the cache"
    if "\\" in rel:
        return f"artifact entry {rel!r}: a backslash; entries are POSIX paths"
    if p.parts[0] not in ARTIFACT_DIRS or len(p.parts) < 2:
        return f"artifact entry {rel!r}: not under {'/ or '.join(ARTIFACT_DIRS)}/"
    if is_state_file(rel):
        return f"artifact entry {rel!r}: a build-tool state file ({', '.join(STATE_SUFFIXES)})"
    return None


def stat_snapshot(cache_dir: Path, found: CacheFiles | None = None) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every non-state file: a (re)compilation while loading changes it."""
    found = found or walk(cache_dir, trust_unsafe_permissions=True)
    out = {}
    for rel in found.files:
        st = os.lstat(Path(cache_dir) / rel)
        out[rel] = (st.st_size, st.st_mtime_ns)
    return out


def collect_artifacts(cache_dir: Path) -> dict[str, str]:
    """sha256 of every artifact file (every file but the manifest and state files), by path.

    Raises RuntimeError where the folder holds what a cache may not (symlinks, special files)."""
    found = walk(cache_dir, trust_unsafe_permissions=True)
    if found.problems:
        raise RuntimeError(f"{cache_dir}: cannot make a graph cache of it: {list(found.problems)}")
    digests = hash_files(cache_dir, list(found.files))
    for d in digests:
        if isinstance(d, OSError):
            raise d
    return dict(zip(found.files, digests))


def drop_group_other_write(cache_dir: Path) -> None:
    """chmod go-w the cache directory and everything in it (graphrt-capture's last step)."""
    for root, dirs, names in os.walk(cache_dir):
        for p in [Path(root)] + [Path(root) / n for n in names]:
            st = os.lstat(p)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & UNSAFE_MODE:
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~UNSAFE_MODE)
