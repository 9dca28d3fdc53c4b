"""The walk over a graph cache's files: classification, refusals, hashing, permissions fix-up."""
from __future__ import annotations

import hashlib
import os
import stat

import pytest

from graphrt.cache.files import (READ_BLOCK, collect_artifacts, drop_group_other_write, entry_problem,
                                 hash_files, sha256, stat_snapshot, walk)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "gc"
    for rel, data in {"manifest.json": b"{}", "flashinfer/m/mod.so": b"so", "flashinfer/m/a.o": b"o",
                      "flashinfer/m/.ninja_log": b"log", "flashinfer/m/.ninja_deps": b"deps",
                      "flashinfer/tmp/mod.lock": b"", "triton/K/k.cubin": b"cubin"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_walk_classifies_files_and_state(tree):
    found = walk(tree)
    assert found.problems == ()
    assert found.files == ("flashinfer/m/a.o", "flashinfer/m/mod.so", "triton/K/k.cubin")
    assert set(found.state) == {"flashinfer/m/.ninja_log", "flashinfer/m/.ninja_deps",
                                "flashinfer/tmp/mod.lock"}
    arts = collect_artifacts(tree)
    assert arts == {rel: sha256(tree / rel) for rel in found.files}
    assert set(stat_snapshot(tree)) == set(found.files)


def test_hash_files_keeps_order_and_returns_errors(tmp_path):
    sizes = [0, 1, 2047, 2048, READ_BLOCK - 1, READ_BLOCK, READ_BLOCK + 1, 3 * READ_BLOCK + 7] + [100] * 30
    rels = [f"f{i:02d}" for i in range(len(sizes))]
    for i, (rel, n) in enumerate(zip(rels, sizes)):
        (tmp_path / rel).write_bytes(os.urandom(n) if n > 100 else bytes([i]) * n)
    (tmp_path / "link").symlink_to(tmp_path / "f01")
    got = hash_files(tmp_path, rels + ["link", "gone"])
    assert got[:-2] == [hashlib.sha256((tmp_path / rel).read_bytes()).hexdigest() for rel in rels]
    assert got[:-2] == [sha256(tmp_path / rel) for rel in rels]   # one file at a time: the same
    assert isinstance(got[-2], OSError) and isinstance(got[-1], FileNotFoundError)  # a symlink is not followed
    assert hash_files(tmp_path, []) == [] and hash_files(tmp_path, ["f01"]) == [got[1]]


def test_lock_files_may_be_group_writable_nothing_else(tree):
    os.chmod(tree / "flashinfer/tmp/mod.lock", 0o666)  # a lock file's bytes are never read
    assert walk(tree).problems == ()
    os.chmod(tree / "flashinfer/m/.ninja_log", 0o666)  # ninja reads its log
    assert walk(tree).problems == ("flashinfer/m/.ninja_log: writable by group/others "
                                   "(mode 0666); chmod go-w it",)


def test_special_files_and_symlinks_are_refused(tree):
    os.mkfifo(tree / "triton/K/pipe")
    (tree / "triton/link").symlink_to(tree / "triton/K", target_is_directory=True)
    problems = walk(tree, trust_unsafe_permissions=True).problems
    assert any(p.startswith("triton/K/pipe: not a regular file") for p in problems)
    assert any(p.startswith("triton/link: a symlink") for p in problems)
    with pytest.raises(RuntimeError, match="cannot make a graph cache"):
        collect_artifacts(tree)


def test_cache_dir_itself_a_symlink_is_refused(tree, tmp_path):
    (tmp_path / "alias").symlink_to(tree, target_is_directory=True)
    assert walk(tmp_path / "alias").problems[0].endswith("graph caches hold no symlinks")


def test_drop_group_other_write(tree):
    os.chmod(tree / "flashinfer/m/mod.so", 0o777)
    os.chmod(tree / "triton", 0o775)
    drop_group_other_write(tree)
    assert stat.S_IMODE((tree / "flashinfer/m/mod.so").stat().st_mode) == 0o755
    assert stat.S_IMODE((tree / "triton").stat().st_mode) == 0o755
    assert walk(tree).problems == ()


@pytest.mark.parametrize("entry, ok", [
    ("flashinfer/.cache/x/mod.so", True), ("triton/K/k.cubin", True), ("triton", False),
    ("", False), (3, False), ("/abs/x", False), ("../x", False), ("triton/a/../b", False),
    ("triton/./b", False), ("triton//b", False), ("triton\\b", False), ("manifest.json", False),
    ("triton/tmp/k.lock", False)])
def test_entry_problem(entry, ok):
    assert (entry_problem(entry) is None) == ok
