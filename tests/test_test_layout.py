"""The test tree itself: pytest imports test files by basename (rootdir mode, no packages), so two
files with the same name in different folders abort collection of the whole suite."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_test_file_basenames_are_unique():
    where = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        where[path.name].append(str(path.relative_to(TESTS)))
    dups = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not dups, f"test files share a basename (pytest cannot collect both): {dups}"
